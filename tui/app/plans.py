"""What the Plan view reads and starts, off the UI thread: a plan's report from its record and the store
(:class:`PlanFeed`, polled as the Runs screen polls; the figures are ``ftui plan``'s own,
:func:`tui.render.plan.plan_report` over :func:`runner.service.plan.standings`), and ``ftui plan`` started
as a process of its own (:func:`start_plan`), so that a plan outlives the dashboard as a run does.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runner.analysis.ranking import Ranking
from runner.analysis.track_record import host_track_record
from runner.service import plan, plan_commit, plan_record
from runner.service.plan_record import PlanCommand, PlanRecord, Process
from runner.spec.paths import make_private_dir
from runner.spec.recipe import Recipe, RecipeError
from runner.spec.status import LIVE
from runner.watch import procs
from store import RunInfo, Store
from tui.app.messages import PlanPrepared
from tui.app.poll import tail_lines
from tui.render.plan import plan_report

CLI_MODULE = "tui.cli"
"""``python -m tui.cli``: the ``ftui`` command, as the plan's own process runs it."""
LOG_LINES = 4
"""Lines of the plan process's output the view shows (its last words: a refusal, the commit's line)."""


@dataclass
class PlanView:
    """What the Plan view shows of one plan; built by the feed in a worker thread."""

    pid: str
    report: dict[str, Any] | None
    """:func:`tui.render.plan.plan_report` (None: nothing known of the plan yet, no record and no trial)."""
    ranking: Ranking | None
    record: PlanRecord | None
    racing: bool
    """A process of this plan runs now (the one the record names, or the one the dashboard just started)."""
    process: Process | None = None
    """That process (None when none runs)."""
    running: list[RunInfo] = field(default_factory=list)
    """Its trials (or committed run) running now."""
    committed: RunInfo | None = None
    """The run ``--commit`` started, as the store has it now."""
    log: list[str] = field(default_factory=list)
    """The last lines the plan's process wrote (when the dashboard started it)."""


def command_line(command: PlanCommand, commit: bool = False) -> str:
    """The command as a person types it (a shell's quoting: recipe paths may hold spaces)."""
    return shlex.join(["ftui", *command.argv(), *(["--commit"] if commit else [])])


class PlanFeed:
    """One plan's view, updated from the store and the plan's record by :meth:`poll`; the figures are
    computed again only when a trial changes (a new one, or one that ended), or the record does."""

    def __init__(self, store: Store, pid: str, started: Process | None = None) -> None:
        self.store = store
        self.pid = pid
        self.started = started
        """The process the dashboard started for this plan (before it writes the record)."""
        self._seen: tuple[Any, ...] = ()
        self._view: PlanView | None = None
        self._record: tuple[tuple[int, int] | None, PlanRecord | None] = (None, None)

    def record(self) -> PlanRecord | None:
        """The plan's record, read again only when its file changed."""
        try:
            info = plan_record.path(self.pid).stat()
            stamp: tuple[int, int] | None = (info.st_mtime_ns, info.st_size)
        except OSError:
            stamp = None
        if stamp != self._record[0]:
            self._record = (stamp, plan_record.read(self.pid) if stamp else None)
        return self._record[1]

    def poll(self) -> PlanView | None:
        """The plan now; None when nothing shown changed since the last poll. Blocking: from a worker."""
        runs = self.store.list_runs(sweep_id=self.pid)
        record = self.record()
        process = next((p for p in (record.process if record else None, self.started) if p is not None and p.alive()),
                       None)
        racing = process is not None
        committed = self.store.get_run(record.commit_run) if record and record.commit_run else None
        log = tail_lines(plan_record.log_path(self.pid), LOG_LINES)
        seen = (tuple((r.id, r.status) for r in runs), self._record[0], process, committed and committed.status, log)
        if seen == self._seen:
            return None
        changed = self._view is None or seen[:3] != self._seen[:3]
        self._seen = seen
        report, ranking = self._figures(runs, record, racing) if changed else (
            (self._view.report, self._view.ranking) if self._view else (None, None))
        live = [r for r in [*runs, *([committed] if committed else [])] if r.status in LIVE]
        self._view = PlanView(self.pid, report, ranking, record, racing, process, live, committed, log)
        return self._view

    def _figures(self, runs: list[RunInfo], record: PlanRecord | None,
                 racing: bool) -> tuple[dict[str, Any] | None, Ranking | None]:
        setup = record.setup if record else plan_record.setup_from_trials(self.pid, list(reversed(runs)))
        if setup is None:
            return None, None
        found = plan.standings(self.store, self.pid) if runs else None
        ranking = found[1] if found else None
        progress = plan_record.progress_of(self.store, self.pid, record)
        return plan_report(setup, progress, ranking, host_track_record(self.store), racing=racing), ranking


