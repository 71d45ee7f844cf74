"""Recovery: runs whose watcher died (``ftui run`` or the TUI's background watcher SIGKILLed,
a reboot) get a true status, or a new watcher, from what their run folder and processes say.

The rule (docs/reliability.md, "If the watcher dies"):

* The ranks do not depend on their watcher: they run in a session of their own and go on training
  when it dies. A run is *abandoned* when its status is ``created``/``running``, it was watched on
  this host, and nobody holds its ``RUN/watcher.lock`` (the kernel drops that lock when the watcher
  dies, however it dies).
* First the store is brought up to date from the folder, idempotently: ``events.jsonl`` and
  ``orchestrator.jsonl`` by ``seq``, ``samples.jsonl`` by time.
* Then: the orchestrator journal has an ``exit`` event -> that status (the watcher died between
  its journal and the store). Else the ranks (the launcher, or a rank) still run, proven the run's
  and not merely holding a number the run had (:func:`runner.watch.procs.leader_alive`,
  :func:`runner.watch.procs.rank_pids`) -> a new watcher re-attaches (``python -m runner.watch.detached --attach PGID``) and
  follows the run to its end. Else the trainer journal has an ``end`` event -> its status. Else
  -> ``failed``, "watcher and ranks gone; last step N" (plus what the launcher log says).
* A ``created`` run with no ``launch`` event is ``failed`` ("never started") once it is older than
  :data:`NEVER_STARTED_AFTER_S` (younger ones may be about to launch).

:func:`recover_all` is what ``ftui recover`` runs, and what every ``ftui`` and ``ftui run`` runs as
they start. Running it twice changes nothing the second time.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.spec import events as ev
from runner.spec.run_record import from_epoch
from runner.watch import journal, procs
from runner.watch.crash import describe
from runner.watch.detached import spawn_watcher
from runner.watch.finish import project_end
from runner.watch.identity import watcher_host
from runner.watch.prepare import load_prepared
from runner.watch.stream import Recorder, RunStream
from store import Store
from store.store import utcnow

NEVER_STARTED_AFTER_S = 120.0


@dataclass(frozen=True)
class Recovered:
    """What recovery did to one run."""

    run_id: int
    action: str
    """``finished`` (status set), ``attached`` (a new watcher follows it), ``watched`` (someone does
    already), ``skipped`` (too young, or another host's)."""
    status: str
    detail: str = ""


def candidates(store: Store) -> list[Any]:
    """Runs that may be abandoned: ``created``/``running``, on this host, with no watcher holding
    their lock. Cheap: two indexed queries and one ``flock`` per live run."""
    here = socket.gethostname()
    found = []
    for status in ("running", "created"):
        for run in store.list_runs(status=status):
            if watcher_host(run) != here or not run.run_dir or (getattr(run, "nnodes", None) or 1) > 1:
                continue
            if journal.WatcherLock(Path(run.run_dir)).held_elsewhere():
                continue
            found.append(run)
    return found


def reingest(store: Store, run_id: int, run_dir: Path) -> dict[str, int]:
    """Bring the store up to date with a run folder (no duplicate, no missing row); the counts added."""
    trainer = journal.read_jsonl(run_dir / ev.EVENTS_FILE)
    orch = journal.read_jsonl(run_dir / journal.ORCHESTRATOR_FILE)
    devices, procs = journal.read_samples(run_dir)
    return {
        "events": store.ingest(run_id, trainer),
        "orchestrator_events": store.ingest(run_id, orch, source="orchestrator"),
        "samples": store.ingest_samples(run_id, devices, procs),
    }


def recover_run(store: Store, run: Any, attach: bool = True, fake_gpus: int = 0) -> Recovered:
    """Apply the rule of this module to one run (see the module docstring)."""
    run_dir = Path(run.run_dir)
    if not run_dir.is_dir():
        gone = f"run folder {run_dir} is gone; the watcher is gone too"
        store.update_run(run.id, status="failed", error=gone, ended_at=utcnow())
        return Recovered(run.id, "finished", "failed", gone)
    lock = journal.WatcherLock(run_dir)
    if not lock.acquire():
        return Recovered(run.id, "watched", run.status)
    try:
        reingest(store, run.id, run_dir)
        orch_events = journal.read_jsonl(run_dir / journal.ORCHESTRATOR_FILE)
        exits = [e for e in orch_events if e["type"] == "exit"]
        launches = [e for e in orch_events if e["type"] == "launch"]
        prepared = load_prepared(run.id, run_dir) if (run_dir / ev.LAUNCH_FILE).exists() else None
        if prepared is None:
            store.update_run(run.id, status="failed", error=f"{run_dir / ev.LAUNCH_FILE}: missing", ended_at=utcnow())
            return Recovered(run.id, "finished", "failed", "launch.json missing")
        stream = RunStream(store, prepared, None)
        stream.poll()
        stream.flush()
        if exits:  # the watcher journaled the end and died before the store had it
            last = exits[-1]
            outcome = project_end(store, stream, last["status"], last.get("exit_code"), last.get("error"),
                                  ended_at=from_epoch(last["time"]))
            return Recovered(run.id, "finished", outcome.status, outcome.error or "")
        group = launched_group(launches[-1]) if launches else procs.group_of(run.pgid, run.pgid_started)
        if not launches and group is None:
            age = (utcnow() - run.created_at).total_seconds()
            if age < NEVER_STARTED_AFTER_S:
                return Recovered(run.id, "skipped", run.status, f"created {age:.0f} s ago, may be about to launch")
            recorder = Recorder(store, run.id, run_dir)
            never = "never started: the process that prepared it ended before the launch"
            recorder.emit("exit", exit_code=None, status="failed", error=never)
            recorder.close()
            project_end(store, stream, "failed", None, never)
            return Recovered(run.id, "finished", "failed", never)
        alive = (group is not None and procs.leader_alive(group, run_dir)) or bool(procs.rank_pids(run_dir))
        if alive and stream.end is None and attach and group is not None:
            # The new watcher inherits the locked file: no moment without a holder, so a second
            # recover running now cannot start a second watcher.
            child = spawn_watcher(store.url, run.id, group, run_dir, fake_gpus, lock_fd=lock.fileno())
            return Recovered(run.id, "attached", "running",
                             f"watcher pid {child.pid} follows process group {group.pgid}")
        if alive and stream.end is None:
            return Recovered(run.id, "skipped", run.status, "ranks still run; not attaching (--no-attach)")
        recorder = Recorder(store, run.id, run_dir)
        status: str
        error: str | None
        try:
            if stream.end is not None and stream.end.get("status") in ("completed", "stopped"):
                status, error = str(stream.end.get("status")), None
            elif stream.end is not None:
                status, error = "failed", stream.error or f"the trainer ended {stream.end.get('status')}"
            else:
                status = "failed"
                error = f"watcher and ranks gone; last step {stream.last_step if stream.last_step is not None else 0}"
                cause = describe(run_dir, None, None, stream.error)
                if cause:
                    error += f" ({cause})"
            recorder.emit("exit", exit_code=None, status=status, error=error, recovered=True)
        finally:
            recorder.close()
        project_end(store, stream, status, None, error)
        return Recovered(run.id, "finished", status, error or "")
    finally:
        lock.release()


def launched_group(launch: dict[str, Any]) -> procs.Group | None:
    """The process group a ``launch`` event of the orchestrator journal recorded."""
    return procs.group_of(launch.get("pgid"), launch.get("pgid_started"))


def recover_all(store: Store, attach: bool = True, fake_gpus: int = 0) -> list[Recovered]:
    """Recover every abandoned run of this host (:func:`candidates`)."""
    done = []
    for run in candidates(store):
        try:
            done.append(recover_run(store, run, attach=attach, fake_gpus=fake_gpus))
        except Exception as exc:  # noqa: BLE001 (one bad run must not stop ftui from starting)
            done.append(Recovered(run.id, "error", run.status, f"{type(exc).__name__}: {exc}"[:300]))
    return done
