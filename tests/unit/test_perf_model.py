"""The performance model (runner/analysis/perf_model.py) without training.

The seeds' tables in kind (4x A6000, PCIe): the model ranks naive model parallel far below DDP for TinyLlama
1.1B LoRA, which fits one GPU, and FSDP above model parallel for CodeLlama 34B LoRA, which does not. Device
figures like the seeds' are given (compute from the FLOPs formula at an assumed efficiency on the datasheet
peak, a PCIe-like bandwidth); the expectations are derived from those inputs and the formulas, never typed
in. Then the fit: trials made from a known device (their step shares as the profiler would split them) give
that device back, and each raced candidate's held-out prediction matches it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from runner.analysis import perf_model as pm
from runner.analysis.mfu import PEAK_TFLOPS
from runner.spec.flops import flops_per_token

GPUS = 4
MFU = 0.4
"""The assumed share of the datasheet peak a step's matmuls reach (an input of the test, not a result)."""
PCIE = 10e9
"""Bytes/s of a ring all-reduce between 4 GPUs over PCIe 4.0 x16 (32 GB/s per direction on paper)."""
LATENCY = 50e-6
LORA_R = 8
SEQ = 1024


def _lora(hidden: int, kv: int, inter: int) -> int:
    """LoRA parameters of one decoder layer, r x (in + out) for q, k, v, o, gate, up, down."""
    return LORA_R * sum(i + o for i, o in ((hidden, hidden), (hidden, kv), (hidden, kv), (hidden, hidden),
                                           (hidden, inter), (hidden, inter), (inter, hidden)))


def _model(params: int, layers: int, heads: int, head_dim: int, kv: int, inter: int) -> tuple[pm.Workload, float]:
    """A bf16 LoRA model's workload (fp32 adapters) and one A6000's compute seconds per token of it."""
    hidden = heads * head_dim
    trainable = layers * _lora(hidden, kv, inter)
    work = pm.Workload(params * 2, trainable * 4, layers, hidden, SEQ, 2, "test: the model's config")
    fpt = flops_per_token(params, layers, heads, head_dim, SEQ, trainable)
    return work, fpt / (PEAK_TFLOPS["RTX A6000"]["bf16"] * 1e12 * MFU)


TINYLLAMA = _model(1_100_048_384, 22, 32, 64, 256, 5632)
CODELLAMA_34B = _model(33_743_970_304, 48, 64, 128, 1024, 22016)


def _device(c: float, bandwidth: float = PCIE, overhead: float = 0.0, counts: Sequence[int] = (1,),
            shares_host: bool = False) -> pm.Device:
    return pm.Device({n: pm.Rate(c, overhead, ()) for n in counts}, shares_host, bandwidth, LATENCY, "test")


def test_mp_ranks_far_below_ddp_for_a_model_that_fits_one_gpu() -> None:
    work, c = TINYLLAMA
    device = _device(c)
    # the seed's run: 1024 rows of 1024 tokens, batch 16 and accumulation 2 on each GPU
    ddp = pm.predict(device, work, pm.layout_of("ddp", GPUS, 16, 2))
    mp = pm.predict(device, work, pm.layout_of("mp", GPUS, 16, 2))
    assert ddp is not None and mp is not None
    # naive model parallel: one micro-batch, so the stages run one after another: the bubble is (p-1)/p
    assert mp.bubble_s / (mp.compute_s + mp.bubble_s) == pytest.approx((GPUS - 1) / GPUS)
    rows = 16 * 2 * SEQ
    assert mp.compute_s + mp.bubble_s == pytest.approx(rows * c)  # the whole batch at one device's rate
    # DDP: every GPU computes its own rows; its traffic is the LoRA gradients only
    assert ddp.compute_s == pytest.approx(rows * c)
    assert ddp.comm_s == pytest.approx(LATENCY + 2 * (GPUS - 1) / GPUS * work.grad_bytes / PCIE)
    assert ddp.comm_s < 0.01 * ddp.compute_s
    # so DDP is close to GPUS times model parallel: far above it (the seed: 3m53s against 59s, 3.9x)
    assert ddp.tokens_per_s > 3 * mp.tokens_per_s
    assert ddp.tokens_per_s / mp.tokens_per_s == pytest.approx(GPUS * mp.step_s / ddp.step_s)


