"""Stopping runs: signals to ``ftui run``, ``ftui stop``, hung ranks, escalation (issue 10: defects 3, 4,
5, 12). Real ``ftui run`` subprocesses training quickstart on CPU; the processes of each run are checked
with psutil from the pids the ranks wrote (RUN/ranks/*.pid)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from runner.watch import procs
from store import Store
from tests.support import QUICKSTART, ROOT, Ftui
from tests.integration.test_recover import STARTS, record_orphan_run, stranger
from tui.cli import main

# Small steps so that a stop (which waits for the current step) is quick on a busy 2-core machine.
FAST = ["--set", "train.max_steps=5000", "--set", "data.context_length=32", "--set", "train.batch_size=2"]
DDP = ["--strategy", "ddp", "--nproc", "2"]


class Background:
    """``ftui run`` started in the background, and its run (found through ``ftui runs``)."""

    def __init__(self, ftui: Ftui, name: str, *flags: str) -> None:
        self.ftui = ftui
        self.name = name
        self.proc = subprocess.Popen([sys.executable, "-m", "tui.cli", "run", str(QUICKSTART), *FAST, *flags,
                                      "--name", name, "--sample-interval", "0"],
                                     env=ftui.env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        self.run_id: int | None = None
        self.run_dir: Path | None = None

    def wait_for_steps(self, ranks: int, timeout: float = 240) -> None:
        """Until the journal has a step and every rank has written its pid."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"ftui run ended early: {self.proc.communicate()[0][-3000:]}"
            if self.run_dir is None:
                run = next((r for r in self.ftui.runs() if r["name"] == self.name), None)
                if run is not None and run.get("run_dir"):
                    self.run_id, self.run_dir = run["id"], Path(run["run_dir"])
            if self.run_dir is not None and len(self.pids()) == ranks and '"type":"step"' in self.journal_text():
                return
            time.sleep(0.5)
        raise AssertionError(f"no step within {timeout} s")

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

    def finish(self, timeout: float = 180) -> tuple[int, str]:
        out, _ = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, out

    def show(self) -> dict[str, Any]:
        assert self.run_id is not None
        return self.ftui.show(self.run_id)


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
    from runner.watch.procs import find_processes

    assert find_processes(bg.run_dir) == {}


def test_stop_unknown_run_is_one_line_exit_2(ftui: Ftui) -> None:
    proc = ftui.run("stop", "99999")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "ftui: run 99999: no such run"
    assert proc.stdout == ""


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_sigterm_and_sighup_stop_ddp_like_ctrl_c(ftui: Ftui, sig: signal.Signals) -> None:
    """Defect 3 (and 4: the ranks live in sessions of their own, away from the launcher's group)."""
    bg = Background(ftui, f"stop-{sig.name}", *DDP, "--grace", "120")
    bg.wait_for_steps(ranks=2)
    bg.proc.send_signal(sig)
    code, out = bg.finish()
    assert code == 130, out[-3000:]
    run = bg.show()
    assert run["status"] == "stopped", run
    ends = [e for e in bg.journal() if e["type"] == "end"]
    assert ends and ends[-1]["status"] == "stopped", "the ranks did not finish their step and journal their end"
    assert "all processes exited within the grace period" in run["summary"]["stop"]
    assert_all_gone(bg)


@pytest.mark.slow
def test_ctrl_c_of_single_process_run_lets_the_rank_end(ftui: Ftui) -> None:
    """Defect 5: the grace period waits for the rank, not for the launcher (which exits at once)."""
    bg = Background(ftui, "stop-single-int", "--strategy", "single", "--grace", "120")
    bg.wait_for_steps(ranks=1)
    bg.proc.send_signal(signal.SIGINT)
    code, out = bg.finish()
    assert code == 130, out[-3000:]
    ends = [e for e in bg.journal() if e["type"] == "end"]
    assert ends and ends[-1]["status"] == "stopped", "the rank was killed before it journalled its end"
    run = bg.show()
    assert run["status"] == "stopped"
    assert run["summary"]["steps"] >= 1 and run["summary"]["final_loss"] is not None
    assert_all_gone(bg)


@pytest.mark.slow
def test_hung_rank_is_killed_after_the_grace_period(ftui: Ftui) -> None:
    """Defect 4: a rank stopped with SIGSTOP (a hang) and its partner stuck in the collective are both
    SIGKILLed after the grace period; the status is still recorded and ftui exits 130."""
    bg = Background(ftui, "stop-hung", *DDP, "--grace", "3")
    bg.wait_for_steps(ranks=2)
    os.kill(bg.pids()[1], signal.SIGSTOP)
    time.sleep(1.0)
    started = time.monotonic()
    bg.proc.send_signal(signal.SIGINT)
    code, out = bg.finish(timeout=120)
    assert code == 130, out[-3000:]
    assert time.monotonic() - started < 60
    run = bg.show()
    assert run["status"] == "stopped", run
    assert "SIGKILLed" in run["summary"]["stop"] and "no process of the run left" in run["summary"]["stop"]
    assert_all_gone(bg)


