"""``ftui plan --commit`` (and ``c`` in the Plan view): the plan's winner run for real, to the recipe's own
``train.max_steps``, continuing from the checkpoint of the winner's trial when the recipe allows.

A trial trains the first steps of the run's own schedule (``train.stop_after``, :func:`runner.service.plan.trial_sets`)
and checkpoints its last step, so the committed run resumes there (``train.resume_from``) and trains only the
steps after it, as the same run uninterrupted would. :func:`continuation` decides whether it may: the strategy
writes checkpoints, the trial completed, its checkpoint is whole, and it was taken by the same recipe (strategy,
processes, global batch, data order, data, schedule); otherwise the run starts at step 0 and says why in one
line. The committed run records the plan (``committed_by_plan``) and the trial it continues
(``continued_from_trial``, ``resumed_from``) or why it started over (``started_over``).

It goes through this host's queue (:func:`enqueue_commit`), so it never starts on devices a running run holds;
:func:`follow_commit` waits for it to start and end, with its journal's events as they come.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.analysis.ranking import Ranking
from runner.data.cache import source_digest
from runner.service.plan import Candidate, PlanError, Setup, stored, trial_sets, winner, writes_checkpoints
from runner.service.queue import Enqueued, QueueOptions, QueueRefused, enqueue, remove
from runner.service.stop import request_stop
from runner.service.sweep import SweepItem
from runner.spec import checkpoint as ck
from runner.spec import events as ev
from runner.spec import layout, watching
from runner.spec.recipe import Recipe, RecipeError, load_recipe
from runner.spec.status import DONE, NOT_STARTED, entry_state
from runner.watch.follow import Stop
from store import RunInfo, Store
from store import queue as entries_store


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


@dataclass(frozen=True)
class Queued:
    """A commit put in this host's queue."""

    item: SweepItem
    start: Continuation
    entry: Enqueued


@dataclass(frozen=True)
class Outcome:
    """How a queued commit ended."""

    run_id: int | None
    """None: it never started (refused when its turn came, or taken out of the queue)."""
    status: str
    reason: str | None


def enqueue_commit(store: Store, recipe_path: Path, setup: Setup, c: Candidate, sets: Sequence[str],
                   start_runner: bool = True) -> Queued:
    """Put the committed run of ``c`` (:func:`commit_item`, from its trial's checkpoint when :func:`decide`
    allows) at the end of this host's queue (:func:`runner.service.queue.enqueue`): it starts when no run of
    this host holds a device it takes, and records the plan and where it started.

    Raises:
        RecipeError: the pre-flight refuses it (one line naming the field); nothing is queued.
    """
    start = decide(store, recipe_path, setup, c, sets)
    item = commit_item(setup, c, sets, start)
    path = Path(recipe_path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise RecipeError(f"{path}: cannot read recipe: {exc.strerror or exc}") from None
    summary = {"committed_by_plan": setup.pid, "sweep_note": item.note, "sweep_grid": item.grid, **start.summary()}
    options = QueueOptions(summary=summary, resumed_from=start.trial)
    entry = enqueue(text, item.overrides, store=store, source=str(path), base_dir=path.parent, options=options,
                    start_runner=start_runner)
    return Queued(item, start, entry)


class Journal:
    """The events of a run's journal (``RUN/events.jsonl``) not read yet: each look reads from where the last
    ended, whole lines only."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except FileNotFoundError:
            return []  # the ranks have not written it yet
        self.offset += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        out = []
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue  # not an event (a line cut by a crash): the watcher's own reading skips it too
            if isinstance(event, dict):
                out.append(event)
        return out


def follow_commit(store: Store, queued: Queued, on_start: Callable[[SweepItem, int], None] | None = None,
                  on_event: Callable[[dict[str, Any]], None] | None = None, stop: Stop | None = None,
                  poll_s: float = watching.SAMPLE_INTERVAL_S, sleep: Callable[[float], None] = time.sleep) -> Outcome:
    """Wait for a queued commit to start (``on_start``) and end, its journal's events to ``on_event`` as they
    come; ``stop`` (Ctrl-C) takes it out of the queue before it starts, or stops its run. Looks every
    ``poll_s``, as often as the watcher samples."""
    entry_id, journal, asked = queued.entry.entry_id, None, False
    while True:
        entry = entries_store.get_entry(store, entry_id)
        if entry is None:
            return Outcome(None, "failed", f"queue entry {entry_id} was removed before its run ended")
        run = store.get_run(entry.run_id) if entry.run_id is not None else None
        if journal is None and run is not None and run.run_dir:
            journal = Journal(Path(run.run_dir) / ev.EVENTS_FILE)
            if on_start:
                on_start(queued.item, run.id)
        state = entry_state(entry.status, entry.run_status)  # before the journal: an ended run's is read whole
        if journal is not None and on_event is not None:
            for event in journal.read():
                on_event(event)
        if state == NOT_STARTED:
            return Outcome(entry.run_id, "failed", entry.error)
        if state == DONE:
            return Outcome(entry.run_id, run.status if run else "failed", run.error if run else "its run was deleted")
        if stop is not None and stop.is_set() and not asked:
            asked = _stop(store, entry_id, run)
            if asked and run is None:
                return Outcome(None, "stopped", f"taken out of the queue (entry {entry_id}) before it started")
        sleep(poll_s)


def _stop(store: Store, entry_id: int, run: RunInfo | None) -> bool:
    """Take the entry out of the queue (no run yet) or ask its run to stop; whether it was done (an entry
    that started meanwhile is not removed: its run is stopped at the next look)."""
    if run is None:
        try:
            remove(store, entry_id)
        except QueueRefused:
            return False
        return True
    request_stop(store, run.id, wait=False)
    return True
