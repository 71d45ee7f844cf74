"""The memory estimate: the seed's and the ZeRO paper's hand-computed cases, exact LoRA counts against peft,
and the activation formula against what the builtin tiny Llama really saves for backward."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from runner.planner import (
    GIB,
    PARTS,
    EstimateInput,
    LinearSpec,
    ModelShape,
    activation_bytes,
    breakdown_json,
    estimate,
    estimate_report,
    gpus_needed,
    lora_trainable_params,
    parse_bytes,
    recommend,
    shape_from_config,
    shape_from_params,
)
from runner.planner.memory import NF4_DOUBLE_QUANT_OVERHEAD_BITS
from runner.spec.builtin import tiny_llama_config
from runner.spec.strategies import names as strategy_names

ALL_LLAMA_LINEARS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
MICRO_BATCH, SEQ = 2, 128


@pytest.fixture(scope="module")
def tiny_shape() -> ModelShape:
    return shape_from_config(tiny_llama_config())


def test_shape_from_config_counts_every_linear(tiny_shape: ModelShape) -> None:
    cfg = tiny_llama_config()
    real = AutoModelForCausalLM.from_config(cfg)
    assert tiny_shape.total_params == sum(p.numel() for p in real.parameters())
    linear_weights = sum(m.weight.numel() for m in real.modules() if isinstance(m, torch.nn.Linear))
    assert tiny_shape.linear_params == linear_weights
    assert tiny_shape.linears["k_proj"] == LinearSpec(384, 128, 6)
    assert tiny_shape.linears["lm_head"] == LinearSpec(384, 4096, 1)
    assert (tiny_shape.layers, tiny_shape.kv_heads, tiny_shape.head_dim) == (6, 2, 64)


def test_shape_from_params_picks_nearest_llama() -> None:
    shape = shape_from_params(34e9)
    assert shape.total_params == 34_000_000_000
    assert (shape.layers, shape.hidden, shape.kv_heads, shape.intermediate) == (48, 8192, 8, 22016)
    # Linear layers sum to the reference model's size, within a few percent of the requested count.
    assert shape.linear_params == pytest.approx(34e9, rel=0.05)
    assert shape_from_params(6.5e9, layers=32).hidden == 4096  # 12 * L * h**2 = n


def test_seed_full_finetune_7b_is_16_bytes_per_param() -> None:
    shape = shape_from_params(7e9)
    fp32_weights = estimate(EstimateInput(shape, method="full", precision="bf16"))
    assert fp32_weights.model_states == 112 * 10**9
    assert (fp32_weights.params, fp32_weights.grads_total, fp32_weights.optimizer, fp32_weights.master) == (
        28 * 10**9,
        28 * 10**9,
        56 * 10**9,
        0,
    )
    # The seed's split (16-bit weights and grads, fp32 Adam moments and an fp32 master copy) is DeepSpeed's.
    deepspeed = estimate(EstimateInput(shape, method="full", precision="bf16", strategy="zero1"))
    assert (deepspeed.params, deepspeed.grads_total, deepspeed.optimizer, deepspeed.master) == (
        14 * 10**9,
        14 * 10**9,
        56 * 10**9,
        28 * 10**9,
    )
    assert deepspeed.model_states == 112 * 10**9
    # The trainer's torch AdamW over bf16 weights (model.dtype = bf16) keeps bf16 moments and no master: fp32
    # moments and a master copy would be 56 GB of model states that are not there.
    bf16_weights = estimate(EstimateInput(shape, method="full", precision="bf16", param_dtype="bf16"))
    assert (bf16_weights.params, bf16_weights.grads_total, bf16_weights.optimizer, bf16_weights.master) == (
        14 * 10**9,
        14 * 10**9,
        28 * 10**9,
        0,
    )
    assert bf16_weights.model_states == 56 * 10**9


def test_seed_lora_rank_8_on_1024_square_trains_one_64th() -> None:
    shape = ModelShape(
        1024 * 1024, 1, 1024, 8, 8, 128, 4096, 32000, False, {"q_proj": LinearSpec(1024, 1024, 1)}
    )
    trainable = lora_trainable_params(shape, 8, ["q_proj"])
    assert trainable == 2 * 8 * 1024
    assert trainable / (1024 * 1024) == 1 / 64


@pytest.mark.parametrize(
    ("strategy", "gb"),
    [("ddp", 120.0), ("zero1", 31.4), ("zero2", 16.6), ("zero3", 1.9), ("fsdp", 1.9)],
)
def test_zero_paper_figure_1(strategy: str, gb: float) -> None:
    """7.5B parameters, K=12, N=64 (Rajbhandari et al. 2020, figure 1)."""
    inp = EstimateInput(shape_from_params(7.5e9), precision="bf16", strategy=strategy, n_devices=64)  # type: ignore[arg-type]
    assert round(estimate(inp).model_states / 1e9, 1) == gb


@pytest.mark.parametrize(
    ("r", "targets"),
    [(8, ["q_proj", "v_proj"]), (16, ALL_LLAMA_LINEARS), (4, ["lm_head", "down_proj"]), (8, "all-linear")],
)
def test_lora_count_is_exactly_peft(tiny_shape: ModelShape, r: int, targets: list[str] | str) -> None:
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(
        AutoModelForCausalLM.from_config(tiny_llama_config()), LoraConfig(r=r, target_modules=targets)
    )
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert lora_trainable_params(tiny_shape, r, targets) == trainable


def _saved_bytes(method: str, checkpointing: bool) -> tuple[int, int]:
    """Bytes autograd saves in one fp32 forward of the tiny Llama, and what decoder layer 1 saves.

    Unique storages only (views and reuse counted once); parameters skipped.
    """
    torch.manual_seed(0)
    cfg = tiny_llama_config()
    model = AutoModelForCausalLM.from_config(cfg)
    if method == "lora":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))
    if checkpointing:
        model.gradient_checkpointing_enable()
        if method == "lora":
            model.enable_input_require_grads()
    model.train()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}
    where = ["outside"]
    in_layer_1 = [0]
    for name, module in model.named_modules():
        if name.endswith("model.layers.1") or name.endswith("model.layers.2"):
            module.register_forward_pre_hook(lambda mod, args, name=name: where.__setitem__(0, name[-1]))

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params and ptr not in seen:
            seen[ptr] = t.untyped_storage().nbytes()
            if where[0] == "1":
                in_layer_1[0] += seen[ptr]
        return t

    ids = torch.randint(0, cfg.vocab_size, (MICRO_BATCH, SEQ))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=ids, labels=ids)
    return sum(seen.values()), in_layer_1[0]


@pytest.mark.parametrize("method", ["full", "lora"])
def test_activations_match_saved_tensors(tiny_shape: ModelShape, method: str) -> None:
    inp = EstimateInput(
        tiny_shape,
        method=method,
        precision="fp32",
        micro_batch=MICRO_BATCH,
        seq_len=SEQ,
        lora_r=8,  # type: ignore[arg-type]
    )
    measured, layer_1 = _saved_bytes(method, checkpointing=False)
    est = activation_bytes(inp)
    assert est.stored == pytest.approx(measured, rel=0.15)
    assert est.per_layer == pytest.approx(layer_1, rel=0.15)
    assert est.recompute == 0

    measured_ckpt, _ = _saved_bytes(method, checkpointing=True)
    est_ckpt = activation_bytes(replace(inp, gradient_checkpointing=True))
    assert est_ckpt.stored == pytest.approx(measured_ckpt, rel=0.15)
    # Backward recomputes one layer: its full activations, as measured without checkpointing.
    assert est_ckpt.recompute == pytest.approx(layer_1, rel=0.15)
    assert est_ckpt.peak < est.peak


def _forward_saved(method: str, precision: str, attention: str, layers: int = 2, backend: str | None = None) -> int:
    """Bytes one forward of the tiny Llama (two layers: the first and the others differ) saves for backward
    (unique storages, parameters skipped), as the trainer runs it: 16-bit LoRA weights under a 16-bit
    precision, autocast; ``backend``: each decoder layer compiled with it (by this forward)."""
    torch.manual_seed(0)
    cfg = tiny_llama_config()
    cfg.num_hidden_layers, cfg._attn_implementation = layers, attention
    dtype = torch.bfloat16 if method == "lora" and precision == "bf16" else torch.float32
    model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    if method == "lora":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    if backend is not None:
        from runner.rank.compiling import decoder_layers

        torch._dynamo.reset()
        for layer in decoder_layers(model):
            layer.compile(backend=backend)
    model.train()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.untyped_storage().data_ptr() not in params:
            seen.setdefault(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
        return t

    ids = torch.randint(0, cfg.vocab_size, (MICRO_BATCH, SEQ))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
            torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
        model(input_ids=ids, labels=ids)
    return sum(seen.values())


def _estimated(method: str, precision: str, attention: str, layers: int = 2, compiled: bool = False) -> int:
    cfg = tiny_llama_config()
    cfg.num_hidden_layers = layers
    inp = EstimateInput(shape_from_config(cfg), method=method, precision=precision,  # type: ignore[arg-type]
                        param_dtype="bf16" if method == "lora" and precision == "bf16" else "fp32",
                        micro_batch=MICRO_BATCH, seq_len=SEQ, lora_r=8, device="cpu", attention=attention,
                        compiled=compiled)
    acts = activation_bytes(inp)
    return acts.stored + acts.weight_copies


# 16-bit LoRA keeps 6144 bytes per adapted module less than estimated: the first layer's lora_A casts, which
# the estimate counts as kept although that layer's input needs no gradient (tests/unit/test_families.py).
LORA_16_FIRST_LAYER = 2 * 6144


@pytest.mark.parametrize(("method", "precision"), [("full", "fp32"), ("lora", "fp32"), ("full", "bf16"),
                                                   ("lora", "bf16")])
def test_eager_and_sdpa_attention_are_what_one_forward_saves_to_the_byte(method: str, precision: str) -> None:
    """Eager attention keeps the B x H x S x S probabilities (fp32, and a 16-bit copy under autocast), k and v
    repeated to every head, and the output projection's own input; SDPA keeps q, k, v, its output and a
    log-sum-exp per row (runner/planner/activations.py)."""
    unmodelled = LORA_16_FIRST_LAYER if (method, precision) == ("lora", "bf16") else 0
    measured = {a: _forward_saved(method, precision, a) for a in ("eager", "sdpa")}
    for attention, saved in measured.items():
        assert _estimated(method, precision, attention) == saved + unmodelled, attention
    probabilities = 4 * MICRO_BATCH * 6 * SEQ * SEQ  # one layer's, fp32, 6 heads
    assert measured["eager"] - measured["sdpa"] > probabilities


def test_compiled_layers_save_what_the_partitioner_keeps() -> None:
    """torch.compile's min-cut partitioner recomputes the MLP activation and the RMSNorm products in backward,
    and casts an input once for every linear reading it (aot_eager_decomp_partition: inductor's partition
    without its C++ build; the same bytes, checked in docs/memory-model.md). Full fine-tuning in bf16 takes every
    rule; quickstart's LoRA in fp32 is checked by its real compiled run (tests/e2e/test_kernels.py)."""
    compiled = _forward_saved("full", "bf16", "sdpa", backend="aot_eager_decomp_partition")
    assert _estimated("full", "bf16", "sdpa", compiled=True) == compiled
    assert compiled < _forward_saved("full", "bf16", "sdpa")


