"""The multi-node flags of ``ftui run`` and ``ftui resume`` (``--nnodes --node-rank --main-addr --main-port
--rdzv-endpoint --run-key``, declared in :mod:`tui.cli.parser`): recipe overrides for the launch fields, and
this machine's :class:`runner.spec.rendezvous.NodeSpec`."""

from __future__ import annotations

import argparse
import json
import os

from rich.console import Console
from rich.text import Text

from runner.service import launch
from runner.spec.recipe import Recipe
from runner.spec.rendezvous import NodesError, NodeSpec, node_spec
from runner.watch.prepare import Prepared
from store import Store
from tui.cli.exits import UsageError
from tui.cli.parser import NODE_FIELDS


def overrides(args: argparse.Namespace) -> list[str]:
    """``--set`` style overrides for the flags given."""
    out = []
    for name in NODE_FIELDS:
        value = getattr(args, name, None)
        if value is not None:
            out.append(f"launch.{name}={json.dumps(value)}")
    return out


def given(args: argparse.Namespace) -> bool:
    """Whether any multi-node flag was given."""
    return any(getattr(args, name, None) is not None for name in (*NODE_FIELDS, "run_key"))


def prepare_resume(args: argparse.Namespace, store: Store, out: Console) -> Prepared:
    """``ftui resume ID --nnodes N --node-rank K --main-addr A`` (or ``--rdzv-endpoint HOST:PORT``): this node's
    part of the resumed run (:mod:`runner.nodes.resume`, :mod:`runner.nodes.c10d_resume`); a step passed over is said on
    one line."""

    def warn(text: str) -> None:
        out.print(Text.assemble(("warning:", "yellow"), f" {text}"), soft_wrap=True)

    request = launch.NodeResumeRequest(args.run_id, args.nnodes, args.node_rank, args.main_addr, args.main_port,
                                       args.rdzv_endpoint, args.run_key, force=args.force)
    prepared = launch.resume_node(store, request, warn=warn)
    assert prepared.node is not None
    spec = prepared.node.spec
    rank = "from c10d" if spec.node_rank is None else spec.node_rank
    out.print(f"node #{prepared.node.slot} of {spec.nnodes} (node rank {rank}, rendezvous at "
              f"{spec.main_addr}:{spec.main_port}, run key {spec.run_key})", markup=False, soft_wrap=True)
    return prepared


def spec_for(args: argparse.Namespace, recipe: Recipe) -> NodeSpec | None:
    """This machine's :class:`runner.spec.rendezvous.NodeSpec`, or None for a one-machine run (UsageError on a
    setting that cannot work)."""
    fields = recipe.launch
    if (fields.nnodes or 1) <= 1 and fields.rdzv_endpoint is None:
        for name in NODE_FIELDS[1:]:
            if getattr(fields, name) is not None:
                raise UsageError(f"launch.{name}: only for a multi-node run (--nnodes 2 or more)")
        return None
    key = getattr(args, "run_key", None)
    if key is None and os.environ.get("SLURM_JOB_ID"):
        key = f"slurm-{os.environ['SLURM_JOB_ID']}"  # every node of the job derives the same
    try:
        return node_spec(fields.nnodes or 1, fields.node_rank, fields.main_addr, fields.main_port,
                         fields.rdzv_endpoint, key, recipe.name)
    except NodesError as exc:
        raise UsageError(str(exc)) from None
