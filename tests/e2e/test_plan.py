"""``ftui plan`` end to end with the fewest launches that prove it: a plan of single and DDP x2 cut short by
its budget after its first trial, then the same command again, which races only the trial it lacks; then a
budget shorter than a measured trial, refused in one line before anything runs; then the single candidate
committed, continuing from its trial's checkpoint. Three real trainings of quickstart in all (the two trials:
the first 4 steps of the matrix's 5-step schedule, two metered, one steady, the last profiled; the commit: step
5), checked against the shared matrix's single run of the same recipe, uninterrupted."""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path
from typing import Any

import pytest

from runner.service import plan, plan_commit
from runner.spec import checkpoint as ck
from store import Store
from tests.support import QUICKSTART, new_home
from tests.support.matrix import COMMON, Matrix

TRIAL_STEPS = 4
"""Steps of each trial: the first 4 of the matrix's 5 (:data:`tests.support.matrix.STEPS`)."""
STRATEGIES = ["single", "ddp"]
PLAN = ["plan", str(QUICKSTART), "--nproc", "2", "--strategies", ",".join(STRATEGIES), "--steps", str(TRIAL_STEPS),
        *[a for s in COMMON for a in ("--set", s)]]


def _by_label(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["label"]: c for c in report["candidates"]}


def test_a_plan_cut_by_its_budget_continues_where_it_stopped(tmp_path: Path, matrix: Matrix,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    ftui = new_home(tmp_path)
    # 3 seconds: the first trial starts (nothing measured yet), the second would run past the budget.
    first = ftui.run(*PLAN, "--budget", "0.05", "--format", "json", check=True)
    cut = json.loads(first.stdout)
    single, ddp = _by_label(cut)["single"], _by_label(cut)["ddp x2"]
    assert single["status"] == "completed" and len(single["run_ids"]) == 1, first.stderr
    assert (ddp["status"], ddp["reason"], ddp["run_ids"]) == ("not raced", "over the --budget", [])

    again = ftui.run(*PLAN, "--format", "json", check=True)
    assert "1 trial(s) already stored, continuing" in " ".join(again.stderr.split())
    report = json.loads(again.stdout)
    assert report["plan_id"] == cut["plan_id"]
    found = _by_label(report)
    assert found["single"]["run_ids"] == single["run_ids"]  # not raced again
    assert found["ddp x2"]["status"] == "completed" and found["ddp x2"]["micro_batch"] == 1
    for entry in found.values():  # what the JSON promises of every raced candidate
        tps, mem, first_step = entry["tokens_per_s"], entry["peak_memory"], entry["time_to_first_step_s"]
        assert tps["n"] == 1 and tps["median"] > 0 and tps["low"] == tps["high"] == tps["median"]
        assert mem["estimated_bytes"] > 0 and mem["measured_bytes"] > 0
        assert abs(mem["measured_bytes"] - mem["estimated_bytes"]) / mem["measured_bytes"] < 0.2
        assert 0 < first_step["median"] < 600 and entry["fit"] == "fits"
        assert entry["utilisation"]["mean_pct"] is not None
        split = entry["time_split"]  # where the profiled step went, shares of the step over the ranks
        assert sum(split[f"{k}_share"] for k in ("compute", "comm", "data", "other")) == pytest.approx(1, abs=1e-3)
        assert split["ranks"] == entry["nproc"] and (split["comm_share"] > 0) == (entry["nproc"] > 1)
        assert "communication or waiting on another rank" in entry["time_split_text"]
    # the performance model, fitted on the two trials: each raced one predicted by a fit without its own trial
    model = report["performance_model"]
    assert model["fitted_on"] == ["ddp x2", "single"] and set(model["compute_s_per_token"]) == {"1", "2"}
    single_pred, ddp_pred = found["single"]["predicted"], found["ddp x2"]["predicted"]
    assert single_pred["held_out"] and single_pred["tokens_per_s"] > 0 and "scaled by 1/2" in single_pred["source"]
    assert single_pred["error_pct"] == pytest.approx(
        (single_pred["tokens_per_s"] - found["single"]["tokens_per_s"]["median"])
        / found["single"]["tokens_per_s"]["median"] * 100, abs=0.2)
    # without DDP's trial no collective was measured: no prediction, and the error's source says why
    assert ddp_pred["tokens_per_s"] is None and ddp_pred["error_pct"] is None
    assert "no collective measured" in ddp_pred["error_source"] and ddp_pred["fitted_tokens_per_s"] > 0
    # not raced: DDP over 4 processes (2 a core), each at twice its micro-batch (single takes one process only)
    doubled = {label: 2 * found[label]["micro_batch"] for label in ("single", "ddp x2")}
    assert sorted((w["label"], w["change"].split(",")[0]) for w in model["not_raced"]) == [
        ("ddp x2", f"micro-batch {doubled['ddp x2']} and accumulation kept"), ("ddp x4", "4 processes"),
        ("single", f"micro-batch {doubled['single']} and accumulation kept")]
    decision = report["decision"]  # one trial each, no spread measured: never a winner on one run each
    assert decision["kind"] in ("unknown", "tie") and decision["winner_run_id"] is None
    assert set(decision["ties"]) == {"single", "ddp x2"}

    store = Store(ftui.db)
    trials = store.list_runs(sweep_id=report["plan_id"])
    assert sorted(r.id for r in trials) == sorted(found["single"]["run_ids"] + found["ddp x2"]["run_ids"])
    assert all(r.status == "completed" and r.steps_done == 4 for r in trials)
    assert {r.summary.sweep_note for r in trials} == {"micro-batch 2 x 1 process",
                                                      "micro-batch 2/2 = 1 x 2 processes (global batch 4 kept)"}

    # The plan is whole: the same command with --commit races nothing and, without a winner, launches nothing.
    commit = ftui.run(*PLAN, "--commit")
    assert commit.returncode == 1, commit.stdout + commit.stderr
    assert "--commit: the plan names no winner, so nothing is launched (" in " ".join(commit.stdout.split())
    assert len(store.list_runs()) == 2

    short = ftui.run(*PLAN, "--repeat", "2", "--budget", "0.05")
    assert short.returncode == 2 and short.stdout == ""
    assert short.stderr.startswith("ftui: --budget: 0.05 minutes is less than one trial (")
    assert len(short.stderr.strip().splitlines()) == 1
    assert len(store.list_runs(sweep_id=report["plan_id"])) == 2  # nothing started, nothing lost

    _commit_continues_the_trial(ftui, store, report["plan_id"], found["single"]["run_ids"][0], matrix, monkeypatch)


def _commit_continues_the_trial(ftui: Any, store: Store, pid: str, trial_id: int, matrix: Matrix,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The single candidate committed as ``--commit`` commits a winner (the plan's tie names none), through
    this host's queue: it resumes from its trial's checkpoint of step 4 and trains step 5, whose loss is the
    uninterrupted run's; the trial's own steps are that run's first four (the same lr schedule)."""
    trial = store.get_run(trial_id)
    assert trial is not None and trial.total_steps == TRIAL_STEPS
    folders = ck.complete_checkpoints(Path(trial.run_dir))  # one, of its last step: a LoRA adapter's
    assert [f.name for f in folders] == [ck.checkpoint_dir(Path(trial.run_dir), TRIAL_STEPS).name]
    assert (ck.read_manifest(folders[0]) or {})["bytes"] < 4 * (trial.summary.params or 0) / 10  # not the model

    for name, value in (("FTUI_HOME", str(ftui.home)), ("FTUI_DB", ftui.db), ("FTUI_QUEUE_POLL_S", "0.2")):
        monkeypatch.setenv(name, value)  # the queue runner the commit starts, and its run, see this home
    setup = plan.setup(QUICKSTART, COMMON, STRATEGIES, 2, steps=TRIAL_STEPS)
    assert setup.pid == pid
    single = next(c for c in setup.candidates if c.label == "single")
    queued = plan_commit.enqueue_commit(store, QUICKSTART, setup, single, COMMON)
    assert queued.entry.position == 1 and queued.entry.runner_pid is not None
    lines: list[str] = []
    steps: list[int] = []
    bound = threading.Timer(600, (stop := threading.Event()).set)  # a bound for a loaded machine, not a wait
    bound.start()
    try:
        result = plan_commit.follow_commit(store, queued, on_start=lambda item, run_id: lines.append(item.note),
                                           on_event=lambda e: steps.extend([e["step"]] if e["type"] == "step" else []),
                                           stop=stop, poll_s=0.1)
    finally:
        bound.cancel()
    assert lines == [f"the winner of plan {pid}; continues from trial run {trial_id}'s checkpoint at step 4"]
    assert (result.status, steps) == ("completed", [5]), result.reason
    assert result.run_id is not None
    committed = store.get_run(result.run_id)
    assert committed is not None and committed.resumed_from == trial_id and committed.sweep_id is None
    assert committed.summary.committed_by_plan == pid and committed.summary.continued_from_trial == trial_id
    assert committed.summary.resumed_from == {"run_id": trial_id, "checkpoint": str(folders[0]), "step": 4}

    uninterrupted = {m["step"]: m for m in matrix["single"].metrics}
    for shown, expected in ((ftui.show(trial_id), [1, 2, 3, 4]), (ftui.show(committed.id), [5])):
        assert [m["step"] for m in shown["metrics"]] == expected
        for m in shown["metrics"]:
            ref = uninterrupted[m["step"]]
            assert math.isclose(m["lr"], ref["lr"], rel_tol=1e-9), (m, ref)
            assert abs(m["loss"] - ref["loss"]) < 1e-6, (m, ref)
