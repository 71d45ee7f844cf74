"""The ZeRO stages on both engines: real ranks over gloo, real training of quickstart, real SQLite.

The stages on DeepSpeed come from the shared matrix's sweep; the stages on PyTorch alone and the offloads
are its extra runs (docs/zero.md). Every run trains the global batch of the sweep's DDP run (2 ranks x 1 row
x 2 micro-steps), which it is compared with step by step.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from runner.analysis.shard_verdict import shard_verdict
from runner.spec import deepspeed_config, strategies
from runner.spec.recipe import RecipeError, load_recipe
from runner.spec.summary import model_state_bytes
from tests.support import QUICKSTART, ROOT, Ftui
from tests.support.matrix import STEPS, Matrix

# fp32 on CPU, the same rows per optimizer step, the same AdamW: DeepSpeed and FSDP reduce gradients in
# another order than DDP, so the sums differ in the last bits (measured differences ~1e-6).
LOSS_TOLERANCE = 1e-4
# Measured model-state bytes per rank (parameters, gradients, optimizer state, fp32 master, on the device
# and offloaded) against the planner's estimate.
MODEL_STATE_TOLERANCE = 0.02

# (strategy, engine, offload): every stage on DeepSpeed, with the optimizer offloaded at a stage below 3 and
# everything offloaded at stage 3; every stage on torch, with the offload at stage 3.
MATRIX = [
    ("zero1", "deepspeed", "none"),
    ("zero2", "deepspeed", "none"),
    ("zero2", "deepspeed", "optimizer"),
    ("zero3", "deepspeed", "none"),
    ("zero3", "deepspeed", "optimizer+params"),
    ("zero1", "torch", "none"),
    ("zero2", "torch", "none"),
    ("zero3", "torch", "optimizer+params"),
]


def _key(strategy: str, engine: str, offload: str) -> str:
    """The matrix's key: the sweep's run for a stage on its default engine, else the extra run."""
    if engine == "deepspeed" and offload == "none":
        return strategy
    return "-".join([strategy, engine] + ([offload] if offload != "none" else []))


def _run(matrix: Matrix, strategy: str, engine: str, offload: str) -> dict[str, Any]:
    return matrix[_key(strategy, engine, offload)].shown


@pytest.mark.parametrize(("strategy", "engine", "offload"), MATRIX)
def test_the_engine_and_sharding_asked_for_are_in_effect(matrix: Matrix, strategy: str, engine: str,
                                                          offload: str) -> None:
    run = _run(matrix, strategy, engine, offload)
    row = strategies.resolve(strategy, engine)
    assert run["status"] == "completed"
    assert run["distributed_type"] in row.expect
    sharding = run["summary"]["sharding"]
    assert (sharding["engine"], sharding["stage"], sharding["offload"]) == (engine, int(strategy[-1]), offload)
    assert run["summary"]["engine"] == engine


@pytest.mark.parametrize(("strategy", "engine", "offload"), MATRIX)
def test_losses_match_ddp_at_the_same_global_batch(matrix: Matrix, strategy: str, engine: str,
                                                   offload: str) -> None:
    ddp = matrix["ddp"].losses
    mine = [m["loss"] for m in _run(matrix, strategy, engine, offload)["metrics"]]
    assert len(mine) == len(ddp) == STEPS
    assert mine == pytest.approx(ddp, abs=LOSS_TOLERANCE)


@pytest.mark.parametrize("engine", ["deepspeed", "torch"])
def test_model_state_bytes_per_rank_fall_as_the_stage_rises_as_the_planner_predicts(
        matrix: Matrix, engine: str) -> None:
    # One run per stage (without offload where the matrix has one: offload moves bytes, it does not remove
    # them), then every run of the engine for the 2% check.
    per_stage = {s: _run(matrix, s, e, o) for s, e, o in reversed(MATRIX) if e == engine}
    ordered = [matrix["ddp"].shown] + [per_stage[s] for s in ("zero1", "zero2", "zero3")]
    everything = ordered + [_run(matrix, s, e, o) for s, e, o in MATRIX if e == engine]
    for run in everything:
        per_device = run["summary"]["estimate"]["per_device_bytes"]
        planned = per_device["model_states"] + per_device.get("host_bytes", 0)
        for rank in run["summary"]["ranks"]:
            assert model_state_bytes(rank) == pytest.approx(planned, rel=MODEL_STATE_TOLERANCE), (run["name"], rank)
    measured, estimated = [], []
    for run in ordered:
        per_device = run["summary"]["estimate"]["per_device_bytes"]
        measured.append(max(model_state_bytes(r) for r in run["summary"]["ranks"]))
        estimated.append(per_device["model_states"] + per_device.get("host_bytes", 0))
    # Non-increasing from DDP to ZeRO-3, and ZeRO-3 holds about half of DDP's (2 ranks, the frozen base sharded).
    assert measured == sorted(measured, reverse=True), measured
    assert estimated == sorted(estimated, reverse=True), estimated
    assert measured[-1] < 0.6 * measured[0]


ZERO3_DS = ("optimizer sharded 1/2: yes; fp32 master sharded 1/2: yes; grads sharded 1/2: yes; params sharded 1/2: "
            "yes (beside it each rank keeps 6% of them whole: ZeRO-3's persistence threshold)")
ZERO2_DS = ("optimizer sharded 1/2: yes; fp32 master sharded 1/2: yes; grads sharded 1/2: yes; params: replicated "
            "(as zero2 promises)")
# Each run's sharding verdict (runner/analysis/shard_verdict.py): every rank's bytes of each kind against the
# whole it measured, and the share the strategy promises. DeepSpeed's ZeRO-1 keeps only its partition's
# gradients once reduced, torch's ZeRO-2 (FSDP2 without reshard after forward) its shard of the weights at
# rest: less than promised, said. ZeRO-3 on DeepSpeed keeps its small parameters (k/v projections, norms,
# LoRA's matrices: under 100,000 elements) whole on every rank beside the partitions: 6% of the weights.
VERDICTS = {
    "ddp": "optimizer: replicated (as ddp promises); grads: replicated (as ddp promises); params: replicated "
           "(as ddp promises)",
    "fsdp": "optimizer sharded 1/2: yes; grads sharded 1/2: yes; params sharded 1/2: yes",
    "zero1": "optimizer sharded 1/2: yes; fp32 master sharded 1/2: yes; grads: each rank holds 50%, less than zero1 "
             "promises (replicated); params: replicated (as zero1 promises)",
    "zero2": ZERO2_DS,
    "zero2-deepspeed-optimizer": ZERO2_DS,
    "zero3": ZERO3_DS,
    "zero3-deepspeed-optimizer+params": ZERO3_DS,
    "zero1-torch": "optimizer sharded 1/2: yes; grads: replicated (as zero1 promises); params: replicated (as zero1 "
                   "promises)",
    "zero2-torch": "optimizer sharded 1/2: yes; grads sharded 1/2: yes; params: each rank holds 50%, less than zero2 "
                   "promises (replicated)",
    "zero3-torch-optimizer+params": "optimizer sharded 1/2: yes; grads sharded 1/2: yes; params sharded 1/2: yes",
}


@pytest.mark.parametrize("key", list(VERDICTS))
def test_each_rank_holds_the_share_its_strategy_promises(matrix: Matrix, key: str) -> None:
    summary = matrix[key].summary
    verdict = shard_verdict(matrix[key]["strategy"], summary["ranks"], summary.get("parallel"))
    assert verdict.line() == VERDICTS[key]
    assert verdict.ok is True and verdict.short() == "as promised"
    row = strategies.get(matrix[key]["strategy"])
    for check in verdict.checks:  # every kind the table says the strategy divides is sharded 1/2
        shard = {"optimizer": "optimizer", "fp32 master": "optimizer"}.get(check.kind, check.kind)
        assert (check.promise == "sharded") == (shard in row.shards), (check.kind, check.promise)


def test_the_precision_in_effect_is_measured_and_shown(ftui: Ftui, matrix: Matrix) -> None:
    deepspeed = _run(matrix, "zero1", "deepspeed", "none")["summary"]["precision"]
    torch_run = _run(matrix, "zero1", "torch", "none")
    assert deepspeed["master"] == "fp32" and deepspeed["params"] == "fp32" and deepspeed["compute"] == "fp32"
    assert torch_run["summary"]["precision"]["master"] is None  # torch's AdamW updates the weights themselves
    shown = subprocess.run([sys.executable, "-m", "tui.cli", "show", str(torch_run["id"])], cwd=ROOT, text=True,
                           env={**ftui.env, "COLUMNS": "220"}, capture_output=True, check=True).stdout
    assert "DDP + ZeroRedundancyOptimizer" in shown and "optimizer state fp32 · master none" in shown
    # The sharding verdict, then each kind's bytes per rank against the whole (480 KiB of LoRA gradients).
    assert "as promised" in shown and "optimizer sharded 1/2: yes; grads: replicated" in shown
    assert "grads per rank" in shown and "480.0 KiB / 480.0 KiB of 480.0 KiB" in shown


def test_zero3_saves_the_whole_adapter(matrix: Matrix) -> None:
    """ZeRO-3's weights are partitions, gathered onto rank 0 to be saved."""
    from safetensors import safe_open

    saved = Path(_run(matrix, "zero3", "deepspeed", "none")["summary"]["saved"]) / "adapter_model.safetensors"
    with safe_open(str(saved), framework="pt") as fh:
        shapes = {tuple(fh.get_tensor(k).shape) for k in fh.keys()}
    assert shapes == {(8, 384), (384, 8), (128, 8)}, shapes  # LoRA A and B of q/o (384) and k/v (128), none empty


