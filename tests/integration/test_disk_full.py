"""A full disk under a watched run, made for real (a small tmpfs, filled by the test): training is never
ended by a write that failed, the run's status is true, and a full disk is named.

The rank is scripted (no model): it journals through ftui's own writer and reports its failure through the
trainer's own path (:func:`runner.rank.rank_log.run_reporting`), and waits for files from the test at the
points where the test fills or frees a disk."""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from runner.service.recover import recover_all
from runner.spec import events as ev
from runner.spec.recipe import load_recipe
from runner.watch import journal
from runner.watch.finish import Outcome
from runner.watch.follow import WatchOptions, execute
from runner.watch.prepare import Prepared, load_prepared, prepare
from store import Store
from tests.support import QUICKSTART, ROOT, run_in_process
from tests.support.disks import fill, small_filesystem
from tui.cli.exits import ExitCode
from tui.cli.run import follow

RANK = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from runner.rank.rank_log import redirect_output, run_reporting
    from runner.spec import events as ev

    run, steps, mode = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    redirect_output(ev.rank_log(run, 0))
    ev.rank_pid_file(run, 0).parent.mkdir(exist_ok=True)
    ev.rank_pid_file(run, 0).write_text(str(os.getpid()))

    def wait_for(name):
        while not (run / name).exists():
            time.sleep(0.02)

    def train(journal):
        journal.emit("start", distributed_type="NO", world_size=1, total_steps=steps)
        for step in range(1, steps + 1):
            pad = "x" * 5000 if step > 3 else ""  # more than a page: no slack of the file takes it
            journal.emit("step", step=step, loss=3.0 / step, step_time=0.01, tokens_per_s=100.0, pad=pad)
            if step == 3:
                (run / "at-3").touch()
                wait_for("go")
        if mode == "save":  # a checkpoint save on the full disk: the write the trainer cannot guard
            with open(run / "checkpoint.bin", "wb") as fh:
                while True:
                    fh.write(b"\\0" * 65536)
        journal.emit("end", status="completed", steps=steps, final_loss=3.0 / steps, ranks=[], pad="x" * 5000)
        return "completed"

    code = run_reporting(train, run, 0)
    sys.stdout.flush()
    os._exit(code)
    """
)
"""A scripted rank 0: ``STEPS`` steps; after step 3 it touches ``RUN/at-3`` and waits for ``RUN/go``. Mode
``save``: then it writes a checkpoint until the disk is full."""


def _prepared(store: Store, runs: Path, steps: int, mode: str = "train") -> Prepared:
    prepared = prepare(store, load_recipe(QUICKSTART), root=runs)
    (prepared.run_dir / ev.LAUNCH_FILE).write_text(json.dumps(
        {"argv": [sys.executable, "-c", RANK, str(prepared.run_dir), str(steps), mode],
         "env": {"PYTHONPATH": str(ROOT)}, "accelerate_config": None}))
    assert prepared.run_id is not None
    return load_prepared(prepared.run_id, prepared.run_dir)


def _options() -> WatchOptions:
    return WatchOptions(sample_interval_s=0.05, poll_s=0.05, fake_gpus=1)


def _in_thread(store: Store, prepared: Prepared) -> tuple[threading.Thread, list[Outcome]]:
    outcomes: list[Outcome] = []
    thread = threading.Thread(target=lambda: outcomes.append(execute(store, prepared, _options())), daemon=True)
    thread.start()
    return thread, outcomes


def _until(done: Callable[[], Any], thread: threading.Thread, timeout: float = 60) -> None:
    """Wait until ``done()`` holds (or the watch ended: the asserts after say what went wrong)."""
    deadline = time.monotonic() + timeout
    while not done() and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)


def test_a_database_whose_disk_is_full_for_the_whole_run_never_ends_it_and_recover_completes_the_record(
        tmp_path: Path) -> None:
    with small_filesystem(tmp_path / "db", "2m") as db_disk:
        store = Store(f"sqlite:///{db_disk / 'ftui.db'}")
        prepared = _prepared(store, tmp_path / "runs", steps=8)
        (prepared.run_dir / "go").touch()
        filler = fill(db_disk)
        outcome = execute(store, prepared, _options())
        assert (outcome.status, outcome.error) == ("completed", None)
        (note,) = outcome.notes
        assert f"no space left on tmpfs at {db_disk} ({db_disk / 'ftui.db'})" in note and "ftui recover" in note
        exits = [e for e in journal.read_jsonl(prepared.run_dir / journal.ORCHESTRATOR_FILE) if e["type"] == "exit"]
        assert [e["status"] for e in exits] == ["completed"], "the journal has the end"
        assert store.get_run(outcome.run_id).status != "completed"  # type: ignore[union-attr]
        filler.unlink()
        assert [(r.action, r.status) for r in recover_all(store)] == [("finished", "completed")]
        run = store.get_run(outcome.run_id)
        assert run is not None and run.status == "completed" and run.steps_done == 8 and run.total_steps == 8
        assert [m.step for m in store.metrics(outcome.run_id)] == list(range(1, 9))
        store.close()


def test_a_run_folder_whose_disk_fills_mid_run_keeps_training_and_its_telemetry(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'ftui.db'}")
    with small_filesystem(tmp_path / "runs", "2m") as runs:
        prepared = _prepared(store, runs, steps=8)
        thread, outcomes = _in_thread(store, prepared)
        _until(lambda: (prepared.run_dir / "at-3").exists(), thread)
        filler = fill(runs)
        full_at = time.time()
        # telemetry read while the disk is full reaches the store (the watcher lives on)
        _until(lambda: any(s.time > full_at + 0.2 for s in store.samples(prepared.run_id or 0)), thread)
        filler.unlink()
        (prepared.run_dir / "go").touch()
        thread.join(60)
        (outcome,) = outcomes
        assert (outcome.status, outcome.error) == ("completed", None)
        assert outcome.notes == [], "everything the full disk refused was written once it had room"
        assert [m.step for m in store.metrics(outcome.run_id)] == list(range(1, 9))
        devices, _ = journal.read_samples(prepared.run_dir)
        assert any(d.time > full_at + 0.2 for d in devices), "what the full disk refused was written after"
        assert len(devices) == len(store.samples(outcome.run_id))
    store.close()


def test_a_run_whose_journal_stays_full_to_its_end_fails_with_no_space_left_named(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'ftui.db'}")
    with small_filesystem(tmp_path / "runs", "2m") as runs:
        prepared = _prepared(store, runs, steps=5)
        thread, outcomes = _in_thread(store, prepared)
        _until(lambda: (prepared.run_dir / "at-3").exists(), thread)
        fill(runs)
        (prepared.run_dir / "go").touch()  # steps 4, 5 and the end: the disk takes none of them
        thread.join(60)
    (outcome,) = outcomes
    assert outcome.status == "failed" and outcome.exit_code == ev.EXIT_NO_SPACE
    assert outcome.error is not None and f"no space left on tmpfs at {runs} ({prepared.run_dir})" in outcome.error
    assert store.get_run(outcome.run_id).steps_done == 3  # type: ignore[union-attr]
    store.close()


def test_a_rank_that_fills_the_disk_in_a_save_fails_the_run_with_no_space_left_named(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'ftui.db'}")
    with small_filesystem(tmp_path / "runs", "2m") as runs:
        prepared = _prepared(store, runs, steps=5, mode="save")
        (prepared.run_dir / "go").touch()
        outcome = execute(store, prepared, _options())
    assert outcome.status == "failed" and outcome.exit_code == ev.EXIT_NO_SPACE
    assert outcome.error is not None and f"no space left on tmpfs at {runs} (" in outcome.error, outcome.error
    run = store.get_run(outcome.run_id)
    assert run is not None and run.status == "failed" and run.error == outcome.error and run.steps_done == 5
    store.close()



def test_ftui_run_on_a_database_that_fills_says_so_in_one_line_and_recover_completes_the_record(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with small_filesystem(tmp_path / "db", "2m") as db_disk:
        db = f"sqlite:///{db_disk / 'ftui.db'}"
        store = Store(db)
        prepared = _prepared(store, tmp_path / "runs", steps=3)
        (prepared.run_dir / "go").touch()
        filler = fill(db_disk)
        args = argparse.Namespace(sample_interval=0.05, hang_after=300.0, grace=5.0, fake_gpus=1, notify=False)
        code = follow(args, store, prepared, Console(width=100, color_system=None))  # what `ftui run` does next
        out = capsys.readouterr().out
        assert code == ExitCode.OK and "Traceback" not in out, out
        assert (f"warning: the store was not written (--db {db}: no space left on tmpfs at {db_disk} "
                f"({db_disk / 'ftui.db'})); the run folder's journals hold the run: `ftui recover` records it"
                in " ".join(out.split())), out
        filler.unlink()
        recovered = run_in_process(capsys, "recover", "--db", db)
        assert recovered.returncode == 0 and "finished -> completed" in recovered.stdout, recovered
        (run,) = store.list_runs()
        assert (run.status, run.steps_done) == ("completed", 3)
        store.close()
