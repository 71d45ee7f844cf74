"""The store's records against its tables: a run's columns and a sample's fields are declared once (the
ORM models), and the frozen records readers get match them field for field; the run summary's record
(runner.spec.summary.RunSummary) and its one upgrader."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from runner.spec.summary import CPU_CORE_UNIT, SCHEMA, RunSummary, cpu_threads_unit
from store import ProcessSampleInfo, RunInfo, RunUpdate, SampleInfo, Store
from store.models import DeviceSampleRow, ProcessSampleRow, Run


def _column_types(model: Any) -> dict[str, str]:
    """Each mapped attribute's annotation without ``Mapped[...]`` (postponed annotations are strings)."""
    out = {}
    for klass in reversed(model.__mro__):
        for name, annotation in getattr(klass, "__annotations__", {}).items():
            text = str(annotation)
            if text.startswith("Mapped[") and name in model.__table__.columns:
                out[name] = text.removeprefix("Mapped[").removesuffix("]")
    return out


def _field_types(record: Any) -> dict[str, str]:
    return {f.name: str(f.type) for f in fields(record)}


def test_run_info_is_the_runs_table_field_for_field() -> None:
    columns, info = _column_types(Run), _field_types(RunInfo)
    assert set(info) == set(columns)
    assert {k: v for k, v in info.items() if k != "summary"} == {k: v for k, v in columns.items() if k != "summary"}
    assert info["summary"] == "RunSummary"


def test_run_update_names_updatable_columns_of_their_types() -> None:
    info = _field_types(RunInfo)
    update = {name: getattr(t, "__forward_arg__", str(t)) for name, t in RunUpdate.__annotations__.items()}
    assert set(update) <= set(info)
    assert {k: v for k, v in update.items() if k != "summary"} == {k: info[k] for k in update if k != "summary"}
    assert not {"id", "uid", "recipe_text", "recipe_hash", "created_at"} & set(update), "identity is fixed"


def test_sample_records_are_their_tables_plus_nothing() -> None:
    for record, model in ((SampleInfo, DeviceSampleRow), (ProcessSampleInfo, ProcessSampleRow)):
        assert {f.name for f in fields(record)} == set(model.__table__.columns.keys()) - {"run_id"}, record


def test_a_version_1_summary_is_upgraded_once_where_it_is_read() -> None:
    v1 = {"threads": 2, "telemetry": {"whole": {"kind": "rank", "util_mean": 198.0, "devices": 2,
                                                "util_min": 150.0, "util_max": 250.0}}, "mine": [1]}
    summary = RunSummary.from_json(v1)
    assert summary.telemetry is not None and summary.telemetry["active"] is None
    whole = summary.telemetry["whole"]
    assert (whole["util_mean"], whole["util_min"], whole["util_unit"]) == (99.0, None, cpu_threads_unit(2))
    assert summary.extra == {"mine": [1]} and summary.to_json()["mine"] == [1]
    no_threads = RunSummary.from_json({"telemetry": {"whole": {"kind": "rank", "util_mean": 198.0, "devices": 1}}})
    assert no_threads.telemetry is not None and no_threads.telemetry["whole"]["util_unit"] == CPU_CORE_UNIT
    # A current summary is read as it is; a value of the wrong JSON type is kept aside, never typed.
    current = RunSummary.from_json({"schema": SCHEMA, **summary.to_json(), "estimate": 1000})
    assert current == RunSummary.from_json({**summary.to_json(), "schema": SCHEMA, "estimate": 1000})
    assert current.estimate is None and current.extra["estimate"] == 1000


def test_the_store_writes_the_schema_and_upgrades_before_merging(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'ftui.db'}")
    run_id = store.create_run(name="q", recipe_text="", recipe_hash="", strategy="single", nproc=1, method="lora",
                              model="m", run_dir="", summary={"params": 7})
    with store.engine.begin() as conn:  # a row as version 1 wrote it
        conn.execute(sa.text("UPDATE runs SET summary = :s WHERE id = :id"),
                     {"s": json.dumps({"threads": 4, "telemetry": {"whole": {"kind": "rank", "util_mean": 400.0,
                                                                             "devices": 1}}}), "id": run_id})
    store.update_run(run_id, summary={"stop": "ftui stop"})
    with store.engine.connect() as conn:
        stored = json.loads(conn.execute(sa.text("SELECT summary FROM runs WHERE id = :id"), {"id": run_id}).scalar())
    assert stored["schema"] == SCHEMA and stored["telemetry"]["whole"]["util_mean"] == 100.0
    run = store.get_run(run_id)
    assert run is not None and run.summary.stop == "ftui stop" and run.summary.threads == 4
    assert run.summary.telemetry is not None and run.summary.telemetry["whole"]["util_mean"] == 100.0
    store.close()
