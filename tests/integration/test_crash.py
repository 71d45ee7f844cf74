"""Crash detection (issue 10): a rank killed is named with its signal within 15 s and every process of
the run is reaped; run text that looks like markup is printed as text; a watcher that fails while
watching still records a true status; a hang is warned about and then stopped; run folders are
unique for ever and cannot leave the runs folder."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from rich.console import Console

from runner.spec import events as ev
from runner.spec.launch import LaunchSpec
from runner.spec.paths import RunFolderError, claim_run_folder, slug
from runner.spec.recipe import load_recipe, parse_recipe
from runner.watch import crash
from runner.watch.follow import WatchOptions, execute
from runner.watch.prepare import Prepared, prepare
from store import Store
from tests.support import QUICKSTART, ROOT, Ftui

# What torch elastic wrote to launcher.log when rank 1 of `ftui run ... --strategy ddp --nproc 2` was
# SIGKILLed on this machine (trimmed to the report).
LAUNCHER_REPORT = """\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
runner.rank.trainer FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-23_14:08:50
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 17064)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-23_14:08:49
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 17065)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 17065
============================================================
"""
GLOO = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
        "[127.0.0.1]:40543")


def test_a_gloo_message_with_brackets_is_printed_as_text() -> None:
    from tui.cli.progress import RunProgress

    buffer = io.StringIO()
    progress = RunProgress(Console(file=buffer, width=300, force_terminal=False))
    progress.on_event({"type": "error", "message": f"RuntimeError: {GLOO}"})
    progress.on_event({"type": "hang", "since_step_s": 12.0, "idle": ["rank:0"]})
    assert GLOO in buffer.getvalue()
    assert "hang suspected: no step for 12 s" in buffer.getvalue()


def test_the_launcher_report_names_the_rank_and_the_signal(tmp_path: Path) -> None:
    (tmp_path / ev.LAUNCHER_LOG).write_text(LAUNCHER_REPORT)
    failures = crash.launcher_failures(tmp_path)
    assert failures[0] == crash.RankFailure(rank=1, exit_code=-9, pid=17065, root_cause=True)
    assert crash.describe(tmp_path, trainer_error=f"RuntimeError: {GLOO}") == "rank 1 (pid 17065) was killed by SIGKILL"


def test_a_cuda_oom_in_the_rank_log_is_the_reason(tmp_path: Path) -> None:
    (tmp_path / ev.LAUNCHER_LOG).write_text(LAUNCHER_REPORT.replace("-9 (pid: 17065)  (SIGKILL)", "1 (pid: 17065)"))
    ev.rank_log(tmp_path, 1).parent.mkdir()
    ev.rank_log(tmp_path, 1).write_text("Traceback ...\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    assert crash.describe(tmp_path) == ("rank 1 (pid 17065) exited with code 1: out of GPU memory: "
                                        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")


@pytest.mark.parametrize("name", ["../../x", "/abs", "..", "a/../../b", ".", "~", " "])
def test_a_run_name_cannot_place_its_folder_outside_the_runs_folder(tmp_path: Path, name: str) -> None:
    root = tmp_path / "runs"
    folder = claim_run_folder(root, "20261123-000000-0000abcd", name)
    assert folder.parent == root.resolve() and folder.is_dir()
    assert "/" not in slug(name) and slug(name) not in ("", ".", "..")


def test_a_folder_that_holds_a_run_is_refused(tmp_path: Path) -> None:
    folder = claim_run_folder(tmp_path, "u1", "quickstart")
    (folder / "launch.json").write_text("{}")
    with pytest.raises(RunFolderError, match="already holds a run"):
        claim_run_folder(tmp_path, "u1", "quickstart")


def test_two_stores_sharing_a_data_folder_get_different_run_folders(tmp_path: Path) -> None:
    recipe = load_recipe(QUICKSTART)
    root = tmp_path / "runs"
    first = prepare(Store(f"sqlite:///{tmp_path / 'a.db'}"), recipe, root=root)
    second = prepare(Store(f"sqlite:///{tmp_path / 'b.db'}"), recipe, root=root)
    assert first.run_id == second.run_id == 1, "both stores number their first run 1"
    assert first.run_dir != second.run_dir
    for prepared in (first, second):
        assert prepared.run_dir.parent == root.resolve() and prepared.run_dir.name.endswith("-quickstart")


def test_ftui_run_with_a_name_that_climbs_stays_in_the_runs_folder(ftui: Ftui) -> None:
    result = ftui.run("run", str(QUICKSTART), "--name", "../../escape", "--dry-run", "--format", "json")
    assert result.returncode == 0, result.stderr
    argv = json.loads(result.stdout)["argv"]
    run_dir = Path(argv[argv.index("--run-dir") + 1])
    assert run_dir.parent == (ftui.home / "runs").resolve()


SLOW_RANK = textwrap.dedent(
    """
    import json, os, sys, time
    run = sys.argv[1]
    os.makedirs(f"{run}/ranks", exist_ok=True)
    open(f"{run}/ranks/0.pid", "w").write(str(os.getpid()))
    with open(f"{run}/events.jsonl", "a") as journal:
        journal.write(json.dumps({"seq": 0, "time": time.time(), "type": "start", "distributed_type": "NO",
                                  "world_size": 1, "total_steps": 100}) + "\\n")
        for step in range(1, 100):
            journal.write(json.dumps({"seq": step, "time": time.time(), "type": "step", "step": step,
                                      "loss": 2.0, "step_time": 0.1, "tokens_per_s": 10.0}) + "\\n")
            journal.flush()
            time.sleep(0.1)
    """
)


def _prepared(store: Store, tmp_path: Path, code: str) -> Prepared:
    recipe = parse_recipe("")
    run_id = store.create_run(name="child", recipe_text=recipe.to_toml(), recipe_hash=recipe.digest(),
                              strategy="single", nproc=1, method="lora", model="m", run_dir=str(tmp_path))
    spec = LaunchSpec(argv=[sys.executable, "-c", code, str(tmp_path)], env={}, accelerate_config=None)
    return Prepared(run_id=run_id, run_dir=tmp_path, spec=spec, recipe=recipe)


def test_a_watcher_that_fails_while_watching_reaps_the_run_and_records_why(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'ftui.db'}")
    prepared = _prepared(store, tmp_path, SLOW_RANK)

    def broken(event: dict) -> None:
        if event["type"] == "step" and event["step"] >= 3:
            raise RuntimeError("a progress bar fell over")

    outcome = execute(store, prepared, WatchOptions(sample_interval_s=0.25), on_event=broken)
    run = store.get_run(outcome.run_id)
    assert run is not None and run.status == "failed"
    assert run.error == "watcher error: RuntimeError: a progress bar fell over"
    assert run.pgid is not None and not _group_alive(run.pgid), "the launch's process group was reaped"
    journal = [json.loads(line) for line in (tmp_path / ev.EVENTS_FILE).read_text().splitlines()]
    stored = store.events(outcome.run_id)
    assert len([e for e in stored if e.source == "trainer"]) == len(journal), "nothing read was lost"
    orch = [json.loads(line) for line in (tmp_path / "orchestrator.jsonl").read_text().splitlines()]
    assert [e["type"] for e in orch] == ["launch", "watcher_error", "stop", "exit"]
    assert orch[-1]["status"] == "failed"


HUNG_RANK = textwrap.dedent(
    """
    import json, os, sys, time
    run = sys.argv[1]
    os.makedirs(f"{run}/ranks", exist_ok=True)
    open(f"{run}/ranks/0.pid", "w").write(str(os.getpid()))
    with open(f"{run}/events.jsonl", "a") as journal:
        for seq, event in enumerate([
            {"type": "start", "distributed_type": "NO", "world_size": 1, "total_steps": 100},
            {"type": "step", "step": 1, "loss": 2.0, "step_time": 0.1, "tokens_per_s": 10.0},
        ]):
            journal.write(json.dumps({"seq": seq, "time": time.time(), **event}) + "\\n")
            journal.flush()
    time.sleep(120)  # alive, idle, no step: a hang that would last
    """
)


@pytest.mark.slow
def test_a_hang_that_lasts_is_stopped_and_failed(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'ftui.db'}")
    prepared = _prepared(store, tmp_path, HUNG_RANK)
    started = time.monotonic()
    outcome = execute(store, prepared, WatchOptions(sample_interval_s=0.25, hang_after_s=2.0))
    took = time.monotonic() - started
    assert outcome.status == "failed"
    assert outcome.error is not None and outcome.error.startswith("hang: no step for ")
    assert outcome.error.endswith(" s, devices idle")
    assert took < 30, f"flagged at ~2 s, stopped ~2 s later, SIGTERM ends the sleeper: took {took:.0f} s"
    types = [e.type for e in store.events(outcome.run_id) if e.source == "orchestrator"]
    assert types == ["launch", "hang", "hang_stop", "stop", "exit"]


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return any(p.info["status"] != psutil.STATUS_ZOMBIE for p in psutil.process_iter(["status"])
               if _pgid(p.pid) == pgid)


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


@pytest.mark.slow
def test_kill_9_of_one_ddp_rank_is_recorded_with_its_signal_and_every_process_is_reaped(ftui: Ftui) -> None:
    """The user's report: ftui run died with a MarkupError and the run stayed 'running' for ever."""
    env = {**ftui.env}
    proc = subprocess.Popen([sys.executable, "-m", "tui.cli", "run", str(QUICKSTART), "--strategy", "ddp",
                             "--nproc", "2", "--set", "train.max_steps=400", "--name", "kill-rank"],
                            env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    store = Store(ftui.db)
    run = _wait_for(lambda: next((r for r in store.list_runs() if r.name == "kill-rank" and r.run_dir), None), 120)
    run_dir = Path(run.run_dir)
    _wait_for(lambda: len(ev.read_rank_pids(run_dir)) == 2 and _steps(run_dir) >= 2, 240)
    victim = ev.read_rank_pids(run_dir)[1]
    killed_at = time.time()
    os.kill(victim, signal.SIGKILL)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1, out
    assert "MarkupError" not in out and "Traceback" not in out, out
    final = store.get_run(run.id)
    assert final is not None and final.status == "failed"
    assert final.error == f"rank 1 (pid {victim}) was killed by SIGKILL", final.error
    assert f"rank 1 (pid {victim}) was killed by SIGKILL" in out
    exits = [e for e in store.events(run.id) if e.type == "exit"]
    assert exits and exits[0].time - killed_at < 15, "the reason is recorded within 15 s"
    assert final.pgid is not None and not _group_alive(final.pgid), "launcher and ranks reaped"
    steps = [json.loads(x) for x in (run_dir / ev.EVENTS_FILE).read_text().splitlines()]
    steps = [e for e in steps if e["type"] == "step"]
    metrics = ftui.show(run.id)["metrics"]
    assert len(metrics) == len(steps) >= 2, "every metric up to the fault is kept"
    shown = ftui.run("show", str(run.id))
    assert "killed by SIGKILL" in shown.stdout


def _steps(run_dir: Path) -> int:
    try:
        return sum(1 for line in (run_dir / ev.EVENTS_FILE).read_text().splitlines() if '"type":"step"' in line)
    except OSError:
        return 0


def _wait_for(fn, timeout: float):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout} s")


