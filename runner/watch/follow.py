"""Watching a run: start a prepared run (:func:`execute`) or take over one whose watcher died
(:func:`attach`), and follow it to its end (:func:`follow`).

The run's process group is spawned here and nowhere else (:func:`runner.watch.procs.spawn`: argv lists,
never a shell, in a new session so that the launcher and every rank can be signalled together).
Whatever goes wrong while watching, every process of the run is stopped and reaped and a true status
and reason are recorded: the journal first, then the store.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from runner.hardware import Probe
from runner.hardware.processes import started_wall
from runner.hardware.rapl import read_counters
from runner.spec import events as ev
from runner.spec import watching
from runner.spec.run_record import from_epoch
from runner.watch import procs
from runner.watch.crash import RankWatch, collective_timeout, describe
from runner.watch.finish import Ending, Outcome, finish
from runner.watch.host import probe_for
from runner.watch.identity import record_watcher, watcher_identity
from runner.watch.journal import WatcherLock
from runner.watch.preflight import PreflightError
from runner.watch.prepare import Prepared
from runner.watch.sampling import HANG_CHECK_S, RunTelemetry
from runner.watch.stacks import STACKS_WAIT_S, StackReport
from runner.watch.stream import EventCallback, Recorder, RunStream, quietly
from store import Store

FAULT_GRACE_S = 60.0
"""A rank that vanished with no step and no end event since, while the launcher lives on: the group
is stopped after this long (torch elastic normally tears it down within a second or two)."""

FORCED_GRACE_S = 5.0
"""The grace of a stop the watcher decides itself (a strategy that is not the one asked for, a rank
that vanished, the watcher's own fault)."""

HANG_STOP_GRACE_S = 10.0
"""The grace of the stop of a run the hang rule ended (its ranks were continued first: SIGCONT)."""

Stop = threading.Event | procs.StopRequest


@dataclass(frozen=True)
class WatchOptions:
    """How a run is watched; the same for ``ftui run``, ``ftui resume``, sweeps, the background watcher."""

    sample_interval_s: float = watching.SAMPLE_INTERVAL_S
    """Seconds between telemetry readings; 0 turns telemetry off."""
    hang_after_s: float = watching.HANG_AFTER_S
    """Flag a hang when the run made no progress for this long (no trainer event, every device idle) and
    ask every rank for its stacks; stop the run (failed, "hang: ...") when it is still hung
    ``hang_after_s`` after the flag."""
    grace_s: float = procs.DEFAULT_GRACE_S
    """After a stop request, seconds the ranks get to finish their step, save and exit before whatever
    is left of the run is SIGKILLed (then checked: none left)."""
    fake_gpus: int = 0
    """Scripted GPUs of the demo mode (0: the real NVML), for the default probe."""
    probe: Probe | None = None
    """The telemetry probe; default: :func:`runner.watch.host.probe_for` of ``fake_gpus``."""
    poll_s: float = 0.25
    """How often the journal is read."""
    vanished_after_s: float = FAULT_GRACE_S
    """A rank gone with no step and no end since, while the launcher lives on: the run is stopped
    (failed, with what killed the rank) after this long."""
    forced_grace_s: float = FORCED_GRACE_S
    """The grace of a stop the watcher decides itself (strategy mismatch, vanished rank, its own fault)."""
    hang_stop_grace_s: float = HANG_STOP_GRACE_S
    """The grace of the stop after the hang rule ended the run."""
    hang_check_s: float = HANG_CHECK_S
    """Seconds between two looks of the hang rule at the recent readings."""
    stacks_wait_s: float = STACKS_WAIT_S
    """Seconds the ranks get to write their stacks once asked (a hang, a collective timeout)."""
    clock: Callable[[], float] = field(default=time.time, compare=False)
    """The wall clock of the time-based rules (hang, vanished rank); tests drive their own."""

    def make_probe(self) -> Probe:
        return self.probe if self.probe is not None else probe_for(self.fake_gpus)


class Launcher:
    """The launch being followed: ftui's own child (its exit code is known), or, for a watcher that
    re-attached after the first one died, a process group known by its leader's pid and start time."""

    def __init__(self, group: procs.Group, run_dir: Path, proc: subprocess.Popen[bytes] | None = None) -> None:
        self.group = group
        self.run_dir = run_dir
        self.proc = proc

    def poll(self) -> int | None:
        if self.proc is not None:
            return self.proc.poll()
        return None if procs.leader_alive(self.group, self.run_dir) else -1

    def wait(self) -> int | None:
        """The exit code; None when it is not ours to know (a re-attached watcher)."""
        if self.proc is not None:
            try:
                return self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:  # only when SIGKILL did not take (stop report: left)
                self.proc.kill()
                return self.proc.wait()
        deadline = time.monotonic() + 30
        while procs.leader_alive(self.group, self.run_dir) and time.monotonic() < deadline:
            time.sleep(0.2)
        return None


class Stopper:
    """Stops a run in a thread (:func:`runner.watch.procs.stop_run`) while the watcher keeps reading
    its journal, so that the ranks' last steps and ``end`` events are recorded."""

    def __init__(self, run_dir: Path, group: procs.Group, request: procs.StopRequest) -> None:
        self.run_dir = run_dir
        self.group = group
        self.request = request
        self.thread: threading.Thread | None = None
        self.report: procs.StopReport | None = None

    @property
    def started(self) -> bool:
        return self.thread is not None

    @property
    def done(self) -> bool:
        return self.thread is not None and not self.thread.is_alive()

    def start(self, grace_s: float, kill: bool = False) -> None:
        def run() -> None:
            self.report = procs.stop_run(self.run_dir, self.group, grace_s=grace_s, kill_now=self.request.now,
                                         kill=kill)

        self.thread = threading.Thread(target=run, name="ftui-stop", daemon=True)
        self.thread.start()


def execute(store: Store, prepared: Prepared, options: WatchOptions | None = None,
            on_event: EventCallback | None = None, stop: Stop | None = None) -> Outcome:
    """Start a prepared run and follow it to the end, writing everything to the run folder and then
    to the store.

    Args:
        store: the store (the run's only writer: samples from the telemetry thread are queued and
            written here, in batches).
        prepared: from :func:`runner.watch.prepare.prepare`.
        options: how the run is watched.
        on_event: called with every journal event as it arrives (progress bars), and with the
            watcher's own ``hang`` and ``rank_exit`` events.
        stop: set it (or :meth:`runner.watch.procs.StopRequest.request`) to stop the run gracefully: what
            Ctrl-C, SIGTERM and SIGHUP do for ``ftui run``. A repeated graceful request joins the
            stop in flight (a second Ctrl-C cuts its grace short); a kill request SIGKILLs at once and
            records ``killed``.

    Returns:
        The outcome; the run's row holds the same status, exit code, error and summary.

    Raises:
        PreflightError: another process watches the run.
    """
    assert prepared.run_id is not None, "a dry run cannot be executed"
    run_id = prepared.run_id
    lock = WatcherLock(prepared.run_dir)
    if not lock.acquire(wait_s=5.0):  # a recover check elsewhere may hold it for a moment
        raise PreflightError(f"run {run_id}: another process watches {prepared.run_dir}")
    recorder = Recorder(store, run_id, prepared.run_dir,
                        source=prepared.node.source if prepared.node is not None else "orchestrator")
    proc = procs.spawn(prepared.spec.argv, prepared.spec.env, prepared.run_dir, prepared.run_dir / ev.LAUNCHER_LOG,
                       run_dir=prepared.run_dir)
    # start_new_session: the launcher leads its own group (the ranks may not: procs). Not waited for
    # yet, so its pid is still its own: the start time read now is the launcher's.
    group = procs.Group(proc.pid, procs.started_at(proc.pid))
    # Where the time to first step starts, on the clock the journals' times use (runner.spec.first_step);
    # journaled, so that a re-attached watcher and a rebuild of the store compute the same figures.
    launcher_started = started_wall(proc.pid)
    launched = (options or WatchOptions()).clock()
    watcher = watcher_identity()["summary"]
    record = recorder.emit("launch", argv=prepared.spec.argv, pgid=group.pgid, pgid_started=group.started,
                           launcher_started=launcher_started, watcher_pid=os.getpid(),
                           watcher_started=watcher["orchestrator_create_time"], watcher_host=watcher["orchestrator_host"])
    record_watcher(store, run_id, status="running", started_at=from_epoch(record["time"]), pgid=group.pgid,
                   pgid_started=group.started)
    quietly(recorder.emit, ev.ENERGY_COUNTER, at="start", **read_counters())  # the ledger's CPU energy
    return follow(store, prepared, Launcher(group, prepared.run_dir, proc), recorder, lock, options,
                  on_event=on_event, stop=stop, launched=launched)


def attach(store: Store, prepared: Prepared, group: procs.Group, options: WatchOptions | None = None,
           stop: Stop | None = None, lock_fd: int | None = None) -> Outcome:
    """Follow a run whose watcher died while its ranks train on: re-read its journals from the start
    (idempotent ingest), then watch it to the end like :func:`execute` (see :mod:`runner.service.recover`).

    Raises:
        PreflightError: another process already watches the run.
    """
    assert prepared.run_id is not None
    lock = WatcherLock.adopt(prepared.run_dir, lock_fd) if lock_fd is not None else WatcherLock(prepared.run_dir)
    if not lock.acquire():
        raise PreflightError(f"run {prepared.run_id}: another process watches {prepared.run_dir}")
    recorder = Recorder(store, prepared.run_id, prepared.run_dir)
    watcher = watcher_identity()["summary"]
    recorder.emit("attach", pgid=group.pgid, watcher_pid=os.getpid(), watcher_started=watcher["orchestrator_create_time"],
                  watcher_host=watcher["orchestrator_host"])
    record_watcher(store, prepared.run_id)
    return follow(store, prepared, Launcher(group, prepared.run_dir), recorder, lock, options, stop=stop,
                  launched=(options or WatchOptions()).clock())


def vanished_too_long(vanished_at: float | None, last_step_time: float | None, now: float, after_s: float) -> bool:
    """The vanished-rank rule: a rank disappeared at ``vanished_at``, no step came since, and ``after_s``
    have passed (wall clock): the run is stopped and failed."""
    return (vanished_at is not None and now - vanished_at >= after_s
            and (last_step_time if last_step_time is not None else 0.0) < vanished_at)


class _Watch:
    """The state of one :func:`follow`: what it reads, samples, stops, and why it forced an end."""

    def __init__(self, store: Store, prepared: Prepared, launcher: Launcher, recorder: Recorder,
                 options: WatchOptions, on_event: EventCallback | None, stop: Stop | None) -> None:
        self.prepared = prepared
        self.launcher = launcher
        self.recorder = recorder
        self.options = options
        self.on_event = on_event
        self.request = stop if isinstance(stop, procs.StopRequest) else procs.StopRequest(stop)
        self.stream = RunStream(store, prepared, on_event)
        self.telemetry: RunTelemetry | None = None
        self.ranks = RankWatch(prepared.run_dir, clock=options.clock)
        self.stopper = Stopper(prepared.run_dir, launcher.group, self.request)
        self.forced_error: str | None = None
        self.stacks = StackReport(prepared.run_dir, self._report_stacks, clock=options.clock,
                                  wait_s=options.stacks_wait_s)

    def _report_stacks(self, result: dict[str, object]) -> None:
        """Every rank's stacks came (or the wait ran out): journal them, keep them in the run's summary
        (``ftui show``, the Monitor) and pass them on (the progress line, a notification)."""
        record = self.recorder.emit("stacks", **result)
        quietly(self.stream.store.update_run, self.stream.run_id, summary={"stacks": result})
        if self.on_event is not None:
            self.on_event(record)

    def step(self) -> bool:
        """One round of the watch; True when the run is over."""
        assert self.telemetry is not None
        stream, stopper, recorder, request = self.stream, self.stopper, self.recorder, self.request
        stream.poll()
        if self.telemetry.poll(stream, recorder) is not None:  # a hang flagged: where is every rank?
            self.stacks.request("hang")
        if stream.mismatch and not stopper.started:
            stopper.start(grace_s=self.options.forced_grace_s)
        if request.is_set() and not stopper.started:
            stopper.start(grace_s=self.options.grace_s, kill=request.kill)
            recorder.emit("stop_requested", kill=request.kill, grace_s=self.options.grace_s)
        for rank, pid in self.ranks.poll():
            # (not one we ended; a node without rank 0 sees no end event: its launcher's exit says)
            if stream.end is None and not stopper.started and (self.prepared.node is None or stream.start):
                event = recorder.emit("rank_exit", rank=rank, pid=pid)
                if self.on_event is not None:
                    self.on_event(event)
                if collective_timeout(self.prepared.run_dir, rank):  # a hang another rank timed out on
                    self.stacks.request("collective timeout")
        if (not stopper.started and stream.end is None
                and vanished_too_long(self.ranks.first_vanished_at, stream.last_step_time, self.options.clock(),
                                      self.options.vanished_after_s)):
            self.forced_error = describe(self.prepared.run_dir, self.ranks.vanished, list(self.telemetry.recent),
                                         stream.error)
            stopper.start(grace_s=self.options.forced_grace_s)
        if not stopper.started and self.telemetry.hang_stop(stream):
            self.forced_error = self.telemetry.hang_reason
            recorder.emit("hang_stop", reason=self.forced_error)
            procs.signal_group(self.launcher.group, self.prepared.run_dir, signal.SIGCONT)  # a stopped (SIGSTOP) rank cannot take SIGTERM
            self.stacks.reopen()  # a rank that was stopped writes its stacks now
            stopper.start(grace_s=self.options.hang_stop_grace_s)
        self.stacks.poll()
        if self.prepared.node is not None:  # several machines: heartbeat, stop requests both ways
            self.prepared.node.tick(request, self.prepared.run_dir)
        if stopper.started:
            return stopper.done
        return self.launcher.poll() is not None

    def fault(self, exc: BaseException) -> None:
        """The watcher itself failed: journal it, stop the run and wait for the stop."""
        self.forced_error = f"watcher error: {type(exc).__name__}: {exc}"[:500]
        quietly(self.recorder.emit, "watcher_error", message=self.forced_error)
        if not self.stopper.started:
            self.stopper.start(grace_s=self.options.forced_grace_s)
        if self.stopper.thread is not None:
            self.stopper.thread.join(timeout=60)

    def reap(self) -> int | None:
        """Wait for the launcher and every process of the run; kill what is left. The exit code."""
        self.stream.on_event = self.on_event = None  # the caller's callbacks may be what failed; the rest is bookkeeping
        exit_code: int | None = quietly(self.launcher.wait)
        run_dir, group = self.prepared.run_dir, self.launcher.group
        if not self.stopper.started:
            # The launcher can exit before its ranks: wait for every process of the run (ranks
            # included, in sessions of their own), then kill and check whatever is left.
            deadline = time.monotonic() + 20.0
            while procs.find_processes(run_dir, group) and time.monotonic() < deadline:
                quietly(self.stream.poll)
                time.sleep(self.options.poll_s)
            quietly(procs.kill_all, run_dir, group)
        if self.telemetry is not None:
            quietly(self.telemetry.close)
        quietly(self.stream.poll)
        quietly(self.stream.flush)
        return exit_code

    def unrecorded(self) -> tuple[str, ...]:
        """What the run folder still had not taken at the end (its disk full), one line each."""
        lines = []
        if self.recorder.journal_error is not None:
            lines.append(f"{self.recorder.journal_error}: the watcher's last events are not in the run folder")
        if self.telemetry is not None and self.telemetry.file_error is not None:
            lines.append(f"{self.telemetry.file_error}: the last telemetry readings are not in the run folder")
        return tuple(lines)

    def record_end(self, store: Store, exit_code: int | None) -> Outcome:
        """Journal the stop (if any) and record the run's end."""
        report = self.stopper.report
        if report is not None:
            quietly(self.recorder.emit, "stop", graceful=report.graceful, killed=report.killed, left=report.left,
                    gpu=report.gpu_note, processes={str(k): v for k, v in report.seen.items()})
        if self.prepared.node is not None:
            self.prepared.node.fault_at = self.ranks.first_vanished_at or self.options.clock()
        quietly(self.recorder.emit, ev.ENERGY_COUNTER, at="end", **read_counters())
        stacks = quietly(self.stacks.finish)
        if stacks and self.forced_error is not None and self.forced_error.startswith("hang:"):
            self.forced_error = f"{self.forced_error}; {stacks}"  # where each rank was, in the run's reason
        request = self.request
        ending = Ending(exit_code, stopped_by_user=request.is_set() and not request.kill,
                        killed_by_user=request.kill, forced_error=self.forced_error, vanished=self.ranks.vanished,
                        recent=list(self.telemetry.recent) if self.telemetry is not None else [],
                        launcher_pid=self.launcher.group.pgid, sigkilled=self.sigkilled_because(report),
                        unrecorded=self.unrecorded())
        outcome = finish(store, self.stream, ending, self.recorder)
        if report is not None:
            outcome.stop_report = report.describe()
            quietly(store.update_run, self.stream.run_id, summary={"stop": outcome.stop_report})
        return outcome


    def sigkilled_because(self, report: procs.StopReport | None) -> str | None:
        """Why the stop SIGKILLed processes of the run; None when it SIGKILLed none."""
        if report is None or not report.killed:
            return None
        if self.request.now.is_set():
            return "a second Ctrl-C cut the grace period short"
        return f"the grace period of {self.options.grace_s:g} s ran out"


def follow(store: Store, prepared: Prepared, launcher: Launcher, recorder: Recorder, lock: WatcherLock,
           options: WatchOptions | None = None, on_event: EventCallback | None = None, stop: Stop | None = None,
           launched: float | None = None) -> Outcome:
    """Watch a started run to its end. Whatever goes wrong while watching (an exception in a
    callback, the database), the ``finally`` below stops and reaps every process of the run, writes
    what was read, and records a true status and reason: journal first, then the store."""
    options = options or WatchOptions()
    watch = _Watch(store, prepared, launcher, recorder, options, on_event, stop)
    try:
        watch.telemetry = RunTelemetry(store, prepared, options.make_probe() if options.sample_interval_s > 0 else None,
                                       options.sample_interval_s, options.hang_after_s,
                                       launched or options.clock(), clock=options.clock,
                                       hang_check_s=options.hang_check_s)
        while True:
            try:
                if watch.step():
                    break
                time.sleep(options.poll_s)
            except KeyboardInterrupt:  # a caller without handlers (procs.StopRequest.install) in the main thread
                watch.request.request(again_escalates=True)
    except BaseException as exc:  # noqa: BLE001 (any fault of the watcher: reap and record it below)
        watch.fault(exc)
    finally:
        exit_code = watch.reap()
        try:
            outcome = watch.record_end(store, exit_code)
        finally:
            recorder.close()
            lock.release()
    return outcome
