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

from runner.nodes.agent import is_remote, stop_through_store
from runner.service.recover import recover_run
from runner.watch.identity import watcher_alive
from runner.watch.procs import (
    DEFAULT_GRACE_S,
    KILL_SIGNAL,
    StopReport,
    group_of,
    owns_group,
    signal_pids,
    stop_run,
)
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


def request_stop(store: Store, run_id: int, kill: bool = False, grace_s: float = DEFAULT_GRACE_S,
                 wait: bool = True, poll_s: float = 0.25) -> StopResult:
    """Stop a run started anywhere (``ftui run`` in another terminal, the TUI, node agents elsewhere).

    A run on other machines (several nodes, a SLURM job, a watcher on another host) is asked through the
    store (:func:`runner.nodes.agent.stop_through_store`): its node agents poll the request and stop their ranks.

    When the run's watcher (the ``ftui run`` process or the background watcher) is alive it is
    signalled (SIGTERM: graceful; SIGUSR1: kill) and it stops the run and records the status; this
    waits for the status to change (after ``grace_s`` a second SIGTERM cuts the watcher's grace
    short). When the watcher is gone (or does not answer), this process stops every process of the
    run itself (:func:`runner.watch.procs.stop_run`) and records the status: ``stopped``, or ``failed``
    ("killed by user") with ``kill``. Only processes proven the run's are signalled (a launcher by its pid
    and start time, a rank by the run folder), never one that merely holds a number the run had: when
    none is left, the run is settled from its journal as recovery does (its processes are gone).

    Args:
        store: the store.
        run_id: the run.
        kill: SIGKILL at once instead of a graceful stop.
        grace_s: seconds the ranks get before SIGKILL.
        wait: wait for the status to change (False: signal the watcher and return; the TUI).
        poll_s: seconds between reads of the store.

    Raises:
        StopRefused: no such run, or the run is not running.
    """
    run = store.get_run(run_id)
    if run is None:
        raise StopRefused(f"run {run_id}: no such run")
    if run.status not in ("running", "created"):
        raise StopRefused(f"run {run_id}: not running (status {run.status})")
    if is_remote(run):  # several machines, a SLURM job, or another host: through the store's stop requests
        status = stop_through_store(store, run_id, kill=kill, wait=wait, timeout_s=grace_s + 90.0,
                                    by=f"stop on {socket.gethostname()}")
        return StopResult(run_id, status, "stop request written to the store; every node agent of the run polls "
                                          "it and stops its ranks")
    pid = run.summary.orchestrator_pid
    created = run.summary.orchestrator_create_time
    if pid is not None and watcher_alive(pid, created):
        os.kill(int(pid), KILL_SIGNAL if kill else signal.SIGTERM)
        what = "kill" if kill else "graceful stop"
        if not wait:
            return StopResult(run_id, run.status, f"{what} asked of its watcher (pid {pid})")
        result = _wait_for_watcher(store, run_id, int(pid), created, what, grace_s, poll_s)
        if result is not None:
            return result
    run_dir, group = Path(run.run_dir), group_of(run.pgid, run.pgid_started)
    report = stop_run(run_dir, group, grace_s=grace_s, kill=kill)
    if not report.seen:
        return _settle_gone(store, run, run_dir)
    status, error = ("failed", "killed by user") if kill else ("stopped", None)
    store.add_event(run_id, "stop", time.time(), {"graceful": report.graceful, "killed": report.killed,
                                                  "left": report.left, "gpu": report.gpu_note, "by": "ftui stop"})
    store.update_run(run_id, status=status, ended_at=utcnow(), error=error,
                     summary={"stop": f"ftui stop (no watcher alive): {report.describe()}"})
    return StopResult(run_id, status, f"stopped here (no watcher alive): {report.describe()}", report)


def _settle_gone(store: Store, run: Any, run_dir: Path) -> StopResult:
    """Nothing of the run is left to stop: its status is what its journal says (recovery's rule)."""
    nothing = "nothing to stop: no process of the run is left"
    if run.pgid and not owns_group(group_of(run.pgid, run.pgid_started), run_dir):
        nothing += f" (process group {run.pgid} is not the run's any more: not signalled)"
    done = recover_run(store, run, attach=False)
    return StopResult(run.id, done.status, f"{nothing}; {done.action}: {done.detail or done.status}")


ESCALATE_AFTER_S = 2.0
"""Seconds past our grace before a watcher that has not recorded the end is asked again (kill now)."""
GIVE_UP_AFTER_S = 60.0
"""Seconds past our grace before a watcher that still has not recorded the end is given up on (this
process then stops the run itself)."""


def _wait_for_watcher(store: Store, run_id: int, pid: int, created: Any, what: str, grace_s: float,
                      poll_s: float, clock: Callable[[], float] = time.monotonic,
                      sleep: Callable[[float], None] = time.sleep) -> StopResult | None:
    """Wait for the signalled watcher to record the run's end; None when it died without recording."""
    escalated = False
    started = clock()
    while clock() - started < grace_s + GIVE_UP_AFTER_S:
        now = store.get_run(run_id)
        if now is None or now.status not in ("running", "created"):
            status = "gone" if now is None else now.status
            how = f"{what} done by its watcher (pid {pid}): " + ((now.summary.stop or "") if now else "")
            return StopResult(run_id, status, how)
        if not escalated and clock() - started > grace_s + ESCALATE_AFTER_S:
            escalated = True  # the watcher's own grace may be longer than ours: ask it again (kill now)
            signal_pids([pid], signal.SIGTERM)
        if not watcher_alive(pid, created):
            return None
        sleep(poll_s)
    return None
