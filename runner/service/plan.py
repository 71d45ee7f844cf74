"""``ftui plan``: the strategies a recipe can run under on this host, pruned by the planner, raced for a few
steps each, and ranked by measured steady-state tokens/s.

* **The search space** (:func:`search_space`): every launchable strategy and engine at the process count
  asked for (``single`` at one), the global batch kept as the recipe's by the sweep's fairness rule
  (:func:`runner.spec.layout.keep_global_batch`); activation checkpointing added only to a candidate the
  estimate says may not fit without it, and offload only when nothing else fits.
* **Pruning** (:func:`prune`): the planner's estimate against this host's memory with its error band
  (:func:`runner.planner.recommend.fit_verdict`): ``does not fit`` is never raced; ``might not fit`` is
  raced only when no candidate surely fits, and says so.
* **The race** (:func:`race`): each candidate a normal run of ``steps`` optimizer steps (no evaluation), stored under the plan's id in the sweep column so that ``ftui compare --sweep PLAN_ID`` and
  the dashboard show it; ``repeat`` passes over the candidates while the budget lasts. A candidate that
  fails is recorded as failed and not repeated; the plan goes on.
* **Resuming**: the plan's id is a digest of what it measures (:func:`plan_id`), so the same command finds
  the trials already stored and races only what is missing.
* **The ranking**: :mod:`runner.analysis.ranking`.
* **The trials train the run's first steps** (:func:`trial_sets`): the recipe's own lr schedule, stopped after
  ``steps`` (``train.stop_after``), with a checkpoint of the last step where the strategy writes one.
* **Commit** (:mod:`runner.service.plan_commit`): the winner, when the decision names one, run for real to the
  recipe's own ``train.max_steps``, continuing from its trial's checkpoint when the recipe allows.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC
from pathlib import Path
from typing import Any

import psutil

from runner.analysis import time_split
from runner.analysis.compare import Comparison, load_comparison
from runner.analysis.ranking import Ranking, rank
from runner.hardware import NvmlBackend
from runner.hardware.hostfacts import current
from runner.planner.error_band import Band
from runner.planner.memory import DEFAULT_RESERVE
from runner.planner.recommend import Fit, fit_band, fit_verdict
from runner.rank.memtrack import MEASURED_STEPS
from runner.service.launch import default_nproc
from runner.service.sweep import SweepItem, SweepResult, run_sweep
from runner.spec import layout
from runner.spec import strategies as table
from runner.spec.layout import BatchSplit
from runner.spec.recipe import Recipe, RecipeError, load_recipe
from runner.spec.status import ENDED_BY_USER, LIVE
from runner.spec.units import parse_bytes
from runner.watch.estimate import estimate_summary
from runner.watch.follow import Stop, WatchOptions
from runner.watch.host import nproc_over_host, runs_on_cpu
from runner.watch.preflight import check_inputs
from store import RunInfo, Store

DEFAULT_STEPS = 8
"""Optimizer steps per trial: the first :data:`MEASURED_STEPS` are memory-metered, the rest give the
steady-state tokens/s (:mod:`runner.rank.throughput`)."""

MIN_STEPS = MEASURED_STEPS + 1
"""The fewest steps a trial has a steady-state figure with (one step after the metered ones)."""

TRIAL_SETS = ("train.save=false", "train.eval_every=0")
"""What every trial sets besides its steps (:func:`trial_sets`): no saved adapter or model at its end (a
trial is a measurement, and its checkpoint holds what a commit continues from) and no evaluation."""


PLAN_PREFIX = "plan-"
"""How every plan's id begins (the sweep column of its trials): what tells a plan from a sweep."""


class PlanError(ValueError):
    """Bad input to a plan (one line naming the flag or field)."""


@dataclass(frozen=True)
class Memory:
    """What one candidate's processes may use on this host, and where the figure comes from."""

    bytes: int
    shared: bool
    """The processes share it (CPU ranks share the host's memory); else each device has it all."""
    source: str

    def per_rank(self, nproc: int) -> int:
        return self.bytes // max(1, nproc) if self.shared else self.bytes


