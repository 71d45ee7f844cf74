"""Recovery: when the process watching a run dies (SIGKILL of ``ftui run`` or of the TUI's background
orchestrator), the ranks go on; ``ftui recover`` (also run as every ``ftui`` starts) re-attaches a
watcher while they train, or sets the true status once they are gone, and the store ends up with
exactly the rows of the run folder's journals: no duplicate, none missing, twice.

The ranks here are scripted: a fake rank that holds at a step until the test lets it go on (so that it
is still training when recover looks, without a race against its pace), and ``ftui run --script`` of
:mod:`tests.support.scripted_rank`. Recovery of ftui's real trainer is in ``tests/e2e/test_failure_paths.py``."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from runner.service.recover import recover_all
from runner.spec import events as ev
from runner.spec.recipe import load_recipe
from runner.watch import journal
from runner.watch.detached import start_detached
from runner.watch.prepare import load_prepared, prepare
from runner.watch.stream import Recorder
from store import Store
from tests.support import QUICKSTART, ROOT, Ftui, run_in_process

FAKE_RANK = textwrap.dedent(
    """
    import json, os, sys, time
    run, steps, hold = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    os.makedirs(f"{run}/ranks", exist_ok=True)
    open(f"{run}/ranks/0.pid", "w").write(str(os.getpid()))
    with open(f"{run}/events.jsonl", "a") as journal:
        def emit(seq, **event):
            journal.write(json.dumps({"seq": seq, "time": time.time(), **event}) + "\\n")
            journal.flush()
        emit(0, type="start", distributed_type="NO", world_size=1, total_steps=steps)
        for step in range(1, steps + 1):
            emit(step, type="step", step=step, loss=3.0 / step, step_time=0.2, tokens_per_s=100.0)
            while step == hold and not os.path.exists(f"{run}/go"):  # held until the test says go
                time.sleep(0.05)
        emit(steps + 1, type="end", status="completed", steps=steps, final_loss=3.0 / steps, ranks=[])
    """
)
"""A fake rank 0: ``STEPS`` steps and an end event; after step ``HOLD`` it waits for ``RUN/go``."""


def go(run_dir: Path) -> None:
    """Let the fake rank go on past its held step."""
    (run_dir / "go").touch()


def _detached_fake_run(tmp_path: Path, steps: int, hold: int) -> tuple[Store, int, Path, subprocess.Popen[bytes]]:
    """A run prepared for real whose launch is a fake rank, followed by a detached watcher (the TUI's way)."""
    db = f"sqlite:///{tmp_path / 'ftui.db'}"
    store = Store(db)
    prepared = prepare(store, load_recipe(QUICKSTART), root=tmp_path / "runs")
    (prepared.run_dir / ev.LAUNCH_FILE).write_text(json.dumps(
        {"argv": [sys.executable, "-c", FAKE_RANK, str(prepared.run_dir), str(steps), str(hold)], "env": {},
         "accelerate_config": None}))
    watcher = start_detached(db, load_prepared(prepared.run_id or 0, prepared.run_dir))
    assert prepared.run_id is not None
    return store, prepared.run_id, prepared.run_dir, watcher


def _kill_watcher_after(watcher: subprocess.Popen[bytes], run_dir: Path, steps: int) -> int:
    _wait_for(lambda: _journal_steps(run_dir) >= steps, 60)
    os.kill(watcher.pid, signal.SIGKILL)
    watcher.wait()
    return ev.read_rank_pids(run_dir)[0]


def assert_store_equals_journal(store: Store, run_id: int, run_dir: Path) -> None:
    trainer = journal.read_jsonl(run_dir / ev.EVENTS_FILE)
    orch = journal.read_jsonl(run_dir / journal.ORCHESTRATOR_FILE)
    rows = store.events(run_id)
    assert sorted(e.seq for e in rows if e.source == "trainer") == [e["seq"] for e in trainer]
    assert sorted(e.seq for e in rows if e.source == "orchestrator") == [e["seq"] for e in orch]
    assert [m.step for m in store.metrics(run_id)] == [e["step"] for e in trainer if e["type"] == "step"]
    devices, procs = journal.read_samples(run_dir)
    stored = store.samples(run_id)
    assert len(stored) == len(devices)
    assert len(store.process_samples(run_id)) == len(procs)
    assert len({(s.time, s.kind, s.index) for s in stored}) == len(stored), "no duplicate sample"


def test_a_run_whose_watcher_was_killed_gets_a_new_watcher_and_completes(tmp_path: Path) -> None:
    store, run_id, run_dir, watcher = _detached_fake_run(tmp_path, steps=40, hold=5)
    _kill_watcher_after(watcher, run_dir, 5)
    first = recover_all(store)
    assert [(r.run_id, r.action) for r in first] == [(run_id, "attached")], first
    assert [r.action for r in recover_all(store)] == [], "the new watcher holds the lock: nothing to do"
    go(run_dir)
    _wait_for(lambda: store.get_run(run_id).status != "running", 60)  # type: ignore[union-attr]
    run = store.get_run(run_id)
    assert run is not None and run.status == "completed", run.error
    assert run.steps_done == 40
    assert_store_equals_journal(store, run_id, run_dir)
    assert store.samples(run_id), "telemetry went on under the new watcher"
    types = [e["type"] for e in journal.read_jsonl(run_dir / journal.ORCHESTRATOR_FILE)]
    assert types[0] == "launch" and "attach" in types and types[-1] == "exit"


def test_a_run_whose_watcher_died_and_that_then_finished_is_completed_once(tmp_path: Path) -> None:
    store, run_id, run_dir, watcher = _detached_fake_run(tmp_path, steps=15, hold=3)
    rank = _kill_watcher_after(watcher, run_dir, 3)
    go(run_dir)
    _wait_for(lambda: not _alive(rank), 60)
    assert store.get_run(run_id).status == "running"  # type: ignore[union-attr]
    done = recover_all(store)
    assert [(r.action, r.status) for r in done] == [("finished", "completed")]
    assert_store_equals_journal(store, run_id, run_dir)
    before = (len(store.events(run_id)), len(store.metrics(run_id)), len(store.samples(run_id)))
    assert recover_all(store) == []
    from runner.service.recover import recover_run

    recover_run(store, store.get_run(run_id))  # forced once more on a finished run: still no duplicate
    assert (len(store.events(run_id)), len(store.metrics(run_id)), len(store.samples(run_id))) == before


def test_a_run_whose_watcher_and_ranks_died_is_failed_with_its_last_step(tmp_path: Path) -> None:
    store, run_id, run_dir, watcher = _detached_fake_run(tmp_path, steps=200, hold=4)
    rank = _kill_watcher_after(watcher, run_dir, 4)
    os.kill(rank, signal.SIGKILL)
    _wait_for(lambda: not _alive(rank), 30)
    done = recover_all(store)
    assert [(r.action, r.status) for r in done] == [("finished", "failed")]
    run = store.get_run(run_id)
    assert run is not None and run.error is not None
    last = max(e["step"] for e in journal.read_jsonl(run_dir / ev.EVENTS_FILE) if e["type"] == "step")
    assert run.error.startswith(f"watcher and ranks gone; last step {last}")
    assert_store_equals_journal(store, run_id, run_dir)


def test_a_read_shows_the_true_status_of_a_run_whose_processes_are_gone_without_recover(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``ftui runs`` and ``ftui show`` settle a run left ``running`` by a dead watcher and dead ranks
    before they print it: no read shows a run running whose processes are gone."""
    store, run_id, run_dir, watcher = _detached_fake_run(tmp_path, steps=200, hold=4)
    rank = _kill_watcher_after(watcher, run_dir, 4)
    assert store.get_run(run_id).status == "running"  # type: ignore[union-attr]
    db = ["--db", store.url]
    alive = run_in_process(capsys, "runs", "--format", "json", *db)
    assert [r["status"] for r in json.loads(alive.stdout)] == ["running"], "its rank still lives: running is true"
    os.kill(rank, signal.SIGKILL)
    _wait_for(lambda: not _alive(rank), 30)
    listed = run_in_process(capsys, "runs", "--format", "json", *db)
    assert listed.returncode == 0 and [r["status"] for r in json.loads(listed.stdout)] == ["failed"], listed
    shown = json.loads(run_in_process(capsys, "show", str(run_id), "--format", "json", *db).stdout)
    assert shown["status"] == "failed" and shown["error"].startswith("watcher and ranks gone; last step ")
    assert_store_equals_journal(store, run_id, run_dir)


def test_recover_on_the_command_line_says_what_it_did(ftui: Ftui) -> None:
    Store(ftui.db)  # ftui recover reads an existing database (a missing --db is refused, exit 2)
    result = ftui.run("recover")
    assert result.returncode == 0 and result.stderr == ""
    assert "nothing to recover" in result.stdout or "run " in result.stdout


def test_ftui_run_sigkilled_whose_ranks_then_finished_is_completed_by_recover(tmp_path: Path) -> None:
    """``ftui run`` (ddp x2 of a scripted rank) SIGKILLed after a few steps; the ranks go on and finish;
    ``ftui recover`` then settles the run from its journal: completed, journal and store agree, and a
    second ``ftui recover`` changes nothing."""
    from tests.support.scripted_rank import SCRIPT

    home = tmp_path / "home"
    env = {**os.environ, "FTUI_HOME": str(home), "FTUI_DB": f"sqlite:///{home / 'ftui.db'}", "PYTHONUNBUFFERED": "1"}
    steps = 8
    proc = subprocess.Popen([sys.executable, "-m", "tui.cli", "run", "--script", str(SCRIPT), "--strategy", "ddp",
                             "--nproc", "2", "--", "--steps", str(steps), "--step-s", "0.1"],
                            env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        store = Store(env["FTUI_DB"])
        run = _wait_for(lambda: next((r for r in store.list_runs() if r.run_dir), None), 120)  # folder claimed
        run_dir = Path(run.run_dir)
        _wait_for(lambda: _journal_steps(run_dir) >= 2 and len(ev.read_rank_pids(run_dir)) == 2, 120)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        pids = ev.read_rank_pids(run_dir)
        assert store.get_run(run.id).status == "running"  # type: ignore[union-attr]
        _wait_for(lambda: not any(_alive(p) for p in pids.values()), 120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert _journal_steps(run_dir) == steps, "the ranks went on without their watcher"

    def recover() -> str:
        result = subprocess.run([sys.executable, "-m", "tui.cli", "recover"], env=env, cwd=ROOT,
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        return result.stdout

    out = recover()
    assert f"run {run.id}: finished" in out, out
    assert store.get_run(run.id).status == "completed"  # type: ignore[union-attr]
    assert "nothing to recover" in recover()
    journal_steps = [e for e in journal.read_jsonl(run_dir / ev.EVENTS_FILE) if e["type"] == "step"]
    assert [m.step for m in store.metrics(run.id)] == [e["step"] for e in journal_steps] == list(range(1, steps + 1))
    assert_store_equals_journal(store, run.id, run_dir)


@contextmanager
def stranger() -> Iterator[subprocess.Popen[bytes]]:
    """A program that is no run's, leading a process group of its own (``setsid sleep``): what a pid
    of a dead run's launcher may be given to after a reboot or a kill -9 of watcher and ranks."""
    proc = subprocess.Popen(["sleep", "900"], start_new_session=True)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def record_orphan_run(store: Store, root: Path, pgid: int, started: float | None) -> tuple[int, Path]:
    """A run recorded ``running`` whose watcher and launcher are gone, its launcher having been process
    group ``pgid`` (started at ``started``; None: a row that recorded no start time). Its journal has the
    launch and three steps; no watcher is alive."""
    prepared = prepare(store, load_recipe(QUICKSTART), root=root)
    assert prepared.run_id is not None
    with open(prepared.run_dir / ev.EVENTS_FILE, "a") as events:
        events.write(json.dumps({"seq": 0, "time": time.time(), "type": "start", "distributed_type": "NO",
                                 "world_size": 1, "total_steps": 100}) + "\n")
        for step in range(1, 4):
            events.write(json.dumps({"seq": step, "time": time.time(), "type": "step", "step": step, "loss": 1.0,
                                     "step_time": 0.1, "tokens_per_s": 10.0}) + "\n")
    recorder = Recorder(store, prepared.run_id, prepared.run_dir)
    launch = {"pgid_started": started} if started is not None else {}
    recorder.emit("launch", argv=["accelerate", "launch"], pgid=pgid, watcher_pid=0, **launch)
    recorder.close()
    columns = {"pgid_started": started} if started is not None else {}
    store.update_run(prepared.run_id, status="running", pgid=pgid, watcher_host=socket.gethostname(),
                     summary={"orchestrator_pid": None, "orchestrator_host": socket.gethostname()}, **columns)
    return prepared.run_id, prepared.run_dir


STARTS = {"no-start-time": None, "another-start-time": -3600.0}
"""How the dead launcher was recorded: without a start time, or with one an hour before the stranger's."""


@pytest.mark.parametrize("recorded", list(STARTS.values()), ids=list(STARTS))
def test_recover_never_takes_a_stranger_in_the_launchers_group_id_for_the_run(
        tmp_path: Path, recorded: float | None) -> None:
    """The run's launcher died unrecorded and its pid now leads another program's group: recover does not
    attach a watcher to that program, and settles the run as its processes being gone."""
    store = Store(f"sqlite:///{tmp_path / 'ftui.db'}")
    with stranger() as other:
        started = None if recorded is None else psutil.Process(other.pid).create_time() + recorded
        run_id, run_dir = record_orphan_run(store, tmp_path / "runs", other.pid, started)
        done = recover_all(store)
        assert other.poll() is None, "the stranger was not signalled"
    assert [(r.run_id, r.action, r.status) for r in done] == [(run_id, "finished", "failed")], done
    run = store.get_run(run_id)
    assert run is not None and run.status == "failed"
    assert run.error is not None and run.error.startswith("watcher and ranks gone; last step 3"), run.error
    assert "attach" not in [e["type"] for e in journal.read_jsonl(run_dir / journal.ORCHESTRATOR_FILE)]


def _journal_steps(run_dir: Path) -> int:
    return sum(1 for e in journal.read_jsonl(run_dir / ev.EVENTS_FILE) if e["type"] == "step")


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _wait_for(fn, timeout: float):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout} s")
