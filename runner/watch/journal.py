"""Journal-first recording: what the orchestrator learns about a run goes to the run folder before
the database, so that the store is a projection that :mod:`runner.service.recover` can rebuild.

Two files beside the trainer's ``events.jsonl``:

    orchestrator.jsonl   the orchestrator's own events (launch, hang, rank_exit, exit, ...), one JSON
                         object per line with ``seq`` (0, 1, ... within the run, across watchers: a
                         watcher that re-attaches continues the numbering), ``type`` and ``time``
    samples.jsonl        telemetry, appended in batches: one line per reading, ``{"k": "d"|"p", ...}``
                         (``d`` a device sample, ``p`` a process's GPU memory) with the store's columns

Both are appended whole or not at all (:func:`runner.spec.events.append_whole`: a write the disk cannot take is cut back
off), so a line is whole or absent, and a later line never runs on from a torn one. Readers skip a torn
last line (a watcher killed mid-write). Samples are re-ingested idempotently by time: a batch is written to the store in
one transaction and readings arrive in time order, so "time greater than the newest stored" is exact.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from runner.spec.events import JournalReader, append_whole

ORCHESTRATOR_FILE = "orchestrator.jsonl"
SAMPLES_FILE = "samples.jsonl"
WATCHER_LOCK = "watcher.lock"

DEVICE_FIELDS = ("time", "host", "kind", "index", "name", "util_pct", "mem_used", "mem_total", "power_w",
                 "temp_c", "sm_clock_mhz", "pid", "source")
PROCESS_FIELDS = ("time", "host", "gpu_index", "pid", "rank", "used_bytes", "source")


def append_text(path: Path, text: str) -> None:
    """Append ``text`` to ``path`` whole or not at all (:func:`runner.spec.events.append_whole`)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        append_whole(fd, text.encode())
    finally:
        os.close(fd)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every whole record of a journal file (none when it does not exist)."""
    return JournalReader(path).read_new()


class OrchestratorJournal:
    """Appends the orchestrator's events to ``orchestrator.jsonl``, continuing the file's ``seq``."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / ORCHESTRATOR_FILE
        existing = read_jsonl(self.path)
        self._seq = max((int(e.get("seq", -1)) for e in existing), default=-1) + 1
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)

    def record(self, type_: str, **payload: Any) -> dict[str, Any]:
        """The next event, numbered, not written yet (:meth:`write`)."""
        record = {"seq": self._seq, "type": type_, "time": time.time(), **payload}
        self._seq += 1
        return record

    def write(self, records: list[dict[str, Any]]) -> None:
        """Append records in one write, whole or not at all (:func:`append_whole`).

        Raises:
            OSError: the disk did not take them; nothing of them is in the file.
        """
        assert self._fd is not None, "the journal is closed"
        text = "".join(json.dumps(r, separators=(",", ":"), default=str) + "\n" for r in records)
        append_whole(self._fd, text.encode())

    def emit(self, type_: str, **payload: Any) -> dict[str, Any]:
        """Append one event and return it (as it should then go to the store).

        Raises:
            OSError: the disk did not take it (it is numbered all the same: :class:`runner.watch.stream.Recorder`
                writes it again later).
        """
        record = self.record(type_, **payload)
        self.write([record])
        return record

    def close(self) -> None:
        """Flush to disk and close."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.fsync(fd)
        except OSError:
            pass  # what the disk could not take was said when it was written
        finally:
            os.close(fd)


def sample_lines(samples: Iterable[Any], procs: Iterable[Any]) -> str:
    """The ``samples.jsonl`` text of one batch."""
    lines = [json.dumps({"k": "d", **{f: getattr(s, f) for f in DEVICE_FIELDS}}, separators=(",", ":"))
             for s in samples]
    lines += [json.dumps({"k": "p", **{f: getattr(p, f) for f in PROCESS_FIELDS}}, separators=(",", ":"))
              for p in procs]
    return "".join(line + "\n" for line in lines)


def append_samples(run_dir: Path, samples: list[Any], procs: list[Any]) -> None:
    """Append one batch of readings to ``samples.jsonl``, whole or not at all.

    Raises:
        OSError: the disk did not take it; the file is as it was.
    """
    text = sample_lines(samples, procs)
    if text:
        append_text(run_dir / SAMPLES_FILE, text)


class _Row:
    """A sample read back from ``samples.jsonl``: the attributes the store's ``add_samples`` reads."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.__dict__.update(values)


