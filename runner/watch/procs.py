"""Process control of runs, in one place: spawning, finding every process of a run, signalling,
stopping gracefully with verification, killing.

Why finding is not just "the launcher's process group": ``accelerate launch`` of several processes
goes through torchrun, which starts each rank in a session of its own, so a signal to the launcher's
group never reaches the ranks. The processes of a run are therefore found from the run itself:

* the rank pids the ranks wrote (``RUN/ranks/{N}.pid``), kept only when the process still names the
  run folder on its command line (a pid reused by another program is not ours);
* the members of the launcher's process group (``runs.pgid``), once the group's leader is proven the
  run's launcher (:func:`owns_group`);
* every descendant of those (dataloader workers, compile workers);
* every process whose environment carries ``FTUI_RUN_DIR=RUN`` (set by :func:`spawn` and inherited by
  everything below it, even after a reparenting to init).

A process is never taken for the run's by its number alone: a run whose processes all died unrecorded
(a reboot, the OOM killer, kill -9) leaves numbers that the kernel gives to other programs. The launcher
is known by its pid and its start time, recorded at spawn (:class:`Group`); a rank by the run folder on
its command line or in its environment. What cannot be proven the run's is neither counted nor signalled.

A graceful stop sends SIGTERM to the ranks only (the trainer's stop flag: every rank leaves the loop
after the same step, saves and journals its ``end``); the launcher then exits on its own. It waits for
the ranks, not for the launcher, up to a grace period, then SIGKILLs whatever of the run is left and
checks that nothing is. A kill request during the grace period kills at once; a repeated graceful
one joins the stop in flight (:class:`StopRequest`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from runner.hardware import NvmlBackend
from runner.spec import events as ev
from runner.spec import watching

RUN_ENV = "FTUI_RUN_DIR"
"""Environment variable naming the run folder in every process of a run."""

DEFAULT_GRACE_S = watching.GRACE_S
"""Seconds the ranks get to finish their step, save and exit before SIGKILL."""

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""What stops ``ftui run`` (and the background orchestrator) gracefully: Ctrl-C, kill/timeout/docker
stop/scheduler pre-emption, a closed terminal or ssh session."""

KILL_SIGNAL = signal.SIGUSR1
"""Sent by ``ftui stop --kill`` to a run's watcher: kill every process now, record ``killed``."""


# ---------------------------------------------------------------------- spawning


def spawn(argv: list[str], env: Mapping[str, str], cwd: Path, log: Path, run_dir: Path | None = None) -> subprocess.Popen[bytes]:
    """Start ``argv`` (never a shell) in a new session, stdout and stderr appended to ``log``.

    Args:
        argv: the command.
        env: variables set on top of this process's environment.
        cwd: working directory.
        log: file the output is appended to.
        run_dir: the run folder; when given, every process below carries ``FTUI_RUN_DIR`` so that
            :func:`find_processes` finds it wherever it ends up in the process tree.

    Returns:
        The child, leader of its own session and process group (its pid is the pgid).
    """
    extra = {RUN_ENV: str(run_dir)} if run_dir is not None else {}
    out = open(log, "ab")  # noqa: SIM115 (the child keeps its own descriptor)
    try:
        return subprocess.Popen(argv, env={**os.environ, **env, **extra}, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, cwd=cwd, start_new_session=True)
    finally:
        out.close()


def started_at(pid: int) -> float | None:
    """The start time of process ``pid`` (psutil ``create_time``, seconds since the epoch); None when gone."""
    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


# ---------------------------------------------------------------------- the launcher's group


START_TOLERANCE_S = 1.0
"""Two readings of one process's start time agree to the clock tick, give or take a shift of the boot
time psutil derives them from (a clock adjusted since); a process given the same pid later cannot start
within this of the first by chance (the kernel hands pids out in turn)."""


@dataclass(frozen=True)
class Group:
    """A run's process group as recorded at spawn: its id, which is the launcher's pid (the launcher
    leads the group), and the launcher's start time, which a later process given that pid does not share."""

    pgid: int
    started: float | None = None
    """psutil ``create_time`` of the launcher; None for a run recorded without it, whose launcher is then
    proven by the run folder in its environment (:data:`RUN_ENV`) alone."""


