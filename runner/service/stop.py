"""Stopping a run started anywhere: ``ftui stop`` and the TUI's stop call :func:`request_stop`."""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from runner.nodes.agent import is_remote, stop_through_store
from runner.service.recover import recover_run, reingest
from runner.spec import events as ev
from runner.spec.status import LIVE
from runner.watch.finish import Ending, finish
from runner.watch.identity import watcher_alive
from runner.watch.prepare import load_prepared
from runner.watch.procs import (
    DEFAULT_GRACE_S,
    KILL_SIGNAL,
    StopReport,
    group_of,
    owns_group,
    signal_pids,
    stop_run,
)
from runner.watch.stream import Recorder, RunStream
from store import Store
from store.store import utcnow


class StopRefused(Exception):
    """The run cannot be stopped from here (unknown, not running): one line."""


@dataclass
class StopResult:
    """How ``ftui stop`` (or the TUI's stop) ended."""

    run_id: int
    status: str
    """The run's status afterwards (``running`` when not waited for)."""
    how: str
    """One line: who stopped it and what was checked."""
    report: StopReport | None = None
    """When this process stopped the run itself (no watcher alive)."""


ANSWER_S = 10.0
"""Seconds a live watcher gets to journal that it took a stop request (``stop_requested``) before it is
taken for one that does not answer (this process then stops the run itself)."""
GIVE_UP_AFTER_S = 60.0
"""Seconds past the watcher's grace before a watcher that took the request but has not recorded the end
is given up on (this process then stops the run itself)."""


def request_stop(store: Store, run_id: int, kill: bool = False, grace_s: float = DEFAULT_GRACE_S,
                 wait: bool = True, poll_s: float = 0.25, answer_s: float = ANSWER_S,
                 on_asked: Callable[[str], None] | None = None) -> StopResult:
    """Stop a run started anywhere (``ftui run`` in another terminal, the TUI, node agents elsewhere).

    A run on other machines (several nodes, a SLURM job, a watcher on another host) is asked through the
    store (:func:`runner.nodes.agent.stop_through_store`): its node agents poll the request and stop their ranks.

    When the run's watcher (the ``ftui run`` process or the background watcher) is alive it is asked
    (SIGTERM: graceful; SIGUSR1: kill; a watcher suspended by SIGSTOP or Ctrl-Z is continued first) and it
    stops the run with its own grace and records the status; this waits for the status to change. A
    graceful stop already in flight (the watcher journaled ``stop_requested``) is not asked again: this
    waits for it, so a second stop never cuts a save short; only ``kill`` escalates. When the watcher is
    gone, or does not answer within ``answer_s``, this process stops every process of the run itself
    (:func:`runner.watch.procs.stop_run`) and records the end as the watcher would
    (:func:`runner.watch.finish.finish`: ``stopped``, or ``killed``). Only processes proven the run's are
    signalled (a launcher by its pid and start time, a rank by the run folder), never one that merely
    holds a number the run had: when none is left, the run is settled from its journal as recovery does.

    Args:
        store: the store.
        run_id: the run.
        kill: SIGKILL at once instead of a graceful stop.
        grace_s: seconds the ranks get before SIGKILL when this process stops them (no watcher alive).
        wait: wait for the status to change (False: ask the watcher and return; the TUI).
        poll_s: seconds between reads of the store.
        answer_s: seconds a live watcher gets to journal that it took the request.
        on_asked: told what was asked of a live watcher (or that a stop is already in flight) before the
            wait, so a command can say it at once.

    Raises:
        StopRefused: no such run, or the run is not running.
    """
    run = store.get_run(run_id)
    if run is None:
        raise StopRefused(f"run {run_id}: no such run")
    if run.status not in LIVE:
        raise StopRefused(f"run {run_id}: not running (status {run.status})")
    if is_remote(run):  # several machines, a SLURM job, or another host: through the store's stop requests
        status = stop_through_store(store, run_id, kill=kill, wait=wait, timeout_s=grace_s + 90.0,
                                    by=f"stop on {socket.gethostname()}")
        return StopResult(run_id, status, "stop request written to the store; every node agent of the run polls "
                                          "it and stops its ranks")
    pid = run.summary.orchestrator_pid
    created = run.summary.orchestrator_create_time
    why_here = "no watcher alive"
    if pid is not None and watcher_alive(pid, created):
        signalled, notes = ask_watcher(store, run_id, int(pid), kill)
        lead = (f"{'kill' if kill else 'graceful stop'} asked of its watcher (pid {pid})" if signalled else
                f"a graceful stop was already in flight with its watcher (pid {pid}): waited for it, not asked again")
        asked = "; ".join([lead, *notes])
        if on_asked is not None:
            on_asked(asked)
        if not wait:
            return StopResult(run_id, run.status, asked)
        waited = _wait_for_watcher(store, run_id, int(pid), created, asked, grace_s, poll_s, answer_s)
        if isinstance(waited, StopResult):
            return waited
        why_here = waited
    run_dir, group = Path(run.run_dir), group_of(run.pgid, run.pgid_started)
    report = stop_run(run_dir, group, grace_s=grace_s, kill=kill)
    if not report.seen:
        return _settle_gone(store, run, run_dir)
    status = _record_stop(store, run, report, kill, grace_s, why_here)
    done = store.get_run(run_id)
    ended = done.summary.ended if done is not None and done.summary.ended else status
    return StopResult(run_id, status, f"stopped here ({why_here}): {ended}; {report.describe()}", report)


