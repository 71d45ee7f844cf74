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

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runner.spec.checkpoint import (
    CheckpointError,
    check_complete,
    check_resume,
    checkpoint_dir,
    checkpoints_root,
    missing_rank_parts,
    step_of,
)
from runner.spec.recipe import Recipe
from runner.spec.rendezvous import NodesError, NodeSpec, node_spec
from store import Store
from store import nodes as store_nodes

if TYPE_CHECKING:
    from runner.nodes.agent import NodeAgent

JOIN_WAIT_S = 600.0
"""How long a resuming node waits for the other nodes to join before it gives up (one line)."""


def wait_for_nodes(store: Store, agent: NodeAgent, nnodes: int, wait_s: float, run_id: int, command: str) -> None:
    """Wait until ``nnodes`` nodes joined the resuming run, renewing this node's heartbeat meanwhile
    (waiting is not dying: settling fails a node silent for 30 s).

    Raises:
        NodeResumeError: fewer joined within ``wait_s``; one line naming ``command`` to run on every node.
    """
    deadline = time.monotonic() + wait_s
    while len(joined := store_nodes.nodes(store, agent.run_id)) < nnodes:
        if time.monotonic() >= deadline:
            raise _refuse(f"run {run_id}: only {len(joined)} of {nnodes} nodes joined the resume within "
                          f"{wait_s:.0f} s: run `{command}` on every node")
        store_nodes.heartbeat(store, agent.run_id, agent.slot)
        time.sleep(1.0)


def _refuse(message: str) -> Exception:
    from runner.watch.orchestrator import PreflightError

    return PreflightError(message)


def node_steps(folder: Path, world_size: int, strategy: str, ranks: range,
               others: list[Path]) -> tuple[list[int], dict[int, str]]:
    """The checkpoint steps of one node's run folder that this node can resume from, and why the others
    cannot (step -> one line).

    A step counts when its manifest is complete with every listed file at its size, it was taken with
    this world size and strategy, this node's ranks' parts are there, and every torch distributed
    checkpoint folder in it can be made whole: its missing files (the metadata, other ranks' shards) are
    in one of ``others`` (the other nodes' folders of the same run) at a complete checkpoint of that step.
    """
    steps: list[int] = []
    reasons: dict[int, str] = {}
    root = checkpoints_root(folder)
    if not root.is_dir():
        return steps, reasons
    for path in sorted(root.iterdir()):
        step = step_of(path)
        if step is None:
            continue
        try:
            check_resume(str(path), world_size, strategy)
        except CheckpointError as exc:
            reasons[step] = str(exc).removeprefix("train.resume_from: ")
            continue
        missing = missing_rank_parts(path, world_size, ranks, metadata=False)
        if missing:
            reasons[step] = f"{path}: parts of this node's ranks are missing ({', '.join(missing)})"
            continue
        try:
            dcp_sources(path, world_size, others)
        except CheckpointError as exc:
            reasons[step] = str(exc)
            continue
        steps.append(step)
    return steps, reasons


def dcp_sources(path: Path, world_size: int, others: list[Path]) -> dict[Path, Path]:
    """The files a checkpoint's torch distributed checkpoint folders lack, each with the other node's
    file to copy it from (empty: nothing lacking, as under DDP or on one machine).

    Raises:
        CheckpointError: one line: a lacking file is in none of the other nodes' folders readable here.
    """
    plan: dict[Path, Path] = {}
    dcps = [p for p in path.iterdir() if p.is_dir()]
    if not dcps:
        return plan
    if not missing_rank_parts(path, world_size, range(world_size), metadata=True):
        return plan
    complete = []
    for other in others:
        theirs = other / path.relative_to(path.parent.parent)
        try:
            check_complete(theirs)
        except CheckpointError:
            continue
        complete.append(theirs)
    for dcp in dcps:
        for part in [".metadata", *(f"__{r}_" for r in range(world_size))]:
            if _part(dcp, part):
                continue
            found: list[Path] = []
            for theirs in complete:
                found = _part(theirs / dcp.name, part)
                if found:
                    break
            if not found:
                what = "the DCP metadata" if part == ".metadata" else f"rank {part[2:-1]}'s shard"
                raise CheckpointError(
                    f"{path}: {dcp.name} lacks {what}, written on another node, and no complete copy of that "
                    "step is readable here (FSDP resume across machines needs the nodes' run folders on a "
                    "shared filesystem)")
            for src_file in found:
                plan[dcp / src_file.name] = src_file
    return plan


def _part(dcp: Path, part: str) -> list[Path]:
    """The files of one DCP part in ``dcp``: its ``.metadata``, or a rank's ``__{rank}_*.distcp``."""
    if not dcp.is_dir():
        return []
    if part == ".metadata":
        return [dcp / part] if (dcp / part).is_file() else []
    return sorted(dcp.glob(f"{part}*.distcp"))


