"""MFU you can bet a GPU-hour on: the CPU peak probed in the ranks beside the run (time-weighted through
the steady steps) and stored with it; a peak benchmarked after the run gives no MFU and says why; an MFU
above 100% never shown; bf16 runs against the bf16 peak; the compare table naming the peak in every format
and saying when two runs hold different peaks; utilisation as CPU % of the rank's threads, GPU busy % apart,
and the spread over ranks.

Real matmuls (small sizes), real SQLite, real subprocesses; what is injected is data (a probe record, a
stored peak) and, for the probe's window logic, the clock.
"""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from runner.analysis import cpu_peak, mfu
from runner.analysis.compare import build_comparison, load_comparison
from runner.rank import peak_probe
from runner.spec import flops
from store import Store
from tests.support import ROOT
from tui.render.compare import COLUMNS, markdown, to_csv, to_html, to_json

TINY_DIMS = {"layers": 6, "heads": 6, "head_dim": 64, "seq_len": 256, "embedding_params": 1572864}
PARAMS, TRAINABLE = 12710784, 122880


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FTUI_HOME", str(tmp_path))
    return tmp_path


def _probe_peak(flops: float, dtype: str = "fp32", threads: int = 1, source: str = "probed for the test") -> mfu.Peak:
    """A peak as the watcher stores it from the ranks' probes."""
    return mfu.Peak(flops, source, kind="probe", dtype=dtype, threads=threads, measured_at=1_790_000_000.0,
                    fingerprint="fp-a", machine="m", size=512)


# ---------------------------------------------------------------------- the machine and the probe


def test_fingerprint_reads_the_cpu_not_the_hostname() -> None:
    cpuinfo = ("processor\t: 0\nmodel name\t: AMD EPYC 9B14\ncpu family\t: 25\nmodel\t\t: 17\nstepping\t: 1\n"
               "flags\t\t: fpu sse avx avx2 fma avx512f avx512_bf16 amx_tile\n\nprocessor\t: 1\nmodel name\t: other\n")
    fp = cpu_peak.machine_fingerprint(cpuinfo)
    assert fp.cpu_model == "AMD EPYC 9B14 (25/17/1)"  # the first processor's fields
    assert fp.isa == ("avx", "avx2", "fma", "avx512f", "avx512_bf16", "amx_tile")
    assert fp.torch == __import__("importlib.metadata").metadata.version("torch")
    without_bf16 = cpu_peak.machine_fingerprint(cpuinfo.replace(" avx512_bf16", ""))
    assert without_bf16.key != fp.key  # another ISA is another peak
    assert cpu_peak.machine_fingerprint(cpuinfo).key == fp.key  # stable
    import socket

    assert socket.gethostname() not in json.dumps(fp.__dict__)
    assert "AMD EPYC 9B14" in fp.describe() and "torch" in fp.describe()


def test_a_measured_peak_is_the_best_of_its_repeats() -> None:
    m = cpu_peak.measure_cpu_peak(1, "fp32", sizes=(64, 128, 256), repeats=4, min_repeat_s=0.01)
    assert set(m.rates) <= {64, 128, 256} and 64 in m.rates
    assert all(len(r) == 4 and all(v > 0 for v in r) for r in m.rates.values())
    assert m.flops == max(max(r) for r in m.rates.values())  # the best repeat of the best size
    lo, mid, hi = m.spread
    assert lo <= mid <= hi == m.flops


def test_the_probe_size_grows_with_the_threads() -> None:
    assert [peak_probe.probe_size(t) for t in (1, 2, 8, 64, 1000)] == [512, 640, 1024, 2048, 2048]