def read_samples(run_dir: Path) -> tuple[list[Any], list[Any]]:
    """Device samples and process samples of ``samples.jsonl``, in file (= time) order."""
    devices: list[Any] = []
    procs: list[Any] = []
    path = run_dir / SAMPLES_FILE
    if not path.exists():
        return devices, procs
    with open(path, "rb") as fh:
        for raw in fh:
            if not raw.endswith(b"\n"):
                break  # a torn last line: the watcher died while writing it
            try:
                record = json.loads(raw)
            except json.JSONDecodeError:
                continue
            kind = record.pop("k", None)
            if kind == "d":
                devices.append(_Row({f: record.get(f) for f in DEVICE_FIELDS}))
            elif kind == "p":
                procs.append(_Row({f: record.get(f) for f in PROCESS_FIELDS}))
    return devices, procs


class ProcessLock:
    """An exclusive ``flock`` on a file, held by one process for its whole life.

    The kernel drops the lock when the process dies, however it dies (SIGKILL, OOM, reboot), so
    "the lock can be taken" means "no process on this host holds it"; this is immune to pid reuse.
    The file also names the holder (pid, host), for people and :meth:`holder`.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self, wait_s: float = 0.0) -> bool:
        """Take the lock, trying for up to ``wait_s`` seconds; False when another process holds it."""
        deadline = time.monotonic() + wait_s
        while not self._try_acquire():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def _try_acquire(self) -> bool:
        if self._fd is not None:
            return True
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        self._fd = fd
        self.name_holder(os.getpid())
        return True

    def name_holder(self, pid: int) -> None:
        """Write ``pid`` (and this host) into the file as the holder's: this process, or the child it hands
        the lock to."""
        assert self._fd is not None, "the lock is not held"
        os.ftruncate(self._fd, 0)
        os.lseek(self._fd, 0, os.SEEK_SET)
        os.write(self._fd, f"{pid} {os.uname().nodename}\n".encode())

    def take_over(self, fd: int) -> None:
        """Hold the lock through ``fd``, inherited from the process that took it (a ``flock`` belongs to the
        open file, so the hand-over leaves no moment without a holder); the file then names this process."""
        os.set_inheritable(fd, False)
        self._fd = fd
        self.name_holder(os.getpid())

    def fileno(self) -> int | None:
        """The descriptor holding the lock (to hand it to a child with ``pass_fds``)."""
        return self._fd

    def release(self) -> None:
        """Give the lock up (closing the file drops it)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def held_elsewhere(self) -> bool:
        """Whether another process holds the lock right now."""
        if self._fd is not None:
            return False
        if not self.path.exists():
            return False
        if self.acquire():
            self.release()
            return False
        return True

    def holder(self) -> int | None:
        """The pid of the process that holds the lock now (what it wrote in the file); None when none does."""
        if not self.held_elsewhere():
            return os.getpid() if self._fd is not None else None
        try:
            return int(self.path.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None


class WatcherLock(ProcessLock):
    """The watcher of a run holds :class:`ProcessLock` on ``RUN/watcher.lock`` for its whole life, so "the
    lock can be taken" means "no process on this host is watching the run"."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__(run_dir / WATCHER_LOCK)

    @classmethod
    def adopt(cls, run_dir: Path, fd: int) -> WatcherLock:
        """The lock held through ``fd``, inherited from the process that handed the run over (a
        ``flock`` belongs to the open file, so the hand-over leaves no moment without a holder)."""
        lock = cls(run_dir)
        lock.take_over(fd)
        return lock