def test_logits_dominate_small_checkpointed_models(tiny_shape: ModelShape) -> None:
    inp = EstimateInput(tiny_shape, micro_batch=4, seq_len=256, precision="bf16", gradient_checkpointing=True)
    est = activation_bytes(inp)
    assert est.logits == 4 * 256 * 4096 * 4  # fp32 log-softmax even in bf16
    assert est.logits > est.stored / 2


def test_qlora_base_is_four_bits_plus_constants(tiny_shape: ModelShape) -> None:
    qlora = estimate(EstimateInput(tiny_shape, method="qlora", precision="bf16", micro_batch=1, seq_len=16))
    quantized = tiny_shape.linear_params - 384 * 4096  # lm_head stays 16 bit
    adapters = lora_trainable_params(tiny_shape, 8, ["q_proj", "v_proj"])
    base = quantized * (4 + NF4_DOUBLE_QUANT_OVERHEAD_BITS) / 8 + (tiny_shape.total_params - quantized) * 2
    assert qlora.params == round(base + adapters * 4)
    assert (qlora.grads_total, qlora.optimizer, qlora.master) == (adapters * 4, adapters * 8, 0)
    assert NF4_DOUBLE_QUANT_OVERHEAD_BITS == pytest.approx(0.127, abs=1e-3)


