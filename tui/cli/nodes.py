"""The multi-node flags of ``ftui run`` (``--nnodes --node-rank --main-addr --main-port --rdzv-endpoint
--run-key``): recipe overrides for the launch fields, and this machine's :class:`runner.spec.rendezvous.NodeSpec`."""

from __future__ import annotations

import argparse
import json
from typing import Any

from tui.cli.common import UsageError, positive_int

FIELDS = ("nnodes", "node_rank", "main_addr", "main_port", "rdzv_endpoint")
"""Flags that are also recipe fields (``launch.<name>``)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the multi-node flags to ``ftui run``."""
    group = parser.add_argument_group(
        "more than one machine",
        "Run the same command on every machine (README: More than one machine); each starts its own ranks and "
        "writes to the shared store (--db), and one run ties them together.")
    group.add_argument("--nnodes", type=positive_int, metavar="N", help="machines in the run (launch.nnodes)")
    group.add_argument("--node-rank", type=int, metavar="K",
                       help="this machine's node rank, 0..N-1, static rendezvous (launch.node_rank)")
    group.add_argument("--main-addr", metavar="ADDR", help="the main node's address (launch.main_addr)")
    group.add_argument("--main-port", type=int, metavar="PORT", help="its rendezvous port (default 29500)")
    group.add_argument("--rdzv-endpoint", metavar="HOST:PORT",
                       help="c10d rendezvous instead of --main-addr/--node-rank: node ranks assigned by arrival")
    group.add_argument("--run-key", metavar="KEY",
                       help="what the nodes share to find one run in the store (default: derived from the "
                            "rendezvous and the recipe name, or $SLURM_JOB_ID)")


def overrides(args: argparse.Namespace) -> list[str]:
    """``--set`` style overrides for the flags given."""
    out = []
    for name in FIELDS:
        value = getattr(args, name, None)
        if value is not None:
            out.append(f"launch.{name}={json.dumps(value)}")
    return out


def given(args: argparse.Namespace) -> bool:
    """Whether any multi-node flag was given."""
    return any(getattr(args, name, None) is not None for name in (*FIELDS, "run_key"))


def prepare_resume(args: argparse.Namespace, store: Any, out: Any) -> Any:
    """``ftui resume ID --nnodes N --node-rank K --main-addr A`` (or ``--rdzv-endpoint HOST:PORT``): this node's
    part of the resumed run (:mod:`runner.nodes.resume`, :mod:`runner.nodes.c10d_resume`); a step passed over is said on
    one line."""
    from rich.text import Text

    from runner.service import launch

    def warn(text: str) -> None:
        out.print(Text.assemble(("warning:", "yellow"), f" {text}"), soft_wrap=True)

    request = launch.NodeResumeRequest(args.run_id, args.nnodes, args.node_rank, args.main_addr, args.main_port,
                                       args.rdzv_endpoint, args.run_key)
    prepared = launch.resume_node(store, request, warn=warn)
    assert prepared.node is not None
    spec = prepared.node.spec
    rank = "from c10d" if spec.node_rank is None else spec.node_rank
    out.print(f"node #{prepared.node.slot} of {spec.nnodes} (node rank {rank}, rendezvous at "
              f"{spec.main_addr}:{spec.main_port}, run key {spec.run_key})", markup=False, soft_wrap=True)
    return prepared


def spec_for(args: argparse.Namespace, recipe: Any) -> Any:
    """This machine's :class:`runner.spec.rendezvous.NodeSpec`, or None for a one-machine run (UsageError on a
    setting that cannot work)."""
    import os

    from runner.spec.rendezvous import NodesError, node_spec

    launch = recipe.launch
    if (launch.nnodes or 1) <= 1 and launch.rdzv_endpoint is None:
        for name in FIELDS[1:]:
            if getattr(launch, name) is not None:
                raise UsageError(f"launch.{name}: only for a multi-node run (--nnodes 2 or more)")
        return None
    key = getattr(args, "run_key", None)
    if key is None and os.environ.get("SLURM_JOB_ID"):
        key = f"slurm-{os.environ['SLURM_JOB_ID']}"  # every node of the job derives the same
    try:
        return node_spec(launch.nnodes, launch.node_rank, launch.main_addr, launch.main_port,
                         launch.rdzv_endpoint, key, recipe.name)
    except NodesError as exc:
        raise UsageError(str(exc)) from None


def remote_facts(store: Any, runs: list[Any]) -> dict[int, dict[str, Any]]:
    """What ``ftui runs`` adds for runs on other machines, from the store (and ``squeue``/``sacct`` for a
    SLURM job still queued or running): ``{"slurm": {"job_id", "state"}, "nodes": [...]}`` by run id."""
    from runner.nodes.slurm import job_state
    from store.nodes import nodes_of, samples_per_node

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


def name_text(run: Any, facts: dict[str, Any] | None) -> str:
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


def nodes_table(facts: dict[str, Any]) -> Any:
    """The nodes of a run on several machines as a rich table (``ftui show``); text from the store as text."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title="nodes (from the store: each node agent's row)", title_justify="left")
    for col in ("node", "host", "ranks", "status", "samples", "last report", "reason"):
        table.add_column(col)
    for n in facts.get("nodes", []):
        node = str(n["node_rank"]) if n["node_rank"] is not None else f"#{n['slot']}"
        table.add_row(node, Text(n["host"]), ",".join(map(str, n["ranks"])) or "-", Text(n["status"]),
                      f"{n['samples']:,}", f"{n['heartbeat_age_s']:.0f} s ago", Text(n["error"] or ""))
    return table
