"""Pipeline (``pp``), naive model parallel over processes (``mp``) and tensor parallel (``tp``): the recipe
rules, the launch, the sweep's batch rule, the planner; and real training on CPU over gloo (the shared
matrix's runs), whose losses match DDP at the same global batch. Hybrid sharding (``hsdp``) against DDP over
4 processes (its rules without training: tests/unit/test_hsdp.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from runner.analysis.shard_verdict import shard_verdict
from runner.planner import estimate, inputs_from_recipe, resolve_model_shape
from runner.service.sweep import plan
from runner.spec import strategies
from runner.spec.launch import accelerate_config
from runner.spec.layout import microbatches, stage_bounds
from runner.spec.recipe import RecipeError, load_recipe
from runner.spec.summary import RunSummary
from tests.support import QUICKSTART, Ftui
from tests.support.matrix import STEPS, Matrix, sweep_id
from tui.render.report import estimate_vs_measured

# fp32 on CPU, the same rows per optimizer step: DDP and the pipeline differ only in summation order
# (measured: <= 2e-6 over 10 steps); tensor parallel also splits each matmul's sum over two processes.
LOSS_TOLERANCE = 1e-4


def _recipe(*sets: str) -> Any:
    return load_recipe(QUICKSTART, list(sets))


# ---------------------------------------------------------------------- recipe rules (fast)


@pytest.mark.parametrize(("sets", "expected"), [
    (["launch.strategy=pp", "launch.nproc=2", "launch.microbatches=3"],
     "launch.microbatches: 3 does not divide train.batch_size 4"),
    (["launch.strategy=pp", "launch.nproc=4", "launch.microbatches=2"],
     "launch.microbatches: 1F1B needs at least as many micro-batches as stages (2 < 4)"),
    (["launch.strategy=mp", "launch.nproc=2", "launch.microbatches=4"],
     "launch.microbatches: mp over 2 processes is naive model parallel, one micro-batch (got 4)"),
    (["launch.strategy=tp", "launch.nproc=2", "launch.tp_size=1"],
     "launch.tp_size: 1 must be at least 2 and divide nproc = 2"),
    (["launch.strategy=tp", "launch.nproc=4", "launch.tp_size=3"],
     "launch.tp_size: 3 must be at least 2 and divide nproc = 4"),
    (["launch.strategy=pp", "launch.nproc=2", "train.save_every=5"],
     "train.save_every: pp writes no checkpoints yet"),
    (["launch.strategy=tp", "launch.nproc=2", 'train.resume_from="/x/step-00000005"'],
     "train.resume_from: tp writes no checkpoints yet (runner/rank/pipeline.py), so it cannot resume"),
    (["launch.strategy=pp", "launch.nproc=1"], "launch.nproc: strategy 'pp' needs at least 2 processes"),
])
def test_layout_mistakes_are_one_line_naming_the_field(sets: list[str], expected: str) -> None:
    with pytest.raises(RecipeError) as info:
        _recipe(*sets)
    assert expected in str(info.value)
    assert "\n" not in str(info.value)


def test_microbatches_default_and_fixed() -> None:
    assert microbatches(_recipe("launch.strategy=pp", "launch.nproc=2")) == 4  # one row each
    assert microbatches(_recipe("launch.strategy=pp", "launch.nproc=2", "launch.microbatches=2")) == 2
    assert microbatches(_recipe("launch.strategy=mp", "launch.nproc=2")) == 1  # naive: one micro-batch
    # GPipe may run fewer micro-batches than stages; mp over processes is always one.
    _recipe("launch.strategy=pp", "launch.nproc=4", "launch.microbatches=2", 'launch.pp_schedule="gpipe"')


def test_stage_bounds_cover_every_layer_once() -> None:
    assert stage_bounds(6, 2) == [(0, 3), (3, 6)]
    assert stage_bounds(7, 3) == [(0, 3), (3, 5), (5, 7)]
    for layers in range(1, 12):
        for stages in range(1, layers + 1):
            bounds = stage_bounds(layers, stages)
            assert [i for lo, hi in bounds for i in range(lo, hi)] == list(range(layers))
            assert max(hi - lo for lo, hi in bounds) - min(hi - lo for lo, hi in bounds) <= 1


def test_the_table_says_which_runs_are_pipelines() -> None:
    mp, pp, tp, ddp = (strategies.get(s) for s in ("mp", "pp", "tp", "ddp"))
    assert not mp.pipelined(1) and mp.pipelined(2) and pp.pipelined(2)
    assert tp.tensor_parallel and not tp.pipelined(2) and not ddp.own_loop
    assert mp.procs(None, 2) == 1 and mp.procs(2, 2) == 2  # mp alone is one process over the GPUs
    assert {"pp", "tp"} <= set(strategies.names(launchable=True))


def test_pipelines_and_tp_launch_one_process_each_and_mp_alone_is_one_process() -> None:
    for sets, expected in (
        (["launch.strategy=pp", "launch.nproc=2"], "MULTI_GPU"),
        (["launch.strategy=mp", "launch.nproc=2"], "MULTI_GPU"),
        (["launch.strategy=tp", "launch.nproc=2"], "MULTI_GPU"),
        (["launch.strategy=mp"], "NO"),
    ):
        config = accelerate_config(_recipe(*sets), 29500)
        assert config["distributed_type"] == expected, sets


def test_the_sweep_keeps_the_batch_of_strategies_whose_processes_share_it(tmp_path: Path) -> None:
    items = {i.strategy: i for i in plan(QUICKSTART, ["single", "mp", "pp", "ddp", "tp", "zero1"], 2, [], [])}
    for name in ("mp", "pp", "tp"):
        assert items[name].nproc == 2 and not any(o.startswith("train.batch_size") for o in items[name].overrides)
        assert "global batch 4 kept" in items[name].note
    assert "train.batch_size=2" in items["ddp"].overrides
    assert items["single"].nproc == 1


def test_the_planner_splits_pp_by_stages_and_tp_by_shards() -> None:
    shape = resolve_model_shape("builtin:tiny-llama", allow_network=False).shape

    def total(*sets: str) -> Any:
        return estimate(inputs_from_recipe(_recipe("method.type=\"full\"", *sets), shape=shape))

    single = total()
    pp = total("launch.strategy=pp", "launch.nproc=2", 'launch.pp_schedule="gpipe"')
    pp_1f1b = total("launch.strategy=pp", "launch.nproc=2", "launch.microbatches=4")
    tp = total("launch.strategy=tp", "launch.nproc=2")
    assert pp.params < single.params and tp.params < single.params
    assert pp.optimizer < single.optimizer and tp.optimizer < single.optimizer
    # 1F1B keeps at most one micro-batch per stage in flight: 2 of 4, GPipe all 4.
    assert pp_1f1b.activations_stored < pp.activations_stored
    assert all(t.total > 0 for t in (single, pp, pp_1f1b, tp))
    # Two tensor-parallel groups of 2: each device holds what a group of 2 holds, whatever the replicas.
    tp_dp = total("launch.strategy=tp", "launch.nproc=4", "launch.tp_size=2")
    assert (tp_dp.params, tp_dp.optimizer) == (tp.params, tp.optimizer)


def test_tensor_parallel_groups_are_data_parallel_replicas_in_the_global_batch() -> None:
    assert strategies.global_batch("tp", 2, 1, 4, 2) == 4  # 2 groups of 2 processes, 2 rows each
    assert strategies.global_batch("tp", 2, 1, 4) == 2  # one group of 4: one batch
    assert strategies.global_batch("ddp", 2, 1, 4, 2) == 8  # tp_size means nothing to other strategies


# ---------------------------------------------------------------------- real training

# The matrix's runs: the sweep's pp (1F1B, one row per micro-batch), mp and tp over 2 processes, and the
# extra runs under GPipe and with two tensor-parallel groups as data-parallel replicas.
LAYOUTS = {"pp": 2, "pp-gpipe": 2, "mp": 2, "tp": 2, "tp-dp": 4}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_each_layout_trains_and_matches_ddp(matrix: Matrix, name: str) -> None:
    run, ddp = matrix[name], matrix["ddp"]
    nproc = LAYOUTS[name]
    assert run["status"] == "completed" and run["nproc"] == nproc
    kind = "TENSOR_PARALLEL" if name.startswith("tp") else "PIPELINE"
    assert run["distributed_type"] == kind  # what the trainer had in effect, not accelerate's DDP
    losses = run.losses
    assert [m["step"] for m in run.metrics] == list(range(1, STEPS + 1))
    assert losses == pytest.approx(ddp.losses, abs=LOSS_TOLERANCE)
    summary = run.summary
    assert len(summary["ranks"]) == nproc and all(r["param_bytes"] > 0 for r in summary["ranks"])
    assert summary["tokens_per_s"] > 0 and summary["final_loss"] == pytest.approx(losses[-1])
    # The same rows per step as DDP's (tokens counted once per replica, not once per process).
    assert [m["tokens"] for m in run.metrics] == [m["tokens"] for m in ddp.metrics]
    parallel = summary["parallel"]
    if name.startswith("tp"):
        assert parallel["tp_size"] == 2 and "q_proj" in parallel["split"] and "down_proj" in parallel["split"]
        assert parallel["data_parallel"] == nproc // 2
        # Each process holds half of every split matrix: fewer elements than the whole model.
        assert summary["local_param_numel"] < summary["params"]
    else:
        assert parallel["stages"] == 2 and parallel["stage_layers"] == [[0, 3], [3, 6]]
        # A micro-batch of 2 rows: one row per pipeline micro-batch by default; mp is one micro-batch.
        expected = {"pp-gpipe": (2, "GPipe"), "pp": (2, "1F1B"), "mp": (1, "GPipe")}[name]
        assert (parallel["microbatches"], parallel["schedule"]) == expected
        # Each stage holds its own layers: the two ranks' parameters add up to the model.
        assert sum(r["param_bytes"] for r in summary["ranks"]) == pytest.approx(summary["params"] * 4, rel=0.01)
    # The sharding verdict (runner/analysis/shard_verdict.py): what each rank holds against the whole it measured.
    verdict = shard_verdict(run["strategy"], summary["ranks"], parallel)
    assert verdict.ok is True and verdict.short() == "as promised", verdict.line()
    assert {c.kind: c.promise for c in verdict.checks} == dict.fromkeys(
        ("optimizer", "grads", "params"), "slices" if name.startswith("tp") else "layers")
    assert all(c.n == 2 for c in verdict.checks)  # tp-dp: slices over its groups of 2, not over its 4 ranks


def test_the_saved_adapter_is_whole(matrix: Matrix) -> None:
    from safetensors.torch import load_file

    ddp = load_file(str(Path(matrix["ddp"].summary["saved"]) / "adapter_model.safetensors"))
    for name in ("pp", "tp"):
        saved = load_file(str(Path(matrix[name].summary["saved"]) / "adapter_model.safetensors"))
        assert set(saved) == set(ddp)  # every stage's (every shard's) adapter tensors, gathered
        assert all(saved[k].shape == ddp[k].shape for k in ddp)
        assert max(float((saved[k] - ddp[k]).abs().max()) for k in ddp) < 1e-4


def test_the_start_event_says_what_is_in_effect(matrix: Matrix) -> None:
    events = [json.loads(line) for line in (matrix["pp-gpipe"].run_dir / "events.jsonl").read_text().splitlines()]
    assert {e["phase"] for e in events if e["type"] == "phase"} >= {"tokenizing", "loading_model", "preparing"}
    events = [e for e in events if e["type"] != "phase"]  # what the run did before step 1, then the start
    assert events[0]["type"] == "start" and events[-1]["type"] == "end"
    assert events[0]["distributed_type"] == "PIPELINE" and events[0]["parallel"]["schedule"] == "GPipe"
    assert {"step", "memory"} <= {e["type"] for e in events}
    assert events[0]["device_map"]["lm_head"] == "rank1"


def test_hsdp_2x2_trains_over_gloo_as_ddp_x4_does(ftui: Ftui) -> None:
    """Hybrid sharding on CPU: one ``ftui sweep`` of ddp and hsdp over 4 processes at one global batch (1 row
    x 2 micro-steps each: the non-final micro-step's no_sync, under HSDP both the reduce-scatter and the
    all-reduce). FSDP2 runs on the 2-D mesh over gloo, the rank records the mesh from its weights'
    placements, the losses are DDP's, each rank holds half the weights, the estimate's model states are the
    measured ones, and the sweep's table names the mesh. 3 steps of 32 tokens: the fewest that show it."""
    proc = ftui.run("sweep", str(QUICKSTART), "--strategies", "ddp,hsdp", "--nproc", "4", "--force",
                    "--set", "train.max_steps=3", "--set", "data.context_length=32", "--set", "train.grad_accum=2",
                    "--format", "md", timeout=900)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert "| hsdp 2x2 |" in proc.stdout and "| ddp |" in proc.stdout  # the comparison's strategy column
    compared = json.loads(ftui.call("compare", "--sweep", sweep_id(proc.stdout + proc.stderr), "--format", "json",
                                    check=True).stdout)
    ids = {r["strategy"]: r["run_id"] for r in compared["runs"]}
    hsdp, ddp = ftui.show(ids["hsdp"]), ftui.show(ids["ddp"])
    assert hsdp["status"] == ddp["status"] == "completed" and hsdp["nproc"] == ddp["nproc"] == 4
    assert hsdp["distributed_type"] == "FSDP"
    sharding = hsdp["summary"]["sharding"]
    assert (sharding["mesh"]["replicate"], sharding["mesh"]["shard"], sharding["mesh"]["placements"]) == \
        (2, 2, ["R", "S(0)"])
    assert sharding["how"] == "FSDP2 fully_shard on a 2-D mesh: replicate 2 x shard 2"
    assert [m["loss"] for m in hsdp["metrics"]] == pytest.approx([m["loss"] for m in ddp["metrics"]],
                                                                 abs=LOSS_TOLERANCE)
    assert [m["tokens"] for m in hsdp["metrics"]] == [m["tokens"] for m in ddp["metrics"]]
    # Each rank holds its shard group's half of the weights (the other group holds the same halves).
    for rank in hsdp["summary"]["ranks"]:
        assert rank["param_bytes"] == pytest.approx(ddp["summary"]["ranks"][0]["param_bytes"] / 2, rel=0.01)
    # The sharding verdict: 1/2 over each group of 2, not 1/4 over the 4 ranks (runner/analysis/shard_verdict.py).
    verdict = shard_verdict("hsdp", hsdp["summary"]["ranks"], None, sharding)
    assert verdict.line() == "optimizer sharded 1/2: yes; grads sharded 1/2: yes; params sharded 1/2: yes"
    assert "as promised" in next(r["sharding"] for r in compared["runs"] if r["strategy"] == "hsdp")
    rows = {kind: (est, meas, err) for kind, est, meas, err
            in estimate_vs_measured(RunSummary.from_json(hsdp["summary"]))}
    states = ("params", "grads", "optimizer state")
    print({k: rows[k] for k in ("peak", *states)})
    assert sum(rows[k][0] for k in states) == pytest.approx(sum(rows[k][1] or 0 for k in states), rel=0.02), rows


def test_a_pipeline_stops_on_sigterm_on_every_stage(ftui: Ftui) -> None:
    import signal
    import subprocess
    import sys
    import time

    from tests.support import ROOT

    proc = subprocess.Popen([sys.executable, "-m", "tui.cli", "run", str(QUICKSTART), "--strategy", "pp", "--nproc",
                             "2", "--set", "train.max_steps=500", "--set", "data.context_length=64",
                             "--sample-interval", "0", "--name", "par-stop"],
                            env=ftui.env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 300
        events: list[dict[str, Any]] = []
        while time.monotonic() < deadline and not any(e["type"] == "step" for e in events):
            time.sleep(0.2)
            folders = list((ftui.home / "runs").glob("*-par-stop/events.jsonl"))
            if folders:
                events = [json.loads(line) for line in folders[0].read_text().splitlines() if line.strip()]
        assert any(e["type"] == "step" for e in events), "no step within 300 s"
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out[-2000:]
    run = next(r for r in ftui.runs() if r["name"] == "par-stop")
    shown = ftui.show(run["id"])
    assert shown["status"] == "stopped" and 0 < shown["summary"]["steps"] < 500
    assert "no process of the run left" in out
