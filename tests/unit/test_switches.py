"""The GPU-only efficiency switches (context parallel, fp8, activation offload, NVMe offload): the recipe's rules,
what a host lacks (runner/spec/switches.py), the planner's terms (runner/planner/switches.py), the rank's
pieces that run anywhere (runner/rank/gpu_switches.py), compare's recipe columns and the report's row. The
real GPU paths are the ``gpu``-marked tests in tests/system/test_gpu_switches.py."""

from __future__ import annotations

import tomllib
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig

from runner.analysis import mfu
from runner.analysis.recipe_diff import recipe_diff
from runner.planner import EstimateInput, estimate, estimate_report, shape_from_config
from runner.planner.activations import activation_bytes
from runner.planner.memory import breakdown_json
from runner.planner.switches import ring_buffer_bytes
from runner.rank import gpu_switches
from runner.service import sweep
from runner.spec import layout, strategies, switches
from runner.spec.deepspeed_config import deepspeed_config
from runner.spec.flops import run_dtype
from runner.spec.recipe import RecipeError, load_recipe, parse_recipe
from tests.support import QUICKSTART, run_in_process
from tui.render.report import switch_text

LLAMA = shape_from_config(LlamaConfig(hidden_size=128, intermediate_size=344, num_hidden_layers=4,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=4096))
FSDP2 = ["launch.strategy=fsdp", "launch.nproc=4", "launch.device=cuda"]


def _refusal(*sets: str) -> str:
    with pytest.raises(RecipeError) as info:
        parse_recipe("", overrides=sets)
    assert "\n" not in str(info.value)
    return str(info.value)


# ---------------------------------------------------------------------- the recipe's rules


@pytest.mark.parametrize(("sets", "field", "words"), [
    (["launch.cp_size=2", "launch.device=cpu", "launch.strategy=fsdp", "launch.nproc=2"], "launch.cp_size",
     "CUDA SDPA kernels"),
    (["launch.cp_size=2", "launch.strategy=ddp", "launch.nproc=2"], "launch.cp_size", "FSDP2"),
    (["launch.cp_size=2", "launch.strategy=fsdp", "launch.fsdp_version=1", "launch.nproc=2"], "launch.cp_size",
     "FSDP2"),
    ([*FSDP2, "launch.cp_size=3"], "launch.cp_size", "does not divide the 4 processes"),
    ([*FSDP2, "launch.cp_size=4", "data.context_length=12"], "launch.cp_size", "multiple of 2 x cp_size = 8"),
    ([*FSDP2, "launch.cp_size=2", "data.pack=false"], "launch.cp_size", "data.pack = true"),
    (["train.precision=fp8", "launch.device=cpu"], "train.precision", "compute capability 8.9"),
    (["train.precision=fp8", "method.type=qlora"], "train.precision", "bitsandbytes"),
    (["train.precision=fp8", "launch.strategy=zero2", "launch.nproc=2"], "train.precision", "accelerate engine"),
    (["train.activation_offload=true", "launch.device=cpu"], "train.activation_offload", "already live in host"),
    (["train.activation_offload=true", "launch.strategy=pp", "launch.nproc=2", "train.batch_size=4"],
     "train.activation_offload", "its own forward"),
    (["launch.strategy=zero3", "launch.nproc=2", "launch.offload=nvme"], "launch.nvme_path", "NVMe folder"),
    (["launch.strategy=zero2", "launch.nproc=2", "launch.offload=nvme", "launch.nvme_path=/nvme"], "launch.offload",
     "'none' or 'optimizer'"),
    (["launch.nvme_path=/nvme"], "launch.nvme_path", "is for 'nvme'"),
    (["launch.cp_size=0"], "launch.cp_size", "greater than 0"),
    (["train.precision=fp4"], "train.precision", "'fp8'"),
])
def test_a_switch_the_recipe_cannot_have_is_one_line_naming_its_field(sets: list[str], field: str, words: str) -> None:
    line = _refusal(*sets)
    assert f" {field}: " in f" {line.split(': ', 1)[-1]}" or f"{field}:" in line, line
    assert words in line, line


def test_the_switches_a_gpu_run_may_have_validate() -> None:
    recipe = parse_recipe("", overrides=[*FSDP2, "launch.cp_size=2", "train.precision=fp8",
                                         "train.activation_offload=true", "method.type=full"])
    assert (recipe.launch.cp_size, recipe.train.precision, recipe.train.activation_offload) == (2, "fp8", True)
    assert recipe.train.accelerate_mixed_precision == "bf16"  # torchao's layers inside bf16 autocast
    nvme = parse_recipe("", overrides=["launch.strategy=zero3", "launch.nproc=2", "launch.offload=nvme",
                                       "launch.nvme_path=/mnt/nvme"])
    zero = deepspeed_config(nvme, on_cpu=False)["zero_optimization"]
    assert zero["offload_optimizer"] == zero["offload_param"] == {"device": "nvme", "nvme_path": "/mnt/nvme",
                                                                   "pin_memory": True}


