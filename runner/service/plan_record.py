"""A plan's record on this host, ``plans/PLAN_ID.json`` in the data folder (:func:`runner.spec.paths.plans_dir`):
what the store does not hold of a plan. The trials are runs in the store (the plan's id in their sweep column);
the record holds the command that makes the plan (the same arguments find it again), the candidates it judged
(raced or not, and why not), the memory they were judged against, the process racing it (pid, start time,
host), how that process's race ended (what the budget left out, a stop) and what ``--commit`` did (the run it
started, or why it started none). ``ftui plan`` writes it; the dashboard's Plan view reads it beside the store.

A plan with no record here (raced on another host of a shared store, or before plans kept records) is shown
from its trials alone (:func:`setup_from_trials`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.service import plan
from runner.spec import layout
from runner.spec.layout import BatchSplit
from runner.spec.paths import make_private_dir, plans_dir
from runner.spec.recipe import RecipeError, parse_recipe
from runner.watch.identity import watcher_alive
from runner.watch.procs import started_at
from store import RunInfo, Store

VERSION = 1
"""The record's format; a record of another version is read as no record (the plan shows its trials only)."""


@dataclass(frozen=True)
class PlanCommand:
    """The arguments of ``ftui plan`` that make a plan: the same ones find it again (its id is a digest of what
    they measure), so the Plan view continues and commits a plan with them."""

    recipe: str
    """The recipe file, absolute."""
    sets: tuple[str, ...] = ()
    strategies: tuple[str, ...] | None = None
    nproc: int | None = None
    steps: int | None = None
    repeat: int = 1

    def argv(self) -> list[str]:
        """The command's words after ``ftui``: ``plan RECIPE --set=... [--strategies ...] [--nproc N]
        [--steps K] --repeat R`` (``--set=VALUE``: a value that starts with ``-`` stays a value)."""
        words = ["plan", self.recipe, *(f"--set={s}" for s in self.sets)]
        if self.strategies:
            words += ["--strategies", ",".join(self.strategies)]
        for flag, value in (("--nproc", self.nproc), ("--steps", self.steps)):
            if value is not None:
                words += [flag, str(value)]
        return [*words, "--repeat", str(self.repeat)]

    def setup(self, inputs: bool = True) -> plan.Setup:
        """The plan these arguments make on this host now (:func:`runner.service.plan.setup`; ``inputs``:
        with the pre-flight's checks of the data and model).

        Raises:
            RecipeError, plan.PlanError: what ``ftui plan`` refuses (one line naming the field or flag).
        """
        return plan.setup(Path(self.recipe), list(self.sets), list(self.strategies) if self.strategies else None,
                          self.nproc, self.steps, self.repeat, inputs)


@dataclass(frozen=True)
class Process:
    """The process racing a plan: its pid and start time (a later process given that pid is not it)."""

    pid: int
    create_time: float | None
    host: str

    def alive(self) -> bool:
        """Whether that process still runs on this host."""
        return self.host == socket.gethostname() and watcher_alive(self.pid, self.create_time)

    @staticmethod
    def of(pid: int) -> Process:
        return Process(pid, started_at(pid), socket.gethostname())


@dataclass(frozen=True)
class Ended:
    """How a plan's race ended (the process that raced it wrote this)."""

    stopped: bool
    """A user stopped a trial (Ctrl-C, ``ftui stop``): the race ended there."""
    over_budget: tuple[tuple[str, int], ...]
    """The trials the ``--budget`` left out: (candidate label, repeat)."""


@dataclass(frozen=True)
class PlanRecord:
    setup: plan.Setup
    command: PlanCommand
    process: Process | None
    ended: Ended | None
    """None while the race goes on, or when its process ended without finishing (killed)."""
    started_at: float
    """When that process began racing, seconds since the epoch."""
    commit_run: int | None = None
    """The run ``--commit`` started."""
    commit_refused: str | None = None
    """Why ``--commit`` started none (one line)."""


def _file_name(pid: str) -> str:
    """The plan's id as one safe file name (a recipe's name, in the id, may hold any character)."""
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in pid).lstrip(".")


def path(pid: str) -> Path:
    return plans_dir() / f"{_file_name(pid)}.json"


def log_path(pid: str) -> Path:
    """Where the output of a plan's process started from the dashboard goes."""
    return plans_dir() / f"{_file_name(pid)}.log"


def _write(pid: str, data: dict[str, Any]) -> str | None:
    """Write the record whole (a reader never sees half of it); the problem in one line, None when written."""
    target = path(pid)
    try:
        make_private_dir(target.parent)
        part = target.with_suffix(f".{os.getpid()}.part")
        part.write_text(json.dumps(data, indent=1))
        os.replace(part, target)
    except OSError as exc:
        return f"plan record {target}: not written ({exc.strerror or exc})"
    return None