def test_offload_moves_states_off_the_device() -> None:
    inp = EstimateInput(shape_from_params(7.5e9), strategy="zero3", n_devices=8, precision="bf16")
    kept = estimate(inp)
    moved = estimate(replace(inp, offload_optimizer=True, offload_params=True))
    assert (moved.optimizer, moved.master, moved.params) == (0, 0, 0)
    assert moved.offloaded == {"optimizer": kept.optimizer, "master": kept.master, "params": kept.params}
    # DeepSpeed allocates the flat gradient partitions on the optimizer's device: the host, under offload.
    assert moved.total == kept.total - kept.optimizer - kept.master - kept.params - kept.grads


def test_model_parallel_splits_states_across_devices() -> None:
    inp = EstimateInput(shape_from_params(34e9), method="lora", precision="bf16", micro_batch=1, seq_len=1024)
    one = estimate(inp)
    four = estimate(replace(inp, strategy="mp", n_devices=4))
    assert four.params == pytest.approx(one.params / 4, rel=0.05)  # busiest device: ~1/N plus an end
    assert four.params > one.params / 4


def test_recommend_ddp_for_tinyllama_lora() -> None:
    cfg = LlamaConfig(
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=22,
        num_attention_heads=32,
        num_key_value_heads=4,
        vocab_size=32000,
    )
    inp = EstimateInput(shape_from_config(cfg), method="lora", precision="bf16", micro_batch=16, seq_len=1024)
    rec = recommend(inp, 48 * GIB, 4)
    assert rec.strategy == "ddp"
    assert rec.method == "lora"
    assert rec.fits["ddp"] and rec.fits["fsdp"] and rec.fits["single"]
    assert "48.0 GiB" in rec.reason
    assert recommend(inp, 48 * GIB, 1).strategy == "single"


