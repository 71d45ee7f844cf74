"""Shared fixtures: one ftui home (database, run folders, tokenizer cache) per test session, and a
helper that runs the real ``ftui`` command line in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest_plugins = ["store_backends", "slurm_cluster"]  # db_url (SQLite and PostgreSQL) and pg_server fixtures

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "recipes" / "quickstart.toml"
STEPS = 8


@dataclass
class Ftui:
    home: Path
    db: str

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "FTUI_HOME": str(self.home), "FTUI_DB": self.db, "PYTHONUNBUFFERED": "1"}

    def run(self, *args: str, timeout: float = 300, check: bool = False) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [sys.executable, "-m", "tui.cli", *args],
            env=self.env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"ftui {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
        return proc

    def show(self, run_id: int) -> dict[str, Any]:
        return json.loads(self.run("show", str(run_id), "--format", "json", check=True).stdout)

    def runs(self) -> list[dict[str, Any]]:
        return json.loads(self.run("runs", "--format", "json", check=True).stdout)


@pytest.fixture(scope="session")
def ftui(tmp_path_factory: pytest.TempPathFactory) -> Ftui:
    from store import Store

    home = tmp_path_factory.mktemp("ftui-home")
    db = f"sqlite:///{home / 'ftui.db'}"
    Store(db).close()  # FTUI_DB names it, so read commands refuse it until it exists
    return Ftui(home=home, db=db)


@pytest.fixture(scope="session")
def strategy_runs(ftui: Ftui) -> dict[str, dict[str, Any]]:
    """quickstart trained for a few steps under every strategy, at the same global batch (4).

    Real subprocesses, real training on CPU, real SQLite: the rest of the suite reads these runs.
    """
    plans = {
        "single": ["--strategy", "single"],
        "mp": ["--strategy", "mp"],
        "ddp": ["--strategy", "ddp", "--nproc", "2", "--set", "train.batch_size=2"],
        "fsdp": ["--strategy", "fsdp", "--nproc", "2", "--set", "train.batch_size=2"],
    }
    results: dict[str, dict[str, Any]] = {}
    for name, flags in plans.items():
        proc = ftui.run("run", str(QUICKSTART), *flags, "--set", f"train.max_steps={STEPS}", "--name", f"t-{name}")
        assert proc.returncode == 0, f"{name}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        run = next(r for r in ftui.runs() if r["name"] == f"t-{name}")
        results[name] = ftui.show(run["id"]) | {"stdout": proc.stdout}
    return results


# Fixtures that train models in subprocesses: any test that uses one is slow (the fast loop,
# `pytest -m "not slow"`, leaves them out; CI runs everything).
TRAINING_FIXTURES = {"strategy_runs", "full_runs", "sweep"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if TRAINING_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