FINISHING_RANK = textwrap.dedent(
    """
    import json, os, sys, time
    run, steps = sys.argv[1], 70
    os.makedirs(f"{run}/ranks", exist_ok=True)
    open(f"{run}/ranks/0.pid", "w").write(str(os.getpid()))
    with open(f"{run}/events.jsonl", "a") as journal:
        def emit(seq, **event):
            journal.write(json.dumps({"seq": seq, "time": time.time(), **event}) + "\\n")
            journal.flush()
        emit(0, type="start", distributed_type="NO", world_size=1, total_steps=steps)
        for step in range(1, steps + 1):
            emit(step, type="step", step=step, loss=1.0, step_time=0.2, tokens_per_s=100.0)
            time.sleep(0.2)
        emit(steps + 1, type="end", status="completed", steps=steps, final_loss=1.0, ranks=[])
    """
)


@pytest.mark.slow
def test_a_database_locked_for_a_while_loses_nothing_and_does_not_end_the_run(tmp_path: Path) -> None:
    import sqlite3
    import threading

    store = Store(f"sqlite:///{tmp_path / 'ftui.db'}")
    prepared = _prepared(store, tmp_path, FINISHING_RANK)
    held = threading.Event()

    def lock_the_database() -> None:
        time.sleep(2.0)
        conn = sqlite3.connect(tmp_path / "ftui.db", timeout=30)
        conn.execute("BEGIN EXCLUSIVE")
        held.set()
        time.sleep(12.0)  # longer than the store's busy_timeout (10 s): its writes fail meanwhile
        conn.rollback()
        conn.close()

    locker = threading.Thread(target=lock_the_database)
    locker.start()
    outcome = execute(store, prepared, WatchOptions(sample_interval_s=0.25))
    locker.join()
    assert held.is_set()
    assert outcome.status == "completed", outcome.error
    assert [m.step for m in store.metrics(outcome.run_id)] == list(range(1, 71))
    journal_samples = sum(1 for line in (tmp_path / "samples.jsonl").read_text().splitlines() if '"k":"d"' in line)
    assert len(store.samples(outcome.run_id)) == journal_samples > 0