def test_a_probe_window_counts_real_matmuls_over_its_wall_and_cpu_clocks() -> None:
    import torch

    ticks = iter(range(100))
    cpu_ticks = iter(x * 0.25 for x in range(100))  # the process ran a quarter CPU-second per wall second
    a = torch.ones(64, 64)
    rate = peak_probe.probe_rate(a, a, torch.empty(64, 64), window_s=3.0, clock=lambda: float(next(ticks)),
                                 cpu_clock=lambda: next(cpu_ticks))
    assert rate.per_s == 2 * 64**3 * 3 / 3.0  # one tick per matmul: 3 matmuls fill 3 seconds
    # the CPU clock is read at the start and once the window is full: 0.25 CPU-second, 3 matmuls
    assert rate.cpu_seconds == 0.25 and rate.per_cpu_s == 2 * 64**3 * 3 / 0.25
    still = iter([0.0] * 10)  # a CPU clock that did not move gives no per-CPU-second rate, never infinity
    ticks = iter(range(100))
    frozen = peak_probe.probe_rate(a, a, torch.empty(64, 64), window_s=1.0, clock=lambda: float(next(ticks)),
                                   cpu_clock=lambda: next(still))
    assert frozen.per_cpu_s is None and frozen.per_s > 0


def test_the_probe_follows_the_steps_and_leaves_its_time_out() -> None:
    now = [0.0]

    def clock() -> float:
        now[0] += 0.001
        return now[0]
    probe = peak_probe.Probe(True, "fp32", clock=clock)
    assert probe.due(last=False)  # the first boundary
    probe.take()
    assert not probe.due(last=False) and probe.due(last=True)  # too soon, unless it is the last step
    now[0] += peak_probe.PROBE_EVERY_S
    assert probe.due(last=False)
    probe.take()
    assert len(probe.rates) == 2 and all(r > 0 for r in probe.rates) and len(probe.seconds) == 1
    assert probe.seconds[0] >= peak_probe.PROBE_EVERY_S and len(probe.spans) == 2
    assert all(span.end - span.start >= peak_probe.PROBE_WINDOW_S and span.cpu >= 0 for span in probe.spans)
    assert len(probe.cpu_rates) == 2 and all(r > 0 for r in probe.cpu_rates)  # the process's CPU clock moved
    assert not peak_probe.Probe(False, "fp32").due(last=True)  # GPU runs keep the datasheet peak
    broken = peak_probe.Probe(True, "int8")
    broken.take()
    assert broken.error is not None and "int8" in broken.error and not broken.due(last=True)


def _probe(ranks: list[dict[str, Any]], dtype: str = "fp32") -> Any:
    return {"dtype": dtype, "threads": 1, "size": 512, "window_s": 0.02, "ranks": ranks}


def test_the_peak_is_the_time_weighted_rate_of_each_rank_and_their_mean() -> None:
    # rank 0: 2 s at (10+30)/2 and 1 s at (30+20)/2 GFLOP/s; rank 1: one probe only
    probe = _probe([{"rank": 0, "rates": [10e9, 30e9, 20e9], "seconds": [2.0, 1.0]},
                    {"rank": 1, "rates": [15e9], "seconds": []}])
    assert cpu_peak.rank_peak(probe["ranks"][0]) == pytest.approx((2 * 20e9 + 1 * 25e9) / 3)
    peak = cpu_peak.peak_from_probe(probe, 1_790_000_000.0)
    assert peak.flops == pytest.approx(((2 * 20e9 + 25e9) / 3 + 15e9) / 2)
    assert (peak.kind, peak.dtype, peak.threads, peak.size) == ("probe", "fp32", 1, 512)
    assert peak.spread == (10e9, peak.flops, 30e9)
    assert peak.source.startswith(cpu_peak.PROBE_SOURCE) and "fp32 512x512, 1 thread(s), 3 probe(s)" in peak.source
    assert "time-weighted, mean over 2 rank(s)" in peak.source and peak.fingerprint in peak.source
    assert peak.label() == "18.3 GFLOP/s fp32, 1 thread, probed beside the run"
    assert mfu.Peak.from_json(peak.to_json()) == peak
    # a rank that failed is left out; none measured: the errors, never a number
    failed = {"rank": 1, "rates": [], "seconds": [], "error": "RuntimeError: no bf16 kernel"}
    assert cpu_peak.peak_from_probe(_probe([probe["ranks"][1], failed]), 0.0).flops == 15e9
    with pytest.raises(ValueError, match="no bf16 kernel"):
        cpu_peak.peak_from_probe(_probe([failed]), 0.0)


