"""Sweeps: one recipe run under several strategies (and over a grid of field values), one run after
another, each stored with a shared sweep id so that ``ftui compare --sweep ID`` reopens them.

Fairness: every run of a grid point trains the same global batch, split over the processes by
:func:`runner.spec.layout.keep_global_batch` (the micro-batch divided by N where N divides it, else the
rows per step; ``pp``, ``mp`` and ``tp`` keep the batch: their processes share it); where N divides
neither, the global batch grows and the run's note says so.

A strategy that cannot run (the recipe refuses it, pre-flight refuses it, or it fails) becomes a
stored run with status ``failed`` and the reason; the sweep goes on.
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from runner.service.launch import default_nproc
from runner.spec import layout
from runner.spec import strategies as table
from runner.spec.recipe import Recipe, RecipeError, load_recipe
from runner.spec.status import ENDED_BY_USER
from runner.spec.toml_text import dump_toml
from runner.watch.follow import Stop, WatchOptions, execute
from runner.watch.preflight import check_host_nproc, check_inputs, check_kernels, preflight
from runner.watch.prepare import prepare, record_summary
from store import Store


@dataclass(frozen=True)
class SweepItem:
    """One planned run of a sweep."""

    strategy: str
    nproc: int
    overrides: list[str]
    grid: str
    """``train.batch_size=2`` for a grid point, empty without a grid."""
    note: str
    """How the batch was kept fair, for the output."""
    mesh: str = ""
    """An ``hsdp`` run's mesh, replicate x shard (``2x2``); empty for other strategies."""

    @property
    def label(self) -> str:
        """``ddp x 4``, or ``hsdp 2x2`` (its mesh says its processes)."""
        return f"{self.strategy} {self.mesh}" if self.mesh else f"{self.strategy} x {self.nproc}"


@dataclass(frozen=True)
class SweepResult:
    """How one run of a sweep ended."""

    run_id: int
    status: str
    reason: str | None


def parse_grid(specs: Sequence[str]) -> list[list[str]]:
    """``["train.batch_size=2,4", "train.lr=1e-3,2e-3"]`` -> every combination as override lists."""
    axes: list[list[str]] = []
    for spec in specs:
        key, sep, values = spec.partition("=")
        if not sep or not key.strip() or not values.strip():
            raise RecipeError(f"--grid {spec!r}: expected FIELD=V1,V2,...")
        axes.append([f"{key.strip()}={v.strip()}" for v in values.split(",") if v.strip()])
    return [list(p) for p in itertools.product(*axes)] if axes else [[]]


def plan(recipe_path: Path, strategies: Sequence[str], nproc: int | None, sets: Sequence[str],
         grid: Sequence[str], default_nproc: int = 2, repeat: int = 1) -> list[SweepItem]:
    """The runs of a sweep, in order: for each grid point, each strategy (``repeat`` times in a row, for
    medians and spread: :mod:`runner.analysis.repeats`).

    Raises:
        RecipeError: the recipe (with ``sets``) or a grid value is invalid for every strategy.
    """
    if nproc is not None and nproc < 1:
        raise RecipeError(f"--nproc: must be at least 1, got {nproc}")
    if repeat < 1:
        raise RecipeError(f"--repeat: must be at least 1, got {repeat}")
    unknown = [s for s in strategies if s not in table.STRATEGIES]
    if unknown:
        raise RecipeError(f"--strategies: unknown {', '.join(unknown)} (choose from {', '.join(table.names())})")
    items: list[SweepItem] = []
    for point in parse_grid(grid):
        base = load_recipe(recipe_path, [*sets, *point])
        micro = base.train.batch_size
        for strategy in strategies:
            n = table.get(strategy).procs(nproc, default_nproc)
            overrides = [*sets, *point, f"launch.strategy={strategy}", f"launch.nproc={n}"]
            split = layout.keep_global_batch(strategy, n, micro, base.train.grad_accum)
            overrides += split.overrides(micro, base.train.grad_accum)
            note = split.note
            mesh = ""
            if table.get(strategy).hybrid:  # the sweep's runs are on this machine: no nnodes
                mesh = layout.mesh_text(layout.hsdp_mesh(n, 1, base.launch.replicate, base.launch.shard))
            for k in range(repeat):
                again = f"; repeat {k + 1}/{repeat}" if repeat > 1 else ""
                items.append(SweepItem(strategy, n, overrides, " ".join(point), note + again, mesh))
    return items


def plan_checked(recipe_path: Path, strategies: Sequence[str], nproc: int | None, sets: Sequence[str],
                 grid: Sequence[str], repeat: int = 1, force: bool = False) -> list[SweepItem]:
    """The runs of ``ftui sweep`` (:func:`plan`, with this host's default process count), after the
    recipe's data and run folders are checked once, before any run is recorded; and, unless ``force``, no
    run asks for more processes than this host has devices for; and this host runs every item's attention
    and compile (a grid over ``model.attn_implementation`` or ``train.compile``).

    Raises:
        RecipeError: the recipe, a grid value or its inputs are unusable, or a run's process count is over
            the host's (one line naming the field).
    """
    items = plan(recipe_path, strategies, nproc, sets, grid, default_nproc=default_nproc(), repeat=repeat)
    base = load_recipe(recipe_path, sets)
    if not force:  # the process counts are the sweep's own (--nproc, or its default), one check each
        for n in sorted({item.nproc for item in items}):
            check_host_nproc(base.model_copy(update={"launch": base.launch.model_copy(update={"nproc": n})}))
    for overrides in dict.fromkeys(tuple(item.overrides) for item in items):  # cheap: before the data is read
        try:
            recipe = load_recipe(recipe_path, overrides)
        except RecipeError:
            continue  # a strategy the recipe refuses: recorded as refused when the sweep reaches it
        check_kernels(recipe)
    check_inputs(base)  # the same data and folders for every item
    return items