def test_recommend_fsdp_for_34b_lora() -> None:
    inp = EstimateInput(
        shape_from_params(34e9),
        method="lora",
        precision="bf16",
        micro_batch=4,
        seq_len=1024,
        gradient_checkpointing=True,
    )
    # 34B in 16 bit is 68 GB: more than one 48 GiB GPU, so neither DDP nor ZeRO-2 fits.
    assert estimate(inp).params > 48 * GIB
    rec = recommend(inp, 48 * GIB, 4)
    assert rec.strategy == "fsdp"
    assert not rec.fits["ddp"] and not rec.fits["zero2"]
    assert rec.fits["zero3"] and rec.fits["mp"]
    assert gpus_needed(replace(inp, strategy="fsdp"), 48 * GIB) == 2
    assert gpus_needed(replace(inp, strategy="ddp"), 48 * GIB) is None


def test_recommend_falls_back_to_lora_when_full_fits_nowhere() -> None:
    inp = EstimateInput(
        shape_from_params(34e9), precision="bf16", micro_batch=1, seq_len=1024, gradient_checkpointing=True
    )
    rec = recommend(inp, 48 * GIB, 4)
    assert not any(rec.fits.values())
    assert rec.method == "lora" and rec.strategy == "fsdp"


def test_report_shape_is_json_ready(tiny_shape: ModelShape) -> None:
    inp = EstimateInput(tiny_shape, method="lora", micro_batch=2, seq_len=128)
    report = estimate_report(inp, 8 * GIB, 2, ["ddp", "zero2", "fsdp"])
    assert json.loads(json.dumps(report)) == report
    assert set(report) == {"strategies", "recommendation", "switches"}
    assert set(report["strategies"]) == {"ddp", "zero2", "fsdp"}
    for entry in report["strategies"].values():
        assert set(entry) == {"per_device_bytes", "fits", "gpus_needed", "error_band"}
        # The contract keys, plus the parts that make the total add up and the stored activations.
        assert set(entry["per_device_bytes"]) == {
            *PARTS,
            "total",
            "activations_stored",
            "grads_total",
            "peak_phase",
            "phases",
            "model_states",  # what persists across the step (on the device), and what offload put on the host
            "offloaded",
            "host_bytes",
            "nvme",  # what ZeRO-Infinity put on the NVMe folder
            "nvme_bytes",
        }
        assert {"params", "grads", "optimizer", "master", "activations", "total"} <= set(PARTS) | {"total"}
        assert entry["fits"] is True and entry["gpus_needed"] == 1
    assert report["recommendation"]["strategy"] == "ddp"
    assert set(report["recommendation"]) == {"strategy", "reason"}