# ---------------------------------------------------------------------- what the host lacks


def _host_lines(sets: list[str], **facts: object) -> list[str]:
    return switches.host_problems(parse_recipe("", overrides=sets), switches.HostFacts(**facts))  # type: ignore[arg-type]


def test_a_host_without_cuda_is_refused_each_switch_with_the_reason() -> None:
    lines = _host_lines([*FSDP2, "launch.cp_size=2", "train.precision=fp8", "train.activation_offload=true"],
                        cuda=False)
    assert [line.split(":")[0] for line in lines] == ["launch.cp_size", "train.precision", "train.activation_offload"]
    assert "_scaled_dot_product" not in lines[0] and "CUDA SDPA kernels" in lines[0]
    assert "host memory" in lines[2]


def test_fp8_names_the_gpu_capability_then_the_missing_package() -> None:
    fp8 = ["train.precision=fp8"]
    assert _host_lines(fp8, cuda=True, capabilities=[(8, 0)], torchao=True) == [
        "train.precision: fp8 needs GPUs of compute capability 8.9 or above (H100/H200, L40S); this run's have 8.0"]
    assert "torchao" in _host_lines(fp8, cuda=True, capabilities=[(9, 0)], torchao=False)[0]
    assert _host_lines(fp8, cuda=True, capabilities=[(9, 0), None], torchao=True) == []


def test_nvme_offload_names_the_async_io_problem() -> None:
    sets = ["launch.strategy=zero3", "launch.nproc=2", "launch.offload=nvme", "launch.nvme_path=/nvme"]
    assert _host_lines(sets, cuda=True, async_io="libaio is not installed") == [
        "launch.offload: 'nvme' needs DeepSpeed's async_io op: libaio is not installed"]
    assert _host_lines(sets, cuda=True, async_io=None) == []


# ---------------------------------------------------------------------- the planner's terms


def _inp(**kw: object) -> EstimateInput:
    base = {"shape": LLAMA, "method": "full", "precision": "bf16", "strategy": "fsdp", "n_devices": 4,
            "micro_batch": 2, "seq_len": 256}
    return EstimateInput(**{**base, **kw})  # type: ignore[arg-type]


def test_context_parallel_keeps_a_sequence_share_of_activations_plus_the_gathered_keys_and_values() -> None:
    whole, split = estimate(_inp()), estimate(_inp(cp_size=2))
    assert split.activations_stored == estimate(_inp(seq_len=128)).activations_stored
    assert split.activations_stored < whole.activations_stored
    ring = 2 * 2 * 256 * LLAMA.kv_heads * LLAMA.head_dim * 2  # K and V of the whole sequence, bf16
    assert ring_buffer_bytes(_inp(cp_size=2), 2) == ring
    assert split.transient == estimate(_inp(seq_len=128)).transient + ring or split.peak_phase == "optimizer"


def test_activation_offload_moves_the_saved_activations_to_the_host() -> None:
    on, off = estimate(_inp()), estimate(_inp(activation_offload=True))
    assert off.activations == 0 and off.offloaded["activations"] > 0
    assert off.total < on.total
    assert breakdown_json(off)["host_bytes"] == off.offloaded["activations"]


def test_nvme_offload_moves_what_host_offload_would_to_nvme() -> None:
    host = estimate(_inp(strategy="zero3", offload_optimizer=True, offload_params=True))
    nvme = estimate(_inp(strategy="zero3", offload_optimizer=True, offload_params=True, nvme_offload=True))
    assert nvme.nvme == host.offloaded and nvme.offloaded == {} and nvme.total == host.total
    assert breakdown_json(nvme)["nvme_bytes"] == sum(host.offloaded.values()) > 0


def test_fp8_keeps_bf16_activations_and_only_the_heads_autocast_copy() -> None:
    fp32_weights = {"strategy": "single", "n_devices": 1, "param_dtype": "fp32"}
    bf16, fp8 = estimate(_inp(**fp32_weights)), estimate(_inp(**fp32_weights, fp8=True))
    copies = activation_bytes(_inp(**fp32_weights)).weight_copies
    head = LLAMA.vocab * LLAMA.hidden
    linears = sum(s.in_features * s.out_features * s.count for s in LLAMA.linears.values())
    assert copies > 0 and bf16.activations == fp8.activations
    assert bf16.activations_stored - fp8.activations_stored == copies - round(copies * head / linears)


def test_the_estimate_report_has_a_line_per_switch_only_where_it_applies() -> None:
    inp = _inp(cp_size=2, fp8=True, activation_offload=True)
    lines = estimate_report(inp, 80 * 2**30, 4)["switches"]
    assert [line.split(":")[0] for line in lines] == ["context parallel", "fp8", "activation offload"]
    assert all(line.endswith("(estimated)") for line in lines)
    assert estimate_report(_inp(), 80 * 2**30, 4)["switches"] == []
    per = estimate_report(inp, 80 * 2**30, 4)["strategies"]
    assert per["ddp"]["per_device_bytes"]["activations_stored"] == \
        estimate(replace(inp, strategy="ddp", cp_size=1)).activations_stored  # cp only under FSDP2


