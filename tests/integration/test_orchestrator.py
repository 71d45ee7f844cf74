"""The watcher on real child processes that are not the trainer: a rank that goes quiet is
flagged as a hang, a launch that dies before its first event is recorded as failed, a launch that
silently became another strategy is stopped and failed, and a rank's own GPU memory (scripted NVML,
the one fake) is attributed to it and summarised."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

from runner.hardware import GIB, FakeGpu, FakeNvml, NvmlBackend, Probe
from runner.spec.launch import LaunchSpec
from runner.spec.recipe import parse_recipe
from runner.watch.follow import WatchOptions, execute
from runner.watch.prepare import Prepared
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
    # alive, idle, no step: a hang; until the watcher has flagged it (then it exits 0 without an end)
    while '"type":"hang"' not in open(f"{run}/orchestrator.jsonl").read().replace(" ", ""):
        time.sleep(0.05)
    """
)


def _prepared(store: Store, tmp_path: Path, code: str, recipe_text: str = "") -> Prepared:
    recipe = parse_recipe(recipe_text)
    run_id = store.create_run(name="child", recipe_text=recipe.to_toml(), recipe_hash=recipe.digest(),
                              strategy="single", nproc=1, method="lora", model="m", run_dir=str(tmp_path))
    spec = LaunchSpec(argv=[sys.executable, "-c", code, str(tmp_path)], env={}, accelerate_config=None)
    return Prepared(run_id=run_id, run_dir=tmp_path, spec=spec, recipe=recipe)


def test_an_idle_rank_without_steps_is_flagged_as_a_hang(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'ftui.db'}")
    prepared = _prepared(store, tmp_path, HANGING_RANK)
    seen: list[dict] = []
    options = WatchOptions(sample_interval_s=0.1, hang_after_s=1.0, hang_check_s=0.1)
    outcome = execute(store, prepared, options, on_event=seen.append)
    hangs = store.events(outcome.run_id, "hang")
    assert len(hangs) == 1, "flagged once per episode"
    assert hangs[0].payload["idle"] == ["rank:0"]
    assert hangs[0].payload["since_progress_s"] >= 1.0
    assert any(e["type"] == "hang" for e in seen)
    samples = store.samples(outcome.run_id)
    assert {s.kind for s in samples} >= {"rank", "host"}
    assert outcome.status == "failed", "exit 0 without an end event is not a completed run"


def test_a_launch_that_dies_at_once_is_failed_with_its_reason(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'ftui.db'}")
    prepared = _prepared(store, tmp_path, "raise SystemExit('ValueError: no such model')")
    outcome = execute(store, prepared, WatchOptions(sample_interval_s=0.25))
    run = store.get_run(outcome.run_id)
    assert run is not None and run.status == "failed" and run.exit_code == 1
    assert run.error == "launcher.log: ValueError: no such model"


def _rank(start: dict, steps: int, until: str = "") -> str:
    """A fake rank 0: writes its pid file, a start event, ``steps`` steps, then stays alive until the run
    folder's ``samples.jsonl`` has a line with ``until`` (empty: until it is stopped), and writes its end."""
    return textwrap.dedent(
        f"""
        import json, os, sys, time
        run = sys.argv[1]
        os.makedirs(f"{{run}}/ranks", exist_ok=True)
        open(f"{{run}}/ranks/0.pid", "w").write(str(os.getpid()))
        events = [{start!r}]
        events += [{{"type": "step", "step": i + 1, "loss": 2.0, "step_time": 0.1}} for i in range({steps})]
        def sampled():
            try:
                return {until!r} and {until!r} in open(f"{{run}}/samples.jsonl").read()
            except OSError:
                return False
        with open(f"{{run}}/events.jsonl", "a") as journal:
            for seq, event in enumerate(events):
                journal.write(json.dumps({{"seq": seq, "time": time.time(), **event}}) + "\\n")
                journal.flush()
            while not sampled():
                time.sleep(0.05)
            end = {{"type": "end", "status": "completed", "steps": {steps}, "ranks": []}}
            journal.write(json.dumps({{"seq": len(events), "time": time.time(), **end}}) + "\\n")
        """
    )


def test_a_launch_that_became_another_strategy_is_stopped_and_failed(tmp_path: Path) -> None:
    """accelerate's CPU trap: FSDP asked for, plain multi-CPU DDP in effect. The run must not go on."""
    store = Store(f"sqlite:///{tmp_path / 'ftui.db'}")
    start = {"type": "start", "distributed_type": "MULTI_CPU", "world_size": 2, "total_steps": 100}
    prepared = _prepared(store, tmp_path, _rank(start, steps=0),
                         recipe_text='[launch]\nstrategy = "fsdp"\nnproc = 2\n')
    outcome = execute(store, prepared, WatchOptions(sample_interval_s=0))
    run = store.get_run(outcome.run_id)
    assert run is not None and run.status == "failed" and run.distributed_type == "MULTI_CPU"
    assert run.error is not None and run.error.startswith("launch.strategy: asked for fsdp (FSDP)")
    assert "MULTI_CPU" in run.error


def test_each_rank_gets_its_own_gpu_memory_peak(tmp_path: Path) -> None:
    """NVML lists the rank's pid on GPU 1 (scripted): the run's summary holds that rank's peak."""
    store = Store(f"sqlite:///{tmp_path / 'ftui.db'}")
    pid_file = tmp_path / "ranks" / "0.pid"

    def on_gpu1(tick: int) -> list[tuple[int, int]]:
        return [(int(pid_file.read_text()), 3 * GIB), (1, 5 * GIB)] if pid_file.is_file() else []

    nvml = FakeNvml([FakeGpu(util=50.0, mem_used=10 * GIB), FakeGpu(util=90.0, mem_used=20 * GIB, processes=on_gpu1)])
    start = {"type": "start", "distributed_type": "NO", "world_size": 1, "total_steps": 4}
    prepared = _prepared(store, tmp_path, _rank(start, steps=4, until='"k":"p"'))  # NVML saw the rank
    outcome = execute(store, prepared, WatchOptions(probe=Probe(nvml=NvmlBackend(lib=nvml)), sample_interval_s=0.2))
    assert outcome.status == "completed", outcome.error
    telemetry = store.get_run(outcome.run_id).summary.telemetry  # type: ignore[union-attr]
    assert telemetry["rank_gpu_mem_peak"] == {"0": 3 * GIB}, "pid 1 is not the run's: not counted"
    assert telemetry["whole"]["kind"] == "gpu" and telemetry["whole"]["util_peak"] == 90.0