@pytest.mark.slow
def test_second_ctrl_c_kills_at_once_and_records_the_status(ftui: Ftui) -> None:
    """Defect 5: a second Ctrl-C cuts a long grace period short; the run is still recorded."""
    bg = Background(ftui, "stop-twice", *DDP, "--grace", "600")
    bg.wait_for_steps(ranks=2)
    os.kill(bg.pids()[0], signal.SIGSTOP)  # keeps the run from ending on its own within the grace period
    bg.proc.send_signal(signal.SIGINT)
    time.sleep(2.0)
    started = time.monotonic()
    bg.proc.send_signal(signal.SIGINT)
    code, out = bg.finish(timeout=120)
    assert code == 130, out[-3000:]
    assert time.monotonic() - started < 60
    assert bg.show()["status"] == "stopped"
    assert_all_gone(bg)


@pytest.mark.slow
def test_ftui_stop_from_another_process(ftui: Ftui) -> None:
    """``ftui stop ID`` asks the run's watcher (the ``ftui run`` process) and waits for the status."""
    bg = Background(ftui, "stop-cmd", *DDP, "--grace", "120")
    bg.wait_for_steps(ranks=2)
    assert bg.run_id is not None
    proc = ftui.run("stop", str(bg.run_id), "--grace", "120", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"run {bg.run_id}: stopped" in proc.stdout
    code, out = bg.finish()
    assert code == 130, out[-3000:]
    assert bg.show()["status"] == "stopped"
    assert_all_gone(bg)
    again = ftui.run("stop", str(bg.run_id))
    assert (again.returncode, again.stderr.strip()) == (2, f"ftui: run {bg.run_id}: not running (status stopped)")


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


@pytest.mark.slow
def test_ftui_stop_kill_without_a_watcher(ftui: Ftui) -> None:
    """The watcher is gone (SIGKILLed): ``ftui stop --kill`` finds the run's processes itself, kills
    them, checks, and records ``failed`` ("killed by user")."""
    bg = Background(ftui, "stop-orphan", *DDP)
    bg.wait_for_steps(ranks=2)
    bg.proc.kill()
    bg.finish()
    assert all(alive(p) for p in bg.pids().values()), "the ranks should outlive their watcher"
    assert bg.run_id is not None
    proc = ftui.run("stop", str(bg.run_id), "--kill", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run = bg.show()
    assert (run["status"], run["error"]) == ("failed", "killed by user")
    assert_all_gone(bg)


def test_one_machine_rendezvous_listens_on_loopback(ftui: Ftui) -> None:
    """Defect 12, through the dry run: the accelerate config and the environment name the loopback."""
    proc = ftui.run("run", str(QUICKSTART), *DDP, "--dry-run", "--format", "json", check=True)
    spec = json.loads(proc.stdout)
    assert spec["env"]["MASTER_ADDR"] == "127.0.0.1"
    assert spec["env"]["GLOO_SOCKET_IFNAME"] == "lo"
    import yaml

    config = yaml.safe_load(Path(spec["accelerate_config"]).read_text())
    assert (config["num_machines"], config["main_process_ip"]) == (1, "127.0.0.1")


@pytest.mark.slow
def test_a_live_ddp_run_listens_on_the_loopback_only(ftui: Ftui) -> None:
    """Defect 12 on a live run: every listening socket of every process of the run (torchrun's
    rendezvous store in the launcher, gloo in the ranks) is bound to 127.0.0.1."""
    from runner.watch.procs import find_processes

    bg = Background(ftui, "loopback", *DDP)
    bg.wait_for_steps(ranks=2)
    assert bg.run_dir is not None
    listening: list[tuple[int, str, int]] = []
    for pid in find_processes(bg.run_dir):
        try:
            listening += [(pid, c.laddr.ip, c.laddr.port) for c in psutil.Process(pid).net_connections()
                          if c.status == psutil.CONN_LISTEN]
        except psutil.NoSuchProcess:
            continue
    bg.proc.send_signal(signal.SIGINT)
    bg.finish()
    assert listening, "the run listens on no port at all?"
    assert {ip for _, ip, _ in listening} == {"127.0.0.1"}, listening


def test_host_facts_are_detected_once_per_command(monkeypatch: pytest.MonkeyPatch) -> None:
    """"Is this a CPU run?" was asked 3-4 times per ``ftui run``, each time starting NVML afresh."""
    from runner.hardware import hostfacts
    from runner.spec.recipe import parse_recipe
    from runner.watch.estimate import estimate_summary
    from runner.watch.host import cpu_threads, cuda_device_count
    from runner.watch.preflight import preflight

    calls: list[hostfacts.HostFacts] = []
    real = hostfacts.detect

    def counting() -> hostfacts.HostFacts:
        calls.append(real())
        return calls[-1]

    monkeypatch.setattr(hostfacts, "detect", counting)
    hostfacts.current.cache_clear()
    recipe = parse_recipe("")
    preflight(recipe)
    cpu_threads(recipe)
    cuda_device_count()
    estimate_summary(recipe)
    assert len(calls) == 1
    facts = calls[0]
    assert facts.has_cuda == (facts.visible_gpus > 0) and facts.cpu_cores >= 1
    hostfacts.current.cache_clear()
