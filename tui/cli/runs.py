"""``ftui runs`` (the runs in the store, newest first) and ``ftui show`` (one run); a run on several
machines or a SLURM job shows its nodes and the job's state, from the store (and ``squeue``/``sacct``)."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from typing import Any

from rich.table import Table
from rich.text import Text

from runner.nodes.slurm import job_state
from store import RunInfo, Store
from store.nodes import nodes_of, samples_per_node
from tui.cli.common import console, open_store, settle_abandoned
from tui.cli.exits import ExitCode, UsageError
from tui.cli.parser import TABLE_LIMIT
from tui.render.report import run_detail, run_to_json, runs_table


def cmd_runs(args: argparse.Namespace) -> int:
    store = open_store(args, create=False)
    settle_abandoned(store)
    # A team's store holds thousands of runs: the table shows the newest (rendering every row of 2,000
    # took 1.8 s); JSON, for scripts, holds every run unless --limit says otherwise.
    limit = args.limit if args.limit is not None else (None if args.all or args.format == "json" else TABLE_LIMIT)
    runs = store.list_runs(status=args.status, limit=limit)
    facts = remote_facts(store, runs)  # runs on other machines: their nodes and SLURM job, from the store
    if args.format == "json":
        print(json.dumps([run_to_json(r) | facts.get(r.id, {}) for r in runs], indent=2))
        return ExitCode.OK
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
    settle_abandoned(store)
    run = store.get_run(args.run_id)
    if run is None:
        raise UsageError(f"run {args.run_id}: no such run in {store.url}")
    metrics = store.metrics(run.id)
    facts = remote_facts(store, [run]).get(run.id, {})  # several machines / a SLURM job: from the store
    if args.format == "json":
        samples = [{"step": e.payload.get("step"), "samples": e.payload.get("samples")}
                   for e in store.events(run.id, "eval_samples")]
        print(json.dumps(run_to_json(run, metrics, store.named_metrics(run.id), samples) | facts, indent=2))
        return ExitCode.OK
    out = console()
    out.print(run_detail(run, metrics, with_recipe=args.recipe, named=store.named_last([run.id]).get(run.id)))
    if facts.get("nodes"):
        out.print(nodes_table(facts))
    return ExitCode.OK


def remote_facts(store: Store, runs: list[RunInfo]) -> dict[int, dict[str, Any]]:
    """What ``ftui runs`` adds for runs on other machines, from the store (and ``squeue``/``sacct`` for a
    SLURM job still queued or running): ``{"slurm": {"job_id", "state"}, "nodes": [...]}`` by run id."""
    facts: dict[int, dict[str, Any]] = {}
    per_run = nodes_of(store, [r.id for r in runs if (r.nnodes or 1) > 1 or r.slurm_job_id])
    for run in runs:
        entry: dict[str, Any] = {}
        if run.slurm_job_id:
            live = run.status in ("created", "running")
            entry["slurm"] = {"job_id": run.slurm_job_id, "state": job_state(run.slurm_job_id) if live else None}
        if run.id in per_run:
            counts = samples_per_node(store, run.id)
            entry["nodes"] = [{"slot": n.slot, "node_rank": n.node_rank, "host": n.host, "ranks": n.ranks,
                               "status": n.status, "error": n.error, "samples": counts.get(n.slot, 0),
                               "heartbeat_age_s": round(n.heartbeat_age(), 1)} for n in per_run[run.id]]
        if entry:
            facts[run.id] = entry
    return facts


def name_text(run: RunInfo, facts: dict[str, Any] | None) -> str:
    """The name cell of a run on other machines: ``quickstart · 2/2 nodes · slurm pending``."""
    if not facts:
        return str(run.name)
    parts = [str(run.name)]
    if facts.get("nodes") is not None and (run.nnodes or 1) > 1:
        parts.append(f"{len(facts['nodes'])}/{run.nnodes} nodes")
    state = (facts.get("slurm") or {}).get("state")
    if state:
        parts.append(f"slurm {state}")
    elif facts.get("slurm"):
        parts.append(f"slurm job {facts['slurm']['job_id']}")
    return " · ".join(parts)


def nodes_table(facts: dict[str, Any]) -> Table:
    """The nodes of a run on several machines as a rich table (``ftui show``); text from the store as text."""
    table = Table(title="nodes (from the store: each node agent's row)", title_justify="left")
    for col in ("node", "host", "ranks", "status", "samples", "last report", "reason"):
        table.add_column(col)
    for n in facts.get("nodes", []):
        node = str(n["node_rank"]) if n["node_rank"] is not None else f"#{n['slot']}"
        table.add_row(node, Text(n["host"]), ",".join(map(str, n["ranks"])) or "-", Text(n["status"]),
                      f"{n['samples']:,}", f"{n['heartbeat_age_s']:.0f} s ago", Text(n["error"] or ""))
    return table
