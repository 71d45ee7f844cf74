"""Multi-node runs in the store: one run row joined by every node agent, one ``run_nodes`` row per
machine, stop requests any host can write, and telemetry samples per node.

The node agents of one run find its row by a key they share (``runs.run_key``: ``--run-key``, the
rendezvous id, ``slurm-<job id>``). Whoever comes first creates the row; a key whose run already ended
is renamed (``KEY#<id>``) by the next launch, in a conditional update, so that two agents racing for
it create one run between them (the unique constraint decides; the loser reads the winner's row).

Nothing here assumes that a run's processes are children of, or on the host of, the caller: the TUI
and ``ftui stop`` reach a run on other machines only through these rows.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError

from runner.spec.status import TERMINAL
from store.engine import StoreError
from store.models import DeviceSampleRow, ProcessSampleRow, Run, RunNode, StopRequestRow
from store.store import Store, utcnow


class JoinRefused(StoreError):
    """The key names a run this node cannot join (one line)."""


@dataclass(frozen=True)
class NodeInfo:
    """One node of a multi-node run, as stored."""

    run_id: int
    slot: int
    node_rank: int | None
    ranks: list[int]
    host: str
    pid: int
    run_dir: str
    status: str
    error: str | None
    exit_code: int | None
    joined_at: datetime
    heartbeat_at: datetime
    ended_at: datetime | None
    fault_at: float | None
    checkpoints: list[int] | None = None
    """The checkpoint steps this node holds complete (None: never recorded)."""

    def heartbeat_age(self, now: datetime | None = None) -> float:
        """Seconds since the agent last reported."""
        return ((now or utcnow()) - self.heartbeat_at).total_seconds()


@dataclass(frozen=True)
class Joined:
    """What :func:`join_run` gives a node agent."""

    run_id: int
    slot: int
    created: bool
    """This agent is the run's first node (slot 0): it records the run's folder and estimate."""


@dataclass(frozen=True)
class StopRequestInfo:
    id: int
    run_id: int
    requested_at: datetime
    kill: bool
    by: str


@dataclass
class Settled:
    """A multi-node run's end, decided from every node's row."""

    status: str
    error: str | None
    nodes: list[NodeInfo] = field(default_factory=list)


def _node(row: RunNode) -> NodeInfo:
    return NodeInfo(row.run_id, row.slot, row.node_rank, list(row.ranks or []), row.host, row.pid, row.run_dir,
                    row.status, row.error, row.exit_code, row.joined_at, row.heartbeat_at, row.ended_at, row.fault_at,
                    list(row.checkpoints) if row.checkpoints is not None else None)


def join_run(store: Store, key: str, nnodes: int, create: dict[str, Any], pid: int,
             host: str | None = None, attempts: int = 20) -> Joined:
    """Join the multi-node run keyed ``key`` as one more node, creating its row when none is open.

    Args:
        store: the store every node shares.
        key: the run's join key.
        nnodes: machines the run spans.
        create: :meth:`store.Store.create_run` keyword arguments, used by the node that creates the row.
        pid: the node agent's pid.
        host: the agent's host (default: this one).
        attempts: tries when other agents race for the same key.

    Raises:
        JoinRefused: the open run of this key already has all its nodes.
    """
    host = host or socket.gethostname()
    for _ in range(attempts):
        try:
            joined = _join_open(store, key, nnodes, pid, host)
        except IntegrityError:  # another node took the same slot meanwhile: read again
            continue
        if joined is not None:
            return joined
        run_id = store.create_run(**create)
        try:
            with store._write() as s:
                s.execute(update(Run).where(Run.id == run_id).values(run_key=key, nnodes=nnodes))
                now = utcnow()
                s.add(RunNode(run_id=run_id, slot=0, host=host, pid=pid, run_dir="", status="running", ranks=[],
                              joined_at=now, heartbeat_at=now))
        except IntegrityError:  # another agent created the key's run meanwhile: drop ours, join theirs
            store.delete_run(run_id)
            continue
        return Joined(run_id, 0, created=True)
    raise JoinRefused(f"--run-key {key}: could not join or create its run after {attempts} tries")


def _join_open(store: Store, key: str, nnodes: int, pid: int, host: str) -> Joined | None:
    """Take the next slot of the key's open run; None when the key has no open run."""
    with store._write() as s:
        run = s.scalars(select(Run).where(Run.run_key == key)).first()
        if run is not None and run.status in TERMINAL:
            # A finished run keeps its key with its id appended: the key starts a new run.
            s.execute(update(Run).where(Run.id == run.id, Run.run_key == key).values(run_key=f"{key}#{run.id}"))
            return None
        if run is None:
            return None
        count = s.scalar(select(func.count(RunNode.id)).where(RunNode.run_id == run.id)) or 0
        if count >= (run.nnodes or nnodes):
            raise JoinRefused(f"--run-key {key}: run {run.id} already has its {count} nodes and is still "
                              f"{run.status}; give this launch its own --run-key")
        now = utcnow()
        s.add(RunNode(run_id=run.id, slot=count, host=host, pid=pid, run_dir="", status="running",
                      ranks=[], joined_at=now, heartbeat_at=now))
        s.flush()
        return Joined(run.id, count, created=count == 0)  # slot 0 records the folder (a submitted job's row)


