"""Full disks made for real: a small tmpfs mounted for one test (tests run as root; a machine that refuses
the mount skips the test and says why), and a filler file that takes every byte left."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest


@contextmanager
def small_filesystem(where: Path, size: str = "4m") -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``where`` (created) for the block; unmounted after, whatever happens."""
    where.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs at {where} (needs root): {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def fill(folder: Path) -> Path:
    """Write a file into ``folder`` until its disk takes nothing more; the file (delete it to free the disk)."""
    filler = folder / "filler"
    chunk = b"\0" * 65536
    with open(filler, "wb", buffering=0) as fh:
        with suppress(OSError):
            while True:
                fh.write(chunk)
        with suppress(OSError):  # the last page's slack
            while True:
                fh.write(b"\0" * 512)
    return filler
