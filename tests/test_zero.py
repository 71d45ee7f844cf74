"""The ZeRO stages on both engines: real ranks over gloo, real training of quickstart, real SQLite.

The full matrix of stages and offloads runs on DeepSpeed, a smaller one on PyTorch alone (docs/zero.md);
each run is a few steps at the global batch of the shared DDP run (2 ranks x 2 rows), which it is
compared with step by step.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import QUICKSTART, STEPS, Ftui

from runner import strategies, zero
from runner.recipe import RecipeError, load_recipe
from runner.summary import model_state_bytes

# fp32 on CPU, the same rows per optimizer step, the same AdamW: DeepSpeed and FSDP reduce gradients in
# another order than DDP, so the sums differ in the last bits (measured differences ~1e-6).
LOSS_TOLERANCE = 1e-4
# Measured model-state bytes per rank (parameters, gradients, optimizer state, fp32 master, on the device
# and offloaded) against the planner's estimate.
MODEL_STATE_TOLERANCE = 0.02

# (strategy, engine, offload): every stage and offload on DeepSpeed, each stage and the offload on torch.
MATRIX = [
    ("zero1", "deepspeed", "none"),
    ("zero1", "deepspeed", "optimizer"),
    ("zero2", "deepspeed", "optimizer"),
    ("zero3", "deepspeed", "none"),
    ("zero3", "deepspeed", "optimizer+params"),
    ("zero1", "torch", "none"),
    ("zero2", "torch", "none"),
    ("zero3", "torch", "optimizer+params"),
]


def _key(strategy: str, engine: str, offload: str) -> str:
    return f"{strategy}-{engine}-{offload.replace('+', '-')}"


@pytest.fixture(scope="module")
def zero_runs(ftui: Ftui, strategy_runs: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each configuration of :data:`MATRIX`, trained as the shared DDP run is (2 ranks x 2 rows, STEPS steps)."""
    results: dict[str, dict[str, Any]] = {}
    for strategy, engine, offload in MATRIX:
        name = "t-" + _key(strategy, engine, offload)
        proc = ftui.run("run", str(QUICKSTART), "--strategy", strategy, "--nproc", "2", "--engine", engine,
                        "--offload", offload, "--set", "train.batch_size=2", "--set", f"train.max_steps={STEPS}",
                        "--set", "train.save=false", "--name", name)
        assert proc.returncode == 0, f"{name}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        run = next(r for r in ftui.runs() if r["name"] == name)
        results[_key(strategy, engine, offload)] = ftui.show(run["id"])
    return results


@pytest.mark.slow
@pytest.mark.parametrize(("strategy", "engine", "offload"), MATRIX)
def test_the_engine_and_sharding_asked_for_are_in_effect(zero_runs: dict[str, Any], strategy: str, engine: str,
                                                          offload: str) -> None:
    run = zero_runs[_key(strategy, engine, offload)]
    row = strategies.resolve(strategy, engine)
    assert run["status"] == "completed"
    assert run["distributed_type"] in row.expect
    sharding = run["summary"]["sharding"]
    assert (sharding["engine"], sharding["stage"], sharding["offload"]) == (engine, int(strategy[-1]), offload)
    assert run["summary"]["engine"] == engine


@pytest.mark.slow
@pytest.mark.parametrize(("strategy", "engine", "offload"), MATRIX)
def test_losses_match_ddp_at_the_same_global_batch(zero_runs: dict[str, Any], strategy_runs: dict[str, Any],
                                                   strategy: str, engine: str, offload: str) -> None:
    ddp = [m["loss"] for m in strategy_runs["ddp"]["metrics"]]
    mine = [m["loss"] for m in zero_runs[_key(strategy, engine, offload)]["metrics"]]
    assert len(mine) == len(ddp) == STEPS
    assert mine == pytest.approx(ddp, abs=LOSS_TOLERANCE)


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["deepspeed", "torch"])
def test_model_state_bytes_per_rank_fall_as_the_stage_rises_as_the_planner_predicts(
        zero_runs: dict[str, Any], strategy_runs: dict[str, Any], engine: str) -> None:
    runs = [("ddp", strategy_runs["ddp"])] + [
        (s, zero_runs[_key(s, e, o)]) for s, e, o in MATRIX if e == engine and o == "none"]
    runs += [(s, zero_runs[_key(s, e, o)]) for s, e, o in MATRIX if e == engine and o != "none" and s == "zero3"]
    measured, estimated = [], []
    for _, run in runs:
        per_device = run["summary"]["estimate"]["per_device_bytes"]
        planned = per_device["model_states"] + per_device.get("host_bytes", 0)
        for rank in run["summary"]["ranks"]:
            assert model_state_bytes(rank) == pytest.approx(planned, rel=MODEL_STATE_TOLERANCE), (run["name"], rank)
        measured.append(max(model_state_bytes(r) for r in run["summary"]["ranks"]))
        estimated.append(planned)
    # Non-increasing from DDP to ZeRO-3, and ZeRO-3 holds about half of DDP's (2 ranks, the frozen base sharded).
    assert measured == sorted(measured, reverse=True), measured
    assert estimated == sorted(estimated, reverse=True), estimated
    assert measured[-2] < 0.6 * measured[0]


@pytest.mark.slow
def test_the_precision_in_effect_is_measured_and_shown(ftui: Ftui, zero_runs: dict[str, Any]) -> None:
    deepspeed = zero_runs[_key("zero1", "deepspeed", "none")]["summary"]["precision"]
    torch_run = zero_runs[_key("zero1", "torch", "none")]
    assert deepspeed["master"] == "fp32" and deepspeed["params"] == "fp32" and deepspeed["compute"] == "fp32"
    assert torch_run["summary"]["precision"]["master"] is None  # torch's AdamW updates the weights themselves
    text = ftui.run("show", str(torch_run["id"]), check=True).stdout
    assert "ZeroRedundancyOptimizer" in text and "optimizer state fp32" in text


@pytest.mark.slow
def test_the_deepspeed_config_is_kept_in_the_run_folder(zero_runs: dict[str, Any]) -> None:
    run = zero_runs[_key("zero3", "deepspeed", "optimizer+params")]
    config = json.loads((Path(run["run_dir"]) / zero.DEEPSPEED_FILE).read_text())
    assert config["zero_optimization"]["stage"] == 3
    assert config["zero_optimization"]["offload_param"]["device"] == "cpu"
    assert config["gradient_clipping"] == 1.0 and config["train_micro_batch_size_per_gpu"] == 2


@pytest.mark.slow
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