@dataclass(frozen=True)
class Candidate:
    """One configuration of the search space, with the planner's verdict and, once pruned, why it is not raced."""

    strategy: str
    nproc: int
    engine: str = "auto"
    checkpointing: bool = False
    offload: str = "none"
    split: BatchSplit | None = None
    overrides: tuple[str, ...] = ()
    """The ``--set`` values on top of the user's that make the candidate (strategy, processes, batch...)."""
    grid: str = ""
    """What tells it from another candidate of the same strategy and processes (engine, checkpointing,
    offload), stored as the run's ``sweep_grid`` so that compare labels it the same way."""
    estimated: int | None = None
    """The planner's estimate per device, bytes (:func:`runner.watch.estimate.estimate_summary`)."""
    band: float | None = None
    """The estimate's error band the fit was judged with, as a fraction."""
    band_source: str = ""
    band_key: str = ""
    """The family and strategy its estimate's error is kept under (:func:`runner.planner.error_band.band_key`)."""
    budget: int | None = None
    fit: Fit | None = None
    """None: no estimate (the model's shape could not be had offline): raced, as nothing says it does not fit."""
    skip: str | None = None
    """Why it is not raced (not launchable here, does not fit, over the budget); None: raced."""
    note: str = ""
    """What the output says beside it (the batch split, a "might not fit" raced anyway)."""
    mesh: str = ""
    """An ``hsdp`` candidate's mesh, replicate x shard (``2x2``); empty for other strategies."""

    @property
    def label(self) -> str:
        """``ddp x2 [launch.engine=torch]`` or ``hsdp 2x2``: as :func:`runner.analysis.verdict.label` names its
        runs."""
        base = f"{self.strategy} {self.mesh}" if self.mesh else self.strategy + (f" x{self.nproc}" if self.nproc > 1 else "")
        return f"{base} [{self.grid}]" if self.grid else base

    def key(self) -> tuple[str, int, str]:
        return self.strategy, self.nproc, self.grid


@dataclass(frozen=True)
class Need:
    """The planner's estimate per device of a candidate, and the error band its fit is judged with."""

    bytes: int
    band: float
    """The estimate's error, as a fraction (:func:`runner.planner.recommend.fit_band`)."""
    band_source: str
    key: str = ""
    """The family and strategy of the estimate (:func:`runner.planner.error_band.band_key`)."""


Estimator = Callable[[Recipe], Need | None]
"""What the planner estimates per device for a recipe (None: no estimate)."""

Loader = Callable[[Sequence[str]], Recipe]
"""The recipe with the user's ``--set`` values and these on top (raises RecipeError)."""


def _variant(base: Candidate, loader: Loader, estimator: Estimator, memory: Memory, extra: Sequence[str],
             grid: Sequence[str]) -> Candidate:
    """``base`` with ``extra`` overrides, loaded (a refusal is its skip), estimated and judged against the
    memory."""
    made = replace(base, overrides=(*base.overrides, *extra), grid=" ".join(grid))
    try:
        recipe = loader(made.overrides)
    except RecipeError as exc:
        return replace(made, skip=f"refused: {exc}")
    launch = recipe.launch
    sizes = layout.mesh(recipe)
    made = replace(made, engine=launch.engine, checkpointing=recipe.train.gradient_checkpointing,
                   offload=launch.offload, mesh=layout.mesh_text(sizes) if sizes is not None else "")
    need = estimator(recipe)
    budget = memory.per_rank(made.nproc)
    if need is None:
        return replace(made, budget=budget)
    return replace(made, estimated=need.bytes, band=need.band, band_source=need.band_source, band_key=need.key,
                   budget=budget, fit=fit_verdict(need.bytes, budget, need.band))


