"""Issue 16, item 3: no silent waits. Before step 1 the trainer journals what it is doing (phase events)
and `ftui run`'s progress line and the Monitor say it; a sweep shows its running run's progress."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from rich.console import Console

from runner.spec import events as ev
from tui.cli.progress import RunProgress


def test_the_progress_line_names_the_phase_before_step_one() -> None:
    console = Console(file=io.StringIO(), width=120, force_terminal=False)
    progress = RunProgress(console)
    description = lambda: progress.progress.tasks[0].description  # noqa: E731
    progress.on_event({"type": "phase", "phase": "tokenizing", "detail": "builtin:pydoc-topics"})
    assert description() == "tokenizing the data (builtin:pydoc-topics)"
    # a path is the user's text: rich markup in it is escaped, not interpreted
    progress.on_event({"type": "phase", "phase": "loading_model", "detail": "/models/[v2]/llama, lora"})
    assert "loading the model" in description() and "\\[v2]" in description()
    progress.on_event({"type": "phase", "phase": "preparing", "detail": "fsdp x 2 (FSDP)"})
    assert description() == "preparing the strategy (fsdp x 2 (FSDP))"
    progress.on_event({"type": "start", "distributed_type": "FSDP", "world_size": 2, "total_steps": 8,
                       "tokens_per_step": 2048, "context_length": 256})
    # issue 16, item 2: the bar says the global batch (a --nproc 2 run trains twice the rows per step)
    assert description() == "training (FSDP, 2 proc, global batch 8)"


def test_every_run_journals_its_phases_before_the_start_event(strategy_runs: dict[str, dict[str, Any]]) -> None:
    for name, run in strategy_runs.items():
        lines = (Path(run["run_dir"]) / ev.EVENTS_FILE).read_text().splitlines()
        kinds = [(e["type"], e.get("phase")) for e in map(json.loads, lines)]
        start = kinds.index(("start", None))
        assert kinds[:start] == [("phase", "tokenizing"), ("phase", "loading_model"), ("phase", "preparing")], name
        assert json.loads(lines[1])["detail"] == "builtin:tiny-llama, lora", lines[1]  # words, not a repr
        assert ev.typed(json.loads(lines[0])) is not None  # a typed trainer event, stored like the rest


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