def test_the_deepspeed_config_is_kept_in_the_run_folder(matrix: Matrix) -> None:
    run = _run(matrix, "zero3", "deepspeed", "optimizer+params")
    config = json.loads((Path(run["run_dir"]) / deepspeed_config.DEEPSPEED_FILE).read_text())
    assert config["zero_optimization"]["stage"] == 3
    assert config["zero_optimization"]["offload_param"]["device"] == "cpu"
    assert config["gradient_clipping"] == 1.0 and config["train_micro_batch_size_per_gpu"] == 1
    assert config["gradient_accumulation_steps"] == 2


def test_a_run_whose_sharding_is_not_the_one_asked_for_fails_with_the_reason(ftui: Ftui, tmp_path: Path) -> None:
    """zero2 on torch, with the user's accelerate config saying FSDP2 with resharding (ZeRO-3): accelerate
    reports FSDP as expected, the trainer finds the weights resharded after forward and stops the run."""
    config = tmp_path / "accelerate.yaml"
    config.write_text("\n".join([
        "compute_environment: LOCAL_MACHINE", "distributed_type: FSDP", "num_machines: 1", "machine_rank: 0",
        "num_processes: 2", "main_process_ip: 127.0.0.1", "main_process_port: 29733", "mixed_precision: 'no'",
        "rdzv_backend: static", "same_network: true", "use_cpu: false",
        "fsdp_config:", "  fsdp_version: 2", "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP",
        "  fsdp_state_dict_type: FULL_STATE_DICT", "  fsdp_offload_params: false",
        "  fsdp_cpu_ram_efficient_loading: false", "  fsdp_reshard_after_forward: true", ""]))
    proc = ftui.run("run", str(QUICKSTART), "--strategy", "zero2", "--nproc", "2", "--engine", "torch",
                    "--set", f"launch.accelerate_config={json.dumps(str(config))}", "--set", "train.max_steps=2",
                    "--set", "train.batch_size=2", "--name", "t-zero-mismatch")
    assert proc.returncode == 1, proc.stdout[-2000:]
    run = ftui.show(next(r["id"] for r in ftui.runs() if r["name"] == "t-zero-mismatch"))
    assert run["status"] == "failed"
    assert "asked for zero2 on the torch engine" in run["error"] and "FSDP2 fully_shard" in run["error"]