def _engine_candidates(strategy: str, nproc: int, base: Recipe, loader: Loader, estimator: Estimator,
                       memory: Memory, host: Callable[[int], str | None], on_cpu: bool) -> list[Candidate]:
    """The candidates of one strategy: one per engine, each with checkpointing added where it may not fit."""
    row = table.get(strategy)
    n = row.procs(nproc, nproc)
    train = base.train
    split = layout.keep_global_batch(strategy, n, train.batch_size, train.grad_accum)
    start = Candidate(strategy, n, split=split, note=split.note)
    why = (row.not_launchable or f"ftui run cannot launch {strategy}") if not row.launchable else (
        row.nproc_problem(n, on_cpu) or host(n)
        or (None if split.kept else f"the global batch cannot be kept: {split.note}"))
    if why:
        return [replace(start, skip=why)]
    start = replace(start, overrides=(f"launch.strategy={strategy}", f"launch.nproc={n}",
                                      *split.overrides(train.batch_size, train.grad_accum)))
    out = []
    for engine in row.engine_names() if row.engines else ("auto",):
        words = [f"launch.engine={engine}"] if row.engines and engine != row.engine_names()[0] else []
        found = _variant(start, loader, estimator, memory, [f"launch.engine={engine}"] if row.engines else [], words)
        out.append(found)
        if found.skip is None and found.fit not in ("fits", None) and not found.checkpointing:
            out.append(_variant(found, loader, estimator, memory, ["train.gradient_checkpointing=true"],
                                [*words, "train.gradient_checkpointing=true"]))
    return out


def _offload_candidates(found: Sequence[Candidate], loader: Loader, estimator: Estimator,
                        memory: Memory) -> list[Candidate]:
    """When nothing fits or might: the launchable candidates whose engine offloads (the checkpointed one
    where there is one), with each offload the engine takes."""
    out = []
    for c in found:
        engine = table.get(c.strategy).engine_row(c.engine) if c.skip is None else None
        checkpointed = any(o.skip is None and o.checkpointing and o.key()[:2] == c.key()[:2] and o.engine == c.engine
                           for o in found)
        if engine is None or (checkpointed and not c.checkpointing):
            continue
        for offload in engine.offloads[1:]:
            words = [*c.grid.split(), f"launch.offload={offload}"]
            out.append(_variant(c, loader, estimator, memory, [f"launch.offload={offload}"], words))
    return out


def search_space(base: Recipe, strategies: Sequence[str], nproc: int, loader: Loader, estimator: Estimator,
                 memory: Memory, host: Callable[[int], str | None], on_cpu: bool) -> list[Candidate]:
    """Every candidate of the plan, raced or not (see the module's docstring), pruned (:func:`prune`).

    Args:
        base: the recipe with the user's ``--set`` values.
        strategies: the strategies to consider (names of the strategies table).
        nproc: processes of the multi-process strategies.
        loader: the recipe with more overrides on top (the validator refuses what a strategy cannot run).
        estimator: the planner's bytes per device of a recipe.
        memory: this host's memory for the ranks.
        host: why ``n`` processes are more than this host takes (None: they fit).
        on_cpu: the ranks train on CPU.
    """
    found = [c for s in strategies for c in _engine_candidates(s, nproc, base, loader, estimator, memory, host,
                                                                on_cpu)]
    if not any(c.skip is None and c.fit in ("fits", "might not fit", None) for c in found):
        found += _offload_candidates(found, loader, estimator, memory)
    return prune(found)


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**30:.2f} GiB"


def prune(found: Sequence[Candidate]) -> list[Candidate]:
    """Which candidates race: those that surely fit (or have no estimate); the ``might not fit`` ones only
    when none surely fits (their note says so); ``does not fit`` never."""
    sure = any(c.skip is None and c.fit in ("fits", None) for c in found)
    out = []
    for c in found:
        if c.skip is not None:
            out.append(c)
            continue
        band = f"{(c.band or 0) * 100:.1f}%"
        est = f"estimated {_gib(c.estimated)} per device ± {band} against {_gib(c.budget)}"
        if c.fit == "does not fit":
            out.append(replace(c, skip=f"does not fit: {est}"))
        elif c.fit == "might not fit" and sure:
            out.append(replace(c, skip=f"might not fit ({est}, within the estimate's error): not raced, "
                                       "other candidates surely fit"))
        elif c.fit == "might not fit":
            out.append(replace(c, note=f"{c.note}; might not fit ({est}): raced because nothing surely fits"))
        else:
            out.append(c)
    return out