def test_fsdp_ranks_above_mp_for_a_model_that_does_not_fit_one_gpu() -> None:
    work, c = CODELLAMA_34B
    assert work.param_bytes > 48 * 2**30  # its bf16 weights alone are more than one 48 GB A6000
    device = _device(c)
    # the seed's run: batch 4 and accumulation 4 on each GPU
    fsdp = pm.predict(device, work, pm.layout_of("fsdp", GPUS, 4, 4))
    mp = pm.predict(device, work, pm.layout_of("mp", GPUS, 4, 4))
    assert fsdp is not None and mp is not None
    # FSDP gathers 3/4 of the weights twice a micro-batch: far more traffic than DDP, yet less time than the
    # 3 of 4 GPUs naive model parallel leaves idle
    gathered = 4 * 2 * (GPUS - 1) / GPUS * work.param_bytes
    assert pm.traffic(work, pm.layout_of("fsdp", GPUS, 4, 4)).bytes > gathered
    assert fsdp.comm_s < (GPUS - 1) * fsdp.compute_s
    assert fsdp.tokens_per_s > mp.tokens_per_s  # the seed: 30 minutes against 47
    # the ranking comes from the traffic: on a link 10x slower, FSDP's gathers cost more than MP's idle GPUs
    slow = _device(c, bandwidth=PCIE / 10)
    slow_fsdp = pm.predict(slow, work, pm.layout_of("fsdp", GPUS, 4, 4))
    slow_mp = pm.predict(slow, work, pm.layout_of("mp", GPUS, 4, 4))
    assert slow_fsdp is not None and slow_mp is not None
    assert slow_fsdp.comm_s > (GPUS - 1) * slow_fsdp.compute_s and slow_fsdp.tokens_per_s < slow_mp.tokens_per_s


def test_the_pipeline_bubble_shrinks_with_micro_batches() -> None:
    work, c = TINYLLAMA
    device = _device(c)
    for m in (1, 2, 4, 16):
        pred = pm.predict(device, work, pm.layout_of("pp", GPUS, 16, 1, pipeline_microbatches=m))
        assert pred is not None
        assert pred.bubble_s / (pred.compute_s + pred.bubble_s) == pytest.approx((GPUS - 1) / (m + GPUS - 1))


def test_a_rank_sharing_the_host_computes_slower_with_more_ranks() -> None:
    cpu = _device(0.001, counts=(2,), shares_host=True)
    gpu = _device(0.001, counts=(2,))
    assert cpu.rate(4)[0].compute_s_per_token == pytest.approx(0.002) and "scaled by 4/2" in cpu.rate(4)[1]
    assert gpu.rate(4)[0].compute_s_per_token == pytest.approx(0.001)
    assert cpu.rate(2)[1] == "measured at 2 process(es)"


def test_a_layout_that_moves_data_has_no_prediction_without_a_measured_bandwidth() -> None:
    work, c = TINYLLAMA
    device = pm.Device({1: pm.Rate(c, 0.0, ())}, False, None, 0.0, "test")
    assert pm.predict(device, work, pm.layout_of("ddp", 2, 4, 1)) is None
    assert pm.predict(device, work, pm.layout_of("single", 1, 4, 1)) is not None


# ---------------------------------------------------------------------- the fit


QUICK = pm.Workload(param_bytes=12_600_000 * 4, grad_bytes=61_440 * 4, layers=6, hidden=256, seq_len=64,
                    act_bytes=4, source="test: quickstart-like")
"""Quickstart's shape (12.6M fp32 parameters, LoRA gradients, 6 layers of 256, context 64)."""

RACED = {"single": ("single", 1, 4, 1), "ddp x2": ("ddp", 2, 2, 1), "fsdp x2": ("fsdp", 2, 2, 1),
         "zero2 x2": ("zero2", 2, 2, 1), "mp x2": ("mp", 2, 4, 1), "pp x2": ("pp", 2, 4, 1), "tp x2": ("tp", 2, 4, 1)}


