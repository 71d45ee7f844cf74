"""Filesystems under the paths a run writes: which device holds a path, how much room it has, and the one
way a full disk is said ("no space left on DEVICE (PATH)")."""

from __future__ import annotations

import errno
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

NO_SPACE_WORDS = ("no space left on device", "database or disk is full", "[errno 28]", "errno.enospc")
"""How a full disk shows in an exception's text or a log line: the C library's words, SQLite's, Python's."""


FULL_BELOW_BYTES = 1 << 20
"""A filesystem with less room than this counts as full: where a write failed without saying why (SQLite's
"disk I/O error", a rank that vanished without a word), a full disk is named when its room is this low."""


@dataclass(frozen=True)
class Filesystem:
    """The filesystem that holds a path."""

    device: str
    """What is mounted (``/dev/nvme0n1p2``, ``tmpfs``)."""
    mountpoint: str
    free_bytes: int
    """Bytes an unprivileged writer may still use."""

    @property
    def name(self) -> str:
        """The device as a person finds it: its node, or a virtual one's kind and mount point."""
        return self.device if self.device.startswith("/") else f"{self.device} at {self.mountpoint}"


def existing_part(path: Path) -> Path:
    """``path``, or its nearest parent that exists (a folder not made yet is on its parent's filesystem)."""
    probe = path.absolute()
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    return probe


def filesystem_of(path: Path) -> Filesystem:
    """The filesystem holding ``path`` (its nearest existing parent), from ``/proc/self/mounts``."""
    here = existing_part(path)
    mountpoint = here if here.is_dir() else here.parent
    while not os.path.ismount(mountpoint) and mountpoint.parent != mountpoint:
        mountpoint = mountpoint.parent
    device = "unknown device"
    try:
        with open("/proc/self/mounts", encoding="utf-8") as fh:
            for line in fh:  # the last mount at a point is the one in effect
                fields = line.split()
                if len(fields) >= 2 and fields[1].replace("\\040", " ") == str(mountpoint):
                    device = fields[0]
    except OSError:
        pass
    try:
        free = shutil.disk_usage(here).free
    except OSError:
        free = 0
    return Filesystem(device=device, mountpoint=str(mountpoint), free_bytes=free)


def is_full(path: Path) -> bool:
    """Whether the filesystem holding ``path`` has (next to) no room left (:data:`FULL_BELOW_BYTES`)."""
    return filesystem_of(path).free_bytes < FULL_BELOW_BYTES


def is_no_space(exc: BaseException) -> bool:
    """Whether ``exc``, or an exception it was raised from, says the disk is full (ENOSPC, SQLITE_FULL)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if says_no_space(str(current)):
            return True
        current = current.__cause__ or current.__context__
    return False


def says_no_space(text: str) -> bool:
    """Whether a message or log line says the disk is full."""
    lower = text.lower()
    return any(word in lower for word in NO_SPACE_WORDS)


def no_space(path: Path) -> str:
    """``no space left on DEVICE (PATH)``: the one line that names a full disk."""
    return f"no space left on {filesystem_of(path).name} ({path})"


def write_problem(path: Path, exc: BaseException) -> str:
    """One line for a failed write to ``path``: :func:`no_space` when the disk is full, else the error."""
    if is_no_space(exc):
        return no_space(path)
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else f"{type(exc).__name__}: {exc}"
    return f"cannot write {path}: {reason}"[:500]
