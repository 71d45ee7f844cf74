"""Stopping runs, as the watcher does it: SIGTERM and SIGHUP to ``ftui run`` stop like Ctrl-C, a
single-process run's grace waits for its rank, a hung rank is SIGKILLed after the grace period, a second
Ctrl-C kills at once, ``ftui stop`` from another process (with or without a watcher alive), never a
stranger holding a number the run had, and a live run listens on the loopback only.

Each run is the real ``ftui run --script`` (the real watcher, ``accelerate launch`` and its ranks in
sessions of their own) of a scripted rank (:mod:`tests.support.scripted_rank`) that trains nothing; the
processes of each run are checked with psutil from the pids the ranks wrote (RUN/ranks/*.pid). What the
real trainer does on a stop is tested in ``tests/e2e/test_failure_paths.py``."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from runner.watch import journal, procs
from store import Store
from tests.integration.test_recover import STARTS, record_orphan_run, stranger
from tests.support import QUICKSTART, ROOT, Ftui, run_in_process
from tests.support.scripted_rank import SCRIPT
from tui.cli import main

DDP = ["--strategy", "ddp", "--nproc", "2"]
"""Two ranks under ``accelerate launch`` (torchrun's agent), in sessions of their own: for what is about ranks
apart from their launcher (each signalled, one hung, one suspended, ranks outliving their watcher)."""
SOLO = ["--strategy", "single"]
"""One rank, which is its launcher (runner/rank/solo_launch.py): for what is about the watcher and ``ftui stop``
(one interpreter and one torch import fewer than DDP's three processes)."""


class Background:
    """``ftui run --script scripted_rank.py`` started in the background, and its run (found through
    ``ftui runs``)."""

    def __init__(self, ftui: Ftui, name: str, *flags: str, script_args: tuple[str, ...] = ()) -> None:
        self.ftui = ftui
        self.name = name
        self.proc = subprocess.Popen([sys.executable, "-m", "tui.cli", "run", "--script", str(SCRIPT), *flags,
                                      "--name", name, "--sample-interval", "0",
                                      *(["--", *script_args] if script_args else [])],
                                     env=ftui.env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        self.store = Store(ftui.db)
        self.run_id: int | None = None
        self.run_dir: Path | None = None

    def wait_for_steps(self, ranks: int, timeout: float = 240) -> None:
        """Until the journal has a step and every rank has written its pid."""
        wait_for(lambda: self._stepping(ranks), timeout,
                 lambda: f"no step; ftui run: {self.output() if self.proc.poll() is not None else 'running'}")

    def _stepping(self, ranks: int) -> bool:
        assert self.proc.poll() is None, f"ftui run ended early: {self.output()}"
        if self.run_dir is None:
            run = next((r for r in self.store.list_runs() if r.name == self.name), None)
            if run is not None and run.run_dir:
                self.run_id, self.run_dir = run.id, Path(run.run_dir)
        return self.run_dir is not None and len(self.pids()) == ranks and '"type":"step"' in self.journal_text()

    def output(self) -> str:
        return self.proc.communicate()[0][-3000:]

    def pids(self) -> dict[int, int]:
        assert self.run_dir is not None
        folder = self.run_dir / "ranks"
        return {int(p.stem): int(p.read_text()) for p in folder.glob("*.pid")} if folder.is_dir() else {}

    def journal_text(self) -> str:
        assert self.run_dir is not None
        path = self.run_dir / "events.jsonl"
        return path.read_text() if path.exists() else ""

    def journal(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.journal_text().splitlines() if line.strip()]

    def watcher_events(self) -> list[str]:
        assert self.run_dir is not None
        return [e["type"] for e in journal.read_jsonl(self.run_dir / journal.ORCHESTRATOR_FILE)]

    def finish(self, timeout: float = 180) -> tuple[int, str]:
        out, _ = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, out

    def show(self) -> dict[str, Any]:
        assert self.run_id is not None
        return self.ftui.show(self.run_id)

    def kill(self) -> None:
        """Whatever the test left running: the watcher, then every process of the run."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()
        if self.run_dir is not None:
            procs.kill_all(self.run_dir, None)


@pytest.fixture
def background(ftui: Ftui):  # type: ignore[no-untyped-def]
    """Start runs with ``background(name, *flags)``; whatever is left of them is killed afterwards."""
    started: list[Background] = []

    def start(name: str, *flags: str, script_args: tuple[str, ...] = ()) -> Background:
        started.append(Background(ftui, name, *flags, script_args=script_args))
        return started[-1]

    yield start
    for bg in started:
        bg.kill()


def wait_for(fn, timeout: float, what=lambda: ""):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s {what()}")


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def assert_all_gone(bg: Background) -> None:
    pids = bg.pids()
    assert pids, "the ranks wrote no pid files"
    left = [pid for pid in pids.values() if alive(pid)]
    assert not left, f"rank processes still alive: {left}"
    assert bg.run_dir is not None
    assert procs.find_processes(bg.run_dir) == {}


def stop_journalled(bg: Background) -> None:
    ends = [e for e in bg.journal() if e["type"] == "end"]
    assert ends and ends[-1]["status"] == "stopped", "the rank did not finish its step and journal its end"


def test_stop_unknown_run_is_one_line_exit_2(ftui: Ftui, capsys: pytest.CaptureFixture[str]) -> None:
    """A refusal before anything starts, in process (its real process: tests/integration/test_bad_arguments.py)."""
    proc = run_in_process(capsys, "stop", "99999", "--db", ftui.db)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "ftui: run 99999: no such run"
    assert proc.stdout == ""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_sigterm_and_sighup_stop_ddp_like_ctrl_c(background, sig: signal.Signals) -> None:  # type: ignore[no-untyped-def]
    """The ranks live in sessions of their own, away from the launcher's group: the watcher signals them."""
    bg = background(f"stop-{sig.name}", *DDP, "--grace", "120")
    bg.wait_for_steps(ranks=2)
    bg.proc.send_signal(sig)
    code, out = bg.finish()
    assert code == 130, out[-3000:]
    run = bg.show()
    assert run["status"] == "stopped", run
    stop_journalled(bg)
    assert "all processes exited within the grace period" in run["summary"]["stop"]
    assert_all_gone(bg)


def test_ctrl_c_of_single_process_run_lets_the_rank_end(background) -> None:  # type: ignore[no-untyped-def]
    """The grace period waits for the rank, not for the launcher (which exits at once)."""
    bg = background("stop-single-int", "--strategy", "single", "--grace", "120")
    bg.wait_for_steps(ranks=1)
    bg.proc.send_signal(signal.SIGINT)
    code, out = bg.finish()
    assert code == 130, out[-3000:]
    stop_journalled(bg)
    run = bg.show()
    assert run["status"] == "stopped"
    assert run["summary"]["steps"] >= 1 and run["summary"]["final_loss"] is not None
    assert_all_gone(bg)


def test_hung_rank_is_killed_after_the_grace_period(background) -> None:  # type: ignore[no-untyped-def]
    """A rank stopped with SIGSTOP (a hang) cannot take its SIGTERM: it and whatever else is left are
    SIGKILLed after the grace period; the status is still recorded and ftui exits 130."""
    bg = background("stop-hung", *DDP, "--grace", "1")
    bg.wait_for_steps(ranks=2)
    hung = psutil.Process(bg.pids()[1])
    hung.suspend()
    wait_for(lambda: hung.status() == psutil.STATUS_STOPPED, 30)
    bg.proc.send_signal(signal.SIGINT)
    code, out = bg.finish()
    assert code == 130, out[-3000:]
    run = bg.show()
    assert run["status"] == "stopped", run
    assert "SIGKILLed" in run["summary"]["stop"], run["summary"]["stop"]
    assert f"pid {hung.pid} (rank 1)" in run["summary"]["stop"], run["summary"]["stop"]
    assert "no process of the run left" in run["summary"]["stop"]
    assert_all_gone(bg)


def test_second_ctrl_c_kills_at_once_and_records_the_status(background) -> None:  # type: ignore[no-untyped-def]
    """A second Ctrl-C cuts a long grace period short (600 s: the run could not end otherwise within
    ``finish``'s timeout); the run is recorded as what happened: killed before its ranks ended."""
    bg = background("stop-twice", *DDP, "--grace", "600")
    bg.wait_for_steps(ranks=2)
    psutil.Process(bg.pids()[0]).suspend()  # keeps the run from ending on its own within the grace period
    bg.proc.send_signal(signal.SIGINT)
    wait_for(lambda: "stop_requested" in bg.watcher_events(), 60)  # the first one was taken
    bg.proc.send_signal(signal.SIGINT)
    code, out = bg.finish(timeout=120)
    assert code == 130, out[-3000:]
    run = bg.show()
    assert (run["status"], run["error"]) == (
        "killed", "stopped, but SIGKILLed before the ranks ended (a second Ctrl-C cut the grace period short)"), run
    assert run["summary"]["ended"].endswith("; no checkpoint"), run["summary"]
    assert "SIGKILLed" in run["summary"]["stop"] and "no process of the run left" in run["summary"]["stop"]
    assert_all_gone(bg)


def test_ftui_stop_from_another_process(ftui: Ftui, background, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    """``ftui stop ID`` asks the run's watcher (the ``ftui run`` process) and waits for the status; a second
    one is refused (in process: a refusal starts nothing)."""
    bg = background("stop-cmd", *SOLO, "--grace", "120")
    bg.wait_for_steps(ranks=1)
    assert bg.run_id is not None
    proc = ftui.run("stop", str(bg.run_id), "--grace", "120", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"run {bg.run_id}: stopped" in proc.stdout
    code, out = bg.finish()
    assert code == 130, out[-3000:]
    assert bg.show()["status"] == "stopped"
    stop_journalled(bg)
    assert_all_gone(bg)
    again = run_in_process(capsys, "stop", str(bg.run_id), "--db", ftui.db)
    assert (again.returncode, again.stderr.strip()) == (2, f"ftui: run {bg.run_id}: not running (status stopped)")


def test_a_second_ftui_stop_waits_for_the_save_in_flight(ftui: Ftui, background, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A second ``ftui stop`` while the first one's ranks are saving (the dashboard's stop confirmed twice
    does the same) joins that stop: nothing is SIGKILLed, the ranks journal their end, and both commands
    say what the watcher recorded. The ranks' save lasts until the test releases it, after the second
    command has said what it decided."""
    release = tmp_path / "release"
    bg = background("stop-twice-cmd", *SOLO, "--grace", "120", script_args=("--save-until", str(release)))
    bg.wait_for_steps(ranks=1)
    assert bg.run_id is not None
    command = [sys.executable, "-m", "tui.cli", "stop", str(bg.run_id)]
    said = [tmp_path / "first.txt", tmp_path / "second.txt"]
    outs = [path.open("w") for path in said]
    first = subprocess.Popen(command, env=ftui.env, cwd=ROOT, stdout=outs[0], stderr=subprocess.STDOUT, text=True)
    second = None
    try:
        wait_for(lambda: release.with_name("release.saving").exists(), 60)  # the watcher took it: rank 0 saves
        second = subprocess.Popen(command, env=ftui.env, cwd=ROOT, stdout=outs[1], stderr=subprocess.STDOUT,
                                  text=True)
        wait_for(lambda: "waiting for it to record the end" in said[1].read_text() or second.poll() is not None, 60)
        release.touch()
        first.wait(timeout=300)
        second.wait(timeout=300)
    finally:
        for proc in (first, second):
            if proc is not None:
                proc.kill()
        for out in outs:
            out.close()
    out_first, out_second = (path.read_text() for path in said)
    for code, out in ((first.returncode, out_first), (second.returncode, out_second)):
        assert code == 0, out
        assert f"run {bg.run_id}: stopped" in out and "it recorded stopped" in " ".join(out.split()), out
    assert "already in flight with its watcher" in " ".join(out_second.split()), out_second
    code, out = bg.finish()
    assert code == 130, out[-3000:]
    stop_journalled(bg)
    run = bg.show()
    assert run["status"] == "stopped", run
    assert "all processes exited within the grace period" in run["summary"]["stop"], run["summary"]["stop"]
    assert run["summary"]["ended"].startswith("stopped at step ") and run["summary"]["ended"].endswith(
        "; no checkpoint"), run["summary"]
    assert_all_gone(bg)


def test_ftui_stop_continues_a_suspended_watcher(ftui: Ftui, background) -> None:  # type: ignore[no-untyped-def]
    """The watcher is suspended (SIGSTOP, Ctrl-Z in its terminal): ``ftui stop`` continues it, and the
    watcher itself stops the run and records it, rather than being waited for in vain."""
    bg = background("stop-suspended", *SOLO, "--grace", "120")
    bg.wait_for_steps(ranks=1)
    assert bg.run_id is not None
    watcher = psutil.Process(bg.proc.pid)
    watcher.suspend()
    wait_for(lambda: watcher.status() == psutil.STATUS_STOPPED, 30)
    proc = ftui.run("stop", str(bg.run_id), "--grace", "1", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    said = " ".join(proc.stdout.split())  # the console folds long lines
    assert "it was suspended (SIGSTOP or Ctrl-Z): continued with SIGCONT" in said, proc.stdout
    assert f"run {bg.run_id}: stopped" in said and "it recorded stopped" in said, proc.stdout
    code, out = bg.finish()
    assert code == 130, out[-3000:]
    stop_journalled(bg)
    assert_all_gone(bg)


def test_ftui_stop_kill_without_a_watcher(ftui: Ftui, background) -> None:  # type: ignore[no-untyped-def]
    """The watcher is gone (SIGKILLed): ``ftui stop --kill`` finds the run's processes itself, kills
    them, checks, and records ``killed`` ("killed by user")."""
    bg = background("stop-orphan", *DDP)
    bg.wait_for_steps(ranks=2)
    bg.proc.kill()
    bg.finish()
    assert all(alive(p) for p in bg.pids().values()), "the ranks should outlive their watcher"
    assert bg.run_id is not None
    proc = ftui.run("stop", str(bg.run_id), "--kill", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run = bg.show()
    assert (run["status"], run["error"]) == ("killed", "killed by user")
    assert_all_gone(bg)


@pytest.mark.parametrize("kill", [False, True], ids=["stop", "kill"])
@pytest.mark.parametrize("recorded", list(STARTS.values()), ids=list(STARTS))
def test_ftui_stop_never_signals_a_stranger_in_the_launchers_group_id(
        tmp_path: Path, recorded: float | None, kill: bool, capsys: pytest.CaptureFixture[str]) -> None:
    """Watcher and launcher of a run died unrecorded and the launcher's pid now leads another program's
    group: ``ftui stop`` signals nothing of it, says that no process of the run was found, and settles the
    run from its journal."""
    db = f"sqlite:///{tmp_path / 'ftui.db'}"
    with stranger() as other:
        started = None if recorded is None else psutil.Process(other.pid).create_time() + recorded
        run_id, _ = record_orphan_run(Store(db), tmp_path / "runs", other.pid, started)
        code = main(["stop", str(run_id), "--db", db, "--grace", "5", *(["--kill"] if kill else [])])
        out = capsys.readouterr().out
        assert other.poll() is None, "the stranger was not signalled"
    assert code == 0, out
    assert f"run {run_id}: failed" in out and "no process of the run" in out, out
    run = Store(db).get_run(run_id)
    assert run is not None and run.status == "failed"
    assert run.error is not None and run.error.startswith("watcher and ranks gone; last step 3"), run.error


def test_ftui_stop_finds_the_launcher_of_a_row_without_a_start_time_by_its_environment(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A run recorded with its process group but no start time for its launcher: the launcher still
    proves itself the run's by the run folder in its environment, and is stopped."""
    db = f"sqlite:///{tmp_path / 'ftui.db'}"
    run_id, run_dir = record_orphan_run(Store(db), tmp_path / "runs", 0, None)
    launcher = procs.spawn(["sleep", "900"], {}, run_dir, run_dir / "launcher.log", run_dir=run_dir)
    try:
        Store(db).update_run(run_id, pgid=launcher.pid)
        code = main(["stop", str(run_id), "--db", db, "--grace", "5"])
        out = capsys.readouterr().out
        assert code == 0, out
        assert launcher.wait(timeout=30) == -signal.SIGTERM
        assert f"run {run_id}: stopped" in out, out
    finally:
        launcher.kill()
        launcher.wait()


def test_one_machine_rendezvous_listens_on_loopback(ftui: Ftui) -> None:
    """Through the dry run (in process): the accelerate config and the environment name the loopback."""
    proc = ftui.call("run", str(QUICKSTART), *DDP, "--dry-run", "--format", "json", check=True)
    spec = json.loads(proc.stdout)
    assert spec["env"]["MASTER_ADDR"] == "127.0.0.1"
    assert spec["env"]["GLOO_SOCKET_IFNAME"] == "lo"
    import yaml

    config = yaml.safe_load(Path(spec["accelerate_config"]).read_text())
    assert (config["num_machines"], config["main_process_ip"]) == (1, "127.0.0.1")