def plan_id(base: Recipe, strategies: Sequence[str], nproc: int, steps: int, host: str) -> str:
    """The plan's id: a digest of what it measures (the recipe with its ``--set`` values, the strategies,
    processes, steps and host), so that the same command finds its trials again."""
    what = json.dumps([base.digest(), sorted(strategies), nproc, steps, host])
    return f"{PLAN_PREFIX}{base.name[:24]}-{hashlib.sha256(what.encode()).hexdigest()[:12]}"


@dataclass(frozen=True)
class Trial:
    """One run of a candidate: the candidate and which repeat."""

    candidate: Candidate
    repeat: int
    """1-based."""


@dataclass
class Progress:
    """What a plan has raced so far: its stored trials per candidate, and what the budget left out."""

    runs: dict[tuple[str, int, str], list[RunInfo]] = field(default_factory=dict)
    over_budget: list[Trial] = field(default_factory=list)
    stopped: bool = False
    """A user stopped a trial (Ctrl-C, ``ftui stop``): the plan ended there."""

    def done(self, c: Candidate) -> list[RunInfo]:
        """The candidate's trials that count: every one that ended, but those a user stopped."""
        return [r for r in self.runs.get(c.key(), []) if r.status not in ENDED_BY_USER and r.status not in LIVE]


def stored(store: Store, pid: str) -> Progress:
    """The plan's trials already in the store (oldest first)."""
    found = Progress()
    for run in reversed(store.list_runs(sweep_id=pid)):
        key = (run.strategy, run.nproc, run.summary.sweep_grid or "")
        found.runs.setdefault(key, []).append(run)
    return found


def wall_seconds(run: RunInfo) -> float | None:
    """How long a trial took, from its record to its end (the store's times)."""
    if run.ended_at is None:
        return None
    return (run.ended_at - run.created_at).total_seconds()


def next_trial(candidates: Sequence[Candidate], progress: Progress, repeat: int) -> Trial | None:
    """The next trial to race: the first pass over the candidates, then the second, ... (so a short budget
    cuts repeats first); a candidate whose trial failed is not repeated."""
    for k in range(1, repeat + 1):
        for c in candidates:
            if c.skip is not None:
                continue
            done = progress.done(c)
            if any(r.status != "completed" for r in done):
                continue
            if len(done) < k:
                return Trial(c, k)
    return None


def trial_guess(c: Candidate, progress: Progress) -> tuple[float, str] | None:
    """How long the next trial of ``c`` should take: its own longest trial, else the plan's longest (None:
    nothing measured yet; the first trial sets the pace)."""
    own = [s for r in progress.done(c) if (s := wall_seconds(r)) is not None]
    if own:
        return max(own), f"{c.label}'s longest trial"
    every = [(s, r) for runs in progress.runs.values() for r in runs if (s := wall_seconds(r)) is not None]
    if every:
        s, r = max(every, key=lambda x: x[0])
        return s, f"the plan's longest trial (run {r.id})"
    return None


def check_budget(budget_s: float | None, guess: tuple[float, str] | None) -> None:
    """Refuse a budget too small for one trial, as measured (raises PlanError)."""
    if budget_s is not None and guess is not None and guess[0] > budget_s:
        raise PlanError(f"--budget: {budget_s / 60:g} minutes is less than one trial ({guess[0]:.0f} s, "
                        f"{guess[1]})")


def check_start(candidates: Sequence[Candidate], progress: Progress, repeat: int, budget_s: float | None) -> None:
    """Refuse a budget shorter than the next trial as measured (raises PlanError)."""
    first = next_trial(candidates, progress, repeat)
    check_budget(budget_s, trial_guess(first.candidate, progress) if first else None)


def writes_checkpoints(c: Candidate) -> bool:
    """Whether the candidate's strategy and engine write checkpoints a run can resume from (the strategies
    table: not pipelines, tensor parallelism or DeepSpeed yet)."""
    row = table.get(c.strategy)
    try:
        return row.with_engine(c.engine).checkpoints
    except KeyError:
        return False