@pytest.mark.parametrize(
    "inp",
    [
        EstimateInput(shape_from_params(7e9), method="full", precision="bf16", reserve_bytes=GIB),
        EstimateInput(shape_from_params(7e9), method="full", precision="bf16", param_dtype="bf16"),
        EstimateInput(shape_from_params(34e9), method="lora", micro_batch=4, seq_len=1024,
                      gradient_checkpointing=True, reserve_bytes=GIB),
        EstimateInput(shape_from_params(13e9), method="qlora", offload_optimizer=True, offload_params=True),
    ],
    ids=["7b-full-fp32-weights", "7b-full-bf16-weights", "34b-lora-ckpt", "13b-qlora-offload"],
)
def test_every_strategy_row_adds_up_to_its_total(inp: EstimateInput) -> None:
    report = estimate_report(inp, 48 * GIB, 4)
    assert set(report["strategies"]) == set(strategy_names())
    for name, entry in report["strategies"].items():
        b = entry["per_device_bytes"]
        assert sum(b[part] for part in PARTS) == b["total"], (name, b)
        assert b["reserve"] == inp.reserve_bytes
    # 7B full fine-tune, fp32 weights under bf16 autocast: the 16-bit weight copies are the buffers (the part
    # the table used to hide), and fsdp's buffers are one gathered layer instead.
    # The peak is the largest phase; each phase is at most the peak. 7B full fine-tuning at seq 2048, batch 1
    # peaks in the optimizer step (all gradients, states and AdamW's temporaries: no activations then).
    for name, entry in report["strategies"].items():
        b = entry["per_device_bytes"]
        assert max(b["phases"].values()) + b["reserve"] == b["total"], name
        assert b["peak_phase"] in b["phases"]
    single = report["strategies"]["single"]["per_device_bytes"]
    if inp.method == "full" and inp.param_dtype is None:
        assert single["peak_phase"] == "optimizer" and single["activations"] == 0 and single["buffers"] == 0
        assert single["transient"] == single["optimizer"] // 2  # foreach AdamW: sqrt(exp_avg_sq) of every param