def nodes(store: Store, run_id: int) -> list[NodeInfo]:
    """The nodes of a run, by slot (empty for a one-machine run)."""
    with store._begin() as s:
        return [_node(r) for r in s.scalars(select(RunNode).where(RunNode.run_id == run_id).order_by(RunNode.slot))]


def nodes_of(store: Store, run_ids: list[int]) -> dict[int, list[NodeInfo]]:
    """The nodes of several runs at once (views listing runs)."""
    if not run_ids:
        return {}
    out: dict[int, list[NodeInfo]] = {}
    with store._begin() as s:
        query = select(RunNode).where(RunNode.run_id.in_(run_ids)).order_by(RunNode.run_id, RunNode.slot)
        for row in s.scalars(query):
            out.setdefault(row.run_id, []).append(_node(row))
    return out


def update_node(store: Store, run_id: int, slot: int, clock: Callable[[], float] = time.time, **values: Any) -> None:
    """Set columns of one node's row; its ``heartbeat_at`` is renewed too, to ``clock()`` (seconds since the
    epoch: the agent's clock, the one :func:`settle` compares heartbeats with)."""
    allowed = {"node_rank", "ranks", "run_dir", "status", "error", "exit_code", "ended_at", "fault_at", "pid",
               "checkpoints"}
    unknown = set(values) - allowed
    if unknown:
        raise TypeError(f"update_node: not an updatable column: {', '.join(sorted(unknown))}")
    with store._write() as s:
        s.execute(update(RunNode).where(RunNode.run_id == run_id, RunNode.slot == slot)
                  .values(heartbeat_at=_utc(clock()), **values))


def record_checkpoints(store: Store, run_id: int, slot: int, steps: list[int]) -> None:
    """Record the checkpoint steps one node holds complete (replacing what was recorded: a pruned or
    damaged checkpoint leaves the list). The heartbeat is not renewed: ``ftui resume`` writes this for a
    run that ended long ago."""
    with store._write() as s:
        s.execute(update(RunNode).where(RunNode.run_id == run_id, RunNode.slot == slot)
                  .values(checkpoints=sorted(set(int(x) for x in steps))))


def common_checkpoint(nodes: list[NodeInfo]) -> int | None:
    """The newest checkpoint step every node recorded complete, or None (a node recorded none, or
    nothing is common)."""
    sets = [set(n.checkpoints or []) for n in nodes]
    common = set.intersection(*sets) if sets else set()
    return max(common) if common else None


def heartbeat(store: Store, run_id: int, slot: int, clock: Callable[[], float] = time.time) -> None:
    """The node agent is alive (at ``clock()``)."""
    update_node(store, run_id, slot, clock=clock)


def post_stop(store: Store, run_id: int, kill: bool = False, by: str | None = None) -> int:
    """Ask every node of a run to stop (gracefully, or ``kill``); also sets ``runs.stop_requested_at``.

    Returns:
        The request's id.
    """
    by = by or f"pid {__import__('os').getpid()} on {socket.gethostname()}"
    with store._write() as s:
        run = s.get(Run, run_id)
        if run is None:
            raise StoreError(f"run {run_id}: no such run in {store.url}")
        now = utcnow()
        run.stop_requested_at = now
        row = StopRequestRow(run_id=run_id, requested_at=now, kill=kill, by=by[:255])
        s.add(row)
        s.flush()
        return row.id


def stop_requests(store: Store, run_id: int, after_id: int = 0) -> list[StopRequestInfo]:
    """Stop requests of a run newer than ``after_id``, oldest first (node agents poll this)."""
    with store._begin() as s:
        query = (select(StopRequestRow).where(StopRequestRow.run_id == run_id, StopRequestRow.id > after_id)
                 .order_by(StopRequestRow.id))
        return [StopRequestInfo(r.id, r.run_id, r.requested_at, r.kill, r.by) for r in s.scalars(query)]