def group_of(pgid: int | None, started: float | None) -> Group | None:
    """The recorded group of a run (``runs.pgid``/``pgid_started``, or its ``launch`` event); None when
    no group was recorded."""
    return Group(int(pgid), None if started is None else float(started)) if pgid else None


def owns_group(group: Group | None, run_dir: Path) -> bool:
    """Whether process group ``group.pgid`` is still the run's: its leader is the launcher recorded (same
    pid and start time; without a recorded start time, a process naming the run folder in its
    environment). A leader that is gone, or a process given its pid since, proves nothing: the
    group's number alone is never taken for the run's."""
    if group is None:
        return False
    try:
        leader = psutil.Process(group.pgid)
        if os.getpgid(group.pgid) != group.pgid:
            return False
        if group.started is not None:
            return bool(abs(leader.create_time() - group.started) < START_TOLERANCE_S)
        return bool(leader.environ().get(RUN_ENV) == str(run_dir))
    except (psutil.Error, OSError):
        return False


def leader_alive(group: Group, run_dir: Path) -> bool:
    """Whether the run's launcher still runs (:func:`owns_group`; a zombie does not)."""
    try:
        return owns_group(group, run_dir) and psutil.Process(group.pgid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def signal_group(group: Group | None, run_dir: Path, sig: int) -> bool:
    """Send ``sig`` to the run's process group; False when it is gone or cannot be proven the run's
    (:func:`owns_group`): then nothing is signalled."""
    if not owns_group(group, run_dir):
        return False
    assert group is not None
    try:
        os.killpg(group.pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


# ---------------------------------------------------------------------- finding


def rank_pids(run_dir: Path) -> dict[int, int]:
    """Rank -> pid of each rank of the run that is alive and really this run's rank."""
    return {rank: pid for rank, pid in ev.read_rank_pids(run_dir).items() if _names_run(pid, run_dir)}


def find_processes(run_dir: Path, group: Group | None = None) -> dict[int, str]:
    """Every live process of the run on this host: pid -> how it was found (``rank N``,
    ``launcher group``, ``child of P``, ``environment``). The group's members count only while its
    leader is proven the run's launcher (:func:`owns_group`). Zombies count as gone; this process and
    its ancestors are never included."""
    found: dict[int, str] = {}
    pgid = group.pgid if owns_group(group, run_dir) and group is not None else None
    for rank, pid in rank_pids(run_dir).items():
        found[pid] = f"rank {rank}"
    mine = {os.getpid(), *(p.pid for p in _ancestors())}
    want = str(run_dir)
    for proc in psutil.process_iter(["pid"]):
        pid = proc.info["pid"]
        if pid in found or pid in mine:
            continue
        try:
            if pgid is not None and os.getpgid(pid) == pgid:
                found[pid] = "launcher group"
            elif proc.environ().get(RUN_ENV) == want:
                found[pid] = "environment"
        except (psutil.Error, OSError):
            continue
    for pid in list(found):
        try:
            for child in psutil.Process(pid).children(recursive=True):
                found.setdefault(child.pid, f"child of {pid}")
        except psutil.Error:
            continue
    return {pid: how for pid, how in found.items() if pid not in mine and _alive(pid)}


def _names_run(pid: int, run_dir: Path) -> bool:
    """Whether ``pid`` is alive and belongs to the run (its command line names the run folder, or
    its environment does): a pid file of a finished run may name a pid since reused."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        if str(run_dir) in " ".join(proc.cmdline()):
            return True
        return bool(proc.environ().get(RUN_ENV) == str(run_dir))
    except (psutil.Error, OSError):
        return False


def _alive(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def _ancestors() -> list[Any]:
    try:
        return list(psutil.Process().parents())
    except psutil.Error:
        return []


def signal_pids(pids: Iterable[int], sig: int) -> list[int]:
    """Send ``sig`` to each pid; returns those it reached."""
    reached = []
    for pid in pids:
        try:
            os.kill(pid, sig)
            reached.append(pid)
        except (ProcessLookupError, PermissionError):
            continue
    return reached


# ---------------------------------------------------------------------- stopping


@dataclass
class StopReport:
    """What a stop did, and what it checked afterwards."""

    graceful: bool
    """True when every process of the run was gone within the grace period (nothing SIGKILLed)."""
    killed: list[int] = field(default_factory=list)
    """Pids SIGKILLed after the grace period (or at once, for a kill)."""
    left: list[int] = field(default_factory=list)
    """Pids of the run still alive after the stop: empty when verified."""
    gpu_note: str = ""
    """The GPU-memory check: which of the run's pids NVML still lists, or why it was skipped."""
    seen: dict[int, str] = field(default_factory=dict)
    """Every process of the run found while stopping, and how it was found."""

    @property
    def verified(self) -> bool:
        """No process of the run is left (checked with psutil, not assumed)."""
        return not self.left

    def describe(self) -> str:
        """One line for the user and the store."""
        killed = ", ".join(f"pid {p} ({self.seen.get(p, 'found at kill')})" for p in self.killed)
        how = "all processes exited within the grace period" if self.graceful else f"SIGKILLed {killed}"
        check = "no process of the run left (psutil)" if self.verified else \
            f"STILL ALIVE: pids {', '.join(map(str, self.left))}"
        return f"{how}; {check}; {self.gpu_note}"


def stop_run(
    run_dir: Path,
    group: Group | None,
    grace_s: float = DEFAULT_GRACE_S,
    kill_now: threading.Event | None = None,
    kill: bool = False,
    while_waiting: Callable[[], None] | None = None,
    poll_s: float = 0.2,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> StopReport:
    """Stop every process of a run and verify that none is left.

    Graceful (``kill=False``): SIGTERM to each rank (once: the trainer exits at once on a second
    signal), or to every process of the run when no rank has written its pid yet; then wait until no
    process of the run is left, at most ``grace_s`` seconds (or until ``kill_now`` is set); then
    SIGKILL whatever is left. ``kill=True`` SIGKILLs at once.

    Args:
        run_dir: the run folder (absolute, as recorded).
        group: the launcher's process group as recorded, if known.
        grace_s: seconds the ranks get to finish their step, save and exit.
        kill_now: set it to cut the grace period short (a second Ctrl-C).
        kill: SIGKILL at once.
        while_waiting: called on every poll (the orchestrator keeps reading the journal).
        poll_s: seconds between checks.
        clock: the monotonic clock the grace period is measured on; ``sleep`` waits between checks.

    Returns:
        The report; ``report.verified`` is False only when a process survived SIGKILL (one stuck
        in the kernel, or owned by another user).
    """
    seen = find_processes(run_dir, group)
    report = StopReport(graceful=not kill, seen=dict(seen))
    if not kill:
        ranks = [pid for pid, how in seen.items() if how.startswith("rank ")]
        signal_pids(ranks or list(seen), signal.SIGTERM)

        def left() -> bool:
            if while_waiting is not None:
                while_waiting()
            now = find_processes(run_dir, group)
            report.seen.update(now)
            return bool(now)

        wait_in_grace(left, grace_s, kill_now, poll_s=poll_s, clock=clock, sleep=sleep)
    report.killed, report.left = kill_all(run_dir, group, known=report.seen)
    if report.killed:
        report.graceful = False
    report.gpu_note = gpu_check(list(report.seen))
    return report


def wait_in_grace(left: Callable[[], bool], grace_s: float, kill_now: threading.Event | None = None,
                  poll_s: float = 0.2, clock: Callable[[], float] = time.monotonic,
                  sleep: Callable[[float], None] = time.sleep) -> bool:
    """The grace rule: check ``left()`` (is anything of the run left?) every ``poll_s`` until it says no,
    ``grace_s`` seconds have passed on ``clock``, or ``kill_now`` is set. True when nothing is left."""
    deadline = clock() + grace_s
    while clock() < deadline and not (kill_now is not None and kill_now.is_set()):
        if not left():
            return True
        sleep(poll_s)
    return False


def kill_all(run_dir: Path, group: Group | None, known: Mapping[int, str] | None = None,
             settle_s: float = 5.0) -> tuple[list[int], list[int]]:
    """SIGKILL every process of the run (found again, plus ``known`` ones still alive and still the
    run's), then check. The group is signalled only while it is proven the run's (:func:`signal_group`).

    Returns:
        ``(killed, left)``: the pids SIGKILLed, and those still alive after ``settle_s`` seconds.
    """
    killed: list[int] = []
    deadline = time.monotonic() + settle_s
    while True:
        targets = set(find_processes(run_dir, group)) | {p for p in (known or {}) if _alive(p) and _same_run(p, run_dir, group)}
        signal_group(group, run_dir, signal.SIGKILL)
        if not targets:
            return killed, []
        killed.extend(p for p in signal_pids(sorted(targets), signal.SIGKILL) if p not in killed)
        if time.monotonic() >= deadline:
            return killed, sorted(p for p in targets if _alive(p))
        time.sleep(0.1)


def _same_run(pid: int, run_dir: Path, group: Group | None) -> bool:
    """A pid seen earlier is still ours (not reused): it names the run, or is in the launcher's group
    while that group is proven the run's."""
    if _names_run(pid, run_dir):
        return True
    try:
        return group is not None and os.getpgid(pid) == group.pgid and owns_group(group, run_dir)
    except OSError:
        return False


def gpu_check(pids: list[int]) -> str:
    """Which of ``pids`` NVML still lists with GPU memory, as a sentence; on a machine without
    NVML the check is skipped and the sentence says so."""
    backend = NvmlBackend()
    try:
        if not backend.available or backend.device_count() == 0:
            return "GPU memory check skipped (no GPU visible through NVML)"
        held = [r for r in backend.process_memory({}) if r.pid in set(pids)]
        if not held:
            return "no GPU memory held by the run's processes (NVML)"
        return "GPU memory STILL HELD (NVML): " + ", ".join(f"pid {r.pid} on GPU {r.gpu_index}" for r in held)
    finally:
        backend.close()


# ---------------------------------------------------------------------- stop requests


class StopRequest:
    """What a run's watcher was asked: stop gracefully (SIGTERM, SIGHUP, a first Ctrl-C), stop now (a
    second Ctrl-C: the grace period is cut short), or kill (SIGUSR1 from ``ftui stop --kill`` or the
    dashboard's kill: SIGKILL at once).

    A graceful request repeated (a second ``ftui stop``, the dashboard's stop confirmed twice, a
    scheduler's SIGTERM after ours) joins the stop in flight: it never shortens the grace, so the ranks
    finish their save. Only a kill, or a second Ctrl-C in the watcher's own terminal, escalates."""

    def __init__(self, stop: threading.Event | None = None) -> None:
        self.stop = stop or threading.Event()
        """Set on the first request: stop gracefully."""
        self.now = threading.Event()
        """Set on a kill, or a second Ctrl-C: SIGKILL what is left at once."""
        self.kill = False
        """A kill was asked for (status ``killed``, "killed by user")."""

    def is_set(self) -> bool:
        return self.stop.is_set()

    def request(self, kill: bool = False, again_escalates: bool = False) -> None:
        """Ask for a stop. ``kill``: SIGKILL at once. ``again_escalates`` (Ctrl-C): when a stop is
        already in flight, cut its grace short; any other repeated request changes nothing."""
        if kill:
            self.kill = True
            self.now.set()
        elif again_escalates and self.stop.is_set():
            self.now.set()
        self.stop.set()

    def install(self) -> Callable[[], None]:
        """Route SIGINT, SIGTERM, SIGHUP (stop) and SIGUSR1 (kill) of this process here (main
        thread only). Returns a function that puts the previous handlers back."""
        previous = {sig: signal.getsignal(sig) for sig in (*STOP_SIGNALS, KILL_SIGNAL)}
        for sig in STOP_SIGNALS:
            signal.signal(sig, lambda *_: self.request())
        signal.signal(signal.SIGINT, lambda *_: self.request(again_escalates=True))  # Ctrl-C twice: now
        signal.signal(KILL_SIGNAL, lambda *_: self.request(kill=True))

        def restore() -> None:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

        return restore