def test_stored_activations_are_what_one_forward_saves(tiny_shape: ModelShape) -> None:
    """``activations_stored`` is the saved-tensor figure (a detail); the parts are what is alive at the peak
    moment. LoRA under checkpointing peaks at the start of backward: the stored layer inputs plus the loss's
    three fp32 vocab-wide tensors, before the first layer is recomputed."""
    from runner.spec.summary import RunSummary
    from tui.render.report import estimate_vs_measured

    inp = EstimateInput(tiny_shape, method="lora", precision="fp32", micro_batch=MICRO_BATCH, seq_len=SEQ,
                        gradient_checkpointing=True, device="cpu")
    acts = activation_bytes(inp)
    est = estimate(inp)
    assert est.peak_phase == "backward"
    assert (est.activations, est.transient) == (acts.stored, acts.logits_backward)
    assert acts.logits_backward == 2 * acts.logits  # the log-softmax's output and input gradients
    assert est.activations_stored == acts.stored + acts.weight_copies == acts.stored  # fp32: no casts
    # Autocast's 16-bit weight casts are saved tensors too: counted in the stored figure.
    autocast = estimate(replace(inp, method="full", precision="bf16", param_dtype="fp32"))
    acts16 = activation_bytes(replace(inp, method="full", precision="bf16", param_dtype="fp32"))
    assert autocast.activations_stored == acts16.stored + acts16.weight_copies
    summary = {"estimate": {"per_device_bytes": breakdown_json(est)},
               "ranks": [{"activation_bytes": acts.stored, "param_bytes": 1, "grad_bytes": 1, "optimizer_bytes": 1,
                          "peak_tensor_bytes": est.total, "phase_peaks": dict(est.phases)}]}
    rows = {kind: (e, m, err) for kind, e, m, err in estimate_vs_measured(RunSummary.from_json(summary))}
    assert rows["saved activations"][0] == acts.stored and rows["saved activations"][2] == 0.0
    assert rows["peak"] == (est.total, est.total, 0.0)
    assert rows["backward peak"][2] == 0.0
    # An estimate stored before the phases existed has no phase rows, and is still compared.
    old = {"estimate": {"per_device_bytes": {"total": est.total, "activations": 1}}, "ranks": summary["ranks"]}
    assert [k for k, *_ in estimate_vs_measured(RunSummary.from_json(old))] == ["peak"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [("48GiB", 48 * GIB), ("80GB", 80 * 10**9), ("512 MiB", 512 * 2**20), ("3.5g", int(3.5 * GIB)), ("1000", 1000)],
)
def test_parse_bytes(text: str, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["1e400GiB", "0", "-1GiB", "0GiB", "nan", "inf", "1.2.3G", "48 parsecs", ""])
def test_parse_bytes_refuses_sizes_that_are_not_finite_and_positive(text: str) -> None:
    with pytest.raises(ValueError, match="size"):
        parse_bytes(text)
    assert parse_bytes("0", allow_zero=True) == 0


@pytest.mark.parametrize("kwargs", [{"n": -1}, {"n": 0}, {"n": float("nan")}, {"n": float("inf")},
                                    {"n": 7e9, "layers": 0}, {"n": 7e9, "hidden": 0}, {"n": 7e9, "heads": -2}])
def test_shape_from_params_refuses_sizes_that_are_not_positive(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must be"):
        shape_from_params(**kwargs)  # type: ignore[arg-type]


def test_a_zero_stage_recommendation_is_launchable_now() -> None:
    inp = EstimateInput(shape_from_params(7e9), method="full", precision="bf16", micro_batch=1, seq_len=512,
                        gradient_checkpointing=True)
    rec = recommend(inp, 80 * GIB, 4)
    assert rec.strategy == "zero2"
    assert "cannot launch" not in rec.reason  # ftui run launches the ZeRO stages
    assert "cannot launch" not in recommend(inp, 80 * GIB, 1).reason  # single: launchable
