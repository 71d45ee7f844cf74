"""How a stop ends, decided in one place: a repeated graceful request joins the stop in flight, and the
recorded status says what happened (``stopped`` with the checkpoint a resume takes, or none; ``killed``),
and a one-process rank killed by a signal is named with it. The watcher's own rules, on a real store
and a real run folder; the stops of real processes are in ``tests/integration/test_stop_signals.py``."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from runner.spec import checkpoint as ckpt
from runner.spec import events as ev
from runner.spec.recipe import load_recipe
from runner.watch.finish import Ending, finish
from runner.watch.prepare import prepare
from runner.watch.procs import StopRequest
from runner.watch.stream import RunStream
from store import Store
from tests.support import QUICKSTART


def test_a_repeated_graceful_request_joins_the_stop_in_flight() -> None:
    """A second ``ftui stop`` (SIGTERM), a scheduler's SIGTERM after ours, SIGHUP: the grace stays."""
    request = StopRequest()
    request.request()
    request.request()
    assert request.is_set() and not request.now.is_set() and not request.kill


def test_a_second_ctrl_c_or_a_kill_escalates() -> None:
    ctrl_c = StopRequest()
    ctrl_c.request(again_escalates=True)
    assert not ctrl_c.now.is_set(), "the first Ctrl-C is a graceful stop"
    ctrl_c.request(again_escalates=True)
    assert ctrl_c.now.is_set() and not ctrl_c.kill
    kill = StopRequest()
    kill.request()
    kill.request(kill=True)
    assert kill.now.is_set() and kill.kill


def _run(tmp_path: Path, steps: int, end: str | None) -> tuple[Store, RunStream]:
    """A recorded run whose journal has ``steps`` steps and, when ``end`` is given, the trainer's end."""
    store = Store(f"sqlite:///{tmp_path / 'ftui.db'}")
    prepared = prepare(store, load_recipe(QUICKSTART), root=tmp_path / "runs")
    records: list[dict[str, object]] = [{"type": "start", "distributed_type": "NO", "world_size": 1,
                                         "total_steps": 100}]
    records += [{"type": "step", "step": s, "loss": 1.0, "step_time": 0.1, "tokens_per_s": 10.0}
                for s in range(1, steps + 1)]
    if end is not None:
        records.append({"type": "end", "status": end, "steps": steps, "train_seconds": 1.0, "tokens": 64,
                        "tokens_per_s": 10.0, "final_loss": 1.0, "saved": None, "ranks": [], "skipped": 0,
                        "checkpoint": None})
    with open(prepared.run_dir / ev.EVENTS_FILE, "w") as journal:
        for seq, record in enumerate(records):
            journal.write(json.dumps({"seq": seq, "time": time.time(), **record}) + "\n")
    stream = RunStream(store, prepared, None)
    stream.poll()
    return store, stream


def _checkpoint(run_dir: Path, step: int, complete: bool) -> Path:
    folder = ckpt.checkpoint_dir(run_dir, step)
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"x" * 16)
    ckpt.write_manifest(folder, {"complete": complete, "step": step, "files": ckpt.file_sizes(folder)})
    return folder


def test_a_graceful_stop_the_ranks_finished_is_stopped_with_the_checkpoint_a_resume_takes(tmp_path: Path) -> None:
    store, stream = _run(tmp_path, steps=3, end="stopped")
    saved = _checkpoint(stream.prepared.run_dir, 2, complete=True)
    _checkpoint(stream.prepared.run_dir, 3, complete=False)  # a save cut off: not one to resume from
    outcome = finish(store, stream, Ending(0, stopped_by_user=True))
    run = store.get_run(outcome.run_id)
    assert run is not None and (run.status, run.error) == ("stopped", None)
    assert run.summary.ended == f"stopped at step 3; checkpoint at step 2: {saved}"


def test_a_graceful_stop_without_a_checkpoint_says_so(tmp_path: Path) -> None:
    store, stream = _run(tmp_path, steps=3, end="stopped")
    outcome = finish(store, stream, Ending(0, stopped_by_user=True))
    run = store.get_run(outcome.run_id)
    assert run is not None and (run.status, run.summary.ended) == ("stopped", "stopped at step 3; no checkpoint")


@pytest.mark.parametrize(("ending", "error"), [
    (Ending(None, killed_by_user=True), "killed by user"),
    (Ending(-9, stopped_by_user=True, sigkilled="the grace period of 30 s ran out"),
     "stopped, but SIGKILLed before the ranks ended (the grace period of 30 s ran out)"),
], ids=["kill", "grace-ran-out"])
def test_ranks_sigkilled_before_their_end_are_recorded_killed(tmp_path: Path, ending: Ending, error: str) -> None:
    """No end event: whatever the last step was saving was cut off; the run is not a clean ``stopped``."""
    store, stream = _run(tmp_path, steps=3, end=None)
    outcome = finish(store, stream, ending)
    run = store.get_run(outcome.run_id)
    assert run is not None and (run.status, run.error) == ("killed", error)
    assert run.summary.ended == "killed at step 3; no checkpoint"


def test_a_one_process_rank_killed_by_a_signal_is_named_with_it(tmp_path: Path) -> None:
    """One process: the rank runs inside the launcher (``runner.rank.solo_launch``), so no torch elastic
    report names it; the launcher's exit code is the rank's signal."""
    store, stream = _run(tmp_path, steps=3, end=None)
    outcome = finish(store, stream, Ending(-9, vanished=[(0, 4321)], launcher_pid=4321))
    assert (outcome.status, outcome.error) == ("failed", "rank 0 (pid 4321) was killed by SIGKILL")
