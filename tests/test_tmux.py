"""Run the tmux driver (tests/tmux_drive.py) in pytest: ftui as a person would use it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from tmux_drive import drive  # tests/ is on sys.path (rootdir conftest, no package)


def _tmux() -> str | None:
    if shutil.which("tmux") is None and shutil.which("apt-get"):
        subprocess.run(["apt-get", "install", "-y", "-qq", "tmux"], capture_output=True, timeout=300)
    return shutil.which("tmux")


@pytest.mark.slow
def test_tmux_drive(tmp_path: Path) -> None:
    if _tmux() is None:
        pytest.skip("tmux is not installed and could not be installed with apt-get")
    seen: list[str] = []
    timings = drive(tmp_path / "home", steps=60, log=seen.append)
    assert len(seen) == 11, seen
    assert timings["first_paint_s"] < 60  # the machine may be heavily loaded