def test_a_cpu_run_s_peak_is_its_probes_flops_per_cpu_second() -> None:
    """Ranks that counted their CPU-seconds give a peak per CPU-second: each rank's time-weighted
    ``cpu_rates``, the mean over the ranks; their wall rates stay in the journal only."""
    probe = {**_probe([{"rank": 0, "rates": [50e9, 40e9], "seconds": [1.0], "cpu_rates": [120e9, 110e9],
                        "steady_seconds": 2.0, "steady_cpu_seconds": 1.0},
                       {"rank": 1, "rates": [45e9], "seconds": [], "cpu_rates": [130e9],
                        "steady_seconds": 2.0, "steady_cpu_seconds": 0.5}]), "omp_wait": "yield"}
    assert cpu_peak.per_cpu_second(probe) and peak_probe.ranks_cpu_seconds(probe) == 1.5
    peak = cpu_peak.peak_from_probe(probe, 1_790_000_000.0)
    assert peak.per_cpu_second and peak.flops == pytest.approx((115e9 + 130e9) / 2)
    assert peak.spread == (110e9, peak.flops, 130e9)
    assert "per CPU-second the process ran, fp32 512x512" in peak.source
    assert "(min 110.0 GFLOP per CPU-second, max 130.0 GFLOP per CPU-second)" in peak.source
    assert peak.label() == "122.5 GFLOP per CPU-second fp32, 1 thread, probed beside the run, OpenMP waits yield"
    assert mfu.Peak.from_json(peak.to_json()) == peak
    # one rank without its CPU-seconds (a journal written before ftui counted them): the wall-clock peak
    older = _probe([{"rank": 0, "rates": [50e9], "seconds": []}])
    assert not cpu_peak.per_cpu_second(older) and peak_probe.ranks_cpu_seconds(older) is None
    assert not cpu_peak.peak_from_probe(older, 0.0).per_cpu_second


def test_the_peak_says_how_the_ranks_openmp_threads_waited_in_show_and_compare(home: Path) -> None:
    """The ranks record how their OpenMP threads waited beside their probes; the stored peak keeps it, and
    ``ftui show``'s peak row and the compare table's peak note say it (the MFU's conditions)."""
    from rich.console import Console

    from tui.render.report import run_summary_table

    probe = {**_probe([{"rank": 0, "rates": [5e11], "seconds": []}]), "omp_wait": "yield"}
    peak = cpu_peak.peak_from_probe(probe, 1_790_000_000.0)
    assert peak.omp_wait == "yield" and peak.waits() == "OpenMP waits yield"
    assert peak.label() == "500.0 GFLOP/s fp32, 1 thread, probed beside the run, OpenMP waits yield"
    assert peak.to_json()["omp_wait"] == "yield" and mfu.Peak.from_json(peak.to_json()) == peak
    store = Store(f"sqlite:///{home / 'ftui.db'}")
    rid = _stored_run(store, peak=peak)
    (run,) = store.get_runs([rid])
    assert run.summary.mfu_peak is not None and run.summary.mfu_peak["omp_wait"] == "yield"
    console = Console(width=300, record=True)
    console.print(run_summary_table(run))
    row = next(line for line in console.export_text().splitlines() if "MFU peak/device" in line)
    assert "500.0 GFLOP/s fp32" in row and "OpenMP waits yield" in row
    cmp = load_comparison(store, [rid])
    assert cmp.rows[0].mfu is not None  # the MFU this peak is the condition of
    assert f"] 500.0 GFLOP/s fp32, 1 thread, probed beside the run, OpenMP waits yield; {cpu_peak.PROBE_SOURCE}" in (
        markdown(cmp))
    # a run recorded before the ranks said it: nothing claimed
    older = mfu.Peak.from_json({k: v for k, v in peak.to_json().items() if k != "omp_wait"})
    assert older is not None and older.waits() == "" and "OpenMP" not in older.label()


