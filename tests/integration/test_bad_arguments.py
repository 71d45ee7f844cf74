"""Bad arguments in a real ``ftui`` process: exit 2 and one line on stderr naming what is wrong, never a
traceback, and nothing recorded."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from store import Store
from tests.support import ROOT


@pytest.mark.parametrize("argv", [
    ["show", "abc"], ["compare", "1", "x"], ["runs", "--status", "x"], ["--bogus"],
    ["run", "recipes/quickstart.toml", "--set", "data.source=\"nope.jsonl\""],
])
def test_bad_arguments_in_a_real_process(tmp_path: Path, argv: list[str]) -> None:
    env = {**os.environ, "FTUI_HOME": str(tmp_path), "FTUI_DB": f"sqlite:///{tmp_path / 'ftui.db'}"}
    proc = subprocess.run([sys.executable, "-m", "tui.cli", *argv], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2, proc
    assert len(proc.stderr.splitlines()) == 1 and proc.stderr.startswith("ftui: "), proc.stderr
    assert not (tmp_path / "ftui.db").exists() or Store(env["FTUI_DB"]).list_runs() == []
