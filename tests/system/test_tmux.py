"""Run the tmux driver (tests/support/tmux_drive.py) in pytest: ftui as a person would use it. Every wait
is on what the screen shows; without tmux on the machine the tests skip and say so."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.support.tmux_drive import Tmux, drive

needs_tmux = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (not on PATH)")


@needs_tmux
def test_tmux_drive(tmp_path: Path) -> None:
    seen: list[str] = []
    timings = drive(tmp_path / "home", steps=60, log=seen.append)
    assert len(seen) == 13, seen
    assert set(timings) == {"first_paint_s", "reopen_paint_s"}  # measured, reported; never a pass mark


@needs_tmux
def test_ftui_over_a_store_that_cannot_open_says_so_in_one_line_and_exits_2(tmp_path: Path) -> None:
    """In a real terminal: ``ftui --db`` naming a folder paints, then ends with the store's one line on the
    restored terminal and exit code 2 (the store opens in the Runs screen's worker, after the first paint)."""
    import os
    import sys

    tmux = Tmux(f"ftui-bad-db-{os.getpid()}", {"FTUI_HOME": str(tmp_path / "home")})
    url = f"sqlite:///{tmp_path}"
    tmux.start(["sh", "-c", f'"{sys.executable}" -m tui.cli --db "{url}"; echo "exit=$?"'])
    try:
        screen = tmux.wait(r"exit=\d", timeout=60)
    finally:
        tmux.kill()
    lines = [line for line in screen.splitlines() if line.strip()]
    ended = next(i for i, line in enumerate(lines) if line.startswith("exit="))
    assert lines[ended] == "exit=2", screen
    # One line, wrapped by the terminal at 80 columns, at a space (dropped) or inside a word: compared
    # without its whitespace.
    said = "".join("".join(lines[:ended]).split())
    assert said == "".join(f"ftui: --db {url}: {tmp_path} is a folder, not a database file".split()), screen
