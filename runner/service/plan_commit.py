"""``ftui plan --commit`` (and ``c`` in the Plan view): the plan's winner run for real, to the recipe's own
``train.max_steps``, continuing from the checkpoint of the winner's trial when the recipe allows.

A trial trains the first steps of the run's own schedule (``train.stop_after``, :func:`runner.service.plan.trial_sets`)
and checkpoints its last step, so the committed run resumes there (``train.resume_from``) and trains only the
steps after it, as the same run uninterrupted would. :func:`continuation` decides whether it may: the strategy
writes checkpoints, the trial completed, its checkpoint is whole, and it was taken by the same recipe (strategy,
processes, global batch, data order, data, schedule); otherwise the run starts at step 0 and says why in one
line. The committed run records the plan (``committed_by_plan``) and the trial it continues
(``continued_from_trial``, ``resumed_from``) or why it started over (``started_over``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.analysis.ranking import Ranking
from runner.data.cache import source_digest
from runner.service.plan import Candidate, PlanError, Setup, stored, trial_sets, winner, writes_checkpoints
from runner.service.sweep import SweepItem, SweepResult, run_item
from runner.spec import checkpoint as ck
from runner.spec import layout
from runner.spec.recipe import Recipe, RecipeError, load_recipe
from runner.watch.follow import Stop, WatchOptions
from store import RunInfo, Store


@dataclass(frozen=True)
class Continuation:
    """Where the committed run starts: from a trial's checkpoint, or at step 0 and why."""

    checkpoint: Path | None = None
    """The trial's checkpoint the run resumes from; None: it starts at step 0."""
    trial: int | None = None
    """The trial run (its id) whose checkpoint it continues."""
    step: int = 0
    """The checkpoint's step: the committed run trains from the next."""
    why: str = ""
    """Why it starts at step 0 (one line); empty when it continues."""

    @property
    def line(self) -> str:
        """What the commit says of its start, one line."""
        if self.checkpoint is None:
            return f"starts at step 0: {self.why}"
        return f"continues from trial run {self.trial}'s checkpoint at step {self.step}"

    def overrides(self) -> list[str]:
        """The recipe value that makes the run resume (none when it starts at step 0)."""
        return [f"train.resume_from={self.checkpoint}"] if self.checkpoint is not None else []

    def summary(self) -> dict[str, Any]:
        """What the committed run records of its start."""
        if self.checkpoint is None:
            return {"started_over": self.why}
        return {"continued_from_trial": self.trial,
                "resumed_from": {"run_id": self.trial, "checkpoint": str(self.checkpoint), "step": self.step}}


def _over(why: str) -> Continuation:
    return Continuation(why=why)


def continuation(c: Candidate, trials: Sequence[RunInfo], recipe: Recipe, trial_digest: str | None,
                 data_digest: Callable[[str], str] = source_digest) -> Continuation:
    """Whether the committed run of ``c`` continues from the checkpoint of its newest completed trial.

    Args:
        c: the winner.
        trials: the winner's trials, oldest first.
        recipe: the committed run's recipe (the user's values with the winner's own).
        trial_digest: the digest of ``recipe`` as a trial of the plan trains it (its steps and checkpoint
            settings on top): what the trial's checkpoint manifest records when nothing else differs; None
            when no trial of it can be made.
        data_digest: a data source's content hash (:func:`runner.data.cache.source_digest`).
    """
    if not writes_checkpoints(c):
        return _over(f"{c.label} writes no checkpoint a run can resume from")
    done = [r for r in trials if r.status == "completed"]
    if not done:
        return _over("no trial of the winner completed" if trials else "the winner has no trial")
    trial = done[-1]
    folder = ck.checkpoint_dir(Path(trial.run_dir), trial.steps_done or 0) if trial.run_dir else None
    if folder is None or not folder.is_dir():
        return _over(f"the trial's checkpoint is missing (run {trial.id})")
    try:
        manifest = ck.verify(folder)
    except ck.CheckpointError as exc:
        return _over(f"the trial's checkpoint is not whole (run {trial.id}): {str(exc).removeprefix(f'{folder}: ')}")
    why = _mismatch(manifest, recipe, trial_digest, data_digest)
    if why:
        return _over(f"{why} (run {trial.id})")
    return Continuation(folder, trial.id, int(manifest["step"]))


