"""The orchestrator on real child processes that are not the trainer: a rank that goes quiet is
flagged as a hang, and a launch that dies before its first event is recorded as failed."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

from runner import orchestrator
from runner.launch import LaunchSpec
from runner.recipe import parse_recipe
from store import Store

HANGING_RANK = textwrap.dedent(
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
    time.sleep(9)  # alive, idle, no step: a hang
    """
)


def _prepared(store: Store, tmp_path: Path, code: str) -> orchestrator.Prepared:
    recipe = parse_recipe("")
    run_id = store.create_run(name="child", recipe_text=recipe.to_toml(), recipe_hash=recipe.digest(),
                              strategy="single", nproc=1, method="lora", model="m", run_dir=str(tmp_path))
    spec = LaunchSpec(argv=[sys.executable, "-c", code, str(tmp_path)], env={}, accelerate_config=None)
    return orchestrator.Prepared(run_id=run_id, run_dir=tmp_path, spec=spec, recipe=recipe)


def test_an_idle_rank_without_steps_is_flagged_as_a_hang(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'ftui.db'}")
    prepared = _prepared(store, tmp_path, HANGING_RANK)
    seen: list[dict] = []
    outcome = orchestrator.execute(store, prepared, on_event=seen.append, sample_interval_s=0.25, hang_after_s=3.0)
    hangs = store.events(outcome.run_id, "hang")
    assert len(hangs) == 1, "flagged once per episode"
    assert hangs[0].payload["idle"] == ["rank:0"]
    assert hangs[0].payload["since_step_s"] >= 3.0
    assert any(e["type"] == "hang" for e in seen)
    samples = store.samples(outcome.run_id)
    assert {s.kind for s in samples} >= {"rank", "host"}
    assert outcome.status == "failed", "exit 0 without an end event is not a completed run"


def test_a_launch_that_dies_at_once_is_failed_with_its_reason(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'ftui.db'}")
    prepared = _prepared(store, tmp_path, "raise SystemExit('ValueError: no such model')")
    outcome = orchestrator.execute(store, prepared, sample_interval_s=0.25)
    run = store.get_run(outcome.run_id)
    assert run is not None and run.status == "failed" and run.exit_code == 1
    assert run.error == "launcher.log: ValueError: no such model"
