"""No silent waits: before step 1 the trainer journals what it is doing (phase events) and `ftui run`'s
progress line and the Monitor say it. (That every real run journals its phases: tests/e2e/test_trainer_phases.py.)"""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from tui.cli.progress import RunProgress


def test_the_progress_line_names_the_phase_before_step_one() -> None:
    console = Console(file=io.StringIO(), width=120, force_terminal=False)
    progress = RunProgress(console)
    description = lambda: progress.progress.tasks[0].description  # noqa: E731
    progress.on_event({"type": "phase", "phase": "tokenizing", "detail": "builtin:pydoc-topics"})
    assert description() == "tokenizing the data (builtin:pydoc-topics)"
    # a path is the user's text: the line shows it as text, never reads it as rich markup
    progress.on_event({"type": "phase", "phase": "loading_model", "detail": "/models/[v2]/llama, lora"})
    assert "loading the model" in description() and "/models/[v2]/llama" in description()
    console.print(progress.progress.get_renderable())
    assert "/models/[v2]/llama" in console.file.getvalue()  # type: ignore[attr-defined]
    progress.on_event({"type": "phase", "phase": "preparing", "detail": "fsdp x 2 (FSDP)"})
    assert description() == "preparing the strategy (fsdp x 2 (FSDP))"
    progress.on_event({"type": "start", "distributed_type": "FSDP", "world_size": 2, "total_steps": 8,
                       "tokens_per_step": 2048, "context_length": 256})
    # the bar says the global batch (a --nproc 2 run trains twice the rows per step)
    assert description() == "training: FSDP × 2, global batch 8"


def test_the_progress_line_names_a_save_or_an_evaluation_until_the_next_step() -> None:
    console = Console(file=io.StringIO(), width=120, force_terminal=False)
    progress = RunProgress(console)
    description = lambda: progress.progress.tasks[0].description  # noqa: E731
    progress.on_event({"type": "start", "distributed_type": "NO", "world_size": 1, "total_steps": 8})
    progress.on_event({"type": "step", "step": 2, "loss": 2.0, "tokens_per_s": 10.0})
    progress.on_event({"type": "phase", "phase": "saving", "detail": "the checkpoint of step 2"})
    assert description() == "saving (the checkpoint of step 2)"
    progress.on_event({"type": "phase", "phase": "evaluating", "detail": "step 2"})
    assert description() == "evaluating (step 2)"
    progress.on_event({"type": "step", "step": 3, "loss": 1.9, "tokens_per_s": 10.0})
    assert description() == "training: one process"


def test_the_monitor_says_the_trainers_phase_before_step_one(tmp_path: Path) -> None:
    from store import Store
    from tui.app.poll import MonitorFeed

    store = Store(f"sqlite:///{tmp_path / 'ftui.db'}")
    run_id = store.create_run(name="q", recipe_text="", recipe_hash="", strategy="single", nproc=1,
                              method="lora", model="builtin:tiny-llama", run_dir=str(tmp_path))
    store.update_run(run_id, status="running")
    store.ingest(run_id, [{"seq": 0, "type": "phase", "time": 1.0, "phase": "loading_model",
                           "detail": "builtin:tiny-llama, lora"}])
    store.ingest(run_id, [{"seq": 0, "type": "launch", "time": 0.5}], source="orchestrator")
    phase = MonitorFeed(store, run_id).poll().phase
    assert phase.startswith("starting: loading the model (builtin:tiny-llama, lora)"), phase