def test_the_run_peak_follows_its_precision_and_a_cpu_run_without_a_probe_has_none() -> None:
    bf16 = cpu_peak.peak_for_run("cpu", _probe([{"rank": 0, "rates": [8e10], "seconds": []}], "bf16"), "bf16")
    assert bf16 is not None and bf16.flops == 8e10 and bf16.dtype == "bf16" and bf16.kind == "probe"
    assert cpu_peak.peak_for_run("cpu", None, "fp32") is None  # never a benchmark taken at another time
    h100 = cpu_peak.peak_for_run("cuda", None, "bf16", ["NVIDIA H100 80GB HBM3"])
    assert h100 is not None and h100.flops == 989.4e12 and h100.kind == "datasheet" and h100.dtype == "bf16"
    fp16 = cpu_peak.peak_for_run("cuda", None, "fp16", ["NVIDIA A100-SXM4-80GB"])
    assert fp16 is not None and fp16.flops == 312e12 and fp16.dtype == "fp16"
    assert cpu_peak.peak_for_run("cuda", None, "bf16", []) is None
    assert mfu.Peak.from_json({"error": "x"}) is None and mfu.Peak.from_json(None) is None


# ---------------------------------------------------------------------- the FLOPs convention


@pytest.mark.parametrize("method", ["full", "lora"])
def test_flops_per_token_matches_torch_flop_counter(method: str) -> None:
    """6N (full) and 4N_frozen + 6N_trainable (LoRA) against torch's own count of the matmuls of one
    forward and backward of the builtin model's layers (a 512-token vocabulary and 32-token sequences:
    the convention holds for any shape, and these keep the count quick). The counter leaves out CPU
    attention (SDPA), so the attention term 12*L*H*Q*T is taken off the formula here; LoRA's count is a
    little lower because autograd skips the input gradients of the first layer's frozen projections."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import LlamaForCausalLM

    from runner.spec.builtin import tiny_llama_config

    cfg = tiny_llama_config(vocab_size=512)
    torch.manual_seed(0)
    model: Any = LlamaForCausalLM(cfg)
    if method == "lora":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    params = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    seq, batch = 32, 2
    x = torch.randint(0, cfg.vocab_size, (batch, seq))
    with FlopCounterMode(display=False) as counter:
        model(input_ids=x, labels=x).loss.backward()
    counted = counter.get_total_flops() / (batch * seq)
    dims = flops.dims_from_config(cfg, seq)
    assert dims is not None and dims["embedding_params"] == cfg.vocab_size * cfg.hidden_size  # untied
    formula = flops.flops_per_token(params - dims["embedding_params"], dims["layers"], dims["heads"], dims["head_dim"],
                                  seq, trainable if method == "lora" else None)
    attention = 12 * dims["layers"] * dims["heads"] * dims["head_dim"] * seq
    assert formula - attention == pytest.approx(counted, rel=0.002 if method == "full" else 0.02)


# ---------------------------------------------------------------------- compare: stored runs


def _stored_run(store: Store, *, precision: str = "fp32", tps: float = 1000.0, threads: int = 1,
                strategy: str = "single", nproc: int = 1, peak: mfu.Peak | None = None,
                telemetry: dict[str, Any] | None = None, **more: Any) -> int:
    recipe = (f'name = "q"\n[model]\nname = "builtin:tiny-llama"\n[data]\ncontext_length = 256\n'
              f'[train]\nbatch_size = 4\ngrad_accum = 1\nprecision = "{precision}"\n'
              f'[launch]\nstrategy = "{strategy}"\nnproc = {nproc}\n')
    rid = store.create_run(name="q", recipe_text=recipe, recipe_hash="", strategy=strategy, nproc=nproc,
                           method="lora", model="builtin:tiny-llama", run_dir="")
    summary: dict[str, Any] = {"params": PARAMS, "trainable_params": TRAINABLE, "world_size": nproc,
                               "threads": threads, "model_dims": TINY_DIMS, "estimate": 1000}
    if peak is not None:
        summary["mfu_peak"] = peak.to_json()
    if telemetry is not None:
        summary["telemetry"] = telemetry
    summary.update(more)
    store.update_run(rid, status="completed", device_type="cpu", tokens_per_s=tps, train_seconds=10.0,
                     final_loss=2.0, summary=summary)
    return rid


def _fpt() -> float:
    return flops.flops_per_token(PARAMS - TINY_DIMS["embedding_params"], 6, 6, 64, 256, TRAINABLE)


def test_mfu_over_100_is_never_printed_and_says_why(home: Path) -> None:
    store = Store(f"sqlite:///{home / 'ftui.db'}")
    rid = _stored_run(store, tps=1e12, peak=_probe_peak(1e3))  # a throughput no CPU reaches: > 100%
    cmp = load_comparison(store, [rid])
    row = cmp.rows[0]
    assert row.mfu is None and row.mfu_rejected is not None and row.mfu_rejected > 1
    assert row.mfu_note is not None and row.mfu_note.startswith("MFU > 100%") and "peak not trustworthy" in row.mfu_note
    assert "exceed the matmul rate probed beside it" in row.mfu_note  # a probe cannot be re-measured after the run
    rejected = f"{row.mfu_rejected * 100:,.0f}"  # kept in the data (mfu_rejected), never in a table or a line
    for text in (markdown(cmp), to_html(cmp)):
        assert "peak not trustworthy" in text and rejected not in text
    # the cell stays short: its mark, and the footnote says why
    assert "| - [1] |" in markdown(cmp).splitlines()[4]
    assert "- [1] run 1 MFU: > 100%: peak not trustworthy" in markdown(cmp)
    assert "MFU " not in cmp.recommendation()


def test_a_cpu_peak_not_measured_beside_the_run_gives_no_mfu(home: Path) -> None:
    """A run recorded before the probe (its peak benchmarked after the run, under another load), or with no
    peak at all: MFU '-', and the reason, in compare and in ``ftui show``'s figures; never a benchmark now."""
    from runner.analysis.run_peak import stored_mfu

    store = Store(f"sqlite:///{home / 'ftui.db'}")
    after = mfu.Peak(5e10, "measured matmul peak (CPU), fp32", kind="measured", dtype="fp32", threads=1,
                     measured_at=1_790_000_000.0, fingerprint="fp-a", machine="m", load=7.5)
    old = _stored_run(store, peak=after)
    none = _stored_run(store)
    probed = _stored_run(store, peak=_probe_peak(5e11))
    rows = load_comparison(store, [old, none, probed]).rows
    assert rows[0].mfu is None and rows[0].mfu_note is not None
    assert "measured after the run, under load the run did not share" in rows[0].mfu_note
    assert rows[1].mfu is None and "no CPU peak measured beside the run" in (rows[1].mfu_note or "")
    assert rows[2].mfu == pytest.approx(_fpt() * 1000 / 5e11)
    runs = {r.id: r for r in store.get_runs([old, none, probed])}
    assert stored_mfu(runs[old])[0] is None and "did not share" in stored_mfu(runs[old])[1]
    assert "FLOPs per token not stored" in stored_mfu(runs[probed])[1]  # compare derives them; show does not
    with_fpt = replace(runs[probed], summary=replace(runs[probed].summary, flops_per_token=_fpt()))
    assert stored_mfu(with_fpt) == (pytest.approx(_fpt() * 1000 / 5e11),
                                        "FLOPs/token x tokens/s / (peak x 1 device)")
    # A given peak still gives one.
    assert load_comparison(store, [old], peak_tflops=0.5).rows[0].mfu == pytest.approx(_fpt() * 1000 / 5e11)


