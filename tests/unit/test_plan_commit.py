"""Where ``ftui plan --commit`` starts the winner: from its trial's checkpoint when the recipe allows, else at
step 0 with the one reason (:func:`runner.service.plan_commit.continuation`). The trials' checkpoints are real
folders sealed and signed as a rank seals them, in this test's own ftui home; nothing is trained."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from runner.service import plan
from runner.service.plan_commit import Continuation, continuation
from runner.spec import checkpoint as ck
from runner.spec import layout
from runner.spec.recipe import Recipe, load_recipe
from store import RunInfo
from tests.support import QUICKSTART, run_info

SETS = ["data.context_length=64"]
STEPS = 4
"""The trial's steps, of the recipe's 30."""
DATA = "the data's hash"


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FTUI_HOME", str(tmp_path / "home"))  # the key the checkpoints are signed with


def _candidates() -> dict[str, plan.Candidate]:
    base = load_recipe(QUICKSTART, SETS)
    found = plan.search_space(base, ["single", "ddp", "pp"], 2, lambda more: load_recipe(QUICKSTART, [*SETS, *more]),
                              lambda r: None, plan.Memory(2**40, True, "test"), lambda n: None, True)
    return {c.label: c for c in found}


def _recipes(c: plan.Candidate, more: Sequence[str] = ()) -> tuple[Recipe, Recipe]:
    """The committed run's recipe and its trial's (``more`` on top of the trial's)."""
    run = load_recipe(QUICKSTART, [*SETS, *c.overrides])
    trial = load_recipe(QUICKSTART, [*SETS, *c.overrides, *plan.trial_sets(c, STEPS, run.train.max_steps), *more])
    return run, trial


def _trial(tmp_path: Path, run_id: int, trial: Recipe, status: str = "completed", **manifest: Any) -> RunInfo:
    """A trial run of ``trial`` with the checkpoint of its last step, sealed as a rank seals it; ``manifest``'s
    keys replace the manifest's (``data`` merged)."""
    run_dir = tmp_path / f"run-{run_id}"
    folder = ck.checkpoint_dir(run_dir, STEPS)
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"adapter" * 10)
    (folder / "random_states_0.pkl").write_bytes(b"rng")
    data = {"rows": 400, "rows_per_step": layout.rows_per_step(trial), "steps_per_epoch": 100,
            "total_steps": trial.train.max_steps, "step_in_epoch": STEPS, "seed": trial.train.seed,
            "shuffle": trial.data.shuffle, "fingerprint": DATA} | manifest.pop("data", {})
    made = {"format": ck.FORMAT, "step": STEPS, "epoch": 0, "tokens_done": 1024, "data": data,
            "recipe_digest": trial.digest(), "world_size": trial.launch.nproc, "strategy": trial.launch.strategy,
            "method": "lora", "reason": "every", "complete": False} | manifest
    ck.write_manifest(folder, ck.seal(folder, made))
    return dataclasses.replace(run_info(run_id, trial.launch.strategy, trial.launch.nproc, 100.0, status=status),
                               run_dir=str(run_dir), steps_done=STEPS)


def _decide(c: plan.Candidate, trials: Sequence[RunInfo], run: Recipe, trial: Recipe) -> Continuation:
    return continuation(c, trials, run, _recipes(c)[1].digest(), data_digest=lambda source: DATA)


def test_the_winner_continues_from_its_newest_completed_trials_checkpoint(tmp_path: Path) -> None:
    c = _candidates()["ddp x2"]
    run, trial = _recipes(c)
    older = _trial(tmp_path, 3, trial)
    newest = _trial(tmp_path, 5, trial)
    failed = _trial(tmp_path, 7, trial, status="failed")
    found = _decide(c, [older, newest, failed], run, trial)
    assert found == Continuation(ck.checkpoint_dir(Path(newest.run_dir), STEPS), 5, STEPS)
    assert found.line == "continues from trial run 5's checkpoint at step 4"
    assert found.overrides() == [f"train.resume_from={found.checkpoint}"]


