"""The run queue with real processes: ``ftui queue add`` starts a detached queue runner that outlives it (and
the hang-up of its terminal) and starts the queued runs one after another, never two at once on this CPU
machine (from the runs' recorded start and end times); ``ftui queue rm`` of the running entry is refused; a
runner killed meanwhile is started again by ``ftui recover``; ``ftui stop`` of the running entry's run stops it
and the runner starts the next, then exits with the queue empty. Bad input to ``ftui queue`` is one line, exit
2, nothing queued. (An entry that cannot start any more: tests/unit/test_store_queue.py.)

The runs are ``--script`` runs of the scripted rank (tests/support/scripted_rank.py), which trains nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from runner.service import plan_commit, queue
from runner.service.sweep import SweepItem
from runner.spec.status import DONE
from runner.watch import procs
from store import Store
from store import queue as entries_store
from tests.support import ROOT, Ftui, new_home, run_in_process
from tests.support.scripted_rank import SCRIPT

POLL_S = "0.2"
"""The queue runner's look at the store (``FTUI_QUEUE_POLL_S``): it wakes at once when a run it started ends."""


def wait_for(what: str, check: Callable[[], object], timeout: float = 240) -> None:
    """Until ``check()`` holds (a bound for a loaded machine, not a wait), else fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Ftui]:
    """A home whose queue runner looks every 0.2 s; this process sees it too (``FTUI_HOME``, ``FTUI_DB``).
    Whatever a failed test leaves (the runner, runs) is killed after."""
    ftui = new_home(tmp_path)
    for name, value in (("FTUI_HOME", str(ftui.home)), ("FTUI_DB", ftui.db), ("FTUI_QUEUE_POLL_S", POLL_S)):
        monkeypatch.setenv(name, value)
    yield ftui
    pid = queue.runner_pid(ftui.db)
    if pid is not None:
        os.kill(pid, signal.SIGKILL)
    for run in Store(ftui.db).list_runs():
        if run.run_dir:
            procs.kill_all(Path(run.run_dir), None)


def add_in_a_terminal_that_closes(ftui: Ftui, name: str, *script_args: str) -> int:
    """``ftui queue add`` in a session of its own, as a terminal starts it; once it has exited, its terminal
    hangs up (SIGHUP to what is left of its session's group). The add's pid (its session's id)."""
    add = subprocess.Popen([sys.executable, "-m", "tui.cli", "queue", "add", "--script", str(SCRIPT), "--name", name,
                            "--sample-interval", "0", "--", *script_args], env=ftui.env, cwd=ROOT,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    out, _ = add.communicate(timeout=120)
    assert add.returncode == 0, out
    assert f": {name} (" in out, out
    try:
        os.killpg(add.pid, signal.SIGHUP)
    except ProcessLookupError:
        pass  # nothing of the add's session is left to hang up: the runner is in a session of its own
    return add.pid


def test_queued_runs_run_one_after_another_unattended_and_a_stop_moves_the_queue_on(
        home: Ftui, capsys: pytest.CaptureFixture[str]) -> None:
    store = Store(home.db)
    add_pid = add_in_a_terminal_that_closes(home, "long", "--steps", "100000", "--step-s", "0.2")
    runner = queue.runner_pid(home.db)
    assert runner is not None and os.getsid(runner) != add_pid, "the runner left the add's session"
    short = run_in_process(capsys, "queue", "add", "--script", str(SCRIPT), "--name", "short", "--sample-interval",
                           "0", "--", "--steps", "3", "--step-s", "0.05")  # a process of its own saves nothing here
    assert short.returncode == 0 and "the queue runner of this host is alive" in short.stdout, short
    first, second = (e.id for e in entries_store.entries(store))

    def stepping() -> bool:
        entry = entries_store.get_entry(store, first)
        run = store.get_run(entry.run_id) if entry is not None and entry.run_id is not None else None
        return run is not None and bool(run.steps_done)

    wait_for("the first run's first step", stepping)
    long_run = entries_store.get_entry(store, first).run_id  # type: ignore[union-attr]
    listed = run_in_process(capsys, "queue")
    assert f"running (run {long_run})" in listed.stdout and "queued" in listed.stdout, listed.stdout
    assert f"queue runner of {os.uname().nodename}: pid {runner}" in listed.stdout
    refused = run_in_process(capsys, "queue", "rm", str(first))
    assert refused.returncode == 2 and refused.stderr == (
        f"ftui: queue entry {first}: running as run {long_run}; stop it with ftui stop {long_run} (the queue then "
        "starts the next), then remove it\n")
    assert entries_store.get_entry(store, second).status == "queued", "never two at once on the CPU"  # type: ignore[union-attr]

    os.kill(runner, signal.SIGKILL)  # the runner dies (the OOM killer, a reboot): the run goes on, the queue waits
    wait_for("the runner gone", lambda: gone(runner))
    recovered = home.run("recover", check=True)
    assert "queue: started this host's queue runner" in recovered.stdout, recovered.stdout
    runner = queue.runner_pid(home.db)
    assert runner is not None

    home.run("stop", str(long_run), check=True)
    wait_for("the runner to exit with the queue empty", lambda: gone(runner))  # type: ignore[arg-type]
    assert queue.runner_pid(home.db) is None
    assert [e.status for e in entries_store.entries(store)] == [DONE, DONE], "the runner recorded both ends"
    runs = {e.name: store.get_run(e.run_id) for e in entries_store.entries(store) if e.run_id is not None}
    assert runs["long"].status == "stopped" and runs["short"].status == "completed"  # type: ignore[union-attr]
    ended, started = runs["long"].ended_at, runs["short"].started_at  # type: ignore[union-attr]
    assert ended is not None and started is not None and started > ended, "one after the other"


@pytest.mark.parametrize(("argv", "line"), [
    (["queue", "add", "--script", str(SCRIPT), "--set", "train.batchsize=2"], "train.batchsize: unknown field"),
    (["queue", "add", "--script", str(SCRIPT), "--set", "launch.nnodes=2", "--strategy", "ddp", "--nproc", "2",
      "--set", "launch.main_addr=10.0.0.1", "--set", "launch.node_rank=0"],
     "launch.nnodes: a run over several machines is not queued"),
    (["queue", "rm", "7"], "queue entry 7: no such entry"),
    (["queue", "rm", "x"], "argument ID: expected a whole number"),
])
def test_bad_input_to_the_queue_is_one_line_and_queues_nothing(
        home: Ftui, capsys: pytest.CaptureFixture[str], argv: list[str], line: str) -> None:
    result = run_in_process(capsys, *argv)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1 and line in result.stderr, result
    assert entries_store.entries(Store(home.db)) == [] and queue.runner_pid(home.db) is None


def _committed(store: Store, home: Ftui, steps: int, start_runner: bool) -> plan_commit.Queued:
    """A plan's commit of a scripted run (``steps`` steps) through the queue, continuing a trial recorded by
    hand, as :func:`runner.service.plan_commit.enqueue_commit` queues one."""
    trial = store.create_run(name="trial", recipe_text="", recipe_hash="", strategy="single", nproc=1, method="-",
                             model="-", run_dir="", sweep_id="plan-x")
    store.update_run(trial, status="completed")  # ended: it holds no device
    start = plan_commit.Continuation(home.home / "checkpoints" / "step-00000004", trial, 4)
    item = SweepItem("single", 1, [], "", f"the winner of plan plan-x; {start.line}")
    text = f'name = "commit"\n[launch]\nscript = "{SCRIPT}"\nscript_args = ["--steps", "{steps}", "--step-s", "0.05"]\n'
    options = queue.QueueOptions(sample_interval_s=0, summary={"committed_by_plan": "plan-x", **start.summary()},
                                 resumed_from=trial)
    return plan_commit.Queued(item, start, queue.enqueue(text, store=store, options=options, start_runner=start_runner))


def test_a_plans_commit_starts_from_the_queue_records_the_trial_and_is_followed_to_its_end(home: Ftui) -> None:
    store = Store(home.db)
    queued = _committed(store, home, 3, start_runner=True)
    started: list[tuple[str, int]] = []
    events: list[dict[str, object]] = []
    bound = threading.Timer(240, (stop := threading.Event()).set)  # a bound for a loaded machine, not a wait
    bound.start()
    try:
        outcome = plan_commit.follow_commit(store, queued, on_start=lambda item, run_id: started.append((item.note,
                                                                                                      run_id)),
                                            on_event=events.append, stop=stop, poll_s=0.05)
    finally:
        bound.cancel()
    assert outcome.status == "completed" and outcome.run_id is not None, outcome
    assert started == [(queued.item.note, outcome.run_id)]
    assert [e["step"] for e in events if e["type"] == "step"] == [1, 2, 3]  # the journal, each event once
    assert events[-1]["type"] == "end"
    run = store.get_run(outcome.run_id)
    assert run is not None and run.resumed_from == queued.start.trial
    assert run.summary.committed_by_plan == "plan-x" and run.summary.continued_from_trial == queued.start.trial
    assert run.summary.resumed_from == {"run_id": queued.start.trial, "checkpoint": str(queued.start.checkpoint),
                                        "step": 4}


def test_a_commit_stopped_before_its_turn_leaves_the_queue(home: Ftui) -> None:
    store = Store(home.db)
    queued = _committed(store, home, 3, start_runner=False)  # no runner: it waits
    stop = threading.Event()
    stop.set()  # Ctrl-C while it waits
    outcome = plan_commit.follow_commit(store, queued, stop=stop, poll_s=0.05)
    assert outcome == plan_commit.Outcome(None, "stopped", f"taken out of the queue (entry {queued.entry.entry_id}) "
                                                           "before it started")
    assert entries_store.entries(store) == [] and len(store.list_runs()) == 1  # the trial alone