def _per_cpu_peak(flops: float, threads: int = 2) -> mfu.Peak:
    """A peak as the watcher stores it from ranks that counted their CPU-seconds."""
    return replace(_probe_peak(flops, threads=threads), per_cpu_second=True, omp_wait="yield")


def test_cpu_mfu_is_the_flops_over_the_peak_per_cpu_second_times_the_cpu_seconds_ran(home: Path) -> None:
    """On CPU, MFU = FLOPs over the steady steps / (FLOPs per CPU-second x CPU-seconds the ranks ran), by hand:
    1,000 tokens/s over 2 s of steady steps is 2,000 tokens; at 500 GFLOP per CPU-second and 0.8 CPU-second
    ran, the run could have done 400 GFLOP. Show and compare say it in words, and tokens/s stays wall-clock."""
    from rich.console import Console

    from runner.analysis.run_peak import stored_mfu
    from tui.render.report import run_summary_table

    store = Store(f"sqlite:///{home / 'ftui.db'}")
    fpt = _fpt()
    one = _stored_run(store, tps=1000.0, threads=2, peak=_per_cpu_peak(500e9), flops_per_token=fpt,
                      steady_seconds=2.0, steady_cpu_seconds=0.8)
    # two ranks of one thread: their CPU-seconds summed (0.9 + 0.7) over rank 0's 2 wall seconds
    two = _stored_run(store, tps=1000.0, threads=1, strategy="ddp", nproc=2, peak=_per_cpu_peak(500e9, 1),
                      flops_per_token=fpt, steady_seconds=2.0, steady_cpu_seconds=1.6)
    expected_one = fpt * 1000.0 * 2.0 / (500e9 * 0.8)
    expected_two = fpt * 1000.0 * 2.0 / (500e9 * 1.6)
    runs = {r.id: r for r in store.get_runs([one, two])}
    mfu_one, why = stored_mfu(runs[one])
    assert mfu_one == pytest.approx(expected_one)
    assert why == ("per CPU-second the rank ran (peak 500.0 GFLOP per CPU-second fp32, 2 threads, probed beside "
                   "the run, OpenMP waits yield; 0.40 CPU the rank ran over its steady steps)")
    mfu_two, why_two = stored_mfu(runs[two])
    assert mfu_two == pytest.approx(expected_two) and "1.6" not in why_two
    assert why_two.startswith("per CPU-second the ranks ran") and "0.80 CPU its 2 ranks ran over their steady" in why_two
    console = Console(width=400, record=True)
    console.print(run_summary_table(runs[one]))
    shown = console.export_text()
    assert f"{expected_one:.2%}" in shown and "0.40 CPU the rank ran over its steady steps" in shown
    peak_row = next(line for line in shown.splitlines() if "MFU peak per CPU-second" in line)
    assert "500.0 GFLOP per CPU-second fp32, 2 threads" in peak_row
    cmp = load_comparison(store, [one, two])
    assert [r.mfu for r in cmp.rows] == [pytest.approx(expected_one), pytest.approx(expected_two)]
    assert [r.tokens_per_s for r in cmp.rows] == [1000.0, 1000.0]  # wall-clock, as measured
    md = markdown(cmp)
    assert f"| {expected_one * 100:.2f}% |" in md and "500.0 GFLOP/CPU-s fp32" in md
    assert f"MFU of run {one}: per CPU-second the rank ran (peak 500.0 GFLOP per CPU-second" in md
    assert "FLOPs/token x tokens/s / (peak x devices)" not in md  # no run here divides by devices
    assert json.loads(to_json(cmp))["runs"][0]["peak_per_cpu_second"] is True


