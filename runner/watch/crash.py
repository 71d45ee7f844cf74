"""Crash detection: which rank ended, how (signal or exit code), and a one-line reason for the run.

Three sources, best first:

1. The launcher's log. torch elastic (behind ``accelerate launch`` for more than one process) prints a
   ``ChildFailedError`` report with a "Root Cause (first observed failure)" block per failed rank:
   ``rank : 1 (local_rank: 1)`` and ``exitcode : -9 (pid: 17065)`` (a negative code is a signal).
2. The rank pids the ranks wrote to ``RUN/ranks/{N}.pid``, watched with psutil: a rank that vanishes
   while the run goes on is noted at once (its exit status is its parent's to read, not ours).
3. The rank's own log: the last exception line, and CUDA's "out of memory".

A full disk is named wherever it shows (:func:`no_space_reason`): a rank's exit code
:data:`runner.spec.events.EXIT_NO_SPACE`, "No space left on device" in its log or in the trainer's error,
or, for a rank that vanished without a word, a run folder with no room left.
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.hardware.disks import is_full, no_space, says_no_space
from runner.spec import events as ev

_BLOCK = re.compile(
    r"rank\s*:\s*(?P<rank>\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(?P<code>-?\d+)\s*\(pid:\s*(?P<pid>\d+)\)"
)
_OOM = ("CUDA out of memory", "OutOfMemoryError")
_COLLECTIVE_TIMEOUT = re.compile(
    r"Timed out waiting \d+ ?ms"                      # gloo: "Timed out waiting 1800000ms for recv operation"
    r"|collective operation timeout"                  # NCCL's watchdog: "Watchdog caught collective operation timeout"
    r"|ran for \d+ milliseconds before timing out"    # NCCL: the same line's end
    r"|DistBackendError.*timed? ?out", re.IGNORECASE)


@dataclass(frozen=True)
class RankFailure:
    """One failed rank as the launcher reported it."""

    rank: int
    exit_code: int
    pid: int | None
    root_cause: bool


def launcher_failures(run_dir: Path) -> list[RankFailure]:
    """The failed ranks in the launcher's log, the root cause first (empty when it reported none)."""
    try:
        text = (run_dir / ev.LAUNCHER_LOG).read_text(errors="replace")
    except OSError:
        return []
    head, _, root = text.rpartition("Root Cause (first observed failure)")
    found: list[RankFailure] = []
    if root:
        for m in _BLOCK.finditer(root):
            found.append(RankFailure(int(m["rank"]), int(m["code"]), int(m["pid"]), True))
            break
    for m in _BLOCK.finditer(head if root else text):
        found.append(RankFailure(int(m["rank"]), int(m["code"]), int(m["pid"]), False))
    return found


def signal_name(code: int) -> str:
    """``-9`` -> ``SIGKILL``."""
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def rank_log_reason(run_dir: Path, rank: int) -> str | None:
    """CUDA out of memory, else the last exception line of one rank's log."""
    try:
        lines = ev.rank_log(run_dir, rank).read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        if any(marker in line for marker in _OOM):
            return "out of GPU memory: " + line.strip()[:300]
        full = no_space_reason(run_dir, line)
        if full:
            return full
    for line in reversed(lines):
        text = line.strip()
        head = text.split(":", 1)[0]
        if head.endswith(("Error", "Exception")) and " " not in head:
            return text[:300]
    return None


def collective_timeout(run_dir: Path, rank: int) -> str | None:
    """The line of a rank's log saying a collective timed out (gloo or NCCL): a hang some rank timed out
    on (the stacks of the others say where they were); None when there is none."""
    try:
        lines = ev.rank_log(run_dir, rank).read_text(errors="replace").splitlines()
    except OSError:
        return None
    return next((line.strip()[:300] for line in reversed(lines) if _COLLECTIVE_TIMEOUT.search(line)), None)


_NO_SPACE_PATH = re.compile(r"No space left on device: '(?P<path>[^']+)'")
def no_space_reason(run_dir: Path, text: str | None) -> str | None:
    """``no space left on DEVICE (PATH)`` when ``text`` (a log line, the trainer's error) says the disk was
    full; the path it names, else the run folder."""
    if not text or not says_no_space(text):
        return None
    named = _NO_SPACE_PATH.search(text)
    return no_space(Path(named["path"]) if named else run_dir)


def run_folder_full(run_dir: Path) -> str | None:
    """``no space left on DEVICE (RUN)`` when the run folder's filesystem has (next to) no room left."""
    return no_space(run_dir) if is_full(run_dir) else None


def memory_was_short(rank: int, recent: list[Any]) -> bool:
    """Whether the last readings suggest the kernel's OOM killer: the rank's RSS at least half of the
    host's memory, or the host at 90 % of its memory or more (psutil samples)."""
    rank_rss = next((s.mem_used for s in reversed(recent) if s.kind == "rank" and s.index == rank), None)
    host = next((s for s in reversed(recent) if s.kind == "host"), None)
    total = getattr(host, "mem_total", None)
    if not total:
        return False
    if rank_rss and rank_rss >= 0.5 * total:
        return True
    used = getattr(host, "mem_used", None)
    return bool(used and used >= 0.9 * total)


