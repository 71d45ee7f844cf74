"""Which checkpoint steps each node of a multi-node run can resume from, and the waiting and the DCP
copying both resumes share (the static one, :mod:`runner.nodes.resume`, and the c10d one,
:mod:`runner.nodes.c10d_resume`)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from runner.nodes.agent import NodeAgent
from runner.spec.checkpoint import (
    CheckpointError,
    adopt,
    check_complete,
    check_resume,
    checkpoints_root,
    missing_rank_parts,
    step_of,
)
from runner.watch.preflight import PreflightError
from store import nodes as store_nodes


def wait_for_nodes(agent: NodeAgent, nnodes: int, run_id: int, command: str) -> None:
    """Wait until ``nnodes`` nodes joined the resuming run (:meth:`NodeAgent.wait_for_nodes`, this node's
    heartbeat renewed meanwhile).

    Raises:
        PreflightError: fewer joined within the agent's ``join_wait_s``; one line naming ``command`` to run
            on every node.
    """
    joined = agent.wait_for_nodes(nnodes)
    if joined < nnodes:
        raise refuse(f"run {run_id}: only {joined} of {nnodes} nodes joined the resume within "
                     f"{agent.timings.join_wait_s:.0f} s: run `{command}` on every node")


def refuse(message: str) -> PreflightError:
    """The one-line refusal of a resume (ends this node's command with exit 2)."""
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
    copied: dict[str, Path] = {}
    for dst, src in sorted(dcp_sources(path, world_size, others).items()):
        tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")  # (c10d: another node may copy the same file)
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
        copied[str(dst.relative_to(path))] = src
    adopt(path, copied)  # listed with the source's hashes: the copied metadata may then be loaded
    return list(copied)


def describe_nodes(nodes: list[store_nodes.NodeInfo]) -> str:
    """What each node holds, one clause per node: ``node K (host): steps 2, 4``."""
    parts = []
    for n in sorted(nodes, key=lambda n: n.node_rank if n.node_rank is not None else n.slot):
        steps = n.checkpoints or []
        parts.append(f"node {n.node_rank} ({n.host}): " + (f"steps {', '.join(map(str, steps))}" if steps else "none"))
    return "; ".join(parts)