def test_a_cpu_run_without_its_cpu_seconds_keeps_its_figure_or_says_why(home: Path) -> None:
    """A run stored before the ranks counted their CPU-seconds keeps its wall-clock MFU against its stored
    peak (and says so beside a per-CPU-second one); a peak per CPU-second without the CPU-seconds it
    multiplies gives '-' and the reason, never a number."""
    from runner.analysis.run_peak import stored_mfu

    store = Store(f"sqlite:///{home / 'ftui.db'}")
    fpt = _fpt()
    old = _stored_run(store, peak=_probe_peak(100e9), flops_per_token=fpt)
    lost = _stored_run(store, peak=_per_cpu_peak(100e9, 1), flops_per_token=fpt, steady_seconds=2.0)
    runs = {r.id: r for r in store.get_runs([old, lost])}
    assert stored_mfu(runs[old]) == (pytest.approx(fpt * 1000 / 100e9), "FLOPs/token x tokens/s / (peak x 1 device)")
    assert stored_mfu(runs[lost]) == (None, "its peak is per CPU-second, and the run stored no CPU-seconds over its "
                                            "steady steps")
    cmp = load_comparison(store, [old, lost])
    assert cmp.rows[0].mfu == pytest.approx(fpt * 1000 / 100e9) and cmp.rows[1].mfu is None
    assert "stored no CPU-seconds" in (cmp.rows[1].mfu_note or "")
    md = markdown(cmp)
    assert ("MFU peaks differ for fp32, 1 thread (run 1 100.0 GFLOP/s, run 2 100.0 GFLOP per CPU-second): some "
            "per CPU-second the ranks ran, some per second of one device") in md