def ingest_node_samples(store: Store, run_id: int, node: int, samples: list[Any], processes: list[Any]) -> int:
    """Store one node's telemetry, idempotently per node (readings not newer than that node's newest stored
    one are skipped: the nodes' clocks and batches interleave). Returns rows added."""
    with store._begin() as s:
        last_d = s.scalar(select(func.max(DeviceSampleRow.time))
                          .where(DeviceSampleRow.run_id == run_id, DeviceSampleRow.node == node))
        last_p = s.scalar(select(func.max(ProcessSampleRow.time))
                          .where(ProcessSampleRow.run_id == run_id, ProcessSampleRow.node == node))
    device_cols = [c.name for c in DeviceSampleRow.__table__.columns if c.name not in ("id", "run_id", "node")]
    proc_cols = [c.name for c in ProcessSampleRow.__table__.columns if c.name not in ("id", "run_id", "node")]
    fresh = [{c: getattr(x, c, None) for c in device_cols} for x in samples if last_d is None or x.time > last_d]
    fresh_p = [{c: getattr(x, c, None) for c in proc_cols} for x in processes if last_p is None or x.time > last_p]
    if fresh or fresh_p:
        with store._write() as s:
            s.add_all(DeviceSampleRow(run_id=run_id, node=node, **row) for row in fresh)
            s.add_all(ProcessSampleRow(run_id=run_id, node=node, **row) for row in fresh_p)
    return len(fresh) + len(fresh_p)


def samples_per_node(store: Store, run_id: int) -> dict[int | None, int]:
    """How many device samples each node wrote for a run (None: a one-machine run's)."""
    with store._begin() as s:
        rows = s.execute(select(DeviceSampleRow.node, func.count(DeviceSampleRow.id))
                         .where(DeviceSampleRow.run_id == run_id).group_by(DeviceSampleRow.node)).all()
    return {node: int(count) for node, count in rows}


def settle(store: Store, run_id: int, dead_after_s: float, clock: Callable[[], float] = time.time) -> Settled | None:
    """Decide a multi-node run's end once every node has ended; None while some node still runs.

    A node still ``running`` whose heartbeat is older than ``dead_after_s`` (by ``clock``, seconds since
    the epoch, the clock the heartbeats are written by) is marked failed, "node died", at its last
    heartbeat. The run is ``failed`` when any node failed, with the reason of the node that failed first
    (``fault_at``: the root cause, not the peers its loss tore down), else ``stopped`` when any node
    stopped, else ``completed``. Writes the run's status once; a run already ended is left as is.
    """
    with store._write() as s:
        run = s.get(Run, run_id)
        if run is None:
            return None
        rows = list(s.scalars(select(RunNode).where(RunNode.run_id == run_id).order_by(RunNode.slot)))
        now = _utc(clock())
        for row in rows:
            age = (now - row.heartbeat_at).total_seconds()
            if row.status == "running" and age > dead_after_s:
                row.status = "failed"
                row.error = f"node died: its agent on {row.host} stopped reporting {age:.0f} s ago"
                row.fault_at = row.heartbeat_at.replace(tzinfo=UTC).timestamp()
                row.ended_at = now
        if run.status in TERMINAL:
            return Settled(run.status, run.error, [_node(r) for r in rows])
        if any(r.status == "running" for r in rows):
            return None
        failed = [r for r in rows if r.status == "failed"]
        status: str
        error: str | None
        missing = (run.nnodes or len(rows)) - len(rows)
        if failed:
            first = min(failed, key=lambda r: (r.fault_at if r.fault_at is not None else float("inf"), r.slot))
            status, error = "failed", f"node {_label(first)} ({first.host}): {first.error or 'failed'}"
        elif missing > 0:
            status, error = "failed", f"only {len(rows)} of {run.nnodes} nodes joined"
        elif any(r.status == "killed" for r in rows):
            status, error = "killed", next((r.error for r in rows if r.status == "killed" and r.error), None)
        elif any(r.status == "stopped" for r in rows):
            status, error = "stopped", None
        else:
            status, error = "completed", None
        run.status, run.error, run.ended_at = status, error, now
        return Settled(status, error, [_node(r) for r in rows])


def _utc(seconds: float) -> datetime:
    """Seconds since the epoch as the store's naive UTC datetime (:func:`store.store.utcnow`'s form)."""
    return datetime.fromtimestamp(seconds, UTC).replace(tzinfo=None)


def _label(row: RunNode) -> str:
    return str(row.node_rank) if row.node_rank is not None else f"#{row.slot}"


def open_slurm_run(store: Store, key: str, nnodes: int, create: dict[str, Any], job_id: str) -> int:
    """The run row of a submitted SLURM job (status ``created`` until its first node joins), keyed as its
    node agents will derive it; the job may have started and created it already. Returns its id."""
    run_id = store.create_run(**create)
    try:
        with store._write() as s:
            s.execute(update(Run).where(Run.id == run_id).values(run_key=key, nnodes=nnodes, slurm_job_id=job_id))
        return run_id
    except IntegrityError:  # a node of the job was quicker
        store.delete_run(run_id)
    with store._write() as s:
        run = s.scalars(select(Run).where(Run.run_key == key)).one()
        run.slurm_job_id = job_id
        return run.id
