"""``ftui resume ID --nnodes N --rdzv-endpoint HOST:PORT`` on each machine: resuming a multi-node run under
a c10d rendezvous (a SLURM job's, :mod:`runner.nodes.slurm`).

c10d gives each node its node rank at the rendezvous, after the agent has launched, so an agent cannot
pick the old node whose parts its ranks load (the static resume, :mod:`runner.nodes.resume`, can: the
node rank is a flag). Here the choice moves to where the node rank is known:

1. Before joining, each agent checks that **every** old node's run folder is readable from this machine
   (a shared filesystem, the normal case on a SLURM cluster; loopback nodes share one disk) and checks
   each of them for complete checkpoints (:func:`runner.nodes.steps.node_steps`: manifest, files and
   sizes, that old node's ranks' parts), recording what it found in the old run's ``run_nodes`` rows. A
   folder not readable here: one line, exit 2, naming the nodes.
2. It joins the new run and waits for every node; every node then picks the newest step every old node
   holds complete, as the static resume does (a newer step some node lacks is passed over with a warning;
   none: every node refuses in one line and the new run ends failed).
3. It writes into its run folder the map old node rank -> that node's checkpoint folder of the step
   (:mod:`runner.rank.resume_map`); each rank loads the entry of the node rank torchrun gave it (``GROUP_RANK``).
   Under FSDP the agent of slot ``s`` first copies into old node ``s``'s folder the DCP files it lacks
   (each folder by one agent; every agent finishes before the rendezvous lets any rank load).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runner.nodes.agent import NodeAgent, prepare_node
from runner.nodes.steps import copy_dcp_parts, describe_nodes, node_steps, refuse, wait_for_nodes
from runner.nodes.timings import NodeTimings
from runner.rank.resume_map import write_map
from runner.spec.checkpoint import checkpoint_dir
from runner.spec.recipe import Recipe
from runner.spec.rendezvous import NodesError, node_spec
from runner.watch.preflight import preflight
from runner.watch.prepare import Prepared
from store import Store
from store import nodes as store_nodes


def unreadable(folders: dict[int, tuple[str, str]]) -> list[str]:
    """The old nodes (``node rank -> (host, folder)``) whose folder this machine cannot read, each as
    ``node K (host): FOLDER``."""
    out = []
    for rank, (host, folder) in sorted(folders.items()):
        path = Path(folder) if folder else None
        if path is None or not path.is_dir() or not os.access(path, os.R_OK | os.X_OK):
            out.append(f"node {rank} ({host}): {folder or '(no folder recorded)'}")
    return out


def prepare_c10d_resume(store: Store, old: Any, recipe: Recipe, rdzv_endpoint: str, run_key: str | None,
                        root: Path | None = None, warn: Callable[[str], None] | None = None,
                        timings: NodeTimings | None = None, force: bool = False) -> Prepared:
    """This machine's part of a new multi-node run continuing run ``old`` under a c10d rendezvous (see the
    module's text).

    Returns:
        The prepared run, whose run folder holds the node-rank map; started by the caller as
        ``ftui run --nnodes`` is.

    Raises:
        runner.watch.preflight.PreflightError: one line: bad flags, an old node that never started or whose
            folder is not readable here, or no step every node holds complete.
    """
    run_id = old.id
    key = run_key
    if key is None and os.environ.get("SLURM_JOB_ID"):
        key = f"slurm-{os.environ['SLURM_JOB_ID']}"  # every node of the job derives the same
    try:
        spec = node_spec(old.nnodes or 1, None, None, None, rdzv_endpoint, key, recipe.name)
    except NodesError as exc:
        raise refuse(str(exc)) from None
    olds = store_nodes.nodes(store, run_id)
    unknown = [n for n in olds if n.node_rank is None]
    if unknown or len(olds) != (old.nnodes or 1):
        raise refuse(f"run {run_id}: node #{unknown[0].slot if unknown else len(olds)} never started its ranks: "
                      "it holds no checkpoint to resume from")
    by_rank = {n.node_rank: n for n in olds if n.node_rank is not None}
    missing = unreadable({k: (n.host, n.run_dir) for k, n in by_rank.items()})
    if missing:
        raise refuse(f"--rdzv-endpoint: a c10d resume needs the old run's folders on a shared filesystem (c10d "
                      "gives each node its node rank only at the rendezvous, and that node then loads the old "
                      f"folder of the same node rank); not readable here: {'; '.join(missing)}")
    nproc = recipe.launch.nproc
    world = nproc * spec.nnodes
    folders = {k: Path(n.run_dir) for k, n in by_rank.items()}
    reasons: dict[int, dict[int, str]] = {}
    for k, n in sorted(by_rank.items()):
        others = [f for r, f in folders.items() if r != k]
        steps, reasons[k] = node_steps(folders[k], world, recipe.launch.strategy,
                                       range(k * nproc, (k + 1) * nproc), others)
        store_nodes.record_checkpoints(store, run_id, n.slot, steps)  # what the shared disk holds now
    launch = recipe.launch.model_copy(update={"nnodes": spec.nnodes, "node_rank": None, "main_addr": None,
                                              "main_port": None, "rdzv_endpoint": rdzv_endpoint})
    recipe = recipe.model_copy(update={"launch": launch,
                                       "train": recipe.train.model_copy(update={"resume_from": None})})
    preflight(recipe, force=force)
    chosen: dict[str, Any] = {}

    def choose(agent: NodeAgent) -> Recipe:
        wait_for_nodes(agent, spec.nnodes, run_id,
                       f"ftui resume {run_id} --nnodes {spec.nnodes} --rdzv-endpoint {rdzv_endpoint}")
        recorded = store_nodes.nodes(store, run_id)  # the last node to join recorded the shared disk last
        step = store_nodes.common_checkpoint(recorded)
        if step is None:
            why = [f"node {k}: {r[max(r)]}" for k, r in sorted(reasons.items()) if r]
            raise refuse(f"run {run_id}: no checkpoint step is complete on every node ({describe_nodes(recorded)})"
                          + (f"; {'; '.join(why)}" if why else ""))
        newest = max(s for n in recorded for s in (n.checkpoints or []))
        if step < newest and warn is not None:
            lacking = [n for n in recorded if newest not in (n.checkpoints or [])]
            why = [reasons[n.node_rank][newest] for n in lacking
                   if n.node_rank is not None and newest in reasons.get(n.node_rank, {})]
            warn(f"step {newest} is not complete on node {', '.join(str(n.node_rank) for n in lacking)}"
                 + (f" ({'; '.join(why)})" if why else "") + f"; resuming from step {step}, the newest every node "
                 "holds complete")
        paths = {k: checkpoint_dir(f, step) for k, f in folders.items()}
        if agent.slot in paths:  # each old folder made whole by one agent (the one of the same slot)
            mine = paths[agent.slot]
            copied = copy_dcp_parts(mine, world, [f for k, f in folders.items() if k != agent.slot])
            if copied and warn is not None:
                warn(f"copied {len(copied)} DCP file(s) of step {step} from the other nodes' folders into {mine}")
        chosen.update(step=step, paths={k: str(p) for k, p in paths.items()})
        # recipe.toml names node 0's folder; each rank loads its own node rank's (resume_map.MAP_FILE).
        return recipe.model_copy(update={"train": recipe.train.model_copy(update={"resume_from": str(paths[0])})})

    prepared = prepare_node(store, recipe, spec, source=f"resume of run {run_id}", root=root, resumed_from=run_id,
                            choose=choose, timings=timings)
    write_map(prepared.run_dir, chosen["step"], chosen["paths"])
    if prepared.node is not None and prepared.node.created and prepared.run_id is not None:
        store.update_run(prepared.run_id, summary={"resumed_from": {"run_id": run_id, "checkpoint": chosen["paths"][0],
                                                                    "step": chosen["step"], "rendezvous": "c10d"}})
    return prepared