def test_bf16_runs_divide_by_the_bf16_peak(home: Path) -> None:
    store = Store(f"sqlite:///{home / 'ftui.db'}")
    a = _stored_run(store, precision="fp32", tps=1000.0, threads=2, peak=_probe_peak(1e11, "fp32", 2))
    b = _stored_run(store, precision="bf16", tps=1000.0, threads=2, peak=_probe_peak(4e11, "bf16", 2))
    rows = load_comparison(store, [a, b]).rows
    assert rows[0].peak_dtype == "fp32" and rows[0].peak_flops == 1e11
    assert rows[1].peak_dtype == "bf16" and rows[1].peak_flops == 4e11
    assert rows[0].mfu == pytest.approx(_fpt() * 1000 / 1e11)
    assert rows[1].mfu == pytest.approx(rows[0].mfu / 4)


def test_two_runs_with_different_peaks_for_one_dtype_and_threads_say_why(home: Path) -> None:
    store = Store(f"sqlite:///{home / 'ftui.db'}")
    quiet = _stored_run(store, peak=_probe_peak(60e9))
    busy = _stored_run(store, peak=_probe_peak(20e9))
    same = _stored_run(store, peak=_probe_peak(20e9 + 1e6))  # prints as 20.0 GFLOP/s too
    md = markdown(load_comparison(store, [quiet, busy, same]))
    assert ("MFU peaks differ for fp32, 1 thread (run 1 60.0 GFLOP/s, run 2 20.0 GFLOP/s, run 3 20.0 GFLOP/s): "
            "each probed beside its own run, under that run's load") in md
    assert "MFU peaks differ" not in markdown(load_comparison(store, [busy, same]))


def _tel(kind: str, means: list[float], threads: int | None) -> dict[str, Any]:
    from runner.analysis.utilisation import summarise
    from runner.hardware import DeviceSample

    samples = [DeviceSample(time=float(t), host="h", kind=kind, index=i, name="x", util_pct=u, mem_used=1,
                            mem_total=2, power_w=None, temp_c=None, sm_clock_mhz=None, pid=None, source="psutil")
               for t in range(3) for i, u in enumerate(means)]
    return json.loads(json.dumps(summarise(samples, None, threads=threads)))


def _table_runs(home: Path) -> tuple[Store, list[int]]:
    store = Store(f"sqlite:///{home / 'ftui.db'}")
    single_peak = mfu.Peak(5e11, "probed for the test", kind="probe", dtype="bf16", threads=2,
                           measured_at=1_790_000_000.0, fingerprint="fp-a", machine="m")
    ddp_peak = mfu.Peak(2.5e11, "probed for the test", kind="probe", dtype="bf16", threads=1,
                        measured_at=1_790_000_000.0, fingerprint="fp-a", machine="m")
    single = _stored_run(store, precision="bf16", tps=2000.0, threads=2, peak=single_peak,
                         telemetry=_tel("rank", [198.0], 2))
    ddp = _stored_run(store, precision="bf16", tps=2000.0, threads=1, strategy="ddp", nproc=2, peak=ddp_peak,
                      telemetry=_tel("rank", [100.0, 92.0], 1))
    return store, [single, ddp]


def test_compare_names_the_peak_dtype_and_threads_in_every_format(home: Path) -> None:
    store, ids = _table_runs(home)
    cmp = load_comparison(store, ids)
    single, ddp = cmp.rows
    assert single.peak_label == "500.0 GFLOP/s bf16, 2 threads, probed beside the run"
    assert ddp.peak_label == "250.0 GFLOP/s bf16, 1 thread, probed beside the run"
    assert single.mfu == pytest.approx(_fpt() * 2000 / 5e11)
    assert ddp.mfu == pytest.approx(_fpt() * 2000 / (2.5e11 * 2))  # per device x 2 devices
    md = markdown(cmp)
    assert "| MFU peak/device |" in md.splitlines()[2]
    assert "500.0 GFLOP/s bf16 [1]" in md and "250.0 GFLOP/s bf16 [2]" in md
    assert f"[1] {single.peak_label}; probed for the test" in md and f"[2] {ddp.peak_label}" in md
    assert single.peak_label in to_html(cmp) and "MFU peak/device" in to_html(cmp)
    rows = list(csv.DictReader(io.StringIO(to_csv(cmp))))
    assert [(r["peak_dtype"], r["peak_threads"], r["peak_kind"]) for r in rows] == [("bf16", "2", "probe"), ("bf16", "1", "probe")]
    assert float(rows[0]["peak_flops"]) == 5e11 and rows[0]["peak_measured_at"] == "2026-09-21T14:13:20+00:00"
    data = json.loads(to_json(cmp))["runs"]
    assert [(r["peak_dtype"], r["peak_threads"], r["peak_flops"], r["peak_fingerprint"]) for r in data] == [
        ("bf16", 2, 5e11, "fp-a"), ("bf16", 1, 2.5e11, "fp-a")]
    from rich.console import Console

    from tui.render.compare import rich_table

    console = Console(width=400, record=True)
    console.print(rich_table(cmp))
    text = console.export_text()
    assert "MFU peak/device" in text and "2 threads" in text and "1 thread," in text


