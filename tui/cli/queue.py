"""``ftui queue`` (the list), ``ftui queue add`` (a run put in line, checked as ``ftui run`` checks it) and
``ftui queue rm`` (one taken out): :mod:`runner.service.queue`."""

from __future__ import annotations

import argparse
import json
import socket

from rich.console import Console
from rich.text import Text

from runner.service import queue
from runner.spec.recipe import RecipeError
from runner.spec.status import QUEUED
from store import Store, StoreError
from store import queue as entries_store
from tui.cli.common import console, open_store
from tui.cli.exits import ExitCode, UsageError
from tui.cli.run import load_run_recipe
from tui.render.queue import queue_json, queue_table, state_words


def cmd_queue(args: argparse.Namespace) -> int:
    """``ftui queue``: every entry in line order, and this host's queue runner."""
    store = open_store(args, create=False)
    listed = entries_store.entries(store)
    if args.format == "json":
        print(json.dumps(queue_json(listed), indent=2))
        return ExitCode.OK
    out = console()
    if not listed:
        out.print("the queue is empty: ftui queue add RECIPE puts a run in it")
        return ExitCode.OK
    out.print(queue_table(listed))
    out.print(runner_line(store, sum(e.status == QUEUED and e.host == socket.gethostname() for e in listed)),
              markup=False, highlight=False, soft_wrap=True)
    return ExitCode.OK


def runner_line(store: Store, waiting_here: int) -> str:
    """Whether this host's queue runner is alive, and what to do when entries wait without one."""
    host = socket.gethostname()
    pid = queue.runner_pid(store.url)
    if pid is not None:
        return f"queue runner of {host}: pid {pid}"
    if waiting_here:
        return (f"no queue runner is alive on {host} while {waiting_here} entr{'ies' if waiting_here != 1 else 'y'} "
                "wait: ftui recover starts it")
    return f"no queue runner on {host}: nothing waits here"


def cmd_queue_add(args: argparse.Namespace) -> int:
    """``ftui queue add RECIPE [flags of ftui run]``: checked now, recorded, started by the runner in turn."""
    if args.recipe is None and args.script is None:
        raise UsageError("queue add: give a recipe file, or --script FILE (your own training script)")
    recipe = load_run_recipe(args)
    source = str(args.recipe) if args.recipe is not None else str(recipe.launch.script)
    options = queue.QueueOptions(fake_gpus=args.fake_gpus, force=args.force, allow_data_change=args.allow_data_change,
                                 sample_interval_s=args.sample_interval, hang_after_s=args.hang_after,
                                 grace_s=args.grace)
    try:
        warnings = queue.admit(recipe, options)  # before the store is opened: bad input records nothing
    except RecipeError as exc:
        raise UsageError(f"{args.recipe}: {exc}" if args.recipe is not None else str(exc)) from None
    store = open_store(args, create=True)
    try:
        added = queue.add(store, recipe, source, options, warnings)
    except (StoreError, OSError) as exc:  # the database cannot take it, the data folder cannot be written
        raise UsageError(str(exc)) from None
    out = console()
    for warning in added.warnings:
        out.print(Text.assemble(("warning:", "yellow"), f" {warning}"), soft_wrap=True)
    say_added(out, added, recipe.name)
    return ExitCode.OK


def say_added(out: Console, added: queue.Enqueued, name: str) -> None:
    where = "next" if added.position == 1 else f"number {added.position} in line"
    out.print(Text(f"queued entry {added.entry_id}: {name} ({where} on {socket.gethostname()}; takes "
                   f"{', '.join(added.devices)})"), soft_wrap=True)
    if added.runner_pid is not None:
        out.print(f"started the queue runner (pid {added.runner_pid}): it starts each run when its devices are free, "
                  "and exits when the queue is empty", markup=False, highlight=False, soft_wrap=True)
    else:
        out.print("the queue runner of this host is alive: it starts the run in turn", markup=False, highlight=False,
                  soft_wrap=True)


def cmd_queue_rm(args: argparse.Namespace) -> int:
    """``ftui queue rm ID``: an entry taken out (a waiting one, or one that ended); the running one is refused."""
    store = open_store(args, create=False)
    try:
        entry = queue.remove(store, args.entry_id)
    except queue.QueueRefused as exc:
        raise UsageError(str(exc)) from None
    console().print(Text(f"removed queue entry {entry.id}: {entry.name} ({state_words(entry)})"))
    return ExitCode.OK