def trial_sets(c: Candidate, steps: int, max_steps: int) -> list[str]:
    """What a trial of ``c`` sets on top of the run's own values: :data:`TRIAL_SETS`, and the first ``steps``
    steps of the run's own schedule (``train.stop_after``: the lr warm-up and decay span ``max_steps``) with a
    checkpoint at the last where the strategy writes one, so that ``--commit`` can continue from it. A
    schedule no longer than the trial (``max_steps`` under ``steps``) is not the run's: the trial trains a
    schedule of ``steps`` of its own and saves nothing."""
    if max_steps and steps > max_steps:
        return [*TRIAL_SETS, "train.save_every=0", f"train.max_steps={steps}"]
    return [*TRIAL_SETS, f"train.save_every={steps if writes_checkpoints(c) else 0}", f"train.stop_after={steps}"]


def trial_item(trial: Trial, sets: Sequence[str], steps: int, repeat: int, max_steps: int = 0) -> SweepItem:
    """The run of one trial (``max_steps``: the recipe's own, which the trial's schedule spans)."""
    c = trial.candidate
    again = f"; repeat {trial.repeat}/{repeat}" if repeat > 1 else ""
    return SweepItem(c.strategy, c.nproc, [*sets, *c.overrides, *trial_sets(c, steps, max_steps)], c.grid,
                     c.note + again)


def race(store: Store, recipe_path: Path, candidates: Sequence[Candidate], pid: str, sets: Sequence[str],
         steps: int, repeat: int, budget_s: float | None = None, clock: Callable[[], float] = time.monotonic,
         on_start: Callable[[SweepItem, int], None] | None = None,
         on_done: Callable[[SweepItem, SweepResult], None] | None = None,
         on_event: Callable[[dict[str, Any]], None] | None = None,
         options: WatchOptions | None = None, stop: Stop | None = None, max_steps: int = 0) -> Progress:
    """Race what the plan lacks, one trial after another, until every candidate ran ``repeat`` times, the
    next trial would run past ``budget_s`` (from now, by ``clock``), or a user stops a trial. ``max_steps``:
    the recipe's ``train.max_steps``, the schedule each trial trains the first ``steps`` of.

    Raises:
        PlanError: the budget is less than one trial already measured.
    """
    progress = stored(store, pid)
    check_start(candidates, progress, repeat, budget_s)
    started = clock()
    while (trial := next_trial(candidates, progress, repeat)) is not None:
        guess = trial_guess(trial.candidate, progress)
        if budget_s is not None and guess is not None and clock() - started + guess[0] > budget_s:
            progress.over_budget = _left(candidates, progress, repeat)
            break
        item = trial_item(trial, sets, steps, repeat, max_steps)
        _, results = run_sweep(store, recipe_path, [item], sweep_id=pid, on_start=on_start, on_done=on_done,
                               on_event=on_event, options=options, stop=stop)
        run = store.get_run(results[0].run_id) if results else None
        if run is not None:
            progress.runs.setdefault(trial.candidate.key(), []).append(run)
        if not results or results[0].status in ENDED_BY_USER or (stop is not None and stop.is_set()):
            progress.stopped = True
            break
    return progress


def _left(candidates: Sequence[Candidate], progress: Progress, repeat: int) -> list[Trial]:
    """The trials not raced: every repeat each candidate still lacks."""
    out = []
    for c in candidates:
        done = progress.done(c)
        if c.skip is None and not any(r.status != "completed" for r in done):
            out += [Trial(c, k) for k in range(len(done) + 1, repeat + 1)]
    return out


# ---------------------------------------------------------------------- this host


def host_memory(on_cpu: bool) -> Memory:
    """What the ranks may use here: on CPU the host memory available now, shared by the ranks (psutil); on
    GPU the smallest visible GPU's memory less the reserve ``ftui estimate`` keeps (NVML)."""
    if not on_cpu:
        backend = NvmlBackend()
        try:
            gpus = [int(g.mem_total) for g in backend.gpu_infos() if g.mem_total]
        finally:
            backend.close()
        if gpus:
            reserve = parse_bytes(DEFAULT_RESERVE)
            return Memory(min(gpus) - reserve, False,
                          f"smallest of {len(gpus)} GPUs (NVML) less the {DEFAULT_RESERVE} reserve")
    available = int(psutil.virtual_memory().available)
    return Memory(available, True, "host memory available now, shared by the ranks (psutil)")