PLAN_SETS_PER_CANDIDATE = ("launch.strategy", "launch.nproc")
"""Fields each candidate of a plan sets itself: not passed to ``ftui plan`` (the form's processes are its
``--nproc``), so the plan of a recipe is the same whichever strategy Compose shows."""


def command_of(recipe_path: str, changed: Sequence[str], recipe: Recipe) -> PlanCommand:
    """Compose's ``ftui plan``: the loaded file (absolute) with ``changed`` (the form's ``--set`` values that
    differ from it) but those each candidate sets, at the form's processes (the command's default, the GPUs
    and at least 2, when the form says 1)."""
    sets = tuple(s for s in changed if s.split("=", 1)[0] not in PLAN_SETS_PER_CANDIDATE)
    nproc = recipe.launch.nproc if recipe.launch.nproc > 1 else None
    return PlanCommand(str(Path(recipe_path).expanduser().absolute()), sets, nproc=nproc)


def prepare(command: PlanCommand) -> PlanPrepared:
    """The plan of ``command`` on this host, checked as ``ftui plan`` checks it but for the data and model
    (the plan's own process checks those: tokenizing data not cached yet would import transformers here),
    and whether a process races it already. Blocking (the recipe, estimates): from a worker.

    Raises:
        RecipeError, plan.PlanError: what ``ftui plan`` refuses (one line).
    """
    setup = command.setup(inputs=False)
    record = plan_record.read(setup.pid)
    racing = record is not None and record.process is not None and record.process.alive()
    return PlanPrepared(command, setup.pid, sum(c.skip is None for c in setup.candidates), len(setup.candidates),
                        setup.steps, racing)


def race_question(prepared: PlanPrepared) -> str:
    """What Compose asks before a plan starts: what it races, and how many trials per candidate."""
    return (f"Race {prepared.raced} of {prepared.candidates} candidates of this recipe on this host, "
            f"{prepared.steps} steps each, in the background (plan {prepared.pid}). Trials per candidate (2 or "
            "more can name a winner beyond the spread; enter starts, escape cancels):")


def start_plan(command: PlanCommand, db_url: str, pid: str, commit: bool = False) -> Process:
    """``ftui plan ...`` (with ``--commit``) as a process of its own, in a session of its own, its output
    appended to the plan's log: it outlives the dashboard. Blocking (a fork): from a worker.

    Raises:
        OSError: the log's folder cannot be made, or the process cannot start.
    """
    log = plan_record.log_path(pid)
    make_private_dir(log.parent)
    argv = [sys.executable, "-m", CLI_MODULE, *command.argv(), *(["--commit"] if commit else []), "--db", db_url]
    child = procs.spawn(argv, {}, Path.cwd(), log)
    return Process.of(child.pid)


@dataclass(frozen=True)
class CommitStart:
    """What the commit key did: the line to show, and the process it started (None: it started none)."""

    line: str
    process: Process | None = None


def start_commit(view: PlanView, db_url: str) -> CommitStart:
    """The commit key: ``ftui plan ... --commit`` started detached when the plan names a winner (the
    decision :func:`runner.service.plan_commit.chosen` makes, as the command makes it again); otherwise nothing
    is started and the line says why. Blocking (the recipe is read again): from a worker."""
    record = view.record
    if view.racing:
        return CommitStart(f"plan {view.pid} is still racing: commit when its process ends")
    if record is None:
        return CommitStart(f"no record of plan {view.pid} on this host: commit it where it was raced "
                           f"(ftui plan RECIPE ... --commit)")
    try:
        plan_commit.chosen(record.setup, view.ranking)
        now = record.command.setup(inputs=False)  # its id: the process checks the data and model
    except (plan.PlanError, RecipeError) as exc:
        return CommitStart(str(exc))
    if now.pid != view.pid:
        return CommitStart(f"--commit: not started: the recipe or the host changed since plan {view.pid} (the "
                           f"same command now makes plan {now.pid})")
    try:
        process = start_plan(record.command, db_url, view.pid, commit=True)
    except OSError as exc:
        return CommitStart(f"--commit: not started: {exc}")
    return CommitStart(f"committing: {command_line(record.command, commit=True)} (pid {process.pid}, "
                       f"output: {plan_record.log_path(view.pid)})", process)