# ---------------------------------------------------------------------- the rank's pieces, compare, report


def test_labels_are_shifted_before_the_sequence_is_split() -> None:
    labels = torch.tensor([[5, 6, 7, -100]])
    assert gpu_switches.shift_labels(labels).tolist() == [[6, 7, -100, -100]]


def test_fp8_converts_the_decoder_linears_not_the_head_nor_odd_sizes() -> None:
    assert gpu_switches._fp8_filter(torch.nn.Linear(32, 64), "model.layers.0.mlp.up_proj")
    assert not gpu_switches._fp8_filter(torch.nn.Linear(32, 64), "lm_head")
    assert not gpu_switches._fp8_filter(torch.nn.Linear(30, 64), "model.layers.0.mlp.up_proj")


def test_activation_offload_is_read_from_the_hooks_the_forward_runs_under() -> None:
    on = parse_recipe("", overrides=["train.activation_offload=true"])
    with gpu_switches.forward_context(on):
        assert gpu_switches.saved_to_host()
    with gpu_switches.forward_context(parse_recipe("")):
        assert not gpu_switches.saved_to_host()


def test_compare_shows_each_switch_that_differs_as_a_recipe_column() -> None:
    a = parse_recipe("", overrides=["launch.strategy=zero3", "launch.nproc=2"])
    b = parse_recipe("", overrides=["launch.strategy=zero3", "launch.nproc=2", "launch.offload=nvme",
                                    "launch.nvme_path=/nvme", "train.activation_offload=true"])
    diff = recipe_diff([a.to_toml(), b.to_toml()])
    assert diff["launch.offload"] == ["none", "nvme"]
    assert diff["train.activation_offload"] == ["false", "true"] and diff["launch.nvme_path"] == ["-", "/nvme"]
    c = parse_recipe("", overrides=[*FSDP2, "launch.cp_size=2", "train.precision=fp8"])
    diff = recipe_diff([parse_recipe("", overrides=FSDP2).to_toml(), c.to_toml()])
    assert diff["launch.cp_size"] == ["1", "2"] and diff["train.precision"] == ["fp32", "fp8"]


def test_the_report_row_says_which_switches_were_live() -> None:
    assert switch_text({"cp_size": 2, "fp8_linears": 28, "activation_offload": True}) == (
        "context parallel over 2 · fp8 in 28 Linear layers · activations saved to host")
    assert switch_text({"cp_size": 1, "fp8_linears": 0, "activation_offload": False}) is None


def test_the_processes_one_sequence_is_split_over_are_one_data_replica() -> None:
    recipe = parse_recipe("", overrides=[*FSDP2, "launch.cp_size=2", "train.batch_size=3", "train.grad_accum=2"])
    assert layout.rows_per_step(recipe) == 3 * 2 * 2  # 4 processes, 2 sequences at a time
    stored = tomllib.loads(recipe.to_toml())
    assert strategies.recipe_global_batch("fsdp", stored, 4) == 12


def test_a_sweep_takes_a_switch_as_a_grid_axis() -> None:
    items = sweep.plan(QUICKSTART, ["fsdp"], 4, FSDP2, ["launch.cp_size=1,2", "train.activation_offload=false,true"])
    recipes = [load_recipe(QUICKSTART, item.overrides) for item in items]
    assert [(r.launch.cp_size, r.train.activation_offload) for r in recipes] == [
        (1, False), (1, True), (2, False), (2, True)]
    assert items[3].grid == "launch.cp_size=2 train.activation_offload=true"


def test_an_fp8_run_takes_the_gpus_float8_datasheet_peak_where_it_has_one() -> None:
    assert run_dtype("fp8") == "fp8"
    assert mfu.gpu_peak("NVIDIA H100 80GB HBM3", "fp8").flops == 1978.9e12  # type: ignore[union-attr]
    assert mfu.gpu_peak("NVIDIA A100-SXM4-80GB", "fp8") is None  # no float8 tensor cores: no MFU, not a wrong one


def test_ftui_estimate_prints_a_line_per_switch(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    recipe = tmp_path / "switches.toml"
    recipe.write_text('[launch]\nstrategy = "fsdp"\nnproc = 2\ndevice = "cuda"\ncp_size = 2\n'
                      '[train]\nprecision = "fp8"\nactivation_offload = true\n')
    result = run_in_process(capsys, "estimate", str(recipe), "--gpu-mem", "80GiB")
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    for start in ("context parallel: 2 processes per sequence", "fp8: decoder Linear layers", "activation offload:"):
        assert start in text, text