def ask_watcher(store: Store, run_id: int, pid: int, kill: bool) -> tuple[bool, list[str]]:
    """Ask the run's live watcher to stop it, once: a suspended watcher (SIGSTOP, Ctrl-Z) is continued
    first, and a graceful stop already in flight (its ``stop_requested`` event) is not asked again.
    Whether the watcher was signalled, and what else was done, as notes."""
    notes = []
    if _suspended(pid):
        signal_pids([pid], signal.SIGCONT)  # a stopped process keeps the request pending: it could not answer
        notes.append("it was suspended (SIGSTOP or Ctrl-Z): continued with SIGCONT")
    if not kill and store.events(run_id, "stop_requested"):
        return False, notes
    os.kill(pid, KILL_SIGNAL if kill else signal.SIGTERM)
    return True, notes


def _suspended(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
    except psutil.Error:
        return False


def _record_stop(store: Store, run: Any, report: StopReport, kill: bool, grace_s: float, why_here: str) -> str:
    """Record the end of a run this process stopped itself, by the watcher's rule (its journal read into
    the store, then :func:`runner.watch.finish.finish`); its status."""
    run_dir = Path(run.run_dir)
    sigkilled = f"the grace period of {grace_s:g} s ran out" if report.killed and not kill else None
    ending = Ending(None, stopped_by_user=not kill, killed_by_user=kill, sigkilled=sigkilled)
    if (run_dir / ev.LAUNCH_FILE).exists():
        reingest(store, run.id, run_dir)
        stream = RunStream(store, load_prepared(run.id, run_dir), None)
        stream.poll()
        stream.flush()
        recorder = Recorder(store, run.id, run_dir)
        try:
            status = finish(store, stream, ending, recorder).status
        finally:
            recorder.close()
    else:
        status, error = ("killed", "killed by user") if kill else ("stopped", None)
        store.update_run(run.id, status=status, ended_at=utcnow(), error=error)
    store.add_event(run.id, "stop", time.time(), {"graceful": report.graceful, "killed": report.killed,
                                                  "left": report.left, "gpu": report.gpu_note, "by": "ftui stop"})
    store.update_run(run.id, summary={"stop": f"ftui stop ({why_here}): {report.describe()}"})
    return status


def _settle_gone(store: Store, run: Any, run_dir: Path) -> StopResult:
    """Nothing of the run is left to stop: its status is what its journal says (recovery's rule)."""
    nothing = "nothing to stop: no process of the run is left"
    if run.pgid and not owns_group(group_of(run.pgid, run.pgid_started), run_dir):
        nothing += f" (process group {run.pgid} is not the run's any more: not signalled)"
    done = recover_run(store, run, attach=False)
    return StopResult(run.id, done.status, f"{nothing}; {done.action}: {done.detail or done.status}")


def _wait_for_watcher(store: Store, run_id: int, pid: int, created: Any, asked: str, grace_s: float,
                      poll_s: float, answer_s: float, clock: Callable[[], float] = time.monotonic,
                      sleep: Callable[[float], None] = time.sleep) -> StopResult | str:
    """Wait for the asked watcher to record the run's end (what it recorded), or say why this process
    must stop the run itself: the watcher died, did not answer, or took longer than its grace allows."""
    started = clock()
    while True:
        now = store.get_run(run_id)
        if now is None or now.status not in LIVE:
            return StopResult(run_id, "gone" if now is None else now.status, asked + "; " + recorded_words(now))
        if not watcher_alive(pid, created):
            return f"its watcher (pid {pid}) died before recording the end"
        requested = store.events(run_id, "stop_requested")
        if not requested and clock() - started > answer_s:
            return f"its watcher (pid {pid}) did not answer within {answer_s:g} s"
        took = max([float(e.payload.get("grace_s") or 0.0) for e in requested], default=grace_s)
        if clock() - started > max(grace_s, took) + GIVE_UP_AFTER_S:
            return f"its watcher (pid {pid}) did not record the end within its grace and {GIVE_UP_AFTER_S:g} s"
        sleep(poll_s)


def recorded_words(run: Any) -> str:
    """What the watcher recorded at the end, in one line: status, what the run left, how it was stopped."""
    if run is None:
        return "the run is no longer in the store"
    parts = [f"it recorded {run.status}", run.summary.ended or run.error, run.summary.stop]
    return "; ".join(p for p in parts if p)
