"""The attention implementation and torch.compile as recipe switches: what a recipe may ask (the strategies
table says where compile is refused), what this host can run (packages, device), the steady state without
compiling steps, and the kernels in effect as compare, its verdict and ftui show carry them."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from runner.analysis.compare import build_comparison
from runner.analysis.run_figures import kernels
from runner.rank.throughput import Steady, Window, throughput
from runner.spec import kernels as spec
from runner.spec.recipe import RecipeError, parse_recipe
from tests.support import run_info
from tui.render.compare_cells import columns, figure_sources
from tui.render.report import zero_rows


def _problem(*overrides: str) -> str:
    with pytest.raises(RecipeError) as exc:
        parse_recipe("", overrides=overrides)
    return str(exc.value)


@pytest.mark.parametrize("value", ["eager", "sdpa", "flex_attention", "flash_attention_2"])
def test_each_attention_implementation_is_a_recipe_value(value: str) -> None:
    overrides = [f"model.attn_implementation={value}", "train.precision=bf16"]
    assert parse_recipe("", overrides=overrides).model.attn_implementation == value
    assert parse_recipe("").model.attn_implementation is None  # transformers' choice


@pytest.mark.parametrize(("overrides", "said"), [
    (["model.attn_implementation=flash"], "--set model.attn_implementation: Input should be 'eager', 'sdpa', "
                                          "'flex_attention' or 'flash_attention_2' (got 'flash')"),
    (["train.compile=1"], "--set train.compile: Input should be a valid boolean (got 1)"),
    (["train.compile=true", "train.compile_mode=fast"], "--set train.compile_mode: Input should be 'default', "
                                                        "'reduce-overhead' or 'max-autotune' (got 'fast')"),
    (["train.compile_mode=max-autotune"], "train.compile_mode: 'max-autotune' takes effect only with train.compile"),
    (["model.attn_implementation=flash_attention_2"], "flash_attention_2 computes in fp16 or bf16 only"),
    (["train.compile=true", "train.gradient_checkpointing=true"], "train.compile: not with train.gradient_checkpointing"),
    (["train.compile=true", "launch.strategy=fsdp", "launch.nproc=2", "launch.fsdp_version=1"],
     "train.compile: not under FSDP1"),
])
def test_a_bad_switch_is_one_line_naming_the_field(overrides: list[str], said: str) -> None:
    assert said in _problem(*overrides)


@pytest.mark.parametrize(("strategy", "engine", "compiles"), [
    ("single", "auto", True), ("ddp", "auto", True), ("fsdp", "auto", True), ("zero1", "torch", True),
    ("zero2", "torch", True), ("zero3", "torch", True), ("zero1", "auto", False), ("zero3", "deepspeed", False),
    ("pp", "auto", False), ("tp", "auto", False), ("mp", "auto", False),
])
def test_the_strategies_table_says_where_compile_is_refused(strategy: str, engine: str, compiles: bool) -> None:
    overrides = ["train.compile=true", f"launch.strategy={strategy}", f"launch.engine={engine}",
                 f"launch.nproc={1 if strategy in ('single', 'mp') else 2}"]
    if compiles:
        assert parse_recipe("", overrides=overrides).train.compile
    else:
        reason = spec.strategies.resolve(strategy, engine).compile_refused
        assert reason and _problem(*overrides).endswith(f"train.compile: not under {strategy} on the "
                                                        f"{spec.strategies.resolve(strategy, engine).engine} engine: "
                                                        f"{reason}")


def test_the_host_problems_name_what_is_missing() -> None:
    def problem(on_cpu: bool, *overrides: str) -> str | None:
        return spec.host_problem(parse_recipe("", overrides=["train.precision=bf16", *overrides]), on_cpu)

    assert problem(True, "model.attn_implementation=flash_attention_2") == \
        "model.attn_implementation: flash_attention_2 needs a CUDA GPU; this run trains on the CPU"
    assert (problem(True, "model.attn_implementation=flex_attention") or "").startswith(
        "model.attn_implementation: flex_attention has no backward on CPU")
    assert problem(True, "train.compile=true") is None  # g++ is installed here
    assert problem(True, "model.attn_implementation=eager") is None
    # On a GPU: the packages, looked up for real (neither is installed on this CPU machine's torch).
    flash = problem(False, "model.attn_implementation=flash_attention_2")
    if importlib.util.find_spec("flash_attn") is None:
        assert flash == ("model.attn_implementation: flash_attention_2 needs the flash_attn package, which is not "
                         "installed here (pip install flash-attn)")
    else:
        assert flash is None
    triton = problem(False, "train.compile=true")
    assert triton == (None if importlib.util.find_spec("triton") else
                      "train.compile: inductor builds GPU kernels with triton, which is not installed here")


def test_torch_really_has_no_flex_attention_backward_on_cpu() -> None:
    """The refusal above stands only while torch refuses it: when a torch trains flex_attention on CPU, this
    fails and the refusal goes."""
    from torch.nn.attention.flex_attention import flex_attention

    q = torch.randn(1, 2, 8, 16, requires_grad=True)
    with pytest.raises(NotImplementedError, match="does not support backward on CPU"):
        flex_attention(q, q, q)


def test_compiling_steps_are_left_out_of_the_steady_state() -> None:
    # Two metered steps (the first compiles), step 3 compiles (a recompilation), two steps of 1 s, then the
    # profiled last step (it compiles too: nothing changes); 100 tokens each.
    steady = Steady()
    steps = [(0.0, True, True, False), (5.0, True, False, False), (6.0, False, True, False),
             (9.0, False, False, False), (10.0, False, False, False), (11.0, False, True, True)]
    for step, (start, metered, compiled, profiled) in enumerate(steps):
        steady.begin(start, 100 * step, metered, profiled)
        steady.end(compiled)
    assert steady.window == Window(start=9.0, tokens_before=300) and steady.steps == 2
    assert steady.until == Window(start=11.0, tokens_before=500)
    figures = throughput(Window(0.0, 0), steady.window, steady.steps, end=14.0, tokens_done=600,
                         steady_until=steady.until)
    assert figures.tokens_per_s == pytest.approx(100.0) and figures.steady_steps == 2


EAGER = {"attention": "eager", "compile": None, "step": 1, "source": "s"}
COMPILED = {"attention": "sdpa", "step": 1, "source": "s",
            "compile": {"mode": "default", "layers": 6, "graphs": 6, "graph_breaks": 0, "seconds": 41.6}}


def test_compare_shows_the_kernels_in_effect_and_tells_the_configurations_apart() -> None:
    runs = [run_info(1, "single", 1, 1000.0), run_info(2, "single", 1, 900.0, kernels=EAGER),
            run_info(3, "single", 1, 1200.0, kernels=COMPILED)]
    cmp = build_comparison(runs, {})
    cells = dict(columns(cmp))
    assert [cells["attention"](r) for r in cmp.rows] == ["-", "eager", "sdpa"]
    assert [cells["compile"](r) for r in cmp.rows] == ["-", "off", "default, 6 layers, 42s"]
    assert [cmp.label(r) for r in cmp.rows] == ["single", "single (eager)", "single (compiled)"]
    assert "mem measured of compiled CPU runs (3): a lower bound" in " ".join(figure_sources(cmp))
    assert "attention" not in dict(columns(build_comparison(runs[:1], {})))  # shown once a run recorded them


def test_show_has_a_row_for_each() -> None:
    summary = run_info(1, "single", 1, 1.0, kernels=COMPILED).summary
    rows = {name: value for name, value, _ in zero_rows(summary)}
    assert rows["attention"] == "sdpa" and rows["compile"] == "default, 6 layers, 42s"
    assert kernels(summary.kernels) is not None and kernels(None) is None


def test_the_decoder_layers_are_found_under_peft_and_fsdp2s_classes() -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    from runner.rank.compiling import compile_layers, compiled_modules, decoder_layers
    from runner.spec.builtin import tiny_llama_config

    config = tiny_llama_config(64)
    config.num_hidden_layers = 2
    model = get_peft_model(LlamaForCausalLM(config), LoraConfig(r=2, target_modules=["q_proj"]))
    assert compile_layers(model, "default") == 2
    layers = decoder_layers(model)
    # FSDP2's fully_shard gives each layer a class of its own, a subclass of the layer's (FSDPLlamaDecoderLayer).
    for layer in layers:
        layer.__class__ = type(f"FSDP{type(layer).__name__}", (type(layer),), {})
    assert decoder_layers(model) == layers
    inside = compiled_modules(model)
    assert {id(m) for m in layers[0].modules()} <= inside and id(model.base_model.model.lm_head) not in inside


def test_ftui_estimate_says_what_the_kernels_do(capsys: pytest.CaptureFixture[str]) -> None:
    from tests.support import QUICKSTART, run_in_process

    result = run_in_process(capsys, "estimate", str(QUICKSTART), "--attn", "eager", "--compile", "--gpu-mem", "8GiB",
                            "--strategy", "single", "--strategy", "ddp")
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert "· eager · compiled" in text and "attention eager: each layer keeps its fp32 attention probabilities" in text
    assert "compiled layers: the partitioner recomputes" in text
    assert "APPROXIMATE: eager attention under torch.compile is estimated as eager's saves" in text  # once, not per strategy
    plain = run_in_process(capsys, "estimate", str(QUICKSTART), "--gpu-mem", "8GiB", "--format", "json")
    eager = run_in_process(capsys, "estimate", str(QUICKSTART), "--attn", "eager", "--gpu-mem", "8GiB", "--format", "json")
    stored = [json.loads(r.stdout)["strategies"]["single"]["per_device_bytes"]["activations_stored"] for r in (plain, eager)]
    assert stored[1] - stored[0] > 4 * 4 * 6 * 256 * 256  # one layer's fp32 probabilities at quickstart's shape
