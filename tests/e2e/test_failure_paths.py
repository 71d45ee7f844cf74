"""Each failure path once, end to end, with ftui's real trainer on CPU: a rank killed with SIGKILL, SIGTERM
and Ctrl-C of ``ftui run``, a hang, and the death of the watcher. Real ``ftui run`` subprocesses train
quickstart; each is stopped, killed or hung mid-run (a step journalled), so the run's length is bounded
by the test, not by ``max_steps``. The watcher's side of each signal (SIGHUP, a second Ctrl-C, ``ftui
stop``, a hung rank's grace) is tested with scripted ranks in ``tests/integration/test_stop_signals.py``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import psutil
import pytest

from runner.spec import events as ev
from runner.watch import journal, procs
from store import Store
from tests.support import QUICKSTART, ROOT, Ftui

# Small steps: a stop (which waits for the current step) is quick on a busy 2-core machine. The run is
# ended by the test long before max_steps.
FAST = ["--set", "train.max_steps=5000", "--set", "data.context_length=32", "--set", "train.batch_size=2"]
DDP = ["--strategy", "ddp", "--nproc", "2"]

T = TypeVar("T")


def wait_for(fn: Callable[[], T], timeout: float, what: str = "") -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


class Run:
    """``ftui run`` of quickstart in the background, and its run (read from the store)."""

    def __init__(self, ftui: Ftui, name: str, *flags: str) -> None:
        self.ftui = ftui
        self.name = name
        self.store = Store(ftui.db)
        self.proc = subprocess.Popen([sys.executable, "-m", "tui.cli", "run", str(QUICKSTART), *flags, "--name", name],
                                     env=ftui.env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        self.run_id = 0
        self.run_dir = Path()

    def wait_for_steps(self, ranks: int, steps: int = 1, timeout: float = 300) -> None:
        """Until the journal has ``steps`` steps and every rank has written its pid."""
        def stepping() -> bool:
            assert self.proc.poll() is None, f"ftui run ended early: {self.proc.communicate()[0][-3000:]}"
            if not self.run_id:
                run = next((r for r in self.store.list_runs() if r.name == self.name and r.run_dir), None)
                if run is None:
                    return False
                self.run_id, self.run_dir = run.id, Path(run.run_dir)
            return len(self.pids()) == ranks and self.steps() >= steps

        wait_for(stepping, timeout, f"{steps} step(s) of {self.name}")

    def pids(self) -> dict[int, int]:
        return ev.read_rank_pids(self.run_dir)

    def journal(self) -> list[dict[str, Any]]:
        return journal.read_jsonl(self.run_dir / ev.EVENTS_FILE)

    def steps(self) -> int:
        return sum(1 for e in self.journal() if e["type"] == "step")

    def watcher_events(self) -> list[str]:
        return [e["type"] for e in journal.read_jsonl(self.run_dir / journal.ORCHESTRATOR_FILE)]

    def finish(self, timeout: float = 180) -> tuple[int, str]:
        out, _ = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, out

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()
        if self.run_id:
            for pid in self.pids().values():  # a rank the test stopped (SIGSTOP) cannot take SIGKILL
                try:
                    psutil.Process(pid).resume()
                except psutil.Error:
                    pass
            procs.kill_all(self.run_dir, None)


@pytest.fixture
def start(ftui: Ftui) -> Iterator[Callable[..., Run]]:
    """``start(name, *flags)``; whatever is left of the runs is killed afterwards."""
    runs: list[Run] = []

    def _start(name: str, *flags: str) -> Run:
        runs.append(Run(ftui, name, *flags))
        return runs[-1]

    yield _start
    for run in runs:
        run.kill()


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def assert_all_gone(run: Run) -> None:
    pids = run.pids()
    assert pids, "the ranks wrote no pid files"
    assert not [pid for pid in pids.values() if alive(pid)], "rank processes still alive"
    assert procs.find_processes(run.run_dir) == {}


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    members = []
    for p in psutil.process_iter(["status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                members.append(p.pid)
        except OSError:
            continue
    return bool(members)


def listening(run_dir: Path) -> list[tuple[int, str, int]]:
    """Every listening socket of every process of the run."""
    found: list[tuple[int, str, int]] = []
    for pid in procs.find_processes(run_dir):
        try:
            found += [(pid, c.laddr.ip, c.laddr.port) for c in psutil.Process(pid).net_connections()
                      if c.status == psutil.CONN_LISTEN]
        except psutil.NoSuchProcess:
            continue
    return found


def test_kill_9_of_one_ddp_rank_is_recorded_with_its_signal_and_every_process_is_reaped(
        ftui: Ftui, start: Callable[..., Run]) -> None:
    """A rank SIGKILLed mid-run: the run is failed with the rank and its signal (read from the launcher's
    report, not the watcher's vanished-rank rule, which would stop the run itself), every process of the
    run is reaped, every metric up to the fault is kept, and nothing is printed as markup. While the run
    was live, every listening socket of it (torchrun's rendezvous store, gloo in the ranks) was bound to
    the loopback."""
    run = start("kill-rank", *DDP, *FAST)
    run.wait_for_steps(ranks=2, steps=2)
    sockets = listening(run.run_dir)
    victim = run.pids()[1]
    os.kill(victim, signal.SIGKILL)
    code, out = run.finish(timeout=120)
    assert code == 1, out
    assert sockets, "the run listens on no port at all?"
    assert {ip for _, ip, _ in sockets} == {"127.0.0.1"}, sockets
    assert "MarkupError" not in out and "Traceback" not in out, out
    final = run.store.get_run(run.run_id)
    assert final is not None and final.status == "failed"
    assert final.error == f"rank 1 (pid {victim}) was killed by SIGKILL", final.error
    assert f"rank 1 (pid {victim}) was killed by SIGKILL" in out
    assert "stop" not in run.watcher_events(), "the launcher's exit ended the run, not the 60 s rule"
    assert final.pgid is not None and not group_alive(final.pgid), "launcher and ranks reaped"
    steps = [e for e in run.journal() if e["type"] == "step"]
    assert len(ftui.show(run.run_id)["metrics"]) == len(steps) >= 2, "every metric up to the fault is kept"
    assert "killed by SIGKILL" in ftui.call("show", str(run.run_id)).stdout


def test_sigterm_of_ftui_run_lets_every_ddp_rank_finish_its_step_and_end(
        ftui: Ftui, start: Callable[..., Run]) -> None:
    run = start("stop-term", *DDP, *FAST, "--grace", "120", "--sample-interval", "0")
    run.wait_for_steps(ranks=2)
    run.proc.send_signal(signal.SIGTERM)
    code, out = run.finish()
    assert code == 130, out[-3000:]
    shown = ftui.show(run.run_id)
    assert shown["status"] == "stopped", shown
    ends = [e for e in run.journal() if e["type"] == "end"]
    assert ends and ends[-1]["status"] == "stopped", "the trainer did not finish its step and journal its end"
    assert "all processes exited within the grace period" in shown["summary"]["stop"]
    assert_all_gone(run)


def test_ctrl_c_of_a_single_process_run_lets_the_trainer_end(ftui: Ftui, start: Callable[..., Run]) -> None:
    run = start("stop-int", "--strategy", "single", *FAST, "--grace", "120", "--sample-interval", "0")
    run.wait_for_steps(ranks=1)
    run.proc.send_signal(signal.SIGINT)
    code, out = run.finish()
    assert code == 130, out[-3000:]
    ends = [e for e in run.journal() if e["type"] == "end"]
    assert ends and ends[-1]["status"] == "stopped", "the rank was killed before it journalled its end"
    shown = ftui.show(run.run_id)
    assert shown["status"] == "stopped"
    assert shown["summary"]["steps"] >= 1 and shown["summary"]["final_loss"] is not None
    assert_all_gone(run)


def test_a_hung_trainer_is_flagged_then_stopped_and_failed(start: Callable[..., Run]) -> None:
    """The trainer stopped (SIGSTOP: alive, idle, no step) is flagged after ``--hang-after`` and, still
    hung that long after, continued and stopped: failed with the hang as its reason, and where the trainer
    was (its stacks, asked for at the flag and written once the stop continued it)."""
    run = start("hang", "--strategy", "single", *FAST, "--hang-after", "3", "--sample-interval", "0.25")
    run.wait_for_steps(ranks=1)
    psutil.Process(run.pids()[0]).suspend()
    code, out = run.finish()
    assert code == 1, out[-3000:]
    final = run.store.get_run(run.run_id)
    assert final is not None and final.status == "failed"
    assert final.error is not None and final.error.startswith("hang: no progress for "), final.error
    # the trainer was stopped mid-step: its stacks, read once it was continued, say where in our code
    assert "; rank 0 in " in final.error and "(runner/" in final.error, final.error
    stacks = final.summary.stacks
    assert stacks is not None and stacks["ranks"]["0"], stacks
    assert "(most recent call first)" in (run.run_dir / "stacks" / "rank0.txt").read_text()
    events = run.watcher_events()
    assert events.index("hang") < events.index("hang_stop") < events.index("stop") < events.index("exit"), events
    assert "stacks" in events, events
    assert "hang suspected" in out
    assert_all_gone(run)


def test_ftui_run_sigkilled_during_ddp_is_recovered_and_completes(tmp_path: Path) -> None:
    """The watcher (``ftui run``) SIGKILLed while ddp x2 trains: the ranks go on, ``ftui recover``
    attaches a new watcher that follows them to ``completed``; journal and store agree; a second
    ``ftui recover`` changes nothing. The ranks are held (SIGSTOP) from the kill to the attach, so that
    they are still training when recover looks, however few steps the run has."""
    from tests.integration.test_recover import assert_store_equals_journal

    home = tmp_path / "home"
    env = {**os.environ, "FTUI_HOME": str(home), "FTUI_DB": f"sqlite:///{home / 'ftui.db'}", "PYTHONUNBUFFERED": "1"}
    steps = 6
    proc = subprocess.Popen([sys.executable, "-m", "tui.cli", "run", str(QUICKSTART), *DDP,
                             "--set", f"train.max_steps={steps}", "--set", "data.context_length=32",
                             "--set", "train.batch_size=2"],
                            env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        store = Store(env["FTUI_DB"])
        run = wait_for(lambda: next((r for r in store.list_runs() if r.run_dir), None), 120, "the run folder")
        run_dir = Path(run.run_dir)
        wait_for(lambda: len(ev.read_rank_pids(run_dir)) == 2 and any(
            e["type"] == "step" for e in journal.read_jsonl(run_dir / ev.EVENTS_FILE)), 300, "a step")
        ranks = [psutil.Process(pid) for pid in ev.read_rank_pids(run_dir).values()]
        for rank in ranks:
            rank.suspend()
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert all(alive(r.pid) for r in ranks), "the ranks go on without their watcher"
        assert store.get_run(run.id).status == "running"  # type: ignore[union-attr]

        def recover() -> str:
            result = subprocess.run([sys.executable, "-m", "tui.cli", "recover"], env=env, cwd=ROOT,
                                    capture_output=True, text=True, timeout=120)
            assert result.returncode == 0, result.stderr
            return result.stdout

        out = recover()
        assert f"run {run.id}: attached" in out, out
        for rank in ranks:
            rank.resume()
        wait_for(lambda: store.get_run(run.id).status != "running", 300, "the end")  # type: ignore[union-attr]
        assert store.get_run(run.id).status == "completed"  # type: ignore[union-attr]
        assert "nothing to recover" in recover()
        shown = json.loads(subprocess.run([sys.executable, "-m", "tui.cli", "show", str(run.id), "--format", "json"],
                                          env=env, cwd=ROOT, capture_output=True, text=True, check=True).stdout)
        journal_steps = [e for e in journal.read_jsonl(run_dir / ev.EVENTS_FILE) if e["type"] == "step"]
        assert [m["step"] for m in shown["metrics"]] == [e["step"] for e in journal_steps] == list(range(1, steps + 1))
        assert_store_equals_journal(store, run.id, run_dir)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