def new_sweep_id() -> str:
    """A sweep id: the time and a few random hex digits."""
    return f"sweep-{datetime.now():%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


def run_sweep(
    store: Store,
    recipe_path: Path,
    items: Sequence[SweepItem],
    sweep_id: str | None = None,
    on_start: Callable[[SweepItem, int], None] | None = None,
    on_event: Callable[[dict[str, Any]], None] | None = None,
    on_done: Callable[[SweepItem, SweepResult], None] | None = None,
    options: WatchOptions | None = None,
    stop: Stop | None = None,
    force: bool = False,
) -> tuple[str, list[SweepResult]]:
    """Run the items one after another, each stored under ``sweep_id``; ``stop`` (Ctrl-C) stops the
    running run and ends the sweep; ``force``: more processes than this host has devices for are started.

    Returns:
        The sweep id and one result per item that was reached (a run stopped by the user ends the
        sweep early).
    """
    sweep_id = sweep_id or new_sweep_id()
    results: list[SweepResult] = []
    for item in items:
        result = run_item(store, recipe_path, item, sweep_id, on_start=on_start, on_event=on_event,
                          options=options, stop=stop, force=force)
        results.append(result)
        if on_done:
            on_done(item, result)
        if result.status in ENDED_BY_USER or (stop is not None and stop.is_set()):
            break  # the user stopped the run (or killed it): the sweep ends with it
    return sweep_id, results


def run_item(
    store: Store,
    recipe_path: Path,
    item: SweepItem,
    sweep_id: str | None,
    on_start: Callable[[SweepItem, int], None] | None = None,
    on_event: Callable[[dict[str, Any]], None] | None = None,
    options: WatchOptions | None = None,
    stop: Stop | None = None,
    force: bool = False,
    summary: dict[str, Any] | None = None,
    resumed_from: int | None = None,
) -> SweepResult:
    """One item as a run of its own, under ``sweep_id`` (None: a run of no sweep), ``summary``'s keys added
    to its summary, recorded as continuing run ``resumed_from`` (None: none); an item that cannot start is
    recorded as a failed run with the reason."""
    extra = {"sweep_note": item.note, "sweep_grid": item.grid, **(summary or {})}
    row = table.get(item.strategy)
    try:
        if not row.launchable:  # the table's own sentence, not the validator's list of choices
            raise RecipeError(row.not_launchable or f"ftui run cannot launch {item.strategy}")
        recipe: Recipe = load_recipe(recipe_path, item.overrides)
        warnings = preflight(recipe, force=force)
    except RecipeError as exc:
        run_id = _refused(store, recipe_path, item, sweep_id, f"refused before launch: {exc}", summary)
        return SweepResult(run_id, "failed", f"refused before launch: {exc}")
    prepared = prepare(store, recipe, source=str(recipe_path), sweep_id=sweep_id, resumed_from=resumed_from)
    assert prepared.run_id is not None
    if warnings:  # e.g. "mp on a CPU-only machine: ... the single-process run"
        extra["sweep_note"] = "; ".join([item.note, *warnings])
    record_summary(store, prepared.run_id, prepared.run_dir, extra)  # the store and RUN/run.json
    if on_start:
        on_start(item, prepared.run_id)
    outcome = execute(store, prepared, options, on_event=on_event, stop=stop)
    return SweepResult(outcome.run_id, outcome.status, outcome.error)


def _refused(store: Store, recipe_path: Path, item: SweepItem, sweep_id: str | None, reason: str,
             summary: dict[str, Any] | None = None) -> int:
    """Record a strategy that could not start as a failed run with its reason (no run folder)."""
    base_overrides = [o for o in item.overrides if not o.startswith("launch.")]
    method: str
    try:
        base = load_recipe(recipe_path, base_overrides)
        data = base.model_dump(mode="json")
        # The stored recipe names the strategy asked for, so that the recipe diff shows it.
        data["launch"].update(strategy=item.strategy, nproc=item.nproc)
        text, digest, name, method, model = dump_toml(data), base.digest(), base.name, base.method.type, base.model.name
    except RecipeError:
        text, digest, name, method, model = "", "", recipe_path.stem, "-", "-"
    run_id = store.create_run(name=name, recipe_text=text, recipe_hash=digest, recipe_source=str(recipe_path),
                              strategy=item.strategy, nproc=item.nproc, method=method, model=model, run_dir="",
                              sweep_id=sweep_id, summary={"refused": True, "sweep_note": item.note,
                                                          "sweep_grid": item.grid, **(summary or {})})
    store.update_run(run_id, status="failed", error=reason)
    return run_id
