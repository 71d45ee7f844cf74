"""The planner through the command line (``tui.cli.main`` in process): ``ftui estimate`` on the seed's cases, bad input, the shapes
it reads. (The estimate against real runs, and the batch-size finder: tests/e2e/test_estimate_vs_measured.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from runner.planner import (
    PARTS,
    EstimateInput,
    breakdown_json,
    estimate,
    inputs_from_recipe,
    resolve_model_shape,
    shape_from_config,
)
from runner.spec.recipe import load_recipe
from tests.support import QUICKSTART, ROOT, CliResult, run_in_process


class Cli:
    """``ftui`` in this process (:func:`tests.support.run_in_process`), from the repository's folder."""

    def __init__(self, capsys: pytest.CaptureFixture[str]) -> None:
        self.capsys = capsys

    def run(self, *args: str, check: bool = False) -> CliResult:
        result = run_in_process(self.capsys, *args)
        if check:
            assert result.returncode == 0, f"ftui {' '.join(args)} exited {result.returncode}\n{result.stderr}"
        return result


@pytest.fixture
def ftui(capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cli:
    monkeypatch.setenv("FTUI_HOME", str(tmp_path))
    monkeypatch.delenv("FTUI_DB", raising=False)
    monkeypatch.chdir(ROOT)
    return Cli(capsys)


def _estimate_json(ftui: Cli, *args: str) -> dict[str, Any]:
    return json.loads(ftui.run("estimate", *args, "--format", "json", check=True).stdout)


def test_seed_7b_full_finetune_is_112_gb_of_model_states(ftui: Cli) -> None:
    report = _estimate_json(ftui, "--params", "7e9", "--method", "full", "--precision", "bf16", "--gpus", "1",
                            "--gpu-mem", "80GiB")
    single = report["strategies"]["single"]["per_device_bytes"]
    assert single["params"] + single["grads"] + single["optimizer"] + single["master"] == 112 * 10**9
    assert set(report) == {"strategies", "recommendation", "switches", "measured_here", "every_switch", "proposals"}
    assert report["every_switch"] == report["proposals"] == []  # no recipe: no host check to make
    assert report["measured_here"] == []  # no recipe: no plan of it
    assert {"params", "grads", "optimizer", "master", "activations", "total"} <= set(single)  # the contract
    assert sum(single[k] for k in PARTS) == single["total"]  # the shown parts add up
    assert single["reserve"] == 2**30  # a GPU target: 1 GiB for the CUDA context by default
    text = ftui.run("estimate", "--params", "7e9", "--method", "full", "--gpus", "1", "--gpu-mem", "80GiB",
                    check=True).stdout
    assert "buffers" in text and "reserve" in text


def _bad_recipe(tmp_path: Path) -> Path:
    """quickstart on a local model folder whose config.json is not JSON."""
    folder = tmp_path / "broken-model"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text('{"model_type": "llama", "hidden_size": ')
    recipe = tmp_path / "broken.toml"
    recipe.write_text(QUICKSTART.read_text().replace('name = "builtin:tiny-llama"', f'name = "{folder}"'))
    return recipe


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--params", "-1"], "--params"),
        (["--params", "0"], "--params"),
        (["--params", "nan"], "--params"),
        (["--params", "inf"], "--params"),
        (["--params", "7e9", "--layers", "0"], "--layers"),
        (["--params", "7e9", "--hidden", "0"], "--hidden"),
        (["--params", "7e9", "--gpu-mem", "1e400GiB"], "--gpu-mem"),
        (["--params", "7e9", "--gpu-mem", "0"], "--gpu-mem"),
        (["--params", "7e9", "--reserve", "-1GiB"], "--reserve"),
        (["--params", "7e9", "--micro-batch", "-3"], "--micro-batch"),
        (["--params", "7e9", "--micro-batch", "0"], "--micro-batch"),
        (["--params", "7e9", "--seq", "-1"], "--seq"),
        (["--params", "7e9", "--gpus", "0"], "--gpus"),
        (["--params", "7e9", "--lora-r", "-8"], "--lora-r"),
        (["recipes/quickstart.toml", "--params", "7e9"], "--params"),
        (["recipes/quickstart.toml", "--hidden", "512"], "--hidden"),
        (["--model", "builtin:tiny-llama", "--layers", "4"], "--layers"),
        (["--model", "builtin:nope"], "--model"),
        (["BROKEN"], "config.json"),
        (["run", str(QUICKSTART), "--find-batch-size", "--mem-cap", "1e400GiB"], "--mem-cap"),
    ],
)
def test_bad_estimate_input_is_one_line_naming_the_flag(ftui: Cli, tmp_path: Path, args: list[str],
                                                          named: str) -> None:
    args = [str(_bad_recipe(tmp_path)) if a == "BROKEN" else a for a in args]
    argv = args if args[0] == "run" else ["estimate", *args, *([] if "--gpu-mem" in args else ["--gpu-mem", "48GiB"])]
    proc = ftui.run(*argv)
    assert proc.returncode == 2, (argv, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ftui: ") and named in lines[0], proc.stderr
    assert proc.stdout == ""


def test_estimate_from_a_model_name_without_a_recipe(ftui: Cli) -> None:
    report = _estimate_json(ftui, "--model", "builtin:tiny-llama", "--method", "lora", "--gpu-mem", "8GiB",
                            "--reserve", "0", "--micro-batch", "2", "--seq", "128")
    single = report["strategies"]["single"]["per_device_bytes"]
    inp = EstimateInput(resolve_model_shape("builtin:tiny-llama").shape, method="lora", micro_batch=2, seq_len=128)
    assert single == breakdown_json(estimate(inp))
    assert single["reserve"] == 0


def test_seed_tinyllama_lora_on_4_gpus_recommends_ddp(ftui: Cli) -> None:
    proc = ftui.run("estimate", "recipes/tinyllama-1.1b-lora.toml", "--gpu-mem", "48GiB", "--gpus", "4", check=True)
    assert "built-in table" in proc.stdout  # no hub: the published config values
    assert "ESTIMATED" in proc.stdout and "recommendation (estimated)" in proc.stdout
    report = _estimate_json(ftui, "recipes/tinyllama-1.1b-lora.toml", "--gpu-mem", "48GiB", "--gpus", "4")
    assert report["recommendation"]["strategy"] == "ddp"
    assert report["strategies"]["ddp"]["fits"]


def test_seed_codellama_34b_lora_on_4_gpus_recommends_sharding(ftui: Cli) -> None:
    # The seed's demo: 4 x 48 GB, batch 4, 1024 context.
    report = _estimate_json(ftui, "--params", "34e9", "--method", "lora", "--gpus", "4", "--gpu-mem", "48GiB",
                            "--micro-batch", "4", "--seq", "1024", "--grad-ckpt")
    assert report["recommendation"]["strategy"] in ("fsdp", "zero3")
    assert not report["strategies"]["ddp"]["fits"]
    plain = _estimate_json(ftui, "--params", "34e9", "--method", "lora", "--gpus", "4", "--gpu-mem", "48GiB")
    assert plain["recommendation"]["strategy"] in ("fsdp", "zero3")
    recipe = _estimate_json(ftui, "recipes/codellama-34b-lora-fsdp.toml", "--gpus", "4", "--gpu-mem", "48GiB")
    assert recipe["recommendation"]["strategy"] in ("fsdp", "zero3")


def test_estimate_on_a_cpu_machine_budgets_host_memory(ftui: Cli) -> None:
    """`ftui estimate RECIPE` on a CPU-only machine budgets host memory (it does not ask for --gpu-mem)."""
    from runner.hardware import NvmlBackend

    if NvmlBackend().device_count():
        pytest.skip("NVML sees GPUs here")
    import psutil

    proc = ftui.run("estimate", str(QUICKSTART))
    assert proc.returncode == 0, proc.stderr
    assert "host memory" in proc.stdout and "psutil" in proc.stdout and "Traceback" not in proc.stderr
    report = json.loads(ftui.run("estimate", str(QUICKSTART), "--format", "json", check=True).stdout)
    single = report["strategies"]["single"]
    assert single["fits"] is (single["per_device_bytes"]["total"] <= psutil.virtual_memory().total)


def test_estimate_help_does_not_import_torch() -> None:
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "tui.cli", "estimate", "--help"],
                          cwd=ROOT, capture_output=True, text=True, check=True)
    assert "torch" not in proc.stderr


def test_builtin_and_table_shapes_are_exact() -> None:
    from transformers import LlamaConfig

    from runner.spec.builtin import tiny_llama_config

    assert resolve_model_shape("builtin:tiny-llama").shape == shape_from_config(tiny_llama_config())
    cfg = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                      num_key_value_heads=4, vocab_size=32000)
    tl = resolve_model_shape("TinyLlama/TinyLlama-1.1B-Chat-v1.0", allow_network=False)
    assert tl.shape == shape_from_config(cfg)
    inp = inputs_from_recipe(load_recipe(ROOT / "recipes" / "tinyllama-1.1b-lora.toml"), shape=tl.shape)
    assert (inp.method, inp.precision, inp.param_dtype, inp.micro_batch, inp.seq_len) == ("lora", "bf16", "bf16", 16,
                                                                                          1024)
    assert inp.gradient_checkpointing and inp.n_devices == 4 and inp.lora_targets[-1] == "down_proj"
    quick = inputs_from_recipe(load_recipe(QUICKSTART))
    assert quick.param_dtype == "fp32" and quick.method == "lora"  # CPU fp32: the trainer keeps fp32 weights