def solo_failure(vanished: list[tuple[int, int]] | None, launcher: tuple[int, int | None] | None) -> RankFailure | None:
    """A rank that ran inside the launcher's own interpreter (one process: ``runner.rank.solo_launch``) and
    died of a signal: the launcher's exit code is the rank's, and no torch elastic report names it.

    Args:
        vanished: ``(rank, pid)`` the watcher saw disappear.
        launcher: ``(pid, exit code)`` of the launcher, when known.
    """
    pid, code = launcher if launcher is not None else (0, None)
    if not vanished or code is None or code >= 0:
        return None
    rank = next((r for r, p in vanished if p == pid), None)
    return RankFailure(rank, code, pid, True) if rank is not None else None


def describe(run_dir: Path, vanished: list[tuple[int, int]] | None = None, recent: list[Any] | None = None,
             trainer_error: str | None = None, launcher: tuple[int, int | None] | None = None) -> str | None:
    """The one-line reason a run failed, from what the launcher, the ranks and their logs say.

    Args:
        run_dir: the run folder.
        vanished: ``(rank, pid)`` in the order the watcher saw them disappear.
        recent: recent telemetry samples (for the OOM-killer note).
        trainer_error: the message of the trainer's ``error`` event, if any.
        launcher: ``(pid, exit code)`` of the launcher, when known (a one-process rank's signal).

    Returns:
        e.g. ``"rank 1 (pid 1234) was killed by SIGKILL"``, or None when nothing is known.
    """
    solo = solo_failure(vanished, launcher)
    failures = [solo] if solo is not None else launcher_failures(run_dir)
    # A rank SIGKILLed from outside (kill -9, the OOM killer) is the cause even when the launcher observed a
    # peer first: that peer failed on the closed connection (gloo, NCCL) in the same instant.
    killed = [f for f in failures if f.exit_code == -signal.SIGKILL]
    first = killed[0] if killed else failures[0] if failures else None
    if first is None and trainer_error:
        # the trainer caught it and said so: the best words there are
        return no_space_reason(run_dir, trainer_error) or trainer_error
    if first is None and vanished:
        rank, pid = vanished[0]
        reason = f"rank {rank} (pid {pid}) ended before the run did"
        detail = rank_log_reason(run_dir, rank) or run_folder_full(run_dir)
        return _with_timeout(run_dir, rank, f"{reason}: {detail}" if detail else reason)
    if first is None:
        return None
    who = f"rank {first.rank}" + (f" (pid {first.pid})" if first.pid else "")
    if first.exit_code < 0:
        reason = f"{who} was killed by {signal_name(first.exit_code)}"
        if first.exit_code == -signal.SIGKILL:
            detail = rank_log_reason(run_dir, first.rank)
            if detail and detail.startswith("out of GPU memory"):
                reason += f"; {detail}"
            elif recent is not None and memory_was_short(first.rank, recent):
                reason += " (the kernel's OOM killer, if memory was short: the last reading was near the limit)"
        return _with_timeout(run_dir, first.rank, reason)
    detail = rank_log_reason(run_dir, first.rank) or (trainer_error if first.rank == 0 else None)
    if first.exit_code == ev.EXIT_NO_SPACE and not (detail and detail.startswith("no space left")):
        detail = no_space(run_dir)
    reason = f"{who} exited with code {first.exit_code}"
    return _with_timeout(run_dir, first.rank, f"{reason}: {detail}" if detail else reason)


def _with_timeout(run_dir: Path, rank: int, reason: str) -> str:
    """``reason``, and the collective timeout in the rank's log when it does not say it already."""
    timeout = collective_timeout(run_dir, rank)
    if timeout is None or _COLLECTIVE_TIMEOUT.search(reason):
        return reason
    return f"{reason}; collective timeout (a hang): {timeout}"


class RankWatch:
    """Follows the rank processes named in ``RUN/ranks/*.pid`` (psutil; pid reuse guarded by the
    process's start time) and reports those that disappear."""

    def __init__(self, run_dir: Path, clock: Callable[[], float] = time.time) -> None:
        self.run_dir = run_dir
        self.clock = clock
        self._procs: dict[int, Any] = {}
        self.vanished: list[tuple[int, int]] = []
        self.first_vanished_at: float | None = None

    def poll(self) -> list[tuple[int, int]]:
        """Ranks that disappeared since the last call, as ``(rank, pid)``."""
        import psutil

        for rank, pid in ev.read_rank_pids(self.run_dir).items():
            if rank in self._procs or any(r == rank for r, _ in self.vanished):
                continue
            try:
                self._procs[rank] = psutil.Process(pid)
            except psutil.Error:
                continue  # already gone before we saw it run; the launcher's report will say
        gone: list[tuple[int, int]] = []
        for rank, proc in list(self._procs.items()):
            try:
                alive = proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
            except psutil.Error:
                alive = False
            if not alive:
                gone.append((rank, proc.pid))
                del self._procs[rank]
        if gone and self.first_vanished_at is None:
            self.first_vanished_at = self.clock()
        self.vanished.extend(gone)
        return gone

    def any_alive(self) -> bool:
        """Whether a rank seen so far still runs."""
        self.poll()
        return bool(self._procs)