# ---------------------------------------------------------------------- fast: the recipe rules


@pytest.mark.parametrize(("overrides", "field"), [
    (["launch.strategy='ddp'", "launch.nproc=2", "launch.offload='optimizer'"], "launch.offload"),
    (["launch.strategy='ddp'", "launch.nproc=2", "launch.engine='torch'"], "launch.engine"),
    (["launch.strategy='zero2'", "launch.nproc=2", "launch.engine='torch'", "launch.offload='optimizer'"],
     "launch.offload"),
    (["launch.strategy='zero2'", "launch.nproc=2", "launch.offload='optimizer+params'"], "launch.offload"),
    (["launch.strategy='zero1'", "launch.nproc=2", "train.save_every=5"], "train.save_every"),
    (["launch.strategy='zero3'", "launch.nproc=2", "train.on_nan='skip'"], "train.on_nan"),
])
def test_engine_and_offload_choices_the_table_does_not_hold_are_refused(overrides: list[str], field: str) -> None:
    with pytest.raises(RecipeError) as info:
        load_recipe(QUICKSTART, overrides)
    assert info.value.field == field, str(info.value)


def test_the_launch_names_the_engine_s_config(tmp_path: Path) -> None:
    from runner.spec.launch import accelerate_config, build_launch

    def recipe(*overrides: str) -> Any:
        return load_recipe(QUICKSTART, ["launch.strategy='zero2'", "launch.nproc=2", *overrides])

    spec = build_launch(recipe(), tmp_path, port=29500, cpu_threads=1)
    config = accelerate_config(recipe(), 29500, run_dir=tmp_path)
    assert config["distributed_type"] == "DEEPSPEED" and "mixed_precision" not in config
    assert config["deepspeed_config"]["deepspeed_config_file"] == str(tmp_path / deepspeed_config.DEEPSPEED_FILE)
    written = json.loads(spec.files[deepspeed_config.DEEPSPEED_FILE])
    assert written["zero_optimization"]["stage"] == 2 and "offload_optimizer" not in written["zero_optimization"]
    assert written["gradient_clipping"] == 1.0 and written["train_batch_size"] == 4 * 2

    torch2 = accelerate_config(recipe("launch.engine='torch'"), 29500, run_dir=tmp_path)
    assert torch2["distributed_type"] == "FSDP" and torch2["fsdp_config"]["fsdp_reshard_after_forward"] is False
    torch3 = accelerate_config(recipe("launch.strategy='zero3'", "launch.engine='torch'",
                                      "launch.offload='optimizer+params'"), 29500, run_dir=tmp_path)
    assert torch3["fsdp_config"]["fsdp_reshard_after_forward"] is True
    assert torch3["fsdp_config"]["fsdp_offload_params"] is True
    assert accelerate_config(recipe("launch.strategy='zero1'", "launch.engine='torch'"), 29500,
                             run_dir=tmp_path)["distributed_type"] == "MULTI_GPU"


