"""Named per-step metrics: journal ``metrics`` events -> the store's ``named_metrics`` table -> readers;
and the 0003 migration upgrades a database made at 0002 with every row kept."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command

from runner.spec.events import JournalReader, JournalWriter, metrics_event
from store import Store, migrate


def _new_run(store: Store) -> int:
    return store.create_run(name="r", recipe_text="x", recipe_hash="h", strategy="single", nproc=1,
                            method="lora", model="m", run_dir="/tmp/r")


def test_metrics_events_become_named_rows_idempotently(db_url: str, tmp_path: Path) -> None:
    store = Store(db_url)
    run_id = _new_run(store)
    writer = JournalWriter(tmp_path / "events.jsonl")
    writer.emit("step", step=1, loss=2.0, lr=1e-3, tokens=10, tokens_per_s=5.0)
    writer.write(metrics_event(1, {"train/acc": 0.5, "user/reward": 3}))
    writer.write(metrics_event(2, {"eval/loss": 1.25, "eval/perplexity": math.exp(1.25), "bad": float("nan")}))
    writer.write(metrics_event(2, {"eval/loss": 1.0}))  # reported again for step 2: the later value wins
    writer.close()
    events = JournalReader(tmp_path / "events.jsonl").read_new()
    assert store.ingest(run_id, events[:2]) == 2
    assert store.ingest(run_id, events) == 2, "only the new events"
    assert store.ingest(run_id, events) == 0
    points = store.named_metrics(run_id)
    assert [(p.step, p.name, p.value) for p in points] == [
        (1, "train/acc", 0.5), (1, "user/reward", 3.0),
        (2, "bad", None), (2, "eval/loss", 1.0), (2, "eval/perplexity", pytest.approx(math.exp(1.25))),
    ]
    assert [p.step for p in store.named_metrics(run_id, names=["eval/loss"])] == [2]
    assert [p.name for p in store.named_metrics(run_id, after_step=1)] == ["bad", "eval/loss", "eval/perplexity"]
    assert store.metric_names(run_id) == ["bad", "eval/loss", "eval/perplexity", "train/acc", "user/reward"]
    assert [m.step for m in store.metrics(run_id)] == [1], "the fixed columns are untouched"
    assert store.delete_run(run_id) and store.named_metrics(run_id) == []


def test_metrics_event_refuses_bad_names_and_values() -> None:
    with pytest.raises(ValueError, match="name must be"):
        metrics_event(1, {"": 1.0})
    with pytest.raises(ValueError, match="x: not a number"):
        metrics_event(1, {"x": "abc"})
    with pytest.raises(ValueError, match="step must be"):
        metrics_event(-1, {"x": 1.0})
    assert metrics_event(3, {"x": 2, "y": float("inf")})["values"] == {"x": 2.0, "y": None}


def test_a_0002_database_upgrades_to_0003_keeping_rows(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ftui.db'}"
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        command.upgrade(migrate.alembic_config(conn), "0002")
        conn.execute(sa.text(
            "INSERT INTO runs (uid, name, recipe_text, recipe_hash, strategy, nproc, method, model, status, host, "
            "run_dir, created_at, summary, tags, note) VALUES ('01J0000000000000000000000A', 'old', 't', 'h', "
            "'single', 1, 'lora', 'm', 'completed', 'node', '/r', '2026-01-01 12:00:00', '{}', '[]', '')"))
        conn.execute(sa.text("INSERT INTO metrics (run_id, step, time, loss) VALUES (1, 1, 1.0, 2.5)"))
    engine.dispose()
    assert migrate.current(url) == "0002"
    store = Store(url, create=False)
    assert store.schema_change == ("0002", migrate.HEAD) and migrate.HEAD >= "0003"
    assert [m.loss for m in store.metrics(1)] == [2.5]
    assert store.named_metrics(1) == []
    store.ingest(1, [{"seq": 0, "type": "metrics", "time": 2.0, "rank": 0, "step": 1, "values": {"eval/loss": 2.0}}])
    assert [(p.name, p.value) for p in store.named_metrics(1)] == [("eval/loss", 2.0)]
    store.close()
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        command.downgrade(migrate.alembic_config(conn), "0002")
    assert "named_metrics" not in sa.inspect(engine).get_table_names()
    engine.dispose()


def test_show_json_has_named_metrics(tmp_path: Path) -> None:
    from tests.support.in_process import run_ftui

    root = Path(__file__).resolve().parents[2]
    url = f"sqlite:///{tmp_path / 'ftui.db'}"
    store = Store(url)
    run_id = _new_run(store)
    store.ingest(run_id, [{"seq": 0, "type": "metrics", "time": 2.0, "rank": 0, "step": 5,
                           "values": {"eval/loss": 1.5}},
                          {"seq": 1, "type": "eval_samples", "time": 2.0, "step": 5,
                           "samples": [{"prompt": "hi", "completion": " there"}]}])
    store.close()
    code, out, err = run_ftui(["show", str(run_id), "--format", "json", "--db", url],
                              {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root), "FTUI_HOME": str(tmp_path)}, root)
    assert code == 0, err
    data = json.loads(out)
    assert data["named_metrics"] == {"eval/loss": [{"step": 5, "value": 1.5, "time": 2.0}]}
    assert data["eval_samples"] == [{"step": 5, "samples": [{"prompt": "hi", "completion": " there"}]}]


def _run_with_eval(store: Store, losses: list[float], evals: dict[int, float]) -> int:
    run_id = _new_run(store)
    events: list[dict[str, object]] = []
    for step, loss in enumerate(losses, 1):
        events.append({"seq": len(events), "type": "step", "time": float(step), "step": step, "loss": loss,
                       "lr": 1e-3, "tokens": step * 10, "tokens_per_s": 5.0, "step_time": 1.0})
        if step in evals:
            events.append({"seq": len(events), "type": "metrics", "time": float(step), "rank": 0, "step": step,
                           "values": {"eval/loss": evals[step], "user/score": step * 2.0}})
            events.append({"seq": len(events), "type": "eval_samples", "time": float(step), "step": step,
                           "samples": [{"prompt": "[b]2+2[/b]", "completion": f"four at {step}"}]})
    store.ingest(run_id, events)
    return run_id


def test_monitor_feed_compare_and_report_show_eval(tmp_path: Path) -> None:
    from runner.analysis.compare import load_comparison
    from tui.app.poll import MonitorFeed
    from tui.app.screens.monitor import named_text
    from tui.render.compare import markdown, rich_table, to_html

    store = Store(f"sqlite:///{tmp_path / 'ftui.db'}")
    a = _run_with_eval(store, [3.0, 2.5, 2.0, 1.8], {2: 2.7, 4: 2.2})
    b = _run_with_eval(store, [3.0, 2.6, 2.2, 2.1], {2: 2.8, 4: 2.9})
    snap = MonitorFeed(store, a).poll()
    assert snap.named["eval/loss"] == [(2.0, 2.7), (4.0, 2.2)]
    assert snap.loss_points == [(1.0, 3.0), (2.0, 2.5), (3.0, 2.0), (4.0, 1.8)]
    assert snap.samples == [{"prompt": "[b]2+2[/b]", "completion": "four at 4"}] and snap.samples_step == 4
    text = named_text(snap).plain
    assert "eval/loss 2.2 (4)" in text and "user/score 8 (4)" in text and "[b]2+2[/b] -> four at 4" in text
    cmp = load_comparison(store, [a, b])
    rows = {r.run_id: r for r in cmp.rows}
    assert (rows[a].final_eval_loss, rows[a].best_eval_loss) == (2.2, 2.2)
    assert (rows[b].final_eval_loss, rows[b].best_eval_loss) == (2.9, 2.8)
    assert cmp.eval_curves[b] == [(2, 2.8), (4, 2.9)] and cmp.named[a]["user/score"] == 8.0
    page = to_html(cmp)
    assert "eval loss (whole held-out set)" in page and f"run {b}" in page and "final eval loss" in page
    assert "four at 4" in page and "&lt;" not in "[b]" and "[b]2+2[/b]" in page
    assert "| final eval loss | best eval loss |" in markdown(cmp)
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(rich_table(cmp))
    out = console.export_text()
    assert "best eval loss" in out and "2.8000" in out and "[b]2+2[/b]" in out
