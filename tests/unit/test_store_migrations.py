"""Schema versions on both backends: a new database is the models exactly; a database made before migrations
(the golden DDL of ftui 0.1.0) is recognised, stamped and upgraded with every row kept; a newer one is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from store import Store, StoreError, migrate
from store.models import Base
from tests.support.postgres import new_pg_database

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).resolve().parents[1] / "golden"


def _engine(url: str) -> sa.Engine:
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    return sa.create_engine(url)


def _old_database(url: str) -> None:
    """What ftui 0.1.0's ``Base.metadata.create_all`` made, with two runs' worth of rows in it."""
    engine = _engine(url)
    ddl = (GOLDEN / f"store_schema_0001_{engine.dialect.name}.sql").read_text()
    ddl = "\n".join(line for line in ddl.splitlines() if not line.startswith("--"))
    with engine.begin() as conn:
        for statement in filter(None, (s.strip() for s in ddl.split(";"))):
            conn.exec_driver_sql(statement)
        for name in ("first", "second"):
            conn.execute(sa.text(
                "INSERT INTO runs (name, recipe_text, recipe_hash, strategy, nproc, method, model, status, host, "
                "run_dir, created_at, summary, tags, note, peak_mem_bytes) VALUES (:name, 'toml', 'h', 'ddp', 2, "
                "'lora', 'm', 'completed', 'node', '/runs/x', :t, :summary, :tags, 'a note', 1000)"),
                {"name": name, "t": datetime(2026, 1, 1, 12), "summary": json.dumps({"estimate": {"gib": 1.5}}),
                 "tags": json.dumps(["keep"])})
        ids = [row[0] for row in conn.execute(sa.text("SELECT id FROM runs ORDER BY id"))]
        for run_id in ids:
            for step in (1, 2, 3):
                conn.execute(sa.text("INSERT INTO metrics (run_id, step, time, loss, tokens) "
                                     "VALUES (:r, :s, :s, 2.5, 100)"), {"r": run_id, "s": step})
                conn.execute(sa.text("INSERT INTO events (run_id, source, seq, type, time, payload) "
                                     "VALUES (:r, 'trainer', :s, 'step', :s, :p)"),
                             {"r": run_id, "s": step, "p": json.dumps({"step": step})})
            conn.execute(sa.text(
                'INSERT INTO device_samples (run_id, time, host, kind, "index", name, mem_used, source) '
                "VALUES (:r, 1.0, 'node', 'gpu', 0, 'H100', 1000, 'nvml')"), {"r": run_id})
            conn.execute(sa.text("INSERT INTO process_samples (run_id, time, host, gpu_index, pid, source) "
                                 "VALUES (:r, 1.0, 'node', 0, 42, 'nvml')"), {"r": run_id})
    engine.dispose()


def _schema(url: str) -> dict[str, Any]:
    """Tables as reflected: columns (name, type, nullable), indexes, unique constraints, foreign keys."""
    engine = _engine(url)
    inspector = sa.inspect(engine)
    out: dict[str, Any] = {}
    for table in sorted(set(inspector.get_table_names()) - {migrate.VERSION_TABLE}):
        out[table] = {
            "columns": [(c["name"], str(c["type"]), c["nullable"]) for c in inspector.get_columns(table)],
            "indexes": sorted((i["name"], tuple(i["column_names"]), bool(i["unique"]))
                              for i in inspector.get_indexes(table)),
            "unique": sorted((u["name"], tuple(u["column_names"])) for u in inspector.get_unique_constraints(table)),
            "fks": sorted((tuple(f["constrained_columns"]), f["referred_table"], tuple(f["referred_columns"]),
                           (f.get("options") or {}).get("ondelete")) for f in inspector.get_foreign_keys(table)),
        }
    engine.dispose()
    return out


def _sibling(url: str) -> str:
    """A second empty database on the same backend."""
    if url.startswith("sqlite:///"):
        return url.replace("ftui.db", "other.db")
    return new_pg_database(url.rsplit("/", 1)[0])


def test_known_revisions_are_the_scripts_shipped_in_the_package() -> None:
    scripts = migrate.script_directory()
    assert [r.revision for r in reversed(list(scripts.walk_revisions()))] == list(migrate.REVISIONS)
    assert scripts.get_heads() == [migrate.HEAD]
    assert migrate.MIGRATIONS.parent == Path(migrate.__file__).parent, "inside the store package"
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'store = ["migrations/script.py.mako"]' in pyproject and '"alembic>=' in pyproject


def test_a_new_database_is_the_models_exactly(db_url: str) -> None:
    store = Store(db_url)
    assert store.schema_change == (None, migrate.HEAD)
    with store.engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True,
                                                          "version_table": migrate.VERSION_TABLE})
        assert compare_metadata(context, Base.metadata) == []
    assert migrate.current(db_url) == migrate.HEAD
    assert Store(db_url).schema_change is None, "a current database is left alone"


def test_revision_1_is_the_schema_before_migrations(db_url: str) -> None:
    _old_database(db_url)
    other = _sibling(db_url)
    engine = _engine(other)
    with engine.begin() as conn:
        command.upgrade(migrate.alembic_config(conn), migrate.BASELINE)
    engine.dispose()
    assert _schema(other) == _schema(db_url)


def test_an_old_database_is_stamped_upgraded_and_keeps_every_row(db_url: str) -> None:
    _old_database(db_url)
    assert migrate.current(db_url) == migrate.BASELINE
    store = Store(db_url, create=False)
    assert store.schema_change == (migrate.BASELINE, migrate.HEAD)
    runs = store.list_runs()
    assert [r.name for r in runs] == ["second", "first"]
    assert len({r.uid for r in runs}) == 2 and all(len(r.uid) == 26 for r in runs), "each old run got its own uid"
    for run in runs:
        assert (run.summary.to_json(), run.tags, run.note, run.peak_mem_bytes) == ({"estimate": {"gib": 1.5}}, ["keep"],
                                                                          "a note", 1000)
        assert run.resumed_from is None and run.watcher_pid is None and run.stop_requested_at is None
        assert [m.step for m in store.metrics(run.id)] == [1, 2, 3], "no cascade from rebuilding runs"
        assert [e.payload for e in store.events(run.id)] == [{"step": 1}, {"step": 2}, {"step": 3}]
        assert len(store.samples(run.id)) == 1 and len(store.process_samples(run.id)) == 1
    new = store.create_run(name="third", recipe_text="t", recipe_hash="h", strategy="ddp", nproc=1, method="lora",
                           model="m", run_dir="/r", resumed_from=runs[0].id)
    assert new > runs[0].id and store.get_run(new).resumed_from == runs[0].id  # type: ignore[union-attr]
    assert _schema(db_url) == _schema(_fresh(db_url)), "upgraded == created new"


def _fresh(url: str) -> str:
    other = _sibling(url)
    Store(other).close()
    return other


def test_a_newer_database_is_refused_and_left_alone(db_url: str) -> None:
    Store(db_url).close()
    engine = _engine(db_url)
    with engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE {migrate.VERSION_TABLE} SET version_num = '0099'"))
    engine.dispose()
    expected = (f"--db {db_url}: database schema 0099 is newer than this ftui (knows up to {migrate.HEAD}); "
                "upgrade ftui")
    for open_it in (lambda: Store(db_url), lambda: Store(db_url, create=False), lambda: migrate.upgrade(db_url)):
        with pytest.raises(StoreError) as err:
            open_it()
        assert str(err.value) == expected
    assert migrate.current(db_url) == "0099"


def test_upgrade_and_current(db_url: str) -> None:
    if db_url.startswith("sqlite:///"):
        with pytest.raises(StoreError, match="no such database"):
            migrate.current(db_url)
    else:
        assert migrate.current(db_url) is None
    _old_database(db_url)
    assert migrate.upgrade(db_url) == (migrate.BASELINE, migrate.HEAD)
    assert migrate.upgrade(db_url) == (migrate.HEAD, migrate.HEAD)
    assert migrate.current(db_url) == migrate.HEAD


def test_processes_opening_an_old_database_at_once_upgrade_it_once(db_url: str) -> None:
    _old_database(db_url)
    code = ("import sys\nfrom store import Store\n"
            "print(Store(sys.argv[1]).schema_change, len(Store(sys.argv[1]).list_runs()))\n")
    procs = [subprocess.Popen([sys.executable, "-c", code, db_url], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
             for _ in range(4)]
    results = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), results
    lines = sorted(out.strip() for out, _ in results)
    assert lines == [f"('0001', '{migrate.HEAD}') 2"] + ["None 2"] * 3, lines
