"""What the tests share: the repository's paths, and ``Ftui``, which runs the real ``ftui`` command line
against one home (database, run folders, caches): in a subprocess (``Ftui.run``: whatever trains, forks or
signals, and the tests of the process itself), or in this process as a fresh process runs it
(``Ftui.call``: the commands that only read, :mod:`tests.support.in_process`).

The fixtures live in plugin modules next to this one, registered by tests/conftest.py: ``postgres``
(``db_url``, ``pg_server``), ``slurm_cluster`` and ``matrix`` (the shared real runs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from runner.spec.summary import RunSummary
from store import RunInfo
from tests.support.in_process import call_main, fresh_process_state, run_ftui

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "recipes" / "quickstart.toml"


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

    def call(self, *args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
        """``ftui ARGS`` in this process, as ``run`` would give it from a fresh process (this home's
        environment, cwd ROOT, no terminal): for the commands that neither train nor start processes
        (``show``, ``runs``, ``compare``, ``report``, ``estimate``, ``db``, ``gpus``, and ``run``/``sweep``
        with ``--dry-run``); any other is refused."""
        code, out, err = run_ftui(args, self.env, ROOT)
        if check and code != 0:
            raise AssertionError(f"ftui {' '.join(args)} exited {code}\n{out}\n{err}")
        return subprocess.CompletedProcess([sys.executable, "-m", "tui.cli", *args], code, out, err)

    def show(self, run_id: int) -> dict[str, Any]:
        return json.loads(self.call("show", str(run_id), "--format", "json", check=True).stdout)

    def runs(self) -> list[dict[str, Any]]:
        return json.loads(self.call("runs", "--format", "json", check=True).stdout)


@dataclass(frozen=True)
class CliResult:
    """What a command printed and its exit code, as from a process."""

    returncode: int
    stdout: str
    stderr: str


def run_in_process(capsys: Any, *args: str) -> CliResult:
    """``ftui ARGS`` through ``tui.cli.main.main`` in this process (``capsys`` is pytest's fixture), with
    this process's environment and folder as the test set them: the same parsing, handlers and exit codes
    as the command, without an interpreter's start-up, and no terminal, logging handler, warning filter or
    open database left to or from the test (:func:`tests.support.in_process.fresh_process_state`). Any
    command that starts no process: a dry run, a refusal of bad input, a read."""
    capsys.readouterr()
    with fresh_process_state():
        code = call_main(args)
    out, err = capsys.readouterr()
    return CliResult(code, out, err)


def run_info(id_: int, strategy: str, nproc: int, tps: float | None, status: str = "completed",
             **summary: Any) -> RunInfo:
    """A stored run as the store returns it, made by hand: quickstart's shape, 5 steps, ``summary``'s
    fields in its summary (for comparisons built without training)."""
    now = datetime(2026, 1, 1)
    return RunInfo(id=id_, uid=f"uid{id_}", name="q", sweep_id=None, recipe_text=f'[launch]\nstrategy = "{strategy}"\n',
                   recipe_hash="", recipe_source=None, strategy=strategy, nproc=nproc, method="lora",
                   model="builtin:tiny-llama", status=status, distributed_type=None, device_type="cpu", host="h",
                   run_dir="", pgid=None, created_at=now, started_at=now, ended_at=now, exit_code=0,
                   error=None if status == "completed" else "boom", total_steps=5, steps_done=5,
                   train_seconds=10.0, tokens_per_s=tps, final_loss=2.0, peak_mem_bytes=None, mean_util=50.0,
                   summary=RunSummary.from_json({"world_size": nproc, **summary}))


def new_home(root: Path) -> Ftui:
    """An empty ftui home under ``root`` whose database exists (``FTUI_DB`` names it, so read commands
    refuse it until it does)."""
    from store import Store

    db = f"sqlite:///{root / 'ftui.db'}"
    Store(db).close()
    return Ftui(home=root, db=db)
