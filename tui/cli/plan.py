"""``ftui plan``: race the strategies this host can run a recipe under and say which to use
(:mod:`runner.service.plan`; the output: :mod:`tui.render.plan`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.text import Text

from runner.analysis.ranking import Ranking
from runner.analysis.track_record import host_track_record
from runner.service import plan, plan_commit, plan_record
from runner.service.plan_record import PlanCommand
from runner.service.sweep import SweepItem, SweepResult
from runner.spec.recipe import RecipeError
from runner.spec.status import ENDED_BY_USER
from runner.watch.procs import StopRequest
from store import Store
from tui.cli.common import open_store, settle_abandoned
from tui.cli.exits import ExitCode, UsageError
from tui.cli.progress import SweepProgress
from tui.render.plan import plan_markdown, plan_report, plan_table


def _command(args: argparse.Namespace) -> PlanCommand:
    """The plan's arguments, as its record keeps them (the recipe's path made absolute)."""
    names = None
    if args.strategies is not None:
        names = tuple(s.strip() for s in args.strategies.split(",") if s.strip())
        if not names:
            raise UsageError(f"--strategies: no strategy named in {args.strategies!r} (e.g. single,ddp)")
    return PlanCommand(str(Path(args.recipe).absolute()), tuple(args.overrides), names, args.nproc, args.steps,
                       args.repeat)


def _setup(command: PlanCommand) -> plan.Setup:
    """The plan, checked before anything is recorded (bad input: one line, exit 2)."""
    try:
        return command.setup()
    except (RecipeError, plan.PlanError) as exc:
        raise UsageError(str(exc)) from None


def _announce(console: Console, setup: plan.Setup, progress: plan.Progress) -> None:
    raced = [c for c in setup.candidates if c.skip is None]
    done = sum(len(progress.done(c)) for c in raced)
    again = ""
    if done:
        left = plan.next_trial(raced, progress, setup.repeat) is not None
        again = f"; {done} trial(s) already stored, " + ("continuing" if left else "nothing left to race")
    console.print(Text.assemble("plan ", (setup.pid, "bold"), f": {len(raced)} of {len(setup.candidates)} "
                                f"candidates to race, {setup.steps} steps x {setup.repeat} repeat(s){again}"))
    for c in setup.candidates:
        if c.skip is not None:
            console.print(Text(f"  not raced: {c.label}: {c.skip}", style="dim"))


def cmd_plan(args: argparse.Namespace) -> int:
    command = _command(args)
    setup = _setup(command)
    store = open_store(args, create=True)
    settle_abandoned(store)
    console = Console(highlight=False, stderr=args.format != "text")
    budget_s = args.budget * 60 if args.budget else None
    before = plan.stored(store, setup.pid)
    try:
        plan.check_start(setup.candidates, before, setup.repeat, budget_s)
    except plan.PlanError as exc:
        raise UsageError(str(exc)) from None
    _announce(console, setup, before)
    problem = plan_record.begin(setup, command)  # what the dashboard's Plan view reads beside the store
    if problem:
        console.print(f"warning: {problem}", markup=False)
    live = SweepProgress(console)

    def on_start(item: SweepItem, run_id: int) -> None:  # labels and notes are run text: never markup
        console.print(f"run {run_id} · {item.strategy} x {item.nproc}{f' [{item.grid}]' if item.grid else ''} · "
                      f"{item.note}", markup=False)
        live.begin(f"run {run_id} {item.strategy}")

    def on_done(item: SweepItem, result: SweepResult) -> None:
        live.end()
        style = {"completed": "green", "failed": "red"}.get(result.status, "yellow")
        console.print(Text.assemble(f"  run {result.run_id} {item.strategy}: ", (result.status, style),
                                    f": {result.reason}" if result.reason else ""), soft_wrap=True)

    stop = StopRequest()
    restore = stop.install()  # Ctrl-C/SIGTERM/SIGHUP stop the running trial and end the plan; its trials stay
    try:
        progress = plan.race(store, args.recipe, setup.candidates, setup.pid, args.overrides, setup.steps,
                             setup.repeat, budget_s=budget_s, on_start=on_start, on_done=on_done,
                             on_event=live.on_event, stop=stop, max_steps=setup.base.train.max_steps)
    except plan.PlanError as exc:
        raise UsageError(str(exc)) from None
    finally:
        live.end()
        restore()
    plan_record.end(setup.pid, progress)
    found = plan.standings(store, setup.pid)
    report = plan_report(setup, progress, found[1] if found else None, host_track_record(store))
    if args.format == "json":
        print(json.dumps(report, indent=2))
    elif args.format == "md":
        print(plan_markdown(report), end="")
    else:
        console.print(plan_table(report, console.width))
    if progress.stopped or stop.is_set():
        console.print(f"plan stopped: run the same command again to continue {setup.pid}", markup=False)
        return ExitCode.INTERRUPTED
    if not any(e["status"] == "completed" for e in report["candidates"]):
        return ExitCode.FAILED
    return _commit(args, store, setup, found[1] if found else None, console) if args.commit else ExitCode.OK


def _commit(args: argparse.Namespace, store: Store, setup: plan.Setup, ranking: Ranking | None,
            console: Console) -> int:
    """``--commit``: the winner put in this host's queue (it starts when no run holds its devices) and followed
    like ``ftui run`` until its run ends; a plan without a winner, or a commit the pre-flight refuses, queues
    nothing and says why (exit 1: the plan itself is stored and complete)."""
    try:
        winner = plan_commit.chosen(setup, ranking)
        queued = plan_commit.enqueue_commit(store, Path(args.recipe), setup, winner, args.overrides)
    except (plan.PlanError, RecipeError) as exc:
        line = str(exc) if isinstance(exc, plan.PlanError) else f"--commit: not queued: {exc}"
        console.print(line, markup=False)
        plan_record.committed(setup.pid, refused=line)
        return ExitCode.FAILED
    entry = queued.entry
    for warning in entry.warnings:
        console.print(f"warning: {warning}", markup=False)
    where = "next" if entry.position == 1 else f"number {entry.position} in line"
    console.print(f"commit: queued entry {entry.entry_id} ({where} on this host; takes {', '.join(entry.devices)}): "
                  f"{queued.start.line}", markup=False, soft_wrap=True)
    live = SweepProgress(console)

    def on_start(item: SweepItem, run_id: int) -> None:
        console.print(f"commit: run {run_id} · {item.strategy} x {item.nproc} · {item.note}", markup=False)
        plan_record.committed(setup.pid, run_id=run_id)
        live.begin(f"run {run_id} {item.strategy}")

    stop = StopRequest()
    restore = stop.install()  # Ctrl-C: out of the queue before it starts, else its run is stopped
    try:
        result = plan_commit.follow_commit(store, queued, on_start=on_start, on_event=live.on_event, stop=stop)
    finally:
        live.end()
        restore()
    what = f"run {result.run_id}" if result.run_id is not None else f"commit (queue entry {entry.entry_id})"
    console.print(f"{what}: {result.status}" + (f": {result.reason}" if result.reason else ""), markup=False)
    if result.status == "completed":
        return ExitCode.OK
    return ExitCode.INTERRUPTED if result.status in ENDED_BY_USER else ExitCode.FAILED