def test_cpu_util_is_normalised_by_threads_and_spread_shown(home: Path) -> None:
    store, ids = _table_runs(home)
    gpu = _stored_run(store, telemetry=_tel("gpu", [80.0, 40.0], None))
    cmp = load_comparison(store, [*ids, gpu])
    single, ddp, gpu_row = cmp.rows
    # 198% of one core with 2 threads vs 96% with 1: 99% vs 96%.
    assert single.cpu_util == pytest.approx(99.0) and single.cpu_threads == 2 and single.gpu_busy is None
    assert ddp.cpu_util == pytest.approx(96.0) and ddp.cpu_threads == 1
    assert (ddp.util_min, ddp.util_max) == (pytest.approx(92.0), pytest.approx(100.0))
    assert gpu_row.gpu_busy == pytest.approx(60.0) and gpu_row.cpu_util is None
    headers = [h for h, _ in COLUMNS]
    assert len(set(headers)) == len(headers)
    assert "CPU % of its threads" in headers and "GPU busy % (NVML)" in headers
    cells = {h: [cell(r) for r in cmp.rows] for h, cell in COLUMNS}
    assert cells["CPU % of its threads"] == ["99% of 2 threads", "96% of 1 thread", "-"]
    assert cells["GPU busy % (NVML)"] == ["-", "-", "60%"]
    assert cells["util min-max"] == ["-", "92-100%", "40-80%"]
    md = markdown(cmp)
    assert "CPU % of its 2 threads (psutil)" in md and "GPU busy % (NVML" in md


def test_old_runs_without_threads_stay_in_cpu_percent_of_one_core() -> None:
    from tests.support import run_info

    old = run_info(1, "single", 1, 1000.0, telemetry={"whole": {"kind": "rank", "util_mean": 198.0, "devices": 1}})
    row = build_comparison([old], {}).rows[0]
    assert row.cpu_util == 198.0 and row.cpu_threads is None and "one core" in row.util_source
    recorded = run_info(1, "single", 1, 1000.0, threads=2,
                    telemetry={"whole": {"kind": "rank", "util_mean": 198.0, "devices": 1}})
    assert build_comparison([recorded], {}).rows[0].cpu_util == 99.0


def test_compare_of_runs_with_stored_peaks_imports_no_torch(home: Path) -> None:
    """Ten runs with their peak and model dims stored compare without a benchmark or a torch import."""
    store = Store(f"sqlite:///{home / 'ftui.db'}")
    peak = mfu.Peak(5e10, "stored", kind="probe", dtype="fp32", threads=1, measured_at=time.time(),
                    fingerprint="fp-a", machine="m")
    ids = [_stored_run(store, tps=100.0 + i, peak=peak, telemetry=_tel("rank", [90.0], 1)) for i in range(10)]
    code = ("import sys, time, json; t = time.perf_counter(); from store import Store; "
            "from runner.analysis.compare import load_comparison; from tui.render.compare import markdown; "
            f"cmp = load_comparison(Store({store.url!r}), {ids!r}); markdown(cmp); "
            "print(json.dumps({'torch': 'torch' in sys.modules, 'transformers': 'transformers' in sys.modules, "
            "'mfu': [r.mfu for r in cmp.rows], 's': time.perf_counter() - t}))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "FTUI_HOME": str(home), "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["torch"] is False and out["transformers"] is False
    assert all(m is not None and m > 0 for m in out["mfu"])
