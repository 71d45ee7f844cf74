"""Crash detection on scripted ranks: the launcher's report names the rank and its signal; run text that
looks like markup is printed as text; a watcher that fails while watching still records a true status; a
hang is warned about and then stopped; a database locked longer than the store's lock timeout loses
nothing; run folders are unique for ever and cannot leave the runs folder. (A real rank killed with
SIGKILL: ``tests/e2e/test_failure_paths.py``.)"""

from __future__ import annotations

import io
import json
import os
import sys
import textwrap
import threading
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
from runner.watch.journal import read_jsonl
from runner.watch.prepare import Prepared, prepare
from store import Store
from store.engine import StoreError
from tests.support import QUICKSTART, Ftui

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
    progress.on_event({"type": "hang", "since_progress_s": 12.0, "idle": ["rank:0"]})
    assert GLOO in buffer.getvalue()
    assert "hang suspected: no progress for 12 s" in buffer.getvalue()


def test_the_launcher_report_names_the_rank_and_the_signal(tmp_path: Path) -> None:
    (tmp_path / ev.LAUNCHER_LOG).write_text(LAUNCHER_REPORT)
    failures = crash.launcher_failures(tmp_path)
    assert failures[0] == crash.RankFailure(rank=1, exit_code=-9, pid=17065, root_cause=True)
    assert crash.describe(tmp_path, trainer_error=f"RuntimeError: {GLOO}") == "rank 1 (pid 17065) was killed by SIGKILL"


def test_a_sigkilled_rank_is_the_cause_even_when_its_peer_was_observed_first(tmp_path: Path) -> None:
    """The launcher polled rank 0 first: it had failed on the connection its SIGKILLed peer closed."""
    swapped = (LAUNCHER_REPORT.replace("rank      : 0 (local_rank: 0)", "rank      : @")
               .replace("rank      : 1 (local_rank: 1)", "rank      : 0 (local_rank: 0)")
               .replace("rank      : @", "rank      : 1 (local_rank: 1)")
               .replace("exitcode  : 1 (pid: 17064)", "exitcode  : @")
               .replace("exitcode  : -9 (pid: 17065)  (SIGKILL)", "exitcode  : 1 (pid: 17064)")
               .replace("exitcode  : @", "exitcode  : -9 (pid: 17065)  (SIGKILL)"))
    (tmp_path / ev.LAUNCHER_LOG).write_text(swapped)
    assert crash.launcher_failures(tmp_path)[0].rank == 0  # the root cause the launcher reported
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


def test_ftui_run_with_a_name_that_climbs_stays_in_its_folder(ftui: Ftui) -> None:
    result = ftui.call("run", str(QUICKSTART), "--name", "../../escape", "--dry-run", "--format", "json")
    assert result.returncode == 0, result.stderr
    argv = json.loads(result.stdout)["argv"]
    run_dir = Path(argv[argv.index("--run-dir") + 1])
    assert run_dir.parent.name.startswith("ftui-dry-run-") and run_dir.name.endswith("-escape"), run_dir
    assert not list((ftui.home / "runs").glob("*escape*")), "nothing in the runs folder"


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
    assert [e["type"] for e in orch] == ["launch", "energy_counter", "watcher_error", "stop", "energy_counter", "exit"]
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
    time.sleep(3600)  # alive, idle, no step: a hang that would last (the watcher's SIGTERM ends it)
    """
)


def test_a_hang_that_lasts_is_stopped_and_failed(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'ftui.db'}")
    prepared = _prepared(store, tmp_path, HUNG_RANK)
    options = WatchOptions(sample_interval_s=0.1, hang_after_s=1.0, hang_check_s=0.1, hang_stop_grace_s=5.0)
    outcome = execute(store, prepared, options)
    assert outcome.status == "failed"
    assert outcome.error is not None and outcome.error.startswith("hang: no progress for ")
    assert outcome.error.endswith(" s (no event from the trainer, every device idle)"), "no rank could be asked"
    types = [e.type for e in store.events(outcome.run_id) if e.source == "orchestrator"]
    assert types == ["launch", "energy_counter", "hang", "hang_stop", "stop", "energy_counter", "exit"]
    hang, stop = (store.events(outcome.run_id, kind)[0] for kind in ("hang", "stop"))
    assert hang.payload["since_progress_s"] >= 1.0
    assert stop.payload["graceful"], "SIGTERM ended the sleeper within the grace: nothing SIGKILLed"


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


def _steps(run_dir: Path) -> int:
    return sum(1 for e in read_jsonl(run_dir / ev.EVENTS_FILE) if e["type"] == "step")


def _wait_for(fn, timeout: float):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(0.05)
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
            for held, gate in ((10, "go1"), (60, "go2")):  # held until the test opens the gate
                while step == held and not os.path.exists(f"{run}/{gate}"):
                    time.sleep(0.02)
        emit(steps + 1, type="end", status="completed", steps=steps, final_loss=1.0, ranks=[])
    """
)
"""A fake rank: 70 steps and its end; after step 10 it waits for ``RUN/go1``, after step 60 for ``RUN/go2``."""


class FailingWrites(Store):
    """The store, noting each journal batch it could not write (the database locked past its timeout)."""

    def __init__(self, url: str, lock_timeout: float) -> None:
        super().__init__(url, lock_timeout=lock_timeout)
        self.failed = threading.Event()

    def ingest(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        try:
            return super().ingest(*args, **kwargs)
        except StoreError:
            self.failed.set()
            raise


def test_a_database_locked_longer_than_the_lock_timeout_loses_nothing_and_does_not_end_the_run(
        tmp_path: Path) -> None:
    """Another program holds the database's write lock while the rank writes steps 11 to 60, past the
    store's lock timeout (0.5 s here; ``FTUI_DB_LOCK_TIMEOUT``, 120 s by default): the watcher's writes
    fail meanwhile, and everything is written once the lock is gone."""
    import sqlite3

    store = FailingWrites(f"sqlite:///{tmp_path / 'ftui.db'}", lock_timeout=0.5)
    prepared = _prepared(store, tmp_path, FINISHING_RANK)
    held = threading.Event()
    seen_step_10 = threading.Event()
    problems: list[str] = []

    def seen(event: dict) -> None:
        if event["type"] == "step" and event["step"] == 10:
            seen_step_10.set()

    def lock_the_database() -> None:
        try:
            assert seen_step_10.wait(120), "the watcher did not read step 10"
            conn = sqlite3.connect(tmp_path / "ftui.db", timeout=60)
            conn.execute("BEGIN EXCLUSIVE")
            held.set()
            (tmp_path / "go1").touch()
            _wait_for(lambda: _steps(tmp_path) >= 60 and store.failed.is_set(), 120)
            conn.rollback()
            conn.close()
        except BaseException as exc:  # noqa: BLE001 (said by the test below)
            problems.append(repr(exc))
        finally:
            (tmp_path / "go1").touch()
            (tmp_path / "go2").touch()

    locker = threading.Thread(target=lock_the_database)
    locker.start()
    outcome = execute(store, prepared, WatchOptions(sample_interval_s=0.25), on_event=seen)
    locker.join()
    assert problems == [] and held.is_set() and store.failed.is_set()
    assert outcome.status == "completed", outcome.error
    assert [m.step for m in store.metrics(outcome.run_id)] == list(range(1, 71))
    journal_samples = sum(1 for line in (tmp_path / "samples.jsonl").read_text().splitlines() if '"k":"d"' in line)
    assert len(store.samples(outcome.run_id)) == journal_samples > 0