def _over(found: Continuation) -> str:
    assert found.checkpoint is None and found.trial is None and "\n" not in found.why
    assert found.line == f"starts at step 0: {found.why}"
    return found.why


def test_a_strategy_without_checkpoints_starts_over(tmp_path: Path) -> None:
    c = _candidates()["pp x2"]
    run, trial = _recipes(c)
    assert _over(_decide(c, [], run, trial)) == "pp x2 writes no checkpoint a run can resume from"


def test_a_winner_whose_trial_did_not_complete_starts_over(tmp_path: Path) -> None:
    c = _candidates()["single"]
    run, trial = _recipes(c)
    assert _over(_decide(c, [], run, trial)) == "the winner has no trial"
    stopped = _trial(tmp_path, 2, trial, status="stopped")
    assert _over(_decide(c, [stopped], run, trial)) == "no trial of the winner completed"


def test_a_missing_or_broken_checkpoint_starts_over(tmp_path: Path) -> None:
    c = _candidates()["single"]
    run, trial = _recipes(c)
    nothing = dataclasses.replace(run_info(1, "single", 1, 100.0), run_dir=str(tmp_path / "empty"), steps_done=STEPS)
    assert _over(_decide(c, [nothing], run, trial)) == "the trial's checkpoint is missing (run 1)"
    unsaved = dataclasses.replace(nothing, run_dir="")  # a trial refused before its folder was made
    assert _over(_decide(c, [unsaved], run, trial)) == "the trial's checkpoint is missing (run 1)"
    damaged = _trial(tmp_path, 2, trial)
    (ck.checkpoint_dir(Path(damaged.run_dir), STEPS) / "model.safetensors").write_bytes(b"ADAPTER" * 10)
    assert _over(_decide(c, [damaged], run, trial)) == (
        "the trial's checkpoint is not whole (run 2): damaged checkpoint (model.safetensors's content is not "
        "what was written: its hash differs)")
    cut = _trial(tmp_path, 3, trial)
    folder = ck.checkpoint_dir(Path(cut.run_dir), STEPS)
    ck.write_manifest(folder, {**(ck.read_manifest(folder) or {}), "complete": False})
    assert _over(_decide(c, [cut], run, trial)) == (
        "the trial's checkpoint is not whole (run 3): incomplete checkpoint (its save did not finish)")


def test_a_checkpoint_of_another_shape_or_data_starts_over(tmp_path: Path) -> None:
    c = _candidates()["ddp x2"]
    run, trial = _recipes(c)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"world_size": 1, "strategy": "single"}, "the trial ran single on 1 process(es), the run is ddp on 2"),
        ({"data": {"rows_per_step": 8}}, "the trial's global batch (8 rows per step) is not the run's (4)"),
        ({"data": {"seed": 7}}, "the trial's data order (train.seed, data.shuffle) is not the run's"),
        ({"data": {"shuffle": not trial.data.shuffle}}, "the trial's data order (train.seed, data.shuffle) is not the "
                                                        "run's"),
        ({"data": {"fingerprint": "other data"}}, "data.source builtin:pydoc-topics changed since the trial"),
        ({"recipe_digest": _recipes(c, ["train.lr=1e-2"])[1].digest()},
         "the trial's recipe differs from the run's beyond the trial's own steps and checkpoint"),
        ({"data": {"total_steps": STEPS}}, f"the trial trained every step of the run ({STEPS})"),
    ]
    for k, (manifest, why) in enumerate(cases):
        trial_run = _trial(tmp_path, 10 + k, trial, **manifest)
        assert _over(_decide(c, [trial_run], run, trial)) == f"{why} (run {10 + k})"
    assert _over(continuation(c, [_trial(tmp_path, 30, trial)], run, None, lambda s: DATA)) == (
        "the trial's recipe differs from the run's beyond the trial's own steps and checkpoint (run 30)")
