"""``ftui resume ID --nnodes N --node-rank K --main-addr A`` on each machine of a multi-node run.

On several machines each node writes its own ranks' parts of a checkpoint into its own folder
(``<uid>-n<slot>-<name>``) and its agent records in the store which steps that folder holds complete
(``run_nodes.checkpoints``, :meth:`runner.nodes.agent.NodeAgent.record_checkpoints`). The store is the only
thing the nodes share, so a resume agrees on its step through it:

1. Each node finds the old node of its node rank (static rendezvous: the node rank given is the one
   whose ranks' parts are in that folder), checks every checkpoint of that folder on its disk (manifest,
   files and sizes, its ranks' parts: :mod:`runner.spec.checkpoint`) and records what it found complete,
   replacing the old record (a checkpoint deleted or damaged since is no longer counted).
2. It joins the new run (the run key, as ``ftui run --nnodes``) and waits until every node has joined:
   each recorded its disk before joining, so then every record is current.
3. Every node picks the same step: the newest one every node recorded complete. A newer step that some
   node lacks is passed over (a warning naming the nodes); with no common step every node refuses in one
   line naming the nodes and what each holds, and the new run ends failed with that reason.

FSDP: torch distributed checkpoints write the metadata only where global rank 0 is, and keep a
replicated entry in one rank's file only; a node whose folder lacks some of the step's DCP files copies
them in from the other nodes' folders when those are readable here (a shared filesystem, or every node
on one machine); where they are not, that step does not count as complete on this node.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from runner.nodes.agent import NodeAgent, prepare_node
from runner.nodes.c10d_resume import prepare_c10d_resume
from runner.nodes.steps import copy_dcp_parts, describe_nodes, node_steps, refuse, wait_for_nodes
from runner.nodes.timings import NodeTimings
from runner.spec.checkpoint import checkpoint_dir, checkpoints_root
from runner.spec.recipe import Recipe, parse_recipe
from runner.spec.rendezvous import NodesError, NodeSpec, node_spec
from runner.watch.preflight import preflight
from runner.watch.prepare import Prepared
from store import Store
from store import nodes as store_nodes


def prepare_node_resume(
    store: Store,
    run_id: int,
    nnodes: int | None,
    node_rank: int | None,
    main_addr: str | None,
    main_port: int | None,
    rdzv_endpoint: str | None,
    run_key: str | None,
    root: Path | None = None,
    warn: Callable[[str], None] | None = None,
    timings: NodeTimings | None = None,
    force: bool = False,
) -> Prepared:
    """This machine's part of a new multi-node run continuing run ``run_id`` (see the module's text).
    ``timings``: the node agent's (default: from the environment, :func:`runner.nodes.agent.node_timings`);
    ``force``: more processes than this machine has devices for are started anyway.

    Returns:
        The prepared run (with its :class:`runner.nodes.agent.NodeAgent`), started by the caller as
        ``ftui run --nnodes`` is.

    Raises:
        runner.watch.preflight.PreflightError: one line: no such run, not a multi-node run, flags that do not
            fit it, or no step that every node holds complete (naming the nodes and what each holds).
    """
    old = store.get_run(run_id)
    if old is None:
        raise refuse(f"run {run_id}: no such run in {store.url}")
    if (old.nnodes or 1) < 2 and (rdzv_endpoint is None or not store_nodes.nodes(store, run_id)):
        raise refuse(f"--nnodes: run {run_id} ran on one machine: resume it with `ftui resume {run_id}` alone")
    if nnodes is not None and nnodes != old.nnodes:
        raise refuse(f"--nnodes: run {run_id} ran on {old.nnodes} machines; resume it on {old.nnodes}")
    recipe = parse_recipe(old.recipe_text, source=f"run {run_id}'s recipe")
    if rdzv_endpoint is not None:
        return prepare_c10d_resume(store, old, recipe, rdzv_endpoint, run_key, root=root, warn=warn,
                                   timings=timings, force=force)
    try:
        spec = node_spec(old.nnodes or 1, node_rank, main_addr, main_port, None, run_key, recipe.name)
    except NodesError as exc:
        raise refuse(str(exc)) from None
    assert spec.node_rank is not None
    olds = store_nodes.nodes(store, run_id)
    unknown = [n for n in olds if n.node_rank is None]
    if unknown or len(olds) != old.nnodes:
        raise refuse(f"run {run_id}: node #{unknown[0].slot if unknown else len(olds)} never started its ranks: "
                      "it holds no checkpoint to resume from")
    mine = next((n for n in olds if n.node_rank == spec.node_rank), None)
    if mine is None:
        raise refuse(f"--node-rank: run {run_id} had no node {spec.node_rank}")
    nproc = recipe.launch.nproc
    world = nproc * spec.nnodes
    folder = Path(mine.run_dir)
    others = [Path(n.run_dir) for n in olds if n.slot != mine.slot]
    steps, reasons = node_steps(folder, world, recipe.launch.strategy,
                                range(spec.node_rank * nproc, (spec.node_rank + 1) * nproc), others)
    store_nodes.record_checkpoints(store, run_id, mine.slot, steps)  # what this disk holds now
    recipe = _node_recipe(recipe, spec)
    preflight(recipe, force=force)
    chosen: dict[str, Any] = {}

    def choose(agent: NodeAgent) -> Recipe:
        wait_for_nodes(agent, spec.nnodes, run_id, f"ftui resume {run_id} --node-rank K --main-addr ADDR")
        recorded = store_nodes.nodes(store, run_id)  # every node recorded its disk before it joined
        step = store_nodes.common_checkpoint(recorded)
        if step is None:
            own = (f"; here: {reasons[max(reasons)]}" if reasons else
                   f"; here: no checkpoint in {checkpoints_root(folder)}" if not steps else "")
            raise refuse(f"run {run_id}: no checkpoint step is complete on every node ({describe_nodes(recorded)})"
                          f"{own}")
        newest = max(s for n in recorded for s in (n.checkpoints or []))
        if step < newest and warn is not None:
            lacking = [n for n in recorded if newest not in (n.checkpoints or [])]
            here = f" ({reasons[newest]})" if newest in reasons else ""
            warn(f"step {newest} is not complete on node {', '.join(str(n.node_rank) for n in lacking)}{here}; "
                 f"resuming from step {step}, the newest every node holds complete")
        path = checkpoint_dir(folder, step)
        copied = copy_dcp_parts(path, world, others)
        if copied and warn is not None:
            warn(f"copied {len(copied)} DCP file(s) of step {step} from the other nodes' folders into {path}")
        chosen.update(step=step, path=str(path))
        return recipe.model_copy(update={"train": recipe.train.model_copy(update={"resume_from": str(path)})})

    prepared = prepare_node(store, recipe, spec, source=f"resume of run {run_id}", root=root, resumed_from=run_id,
                            choose=choose, timings=timings)
    if prepared.node is not None and prepared.node.created and prepared.run_id is not None:
        store.update_run(prepared.run_id, summary={"resumed_from": {"run_id": run_id, "checkpoint": chosen["path"],
                                                                    "step": chosen["step"]}})
    return prepared


def _node_recipe(recipe: Recipe, spec: NodeSpec) -> Recipe:
    """The old run's recipe with this node's rendezvous (the stored one is the first node's)."""
    launch = recipe.launch.model_copy(update={"nnodes": spec.nnodes, "node_rank": spec.node_rank,
                                              "main_addr": spec.main_addr, "main_port": spec.main_port,
                                              "rdzv_endpoint": None})
    train = recipe.train.model_copy(update={"resume_from": None})  # (set once the nodes agreed on a step)
    return recipe.model_copy(update={"launch": launch, "train": train})