def test_the_planner_puts_offloaded_bytes_on_the_host_and_shards_by_stage() -> None:
    from runner.planner import breakdown_json, estimate, inputs_from_recipe

    def states(strategy: str, engine: str = "auto", offload: str = "none") -> dict[str, Any]:
        r = load_recipe(QUICKSTART, [f"launch.strategy='{strategy}'", "launch.nproc=2", f"launch.engine='{engine}'",
                                     f"launch.offload='{offload}'"] if strategy != "ddp" else
                        ["launch.strategy='ddp'", "launch.nproc=2"])
        return breakdown_json(estimate(inputs_from_recipe(r)))

    ddp = states("ddp")
    for engine in ("deepspeed", "torch"):
        seq = [ddp["model_states"]] + [states(s, engine)["model_states"] for s in ("zero1", "zero2", "zero3")]
        assert seq == sorted(seq, reverse=True) and seq[-1] < 0.6 * seq[0], (engine, seq)
    offloaded = states("zero3", "deepspeed", "optimizer+params")
    assert offloaded["host_bytes"] > 0 and offloaded["params"] == 0 and offloaded["optimizer"] == 0
    # Offload moves bytes to the host, it does not remove any: device + host is the same model state.
    assert offloaded["model_states"] + offloaded["host_bytes"] == states("zero3", "deepspeed")["model_states"]
    assert offloaded["master"] == 0 and states("zero3", "deepspeed")["master"] == 4 * 61440  # DeepSpeed's fp32 copy


def test_the_cli_takes_engine_and_offload(ftui: Ftui) -> None:
    proc = ftui.run("run", str(QUICKSTART), "--strategy", "zero3", "--nproc", "2", "--engine", "torch",
                    "--offload", "optimizer", "--dry-run")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].count("launch.offload") == 1 and "Traceback" not in proc.stderr
    ok = ftui.run("run", str(QUICKSTART), "--strategy", "zero3", "--nproc", "2", "--engine", "torch",
                  "--offload", "optimizer+params", "--dry-run", "--format", "json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["accelerate_config"].endswith("accelerate.yaml")
