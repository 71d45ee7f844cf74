"""Plans made by hand, for the tests of the Plan view and of ``ftui plan``'s record: the plan of quickstart that
``ftui plan`` would make on this host (its real set-up: candidates, id, memory), its trials written straight
into the store as a finished trial leaves them (status, tokens/s, the trainer's summary, the plan's id in the
sweep column), and its record, as ``ftui plan`` writes it. Nothing is trained."""

from __future__ import annotations

import socket
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from runner.service import plan, plan_record
from runner.service.plan_record import PlanCommand, Process
from runner.spec.recipe import Recipe, load_recipe
from store import Store
from tests.support import QUICKSTART
from tests.support.dashboard import trainer_summary

SETS = ("data.context_length=64",)
T0 = datetime(2026, 1, 2, 3, 4, 5)


MEMORY = plan.Memory(16 * 2**30, True, "host memory available now, shared by the ranks (psutil)")
"""The host's memory a hand-made plan was judged against (fixed: the snapshots must not read this host's)."""


def quickstart_plan(strategies: tuple[str, ...] = ("single", "ddp"), repeat: int = 1) -> PlanCommand:
    """``ftui plan recipes/quickstart.toml --strategies ... --nproc 2 --steps 3 --set data.context_length=64``."""
    return PlanCommand(str(QUICKSTART), SETS, strategies, 2, 3, repeat)


def fixed_setup(strategies: tuple[str, ...] = ("single", "ddp", "zero1"), repeat: int = 1,
                pid: str = "plan-quickstart-0123456789ab") -> tuple[plan.Setup, PlanCommand]:
    """The plan :func:`quickstart_plan` makes, its candidates searched and estimated by ``ftui plan``'s own code,
    but judged against :data:`MEMORY` on a host that takes 2 processes, under a fixed id; its command names the
    recipe as typed from the repository (the snapshots show it)."""
    base = load_recipe(QUICKSTART, SETS)

    def loader(more: Sequence[str]) -> Recipe:
        return load_recipe(QUICKSTART, [*SETS, *more])

    found = plan.search_space(base, list(strategies), 2, loader, plan.estimated_need, MEMORY, lambda n: None, True)
    command = PlanCommand("recipes/quickstart.toml", SETS, strategies, 2, 3, repeat)
    return plan.Setup(base, pid, found, MEMORY, 3, repeat), command


def add_trial(store: Store, setup: plan.Setup, label: str, tps: float | None, status: str = "completed",
              n: int = 0) -> int:
    """One trial of the candidate ``label`` (its ``n``-th, for distinct times) as the race stores it: the
    candidate's recipe, the plan's id as sweep, its grid and batch note; a completed one with its tokens/s,
    measured peak, utilisation and first step; a running one with none of those yet."""
    c = next(c for c in setup.candidates if c.label == label)
    recipe = load_recipe(QUICKSTART, [*SETS, *c.overrides,
                                      *plan.trial_sets(c, setup.steps, setup.base.train.max_steps)])
    run_id = store.create_run(name=recipe.name, recipe_text=recipe.to_toml(), recipe_hash=recipe.digest(),
                              strategy=c.strategy, nproc=c.nproc, method="lora", model=recipe.model.name, run_dir="",
                              sweep_id=setup.pid, total_steps=setup.steps,
                              summary={"sweep_grid": c.grid or None, "sweep_note": c.note})
    start = T0 + timedelta(minutes=len(setup.candidates) * n + setup.candidates.index(c))
    done: dict[str, Any] = {}
    if status not in ("running", "created"):
        done = {"ended_at": start + timedelta(seconds=30), "train_seconds": 20.0, "tokens_per_s": tps,
                "peak_mem_bytes": 300 * 2**20, "mean_util": 80.0}
    summary = {**trainer_summary(), "first_step_time": start.replace(tzinfo=UTC).timestamp() + 6.0}
    if done:
        summary["telemetry"] = _telemetry(c.nproc, 70.0 + tps / 100 if tps else 50.0)
    store.update_run(run_id, status=status, started_at=start, error="out of memory" if status == "failed" else None,
                     summary=summary, **done)
    return run_id


def _telemetry(ranks: int, util: float) -> dict[str, Any]:
    """The watcher's utilisation summary of a CPU trial: ``util`` % of each rank's one thread."""
    overall = {"kind": "rank", "devices": ranks, "util_mean": util, "util_peak": util, "util_min": util,
               "util_max": util, "util_unit": "CPU % of its 1 threads (psutil)", "threads": 1, "power_mean_w": None}
    return {"devices": {}, "whole": overall, "active": overall, "window": None}


GONE = Process(1, 0.0, socket.gethostname())
"""A racing process that is no more: pid 1 is another program (it did not start at the epoch)."""


def record(setup: plan.Setup, command: PlanCommand, ended: bool = True, process: Process = GONE,
           over_budget: Sequence[str] = ()) -> None:
    """The plan's record as ``ftui plan`` leaves it, raced by ``process``; ``ended``: its race over, the
    candidates ``over_budget`` (labels) left out by the budget."""
    assert plan_record.begin(setup, command, process) is None
    if ended:
        left = [plan.Trial(c, 1) for c in setup.candidates if c.label in over_budget]
        plan_record.end(setup.pid, plan.Progress(over_budget=left))
