"""``ftui runs`` (the runs in the store, newest first) and ``ftui show`` (one run)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from tui.cli.common import ExitCode, UsageError, console, db_option, open_store, positive_int


def add_parser(sub: Any) -> None:
    runs = sub.add_parser("runs", help="list the runs in the store")
    runs.add_argument("--status", choices=["created", "running", "completed", "failed", "stopped"])
    runs.add_argument("--format", choices=["text", "json"], default="text")
    shown = runs.add_mutually_exclusive_group()
    shown.add_argument("--limit", type=positive_int, metavar="N",
                       help=f"the newest N runs (default: {TABLE_LIMIT} in the table, every run in --format json)")
    shown.add_argument("--all", action="store_true", help="every run in the table too")
    db_option(runs)
    runs.set_defaults(handler=cmd_runs)

    show = sub.add_parser("show", help="show one run: recipe, status, summary, metrics")
    show.add_argument("run_id", type=int)
    show.add_argument("--format", choices=["text", "json"], default="text")
    db_option(show)
    show.set_defaults(handler=cmd_show)



TABLE_LIMIT = 100
"""Runs the table shows by default (the newest)."""


def cmd_runs(args: argparse.Namespace) -> int:
    store = open_store(args, create=False)
    # A team's store holds thousands of runs: the table shows the newest (rendering every row of 2,000
    # took 1.8 s); JSON, for scripts, holds every run unless --limit says otherwise.
    limit = args.limit if args.limit is not None else (None if args.all or args.format == "json" else TABLE_LIMIT)
    runs = store.list_runs(status=args.status, limit=limit)
    from dataclasses import replace

    from tui.cli.nodes import name_text, remote_facts

    facts = remote_facts(store, runs)  # runs on other machines: their nodes and SLURM job, from the store
    if args.format == "json":
        from tui.render.report import run_to_json

        print(json.dumps([run_to_json(r) | facts.get(r.id, {}) for r in runs], indent=2))
        return ExitCode.OK
    from tui.render.report import runs_table

    out = console()
    out.print(runs_table([replace(r, name=name_text(r, facts.get(r.id))) for r in runs], width=out.width))
    if limit is not None and len(runs) == limit:
        older = store.count_runs(status=args.status) - len(runs)
        if older > 0:
            out.print(f"{older:,} older run{'s' if older != 1 else ''} not shown: --limit N or --all",
                      markup=False, highlight=False)
    return ExitCode.OK


def cmd_show(args: argparse.Namespace) -> int:
    store = open_store(args, create=False)
    run = store.get_run(args.run_id)
    if run is None:
        raise UsageError(f"run {args.run_id}: no such run in {store.url}")
    from tui.render.report import run_detail, run_to_json

    metrics = store.metrics(run.id)
    from tui.cli.nodes import nodes_table, remote_facts

    facts = remote_facts(store, [run]).get(run.id, {})  # several machines / a SLURM job: from the store
    if args.format == "json":
        samples = [{"step": e.payload.get("step"), "samples": e.payload.get("samples")}
                   for e in store.events(run.id, "eval_samples")]
        print(json.dumps(run_to_json(run, metrics, store.named_metrics(run.id), samples) | facts, indent=2))
        return ExitCode.OK
    out = console()
    out.print(run_detail(run, metrics))
    if facts.get("nodes"):
        out.print(nodes_table(facts))
    return ExitCode.OK
