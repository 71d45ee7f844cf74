from __future__ import annotations

from pathlib import Path

import sqlalchemy

from runner.events import JournalReader, JournalWriter
from store import Store


def _store(tmp_path: Path) -> Store:
    return Store(f"sqlite:///{tmp_path / 'db' / 'ftui.db'}")


def _new_run(store: Store) -> int:
    return store.create_run(name="r", recipe_text="x", recipe_hash="h", strategy="ddp", nproc=2,
                            method="lora", model="m", run_dir="/tmp/r")


def test_sqlite_pragmas(tmp_path: Path) -> None:
    store = _store(tmp_path)
    with store.engine.connect() as conn:
        assert conn.execute(sqlalchemy.text("PRAGMA journal_mode")).scalar() == "wal"
        assert conn.execute(sqlalchemy.text("PRAGMA foreign_keys")).scalar() == 1
        assert conn.execute(sqlalchemy.text("PRAGMA busy_timeout")).scalar() == 10000


def test_ingest_is_idempotent_and_fills_metrics(tmp_path: Path) -> None:
    store = _store(tmp_path)
    run_id = _new_run(store)
    journal = tmp_path / "events.jsonl"
    writer = JournalWriter(journal)
    writer.emit("start", world_size=2)
    for step in (1, 2, 3):
        writer.emit("step", step=step, loss=3.0 - step / 10, lr=1e-3, tokens=step * 100, tokens_per_s=50.0)
    writer.close()
    events = JournalReader(journal).read_new()
    assert [e["seq"] for e in events] == [0, 1, 2, 3]
    assert store.ingest(run_id, events) == 4
    assert store.ingest(run_id, events) == 0, "a re-ingest stores nothing twice"
    assert [m.step for m in store.metrics(run_id)] == [1, 2, 3]
    assert store.metrics(run_id)[-1].loss == 2.7
    assert store.get_run(run_id).steps_done == 3  # type: ignore[union-attr]
    assert [e.type for e in store.events(run_id)] == ["start", "step", "step", "step"]


def test_reader_returns_only_whole_lines(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    reader = JournalReader(path)
    assert reader.read_new() == []
    path.write_bytes(b'{"seq":0,"type":"start","time":1}\n{"seq":1,"ty')
    assert [e["seq"] for e in reader.read_new()] == [0]
    with open(path, "ab") as fh:
        fh.write(b'pe":"step","time":2}\n')
    assert [e["type"] for e in reader.read_new()] == ["step"]


def test_update_merges_summary_and_delete_cascades(tmp_path: Path) -> None:
    store = _store(tmp_path)
    run_id = _new_run(store)
    store.update_run(run_id, status="running", summary={"a": 1})
    store.update_run(run_id, summary={"b": 2})
    run = store.get_run(run_id)
    assert run is not None and run.status == "running" and run.summary == {"a": 1, "b": 2}
    store.ingest(run_id, [{"seq": 0, "type": "step", "time": 1.0, "step": 1, "loss": 1.0}])
    assert store.delete_run(run_id)
    assert store.get_run(run_id) is None and store.metrics(run_id) == []


def test_a_second_reader_sees_the_writers_rows(tmp_path: Path) -> None:
    writer, reader = _store(tmp_path), _store(tmp_path)
    run_id = _new_run(writer)
    assert [r.id for r in reader.list_runs()] == [run_id]