def estimated_need(recipe: Recipe) -> Need | None:
    """The planner's total per device for the recipe (:func:`runner.watch.estimate.estimate_summary`) with
    the error band of its family and strategy (:func:`runner.planner.recommend.fit_band`)."""
    found = estimate_summary(recipe)
    total = found.get("per_device_bytes", {}).get("total")
    if not isinstance(total, int | float):
        return None
    measured = found.get("error_band")
    band, source = fit_band(str(found.get("band_key")), Band(**measured) if measured else None)
    return Need(int(total), band, source, str(found.get("band_key") or ""))


@dataclass(frozen=True)
class Setup:
    """A plan before its race: the recipe with the user's values, its id and candidates."""

    base: Recipe
    pid: str
    candidates: list[Candidate]
    memory: Memory
    steps: int
    repeat: int


def setup(recipe_path: Path, sets: Sequence[str], strategies: Sequence[str] | None, nproc: int | None,
          steps: int | None = None, repeat: int = 1, inputs: bool = True) -> Setup:
    """The plan of ``ftui plan`` on this host, checked before anything is recorded. ``inputs``: check the
    recipe's data and model as the pre-flight does (which tokenizes data not cached yet: the dashboard leaves
    that to the plan's own process, and imports neither transformers nor torch).

    Raises:
        RecipeError: the recipe or its inputs are unusable (one line naming the field).
        PlanError: a flag is out of range, or no candidate can be raced here.
    """
    steps = DEFAULT_STEPS if steps is None else steps
    if steps < MIN_STEPS:
        raise PlanError(f"--steps: at least {MIN_STEPS} (the first {MEASURED_STEPS} are memory-metered and give no "
                        f"steady-state tokens/s), got {steps}")
    if repeat < 1:
        raise PlanError(f"--repeat: must be at least 1, got {repeat}")
    names = list(strategies) if strategies else list(table.names(launchable=True))
    unknown = [s for s in names if s not in table.STRATEGIES]
    if unknown:
        raise PlanError(f"--strategies: unknown {', '.join(unknown)} (choose from {', '.join(table.names())})")
    base = load_recipe(recipe_path, sets)
    if inputs:
        check_inputs(base)
    n = nproc if nproc is not None else default_nproc()
    on_cpu = runs_on_cpu(base)
    memory = host_memory(on_cpu)

    def loader(more: Sequence[str]) -> Recipe:
        return load_recipe(recipe_path, [*sets, *more])

    def host(k: int) -> str | None:
        return nproc_over_host(base.model_copy(update={"launch": base.launch.model_copy(update={"nproc": k})}))

    found = search_space(base, names, n, loader, estimated_need, memory, host, on_cpu)
    if not any(c.skip is None for c in found):
        why = "; ".join(f"{c.label}: {c.skip}" for c in found)
        raise PlanError(f"no launchable candidate on this host ({why})")
    return Setup(base, plan_id(base, names, n, steps, current().hostname), found, memory, steps, repeat)


def first_step_seconds(run: RunInfo) -> float | None:
    """Seconds from the launch (the watcher's start) to the start of the first optimizer step."""
    first = run.summary.first_step_time
    if first is None or run.started_at is None:
        return None
    return float(first) - run.started_at.replace(tzinfo=UTC).timestamp()


def standings(store: Store, pid: str) -> tuple[Comparison, Ranking] | None:
    """The plan's trials compared (compare's figures, MFU peaks included) and ranked; None before any trial."""
    runs = list(reversed(store.list_runs(sweep_id=pid)))
    if not runs:
        return None
    cmp = load_comparison(store, [r.id for r in runs], sweep_id=pid)
    first = {r.id: s for r in runs if (s := first_step_seconds(r)) is not None}
    splits = {r.id: split for r in runs if (split := time_split.of_run(r.summary)) is not None}
    return cmp, rank(cmp.rows, cmp.floor, first, splits)


def winner(candidates: Sequence[Candidate], ranking: Ranking) -> Candidate | None:
    """The candidate the decision recommends; None when it names none (a tie, nothing comparable)."""
    if ranking.decision.kind != "use" or ranking.decision.run_id is None:
        return None
    label = next((s.label for s in ranking.standings if ranking.decision.run_id in s.run_ids), None)
    return next((c for c in candidates if c.label == label), None)