def _load(file: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("version") == VERSION else None


def begin(setup: plan.Setup, command: PlanCommand, process: Process | None = None) -> str | None:
    """Record a plan as ``process`` (default: this one) starts racing it (what an earlier process of the plan
    recorded is replaced). Returns the problem in one line when the record cannot be written (the plan goes
    on)."""
    data = {
        "version": VERSION, "plan_id": setup.pid, "command": dataclasses.asdict(command),
        "recipe_text": setup.base.to_toml(), "steps": setup.steps, "repeat": setup.repeat,
        "memory": dataclasses.asdict(setup.memory), "candidates": [dataclasses.asdict(c) for c in setup.candidates],
        "process": dataclasses.asdict(process or Process.of(os.getpid())), "started_at": time.time(),
        "ended": None, "commit": None,
    }
    return _write(setup.pid, data)


def _update(pid: str, **fields: Any) -> None:
    data = _load(path(pid))
    if data is not None:
        _write(pid, {**data, **fields})


def end(pid: str, progress: plan.Progress) -> None:
    """Record how the race ended: what the budget left out, whether a user stopped it."""
    over = [[t.candidate.label, t.repeat] for t in progress.over_budget]
    _update(pid, ended={"stopped": progress.stopped, "over_budget": over})


def committed(pid: str, run_id: int | None = None, refused: str | None = None) -> None:
    """Record what ``--commit`` did: the run it started, or why it started none."""
    _update(pid, commit={"run_id": run_id, "refused": refused})


def _candidate(raw: dict[str, Any]) -> plan.Candidate:
    names = {f.name for f in dataclasses.fields(plan.Candidate)}
    known = {k: v for k, v in raw.items() if k in names}
    split = known.get("split")
    known["split"] = BatchSplit(**split) if split else None
    known["overrides"] = tuple(known.get("overrides", ()))
    return plan.Candidate(**known)


def read(pid: str) -> PlanRecord | None:
    """The plan's record on this host; None when there is none (or it cannot be read: the plan is then
    shown from its trials)."""
    found = _read_file(path(pid))
    return found if found is not None and found.setup.pid == pid else None


def _read_file(file: Path) -> PlanRecord | None:
    data = _load(file)
    if data is None:
        return None
    try:
        pid = str(data["plan_id"])
        raw = data["command"]
        command = PlanCommand(raw["recipe"], tuple(raw["sets"]),
                              tuple(raw["strategies"]) if raw["strategies"] else None, raw["nproc"], raw["steps"],
                              raw["repeat"])
        base = parse_recipe(data["recipe_text"], source=str(file), base_dir=Path(command.recipe).parent)
        setup = plan.Setup(base, pid, [_candidate(c) for c in data["candidates"]], plan.Memory(**data["memory"]),
                           int(data["steps"]), int(data["repeat"]))
        process = Process(**data["process"]) if data.get("process") else None
        ended = data.get("ended")
        commit = data.get("commit") or {}
        over = tuple((str(label), int(k)) for label, k in ended["over_budget"]) if ended else ()
        return PlanRecord(setup, command, process, Ended(bool(ended["stopped"]), over) if ended else None,
                          float(data["started_at"]), commit.get("run_id"), commit.get("refused"))
    except (KeyError, TypeError, ValueError, RecipeError):
        return None


def _mesh(run: RunInfo) -> str:
    """An ``hsdp`` trial's mesh in words (its label names it), from its recipe; empty for other strategies."""
    try:
        sizes = layout.mesh(parse_recipe(run.recipe_text, source=f"run {run.id}"))
    except (RecipeError, ValueError):
        return ""
    return layout.mesh_text(sizes) if sizes is not None else ""


def setup_from_trials(pid: str, runs: Sequence[RunInfo]) -> plan.Setup | None:
    """A plan with no record here, from its stored trials (oldest first): one candidate per strategy,
    processes and grid raced, with the batch split and estimate each trial stored; what was not raced, and
    the memory judged against, are not known. None when there is no trial."""
    if not runs:
        return None
    try:
        base = parse_recipe(runs[0].recipe_text, source=f"run {runs[0].id}")
    except RecipeError:
        return None
    found: dict[tuple[str, int, str], plan.Candidate] = {}
    counts: dict[tuple[str, int, str], int] = {}
    for r in runs:
        key = (r.strategy, r.nproc, r.summary.sweep_grid or "")
        counts[key] = counts.get(key, 0) + 1
        if key not in found:
            estimate = (r.summary.estimate or {}).get("per_device_bytes", {}).get("total")
            found[key] = plan.Candidate(r.strategy, r.nproc, grid=key[2], note=r.summary.sweep_note or "",
                                        estimated=int(estimate) if estimate is not None else None, mesh=_mesh(r))
    memory = plan.Memory(0, False, "not known here: this host has no record of the plan")
    return plan.Setup(base, pid, list(found.values()), memory, max(r.total_steps or 0 for r in runs), max(counts.values()))


def progress_of(store: Store, pid: str, record: PlanRecord | None) -> plan.Progress:
    """The plan's stored trials (:func:`runner.service.plan.stored`), with what its record says the budget
    left out."""
    found = plan.stored(store, pid)
    if record is not None and record.ended is not None:
        by_label = {c.label: c for c in record.setup.candidates}
        found.over_budget = [plan.Trial(by_label[label], k) for label, k in record.ended.over_budget
                             if label in by_label]
        found.stopped = record.ended.stopped
    return found


@dataclass(frozen=True)
class Listing:
    """One plan the store or this host knows: its id, trials stored and newest trial, and record."""

    pid: str
    trials: int
    newest_run: int | None
    record: PlanRecord | None


def list_plans(store: Store) -> list[Listing]:
    """Every plan: those with trials in the store (the sweep ids that are plan ids), newest trial first,
    after those recorded here with no trial yet (just started)."""
    stored = {pid: (n, newest) for pid, n, newest in store.sweeps(plan.PLAN_PREFIX)}
    here = {r.setup.pid: r for p in plans_dir().glob("*.json") if (r := _read_file(p)) is not None}
    fresh = sorted((r for pid, r in here.items() if pid not in stored), key=lambda r: r.started_at, reverse=True)
    return [*(Listing(r.setup.pid, 0, None, r) for r in fresh),
            *(Listing(pid, n, newest, here.get(pid)) for pid, (n, newest) in stored.items())]