def _measured(truth: pm.Device, labels: Mapping[str, tuple[str, int, int, int]]) -> list[pm.TrialFigures]:
    """Trials as the plan would measure them on ``truth``: the predicted tokens/s, and the step's shares as the
    profiler splits it (the bubble is waiting on another rank: in the communication share)."""
    out = []
    for i, (label, (strategy, n, micro, accum)) in enumerate(labels.items()):
        lay = pm.layout_of(strategy, n, micro, accum)
        p = pm.predict(truth, QUICK, lay)
        assert p is not None
        shares = {"compute": p.compute_s / p.step_s, "comm": (p.comm_s + p.bubble_s) / p.step_s, "data": 0.0,
                  "other": p.overhead_s / p.step_s}
        out.append(pm.TrialFigures(label, lay, p.tokens_per_s, shares, (i + 1,)))
    return out


def test_the_fit_gives_back_the_device_the_trials_were_measured_on() -> None:
    truth = pm.Device({1: pm.Rate(1 / 2000, 0.004, ()), 2: pm.Rate(1 / 1100, 0.006, ())}, True, 400e6, 0.0008,
                      "truth")
    trials = _measured(truth, RACED)
    found = pm.fit(trials, QUICK, shares_host=True)
    device = found.device
    assert device is not None and set(found.fitted_on) == {"single", "ddp x2", "fsdp x2", "zero2 x2"}
    for n, rate in truth.rates.items():
        assert device.rates[n].compute_s_per_token == pytest.approx(rate.compute_s_per_token)
        assert device.rates[n].overhead_s == pytest.approx(rate.overhead_s)
    assert device.bandwidth == pytest.approx(truth.bandwidth) and device.latency_s == pytest.approx(truth.latency_s)
    # a configuration not raced: DDP over 4 processes, as the truth has it (the CPU rate scaled from 2)
    ddp4 = pm.layout_of("ddp", 4, 1, 1)
    assert pm.predict(device, QUICK, ddp4).tokens_per_s == pytest.approx(  # type: ignore[union-attr]
        pm.predict(truth, QUICK, ddp4).tokens_per_s)  # type: ignore[union-attr]


def test_each_raced_candidates_error_is_of_a_fit_without_its_trials() -> None:
    truth = pm.Device({2: pm.Rate(1 / 1100, 0.006, ())}, False, 400e6, 0.0008, "truth")
    trials = _measured(truth, {k: v for k, v in RACED.items() if k != "single"})
    checked = {c.label: c for c in pm.held_out(trials, QUICK, shares_host=False)}
    assert set(checked) == {t.label for t in trials}
    for t in trials:  # the truth is the model's own form, so every held-out prediction is exact...
        if t.label != "fsdp x2":
            assert checked[t.label].error_pct == pytest.approx(0.0, abs=1e-6), t.label
    # ...but FSDP's: without it the collectives measured (DDP's and ZeRO-2's) have the same calls and bytes, so
    # latency and bandwidth cannot be told apart, and one term is fitted for both
    without = pm.fit([t for t in trials if t.label != "fsdp x2"], QUICK, shares_host=False).device
    assert without is not None and (without.latency_s == 0.0 or without.bandwidth == float("inf"))
    assert checked["fsdp x2"].error_pct is not None and abs(checked["fsdp x2"].error_pct) > 1
    # slow one trial down by a fifth: the error held out says so, and it is not fitted away
    slowed = [pm.TrialFigures(t.label, t.layout, t.tokens_per_s / 1.2 if t.label == "pp x2" else t.tokens_per_s,
                              t.shares, t.runs) for t in trials]
    pp = {c.label: c for c in pm.held_out(slowed, QUICK, shares_host=False)}["pp x2"]
    assert pp.error_pct == pytest.approx(20.0)
    # the only whole-model trial held out: nothing left to fit compute on, and the line says so
    alone = pm.held_out([trials[0]], QUICK, shares_host=False)[0]
    assert alone.error_pct is None and "no completed single or data-parallel trial" in alone.why