def copy_dcp_parts(path: Path, world_size: int, others: list[Path]) -> list[str]:
    """Copy into ``path`` the DCP files it lacks from the other nodes' folders (:func:`dcp_sources`), each
    through a temporary name and a rename; returns the names copied."""
    copied = []
    for dst, src in sorted(dcp_sources(path, world_size, others).items()):
        tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")  # (c10d: another node may copy the same file)
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
        copied.append(str(dst.relative_to(path)))
    return copied


def _describe(nodes: list[store_nodes.NodeInfo]) -> str:
    parts = []
    for n in sorted(nodes, key=lambda n: n.node_rank if n.node_rank is not None else n.slot):
        steps = n.checkpoints or []
        parts.append(f"node {n.node_rank} ({n.host}): " + (f"steps {', '.join(map(str, steps))}" if steps else "none"))
    return "; ".join(parts)


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
    wait_s: float = JOIN_WAIT_S,
    warn: Callable[[str], None] | None = None,
) -> Any:
    """This machine's part of a new multi-node run continuing run ``run_id`` (see the module's text).

    Returns:
        A :class:`runner.watch.orchestrator.Prepared` (with its :class:`runner.nodes.agent.NodeAgent`), started by the
        caller as ``ftui run --nnodes`` is.

    Raises:
        runner.watch.orchestrator.PreflightError: one line: no such run, not a multi-node run, flags that do not
            fit it, or no step that every node holds complete (naming the nodes and what each holds).
    """
    from runner.nodes.agent import prepare_node
    from runner.spec.recipe import parse_recipe
    from runner.watch import orchestrator as orch

    old = store.get_run(run_id)
    if old is None:
        raise _refuse(f"run {run_id}: no such run in {store.url}")
    if (old.nnodes or 1) < 2 and (rdzv_endpoint is None or not store_nodes.nodes(store, run_id)):
        raise _refuse(f"--nnodes: run {run_id} ran on one machine: resume it with `ftui resume {run_id}` alone")
    if nnodes is not None and nnodes != old.nnodes:
        raise _refuse(f"--nnodes: run {run_id} ran on {old.nnodes} machines; resume it on {old.nnodes}")
    recipe = parse_recipe(old.recipe_text, source=f"run {run_id}'s recipe")
    if rdzv_endpoint is not None:
        from runner.nodes.c10d_resume import prepare_c10d_resume

        return prepare_c10d_resume(store, old, recipe, rdzv_endpoint, run_key, root=root, wait_s=wait_s, warn=warn)
    try:
        spec = node_spec(old.nnodes or 1, node_rank, main_addr, main_port, None, run_key, recipe.name)
    except NodesError as exc:
        raise _refuse(str(exc)) from None
    assert spec.node_rank is not None
    olds = store_nodes.nodes(store, run_id)
    unknown = [n for n in olds if n.node_rank is None]
    if unknown or len(olds) != old.nnodes:
        raise _refuse(f"run {run_id}: node #{unknown[0].slot if unknown else len(olds)} never started its ranks: "
                      "it holds no checkpoint to resume from")
    mine = next((n for n in olds if n.node_rank == spec.node_rank), None)
    if mine is None:
        raise _refuse(f"--node-rank: run {run_id} had no node {spec.node_rank}")
    nproc = recipe.launch.nproc
    world = nproc * spec.nnodes
    folder = Path(mine.run_dir)
    others = [Path(n.run_dir) for n in olds if n.slot != mine.slot]
    steps, reasons = node_steps(folder, world, recipe.launch.strategy,
                                range(spec.node_rank * nproc, (spec.node_rank + 1) * nproc), others)
    store_nodes.record_checkpoints(store, run_id, mine.slot, steps)  # what this disk holds now
    recipe = _node_recipe(recipe, spec)
    orch.preflight(recipe)
    chosen: dict[str, Any] = {}

    def choose(agent: NodeAgent) -> Recipe:
        wait_for_nodes(store, agent, spec.nnodes, wait_s, run_id,
                       f"ftui resume {run_id} --node-rank K --main-addr ADDR")
        recorded = store_nodes.nodes(store, run_id)  # every node recorded its disk before it joined
        step = store_nodes.common_checkpoint(recorded)
        if step is None:
            own = (f"; here: {reasons[max(reasons)]}" if reasons else
                   f"; here: no checkpoint in {checkpoints_root(folder)}" if not steps else "")
            raise _refuse(f"run {run_id}: no checkpoint step is complete on every node ({_describe(recorded)})"
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
                            choose=choose)
    if prepared.node.created:
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
