"""The batch-size finder (``ftui run --find-batch-size``, ``ftui estimate --probe``): the largest
micro-batch that fits a memory budget per rank, found with short real runs."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from runner.spec.recipe import Recipe
from runner.spec.status import ENDED_BY_USER
from runner.spec.summary import trained_bytes
from runner.watch.follow import execute
from runner.watch.prepare import prepare
from runner.watch.stream import Recorder
from store import Store


@dataclass(frozen=True)
class BatchTrial:
    """One short real run of the batch-size finder."""

    batch_size: int
    run_id: int
    status: str
    measured_bytes: int | None
    """Busiest rank's measured peak: CUDA peak allocated on GPU, the live-tensor peak on CPU."""
    fits: bool
    error: str | None = None


def trial_bytes(ranks: list[dict[str, Any]]) -> int | None:
    """The memory a run needed on its busiest rank, as the finder compares it with the budget: the
    independent measurement (:func:`runner.spec.summary.trained_bytes`: CUDA peak allocated on GPU, the
    live-tensor peak on CPU), never the planner's estimate."""
    values = [v for r in ranks if (v := trained_bytes(r)) is not None]
    return max(values) if values else None


def _trial(store: Store, recipe: Recipe, batch: int, steps: int, cap_bytes: int, source: str | None,
           sweep_id: str) -> BatchTrial:
    """One trial: ``steps`` steps at micro-batch ``batch``, no checkpoint."""
    train = recipe.train.model_copy(update={"batch_size": batch, "max_steps": steps, "save": False})
    trial_recipe = recipe.model_copy(update={"train": train, "name": f"{recipe.name}-find-bs{batch}"})
    outcome = execute(store, prepare(store, trial_recipe, source=source, sweep_id=sweep_id))
    used = trial_bytes(outcome.summary.get("ranks") or [])
    fits = outcome.status == "completed" and used is not None and used <= cap_bytes
    return BatchTrial(batch, outcome.run_id, outcome.status, used, fits, outcome.error)


def find_batch_size(
    store: Store,
    recipe: Recipe,
    cap_bytes: int,
    source: str | None = None,
    on_trial: Callable[[BatchTrial], None] | None = None,
    max_trials: int = 6,
    max_batch: int = 64,
    steps: int = 2,
) -> dict[str, Any]:
    """The largest micro-batch (``train.batch_size``) that fits ``cap_bytes`` per rank, found with short
    real runs: start at 1, double while it fits, then bisect between the last fit and the first miss.

    Each trial is a normal run (``steps`` steps, ``train.save = false``) of the recipe's strategy and
    process count, recorded in the store with a shared sweep id ``find-batch-...``. A trial misses when it
    fails (out of memory, or anything else: its error is kept) or when its measured bytes
    (:func:`trial_bytes`) exceed the cap. The result is also stored on the last trial: a
    ``batch_size_found`` event and ``summary["find_batch"]``.

    Returns:
        ``{"sweep_id", "chosen" (None when batch 1 misses), "cap_bytes", "trials": [...]}``.
    """
    sweep_id = f"find-batch-{datetime.now():%Y%m%d-%H%M%S}-{os.getpid()}"
    trials: list[BatchTrial] = []
    good, bad, b = 0, None, 1
    while len(trials) < max_trials:
        trial = _trial(store, recipe, b, steps, cap_bytes, source, sweep_id)
        trials.append(trial)
        if on_trial is not None:
            on_trial(trial)
        if trial.status in ENDED_BY_USER:
            break
        if trial.fits:
            good = b
        else:
            bad = b
        if bad is not None and good == 0:
            break
        if bad is None:
            if b >= max_batch:
                break
            b = min(2 * b, max_batch)
        else:
            if bad - good <= 1:
                break
            b = (good + bad) // 2
    result: dict[str, Any] = {
        "sweep_id": sweep_id,
        "chosen": good or None,
        "cap_bytes": cap_bytes,
        "strategy": recipe.launch.strategy,
        "nproc": recipe.launch.nproc,
        "trials": [asdict(t) for t in trials],
    }
    last = trials[-1].run_id
    last_run = store.get_run(last)
    if last_run is not None:  # journal first, like every watcher event
        recorder = Recorder(store, last, Path(last_run.run_dir))
        recorder.emit("batch_size_found", **result)
        recorder.close()
    store.update_run(last, summary={"find_batch": result})
    return result
