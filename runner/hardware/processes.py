"""Rank processes and the host through psutil: the CPU fallback, a second real implementation of the probe.

:class:`ProcessProbe` reports, per rank, the CPU% and RSS of the rank's process tree; :class:`ProcessTree`
attributes NVML's per-process GPU memory to ranks."""

from __future__ import annotations

import math
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import psutil

from runner.hardware.records import DeviceSample


def started_wall(pid: int | None = None) -> float | None:
    """When process ``pid`` (this one when None) started, on the clock ``time.time()`` reads: now less its
    age (/proc: seconds since boot less its start in clock ticks, 10 ms resolution), so that it can be
    subtracted from a journal event's ``time``. psutil's ``create_time`` adds the age to the boot time that
    /proc/stat gives in whole seconds: up to a second off ``time.time()``, the size of a stage it times.
    psutil's elsewhere; None when the process is gone."""
    try:
        stat = Path(f"/proc/{pid or 'self'}/stat").read_text()
        ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, starttime (the fields after comm start at 3)
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        try:
            return float(psutil.Process(pid).create_time())
        except psutil.Error:
            return None

# --------------------------------------------------------------------------------------------------
# Process tree: which pid belongs to which rank


class ProcessTree:
    """Maps every process of a run's tree to its rank, rescanning the process table sparingly.

    A scan walks the whole process table (about 25 us per process with psutil, so ~25 ms on a busy
    box with 1,000 processes), too much to do twice a second. The map is rebuilt when the rank pids
    change and otherwise at most every ``refresh_s`` seconds; a dataloader worker started in
    between is counted from the next scan on.

    Args:
        refresh_s: Longest age of the cached map, in seconds; 0 rescans on every call.
        clock: Monotonic clock, injectable for tests.
    """

    def __init__(self, refresh_s: float = 5.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.refresh_s = refresh_s
        self._clock = clock
        self._key: tuple[tuple[int, int], ...] | None = None
        self._scanned_at = -math.inf
        self._owners: dict[int, int] = {}

    def owners(self, pids_by_rank: Mapping[int, int]) -> dict[int, int]:
        """Return pid -> rank for the rank processes and all their descendants.

        Args:
            pids_by_rank: rank -> pid of the rank process (or of any process whose tree is that
                rank, such as a per-rank launcher).

        Returns:
            A new dict. A rank pid maps to its own rank even when it is a descendant of another
            rank's pid; a descendant belongs to the nearest rank pid above it.
        """
        key = tuple(sorted(pids_by_rank.items()))
        now = self._clock()
        if key != self._key or now - self._scanned_at >= self.refresh_s:
            self._owners = _scan_owners(pids_by_rank) if pids_by_rank else {}
            self._key = key
            self._scanned_at = now
        return dict(self._owners)


def _scan_owners(pids_by_rank: Mapping[int, int]) -> dict[int, int]:
    children: dict[int, list[int]] = {}
    # One pass over the process table for all ranks (Process.children() is one pass per call).
    for proc in psutil.process_iter(["ppid"]):
        ppid = proc.info.get("ppid")
        if ppid is not None:
            children.setdefault(int(ppid), []).append(int(proc.pid))
    owners = {pid: rank for rank, pid in pids_by_rank.items()}
    for rank, root in pids_by_rank.items():
        stack = list(children.get(root, ()))
        while stack:
            pid = stack.pop()
            if pid in owners:  # another rank's own pid, or already claimed: stop there
                continue
            owners[pid] = rank
            stack.extend(children.get(pid, ()))
    return owners


# --------------------------------------------------------------------------------------------------
# CPU fallback


class ProcessProbe:
    """Rank and host readings through psutil: the CPU fallback, also useful next to GPUs.

    CPU% is a rate, so it needs two readings: the ``psutil.Process`` objects are kept between calls
    (``cpu_percent(interval=None)`` measures since the previous call on the same object), and a
    rank's first reading has ``util_pct=None``. Processes that exit are skipped and forgotten.

    Args:
        host: Host name written into samples; defaults to this machine's.
        clock: Wall clock for sample times.
    """

    source = "psutil"

    def __init__(self, host: str | None = None, clock: Callable[[], float] = time.time) -> None:
        self.host = host or socket.gethostname()
        self._clock = clock
        self._lock = threading.Lock()
        self._procs: dict[int, Any] = {}  # pid -> psutil.Process with a cpu_percent baseline
        self._host_times: tuple[float, float] | None = None  # (busy, total) CPU seconds
        self._cores = psutil.cpu_count() or 1
        self._mem_total = int(psutil.virtual_memory().total)

    def sample(
        self, pids_by_rank: Mapping[int, int], owners: Mapping[int, int] | None = None
    ) -> list[DeviceSample]:
        """Read every rank's process tree and the host.

        Args:
            pids_by_rank: rank -> pid of the rank process.
            owners: pid -> rank for the ranks and their descendants (:class:`ProcessTree`); when
                ``None`` the process table is scanned now.

        Returns:
            One ``kind="rank"`` sample per rank whose process is alive, then one ``kind="host"``.
        """
        with self._lock:
            if owners is None:
                owners = ProcessTree(refresh_s=0).owners(pids_by_rank)
            now = self._clock()
            samples = []
            for rank, pid in sorted(pids_by_rank.items()):
                sample = self._rank(now, rank, pid, owners)
                if sample is not None:  # None: the rank's process has exited
                    samples.append(sample)
            # Forget processes that left the tree so their pids can be reused safely.
            for pid in set(self._procs) - set(owners) - set(pids_by_rank.values()):
                del self._procs[pid]
            samples.append(self._host_sample(now))
            return samples

    def _process(self, pid: int) -> tuple[Any, bool]:
        proc = self._procs.get(pid)
        if proc is not None:
            return proc, True
        proc = self._procs[pid] = psutil.Process(pid)
        proc.cpu_percent(None)  # the baseline; the first value means nothing
        return proc, False

    def _rank(self, now: float, rank: int, pid: int, owners: Mapping[int, int]) -> DeviceSample | None:
        try:
            main, primed = self._process(pid)
            with main.oneshot():
                cpu = main.cpu_percent(None)
                rss = int(main.memory_info().rss)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            self._procs.pop(pid, None)
            return None
        for child in (p for p, r in owners.items() if r == rank and p != pid):
            try:
                proc, child_primed = self._process(child)
                value = proc.cpu_percent(None)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                self._procs.pop(child, None)
                continue
            if child_primed:
                cpu += value
        return DeviceSample(
            time=now,
            host=self.host,
            kind="rank",
            index=rank,
            name=f"rank {rank}",
            util_pct=round(cpu, 1) if primed else None,
            mem_used=rss,
            mem_total=self._mem_total,
            power_w=None,
            temp_c=None,
            sm_clock_mhz=None,
            source=self.source,
            pid=pid,
        )

    def _host_sample(self, now: float) -> DeviceSample:
        # Own delta of psutil.cpu_times() rather than psutil.cpu_percent(), whose baseline is one
        # module-wide value that any other caller in the process would move.
        times = psutil.cpu_times()
        total = sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
        busy = total - times.idle - getattr(times, "iowait", 0.0)
        util = None
        if self._host_times is not None:
            d_busy, d_total = busy - self._host_times[0], total - self._host_times[1]
            util = round(100.0 * d_busy / d_total, 1) if d_total > 0 else 0.0
        self._host_times = (busy, total)
        mem = psutil.virtual_memory()
        return DeviceSample(
            time=now,
            host=self.host,
            kind="host",
            index=-1,
            name=f"host CPU ({self._cores} cores)",
            util_pct=util,
            mem_used=int(mem.total - mem.available),
            mem_total=int(mem.total),
            power_w=None,
            temp_c=None,
            sm_clock_mhz=None,
            source=self.source,
            pid=None,
        )
