"""The node agent: ``ftui run RECIPE --nnodes N ...`` on each machine of a multi-node run.

Each machine runs one agent. It joins the run's row in the shared store (:func:`store.nodes.join_run`,
by the run key every node derives alike), writes its own run folder, starts this machine's ranks
through ``accelerate launch`` (the rendezvous of :mod:`runner.spec.rendezvous`) and follows them with the
one-machine watcher (:func:`runner.watch.follow.follow`), which calls back here to

- renew the node's heartbeat and record which global ranks (and node rank) landed here;
- poll the store's stop requests (``ftui stop``, the TUI, another node's Ctrl-C), so a stop asked on any
  machine stops every machine, and post one when this machine is asked to stop;
- write this node's telemetry under its own node number;
- end the node (its status and reason in ``run_nodes``) and, once every node has ended or stopped
  reporting, settle the run's status: failed with the reason of the node that failed first.

The trainer's journal (rank 0) lives on whichever node got global rank 0 (c10d decides); that agent
writes the run's figures (metrics, summary). No agent assumes another's processes are on its host.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runner.nodes import slurm
from runner.nodes.timings import NodeTimings, TimingsError
from runner.spec import events as ev
from runner.spec.checkpoint import complete_checkpoints, step_of
from runner.spec.paths import RunFolderError, claim_run_folder, runs_dir
from runner.spec.recipe import Recipe
from runner.spec.rendezvous import NodeSpec
from runner.watch.estimate import estimate_summary
from runner.watch.identity import record_watcher, watcher_host
from runner.watch.preflight import PreflightError
from runner.watch.prepare import Prepared, run_uid, write_launch
from runner.watch.procs import StopRequest
from store import Store, StoreError
from store import nodes as store_nodes
from store.store import utcnow


@dataclass
class NodeAgent:
    """This machine's part of a multi-node run, as the watcher sees it."""

    store: Store
    run_id: int
    slot: int
    spec: NodeSpec
    created: bool
    nproc: int
    host: str = field(default_factory=socket.gethostname)
    fault_at: float | None = None
    """When a rank of this node first vanished (set by the watcher)."""
    run_dir: Path | None = None
    """This machine's run folder, whose complete checkpoints the agent records (``run_nodes.checkpoints``)."""
    timings: NodeTimings = field(default_factory=NodeTimings)
    clock: Callable[[], float] = time.monotonic
    """Intervals and deadlines (the heartbeat's pace, waiting for the other nodes)."""
    wall_clock: Callable[[], float] = time.time
    """Seconds since the epoch, the heartbeats' clock: whether another node stopped reporting."""
    sleep: Callable[[float], None] = time.sleep
    _last_beat: float | None = None
    _last_stop_id: int = 0
    _posted: bool = False
    _from_store: bool = False
    _ranks_known: bool = False
    _checkpoints: list[int] | None = None

    @property
    def source(self) -> str:
        """The event source of this agent's journal in the store (each node's seq ids are its own)."""
        return "orchestrator" if self.slot == 0 else f"orchestrator:{self.slot}"

    def tick(self, request: StopRequest, run_dir: Path) -> None:
        """Called by the watcher's loop: heartbeat, ranks, stop requests both ways. Never raises (a store
        down for a moment must not end a run)."""
        now = self.clock()
        try:
            if request.is_set() and not self._posted and not self._from_store:
                self._posted = True  # asked here (Ctrl-C, SIGTERM, scancel): tell every other node
                store_nodes.post_stop(self.store, self.run_id, kill=bool(request.kill),
                                      by=f"node #{self.slot} ({self.host})")
            if self._last_beat is not None and now - self._last_beat < self.timings.heartbeat_s:
                return
            self._last_beat = now
            values: dict[str, Any] = {}
            if not self._ranks_known:
                ranks = sorted(ev.read_rank_pids(run_dir))
                if len(ranks) >= self.nproc:
                    self._ranks_known = True
                    # torchrun numbers ranks node by node: GROUP_RANK * nproc + LOCAL_RANK.
                    values = {"ranks": ranks, "node_rank": ranks[0] // self.nproc}
            store_nodes.update_node(self.store, self.run_id, self.slot, clock=self.wall_clock, **values)
            self.record_checkpoints(run_dir)
            for stop in store_nodes.stop_requests(self.store, self.run_id, self._last_stop_id):
                self._last_stop_id = stop.id
                if not request.is_set() or (stop.kill and not request.kill):
                    self._from_store = not request.is_set() or self._from_store
                    request.request(kill=stop.kill)
        except Exception:  # noqa: BLE001 (the next tick tries again)
            pass

    def record_checkpoints(self, run_dir: Path) -> None:
        """Record the steps whose checkpoint this machine's folder holds complete, when they changed (the
        manifest of a new one turned complete, or pruning removed one): :mod:`runner.nodes.resume` reads
        them to pick the step every node can resume from."""
        steps = [s for p in complete_checkpoints(run_dir) if (s := step_of(p)) is not None]
        if steps != self._checkpoints:
            store_nodes.record_checkpoints(self.store, self.run_id, self.slot, steps)
            self._checkpoints = steps

    def finish(self, status: str, error: str | None, exit_code: int | None,
               wait_s: float | None = None) -> store_nodes.Settled | None:
        """Record this node's end; then settle the run once every node has ended, waiting up to ``wait_s``
        (default :attr:`NodeTimings.settle_wait_s`: so that a node that died is noticed by its stale
        heartbeat) for the others. None: not settled here (another node still runs and will settle it)."""
        if self.run_dir is not None:
            try:  # the stop's (or the last) checkpoint was written after the last tick
                self.record_checkpoints(self.run_dir)
            except Exception:  # noqa: BLE001 (the node's end matters more than the record)
                pass
        store_nodes.update_node(self.store, self.run_id, self.slot, clock=self.wall_clock, status=status,
                                error=error, exit_code=exit_code, ended_at=utcnow(),
                                fault_at=self.fault_at if status == "failed" else None)
        deadline = self.clock() + (self.timings.settle_wait_s if wait_s is None else wait_s)
        while True:
            settled = store_nodes.settle(self.store, self.run_id, self.timings.dead_after_s, clock=self.wall_clock)
            if settled is not None or self.clock() >= deadline:
                return settled
            self.sleep(self.timings.poll_s)

    def wait_for_nodes(self, nnodes: int) -> int:
        """Wait up to :attr:`NodeTimings.join_wait_s` until ``nnodes`` nodes joined this run, renewing this
        node's heartbeat meanwhile (waiting is not dying). Returns how many joined (fewer: the wait ran out)."""
        deadline = self.clock() + self.timings.join_wait_s
        while (joined := len(store_nodes.nodes(self.store, self.run_id))) < nnodes and self.clock() < deadline:
            store_nodes.heartbeat(self.store, self.run_id, self.slot, clock=self.wall_clock)
            self.sleep(self.timings.poll_s)
        return joined


def prepare_node(store: Store, recipe: Recipe, spec: NodeSpec, source: str | None = None,
                 root: Path | None = None, resumed_from: int | None = None,
                 choose: Callable[[NodeAgent], Recipe] | None = None,
                 timings: NodeTimings | None = None) -> Prepared:
    """Join (or create) the run of ``spec.run_key`` and write this node's run folder; start nothing.

    ``resumed_from``: the run this one continues; ``choose``: called once joined, before the folder is
    written, returns the recipe to launch (a resume agrees on its checkpoint with the other nodes there:
    :mod:`runner.nodes.resume`); a PreflightError from it ends this node failed with that reason.
    ``timings``: the agent's (default: :meth:`NodeTimings.from_env`).

    Returns:
        The prepared run, with this machine's :class:`NodeAgent`.

    Raises:
        PreflightError: the key's run already has all its nodes, the folder cannot be written, or a timing
            in the environment is not a number of seconds (one line).
    """
    timings = timings if timings is not None else node_timings()
    create = {"name": recipe.name, "recipe_text": recipe.to_toml(), "recipe_hash": recipe.digest(),
              "recipe_source": source, "strategy": recipe.launch.strategy,
              "nproc": recipe.launch.nproc * spec.nnodes, "method": recipe.method.type,
              "model": recipe.model.name, "run_dir": "", "resumed_from": resumed_from}
    try:
        joined = store_nodes.join_run(store, spec.run_key, spec.nnodes, create, pid=os.getpid())
    except store_nodes.JoinRefused as exc:
        raise PreflightError(str(exc)) from None
    agent = NodeAgent(store, joined.run_id, joined.slot, spec, joined.created, recipe.launch.nproc, timings=timings)
    if choose is not None:
        try:
            recipe = choose(agent)
        except PreflightError as exc:  # (every node refuses alike: the last one settles the run)
            agent.finish("failed", str(exc), None, wait_s=timings.refuse_wait_s)
            raise
    uid = run_uid(store, joined.run_id)
    try:  # each machine writes its own folder (no shared filesystem assumed); the slot tells them apart
        run_dir = claim_run_folder(root or runs_dir(), f"{uid}-n{joined.slot}", recipe.name)
    except (RunFolderError, OSError) as exc:
        agent.finish("failed", str(exc), None, wait_s=0)
        raise PreflightError(str(exc)) from None
    launch = write_launch(recipe, run_dir, spec.main_port, spec)
    store_nodes.update_node(store, joined.run_id, joined.slot, run_dir=str(run_dir))
    agent.run_dir = run_dir
    if joined.created:
        record_watcher(store, joined.run_id)
        store.update_run(joined.run_id, run_dir=str(run_dir),
                            summary={"uid": uid, "estimate": estimate_summary(recipe),
                                     "nodes": {"nnodes": spec.nnodes, "backend": spec.backend,
                                               "main": f"{spec.main_addr}:{spec.main_port}",
                                               "run_key": spec.run_key}})
    return Prepared(run_id=joined.run_id, run_dir=run_dir, spec=launch, recipe=recipe, node=agent)


def node_timings() -> NodeTimings:
    """The timings this launch's environment sets (:meth:`NodeTimings.from_env`).

    Raises:
        PreflightError: one line naming the variable that is not a number of seconds.
    """
    try:
        return NodeTimings.from_env()
    except TimingsError as exc:
        raise PreflightError(str(exc)) from None


def is_remote(run: Any) -> bool:
    """Whether ``run`` is followed by agents the store alone reaches: several machines, a SLURM job, or a
    watcher on another host."""
    return bool((getattr(run, "nnodes", None) or 1) > 1 or getattr(run, "slurm_job_id", None)
                or watcher_host(run) != socket.gethostname())


def stop_through_store(store: Store, run_id: int, kill: bool = False, wait: bool = True,
                       timeout_s: float = 120.0, by: str | None = None, poll_s: float = 0.5) -> str:
    """Stop a run whose processes may be on other machines: post a stop request every node agent polls
    (every :attr:`NodeTimings.heartbeat_s`), and wait (``wait``, up to ``timeout_s``, reading the store
    every ``poll_s``) for the run's status to change.

    Returns:
        The run's status afterwards (``running`` when not waited for, or still running at the timeout).
    """
    run = store.get_run(run_id)
    if run is None:
        raise StoreError(f"run {run_id}: no such run")
    if run.slurm_job_id:
        try:  # SIGTERM to every node agent of the job: the ranks finish their step and checkpoint
            slurm.cancel(run.slurm_job_id, kill=kill)
        except slurm.SlurmError:
            pass  # not on a SLURM host: the store's request below still reaches the agents
        if run.status == "created" and not store_nodes.nodes(store, run_id):  # still queued: no agent to ask
            store.update_run(run_id, status="stopped" if not kill else "killed", ended_at=utcnow(),
                             error="killed by user" if kill else None,
                             summary={"stop": f"SLURM job {run.slurm_job_id} cancelled before it started"})
            return "stopped" if not kill else "killed"
    store_nodes.post_stop(store, run_id, kill=kill, by=by or f"ftui stop on {socket.gethostname()}")
    if not wait:
        return run.status
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        now = store.get_run(run_id)
        if now is None or now.status not in ("running", "created"):
            return "gone" if now is None else now.status
        time.sleep(poll_s)
    return "running"