def _mismatch(manifest: dict[str, Any], recipe: Recipe, trial_digest: str | None,
              data_digest: Callable[[str], str]) -> str | None:
    """What in the trial's checkpoint is not the committed run's, or None."""
    launch, data = recipe.launch, manifest.get("data") or {}
    if (manifest.get("strategy"), manifest.get("world_size")) != (launch.strategy, launch.nproc):
        return (f"the trial ran {manifest.get('strategy')} on {manifest.get('world_size')} process(es), the run is "
                f"{launch.strategy} on {launch.nproc}")
    rows = layout.rows_per_step(recipe)
    if data.get("rows_per_step") != rows:
        return f"the trial's global batch ({data.get('rows_per_step')} rows per step) is not the run's ({rows})"
    if (data.get("seed"), data.get("shuffle")) != (recipe.train.seed, recipe.data.shuffle):
        return "the trial's data order (train.seed, data.shuffle) is not the run's"
    if data.get("fingerprint") != data_digest(recipe.data.source):
        return f"data.source {recipe.data.source} changed since the trial"
    if trial_digest is None or manifest.get("recipe_digest") != trial_digest:
        return "the trial's recipe differs from the run's beyond the trial's own steps and checkpoint"
    total = data.get("total_steps")
    if isinstance(total, int) and int(manifest["step"]) >= total:
        return f"the trial trained every step of the run ({total})"
    return None


def chosen(setup: Setup, ranking: Ranking | None) -> Candidate:
    """The plan's winner.

    Raises:
        PlanError: the plan names no winner (the line says why: a tie, or no completed trial).
    """
    found = winner(setup.candidates, ranking) if ranking is not None else None
    if found is None:
        why = ranking.text if ranking is not None else "no trial completed"
        raise PlanError(f"--commit: the plan names no winner, so nothing is launched ({why})")
    return found


def decide(store: Store, recipe_path: Path, setup: Setup, c: Candidate, sets: Sequence[str]) -> Continuation:
    """Where the committed run of ``c`` starts (:func:`continuation`), from the plan's stored trials of it."""
    own = [*sets, *c.overrides]
    try:
        recipe = load_recipe(recipe_path, own)
        trial = load_recipe(recipe_path, [*own, *trial_sets(c, setup.steps, recipe.train.max_steps)])
    except RecipeError as exc:
        return _over(f"the recipe does not load: {exc}")
    return continuation(c, stored(store, setup.pid).runs.get(c.key(), []), recipe, trial.digest())


def commit_item(setup: Setup, c: Candidate, sets: Sequence[str], start: Continuation) -> SweepItem:
    """The run ``--commit`` starts: the user's values with the winner's own (strategy, processes, batch
    split, engine), the recipe's ``train.max_steps`` (none of a trial's settings), resuming from the trial's
    checkpoint where ``start`` says so."""
    return SweepItem(c.strategy, c.nproc, [*sets, *c.overrides, *start.overrides()], c.grid,
                     f"the winner of plan {setup.pid}; {start.line}")


def commit(store: Store, recipe_path: Path, setup: Setup, ranking: Ranking | None, sets: Sequence[str],
           on_start: Callable[[SweepItem, int], None] | None = None,
           on_event: Callable[[dict[str, Any]], None] | None = None,
           options: WatchOptions | None = None, stop: Stop | None = None) -> SweepResult:
    """Run the plan's winner for real (:func:`commit_item`), as a run of no sweep that records the plan and
    where it started.

    Raises:
        PlanError: the plan names no winner.
    """
    c = chosen(setup, ranking)
    return commit_candidate(store, recipe_path, setup, c, sets, on_start, on_event, options, stop)


def commit_candidate(store: Store, recipe_path: Path, setup: Setup, c: Candidate, sets: Sequence[str],
                     on_start: Callable[[SweepItem, int], None] | None = None,
                     on_event: Callable[[dict[str, Any]], None] | None = None,
                     options: WatchOptions | None = None, stop: Stop | None = None) -> SweepResult:
    """Run candidate ``c`` of the plan for real, from its trial's checkpoint when :func:`decide` allows."""
    start = decide(store, recipe_path, setup, c, sets)
    item = commit_item(setup, c, sets, start)
    return run_item(store, recipe_path, item, None, on_start=on_start, on_event=on_event, options=options,
                    stop=stop, summary={"committed_by_plan": setup.pid, **start.summary()},
                    resumed_from=start.trial)
