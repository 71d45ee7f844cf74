"""The store against both backends (a SQLite file and a real PostgreSQL server), plus SQLite's own cases:
pragmas, waiting out another client's lock, and every kind of bad ``--db`` path."""

from __future__ import annotations

import math
import os
import sqlite3
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest
import sqlalchemy

from runner.spec.events import JournalReader, JournalWriter
from store import Store, StoreError
from store import engine as store_engine

ROOT = Path(__file__).resolve().parents[2]
GiB = 1 << 30


def _sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'db' / 'ftui.db'}"


def _new_run(store: Store, **extra: int | None) -> int:
    return store.create_run(name="r", recipe_text="x", recipe_hash="h", strategy="ddp", nproc=2,
                            method="lora", model="m", run_dir="/tmp/r", **extra)


@dataclass
class _Sample:
    time: float
    host: str = "h"
    kind: str = "gpu"
    index: int = 0
    name: str = "H100"
    util_pct: float | None = 50.0
    mem_used: int | None = 70 * GiB
    mem_total: int | None = 80 * GiB
    power_w: float | None = 300.0
    temp_c: float | None = 60.0
    sm_clock_mhz: int | None = 1980
    pid: int | None = None
    source: str = "nvml"


@dataclass
class _Proc:
    time: float
    host: str = "h"
    gpu_index: int = 0
    pid: int = 1234
    rank: int | None = 0
    used_bytes: int | None = 40 * GiB
    source: str = "nvml"


# ---------------------------------------------------------------------- both backends


def test_ingest_is_idempotent_and_fills_metrics(db_url: str, tmp_path: Path) -> None:
    store = Store(db_url)
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


def test_update_merges_summary_and_delete_cascades(db_url: str) -> None:
    store = Store(db_url)
    run_id = _new_run(store)
    store.update_run(run_id, status="running", summary={"a": 1})
    store.update_run(run_id, summary={"b": 2})
    run = store.get_run(run_id)
    assert run is not None and run.status == "running" and run.summary.extra == {"a": 1, "b": 2}
    store.ingest(run_id, [{"seq": 0, "type": "step", "time": 1.0, "step": 1, "loss": 1.0}])
    store.add_samples(run_id, [_Sample(time=1.0)], [_Proc(time=1.0)])
    assert store.delete_run(run_id)
    assert store.get_run(run_id) is None and store.metrics(run_id) == []
    assert store.samples(run_id) == [] and store.process_samples(run_id) == []


def test_update_run_refuses_an_unknown_column_and_changes_nothing(db_url: str) -> None:
    store = Store(db_url)
    run_id = _new_run(store)
    with pytest.raises(TypeError, match="not an updatable run column: stauts"):
        store.update_run(run_id, status="running", stauts="failed")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="recipe_text"):
        store.update_run(run_id, recipe_text="changed")  # type: ignore[call-arg]
    run = store.get_run(run_id)
    assert run is not None and run.status == "created" and run.recipe_text == "x"
    with pytest.raises(StoreError, match="run 999: no such run"):
        store.update_run(999, status="running")


def test_a_second_reader_sees_the_writers_rows(db_url: str) -> None:
    writer, reader = Store(db_url), Store(db_url)
    run_id = _new_run(writer)
    assert [r.id for r in reader.list_runs()] == [run_id]


def test_runs_get_unique_uids_and_resumed_from_is_cleared_when_its_run_goes(db_url: str) -> None:
    store = Store(db_url)
    first = _new_run(store)
    second = _new_run(store, resumed_from=first)
    a, b = store.get_run(first), store.get_run(second)
    assert a is not None and b is not None
    assert len(a.uid) == 26 and a.uid != b.uid and a.uid < b.uid, "uids are ULIDs: unique, in creation order"
    assert b.resumed_from == first
    assert store.get_run_by_uid(b.uid) == b and store.get_run_by_uid("nope") is None
    store.delete_run(first)
    again = store.get_run(second)
    assert again is not None and again.resumed_from is None, "ON DELETE SET NULL"
    with pytest.raises(sqlalchemy.exc.IntegrityError):
        _new_run(store, resumed_from=12345)


def test_watcher_and_stop_request_columns(db_url: str) -> None:
    store = Store(db_url)
    run_id = _new_run(store)
    asked = datetime(2026, 1, 2, 3, 4, 5)
    store.update_run(run_id, watcher_pid=4321, watcher_host="node-7", stop_requested_at=asked)
    run = store.get_run(run_id)
    assert run is not None and (run.watcher_pid, run.watcher_host, run.stop_requested_at) == (4321, "node-7", asked)


def test_byte_counts_past_2_gib_round_trip(db_url: str) -> None:
    """PostgreSQL's INTEGER stops at 2 GiB; an 80 GB GPU's bytes must fit."""
    store = Store(db_url)
    run_id = _new_run(store)
    store.update_run(run_id, peak_mem_bytes=79 * GiB)
    store.ingest(run_id, [{"seq": 0, "type": "step", "time": 1.0, "step": 1, "tokens": 5_000_000_000}])
    store.add_samples(run_id, (s for s in [_Sample(time=1.0)]), (p for p in [_Proc(time=1.0)]))
    assert store.get_run(run_id).peak_mem_bytes == 79 * GiB  # type: ignore[union-attr]
    assert store.metrics(run_id)[0].tokens == 5_000_000_000
    sample, = store.samples(run_id)
    assert (sample.mem_used, sample.mem_total) == (70 * GiB, 80 * GiB)
    assert store.process_samples(run_id)[0].used_bytes == 40 * GiB


def test_non_finite_numbers_are_stored(db_url: str) -> None:
    """A diverged loss (NaN) must not stop ingestion: PostgreSQL's JSON refuses NaN, so payloads say null."""
    store = Store(db_url)
    run_id = _new_run(store)
    assert store.ingest(run_id, [{"seq": 0, "type": "step", "time": 1.0, "step": 1, "loss": float("nan"),
                                  "grad_norm": float("inf")}]) == 1
    store.update_run(run_id, final_loss=float("nan"), summary={"final_loss": float("nan"), "ranks": [{"x": 1.0}]})
    metric, = store.metrics(run_id)
    event, = store.events(run_id)
    run = store.get_run(run_id)
    assert run is not None and metric.grad_norm == float("inf") and run.summary.ranks == [{"x": 1.0}]
    if db_url.startswith("sqlite"):
        # SQLite stores a NaN REAL as NULL; its JSON is text, which keeps Python's NaN.
        assert metric.loss is None and run.final_loss is None
        assert math.isnan(event.payload["loss"]) and math.isnan(run.summary.final_loss)
    else:
        assert metric.loss is not None and math.isnan(metric.loss)
        assert run.final_loss is not None and math.isnan(run.final_loss)
        assert event.payload["loss"] is None and run.summary.final_loss is None


def test_a_read_open_of_an_empty_database_is_refused(db_url: str) -> None:
    with pytest.raises(StoreError) as err:
        Store(db_url, create=False)
    assert str(err.value) == f"--db {db_url}: no such database (run something first, or check the path)"


# ---------------------------------------------------------------------- SQLite


def test_sqlite_pragmas(tmp_path: Path) -> None:
    store = Store(_sqlite_url(tmp_path))
    with store.engine.connect() as conn:
        assert conn.execute(sqlalchemy.text("PRAGMA journal_mode")).scalar() == "wal"
        assert conn.execute(sqlalchemy.text("PRAGMA foreign_keys")).scalar() == 1
        assert conn.execute(sqlalchemy.text("PRAGMA busy_timeout")).scalar() == 10000


def _hold_exclusive_lock(path: Path, seconds: float, locked: threading.Event) -> None:
    """Another SQLite client (plain sqlite3, not the store) holding the write lock."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN EXCLUSIVE")
    conn.execute("UPDATE runs SET note = 'held' WHERE id = 1")
    locked.set()
    time.sleep(seconds)
    conn.execute("COMMIT")
    conn.close()


def test_writes_wait_out_a_lock_held_longer_than_sqlites_busy_timeout(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLite's own wait (its busy timeout, 0.2 s here) runs out while another client holds the lock (0.8 s);
    the store's retry loop waits on and every write lands."""
    monkeypatch.setattr(store_engine, "_BUSY_TIMEOUT_MS", 200)
    store = Store(_sqlite_url(tmp_path), lock_timeout=30.0)
    run_id = _new_run(store)
    locked = threading.Event()
    holder = threading.Thread(target=_hold_exclusive_lock, args=(tmp_path / "db" / "ftui.db", 0.8, locked))
    holder.start()
    assert locked.wait(10)
    began = time.monotonic()
    store.ingest(run_id, [{"seq": i, "type": "step", "time": float(i), "step": i, "loss": 1.0} for i in range(50)])
    waited = time.monotonic() - began
    store.update_run(run_id, status="completed", summary={"k": 1})
    store.add_samples(run_id, [_Sample(time=1.0)])
    holder.join()
    assert waited > 0.3, f"the write should have waited past SQLite's 0.2 s for the lock, returned after {waited:.2f} s"
    run = store.get_run(run_id)
    assert run is not None and run.status == "completed" and run.note == "held" and run.steps_done == 49
    assert len(store.metrics(run_id)) == 50 and len(store.events(run_id)) == 50 and len(store.samples(run_id)) == 1


def test_a_lock_held_past_the_budget_is_one_line_and_loses_nothing(tmp_path: Path) -> None:
    url = _sqlite_url(tmp_path)
    store = Store(url, lock_timeout=0.5)
    run_id = _new_run(store)
    locked = threading.Event()
    holder = threading.Thread(target=_hold_exclusive_lock, args=(tmp_path / "db" / "ftui.db", 1.5, locked))
    holder.start()
    assert locked.wait(10)
    with pytest.raises(StoreError) as err:
        store.update_run(run_id, status="running")
    assert str(err.value) == (f"--db {url}: database still locked by another program after 0.5 s "
                              "(FTUI_DB_LOCK_TIMEOUT)")
    assert store.get_run(run_id) is not None, "reads go on while another client writes (WAL)"
    holder.join()
    store.update_run(run_id, status="running")
    assert store.get_run(run_id).status == "running"  # type: ignore[union-attr]


def test_created_database_is_private(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'new' / 'deeper' / 'ftui.db'}"
    store = Store(url)
    _new_run(store)
    with store.engine.connect() as conn:  # an open connection keeps the -wal and -shm files
        conn.execute(sqlalchemy.text("SELECT 1 FROM runs")).all()
        files = sorted(p.name for p in (tmp_path / "new" / "deeper").iterdir())
        assert files == ["ftui.db", "ftui.db-shm", "ftui.db-wal"]
        for name in files:
            assert stat.S_IMODE((tmp_path / "new" / "deeper" / name).stat().st_mode) == 0o600, name
    for folder in (tmp_path / "new", tmp_path / "new" / "deeper"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder


def test_read_open_of_a_missing_file_creates_nothing(tmp_path: Path) -> None:
    for path in (tmp_path / "ftui.db", tmp_path / "missing" / "ftui.db"):
        url = f"sqlite:///{path}"
        with pytest.raises(StoreError) as err:
            Store(url, create=False)
        assert str(err.value) == f"--db {url}: no such database (run something first, or check the path)"
    assert list(tmp_path.iterdir()) == []


def test_bad_sqlite_paths_are_one_line(tmp_path: Path) -> None:
    (tmp_path / "folder").mkdir()
    text = tmp_path / "notes.txt"
    text.write_text("not a database\n" * 10)
    (tmp_path / "afile").write_text("x")
    cases = {
        tmp_path / "folder": f"{tmp_path / 'folder'} is a folder, not a database file",
        text: f"{text} is not an SQLite database",
        tmp_path / "afile" / "ftui.db": f"cannot create folder {tmp_path / 'afile'}: {tmp_path / 'afile'} is a file",
    }
    for path, reason in cases.items():
        for create in (True, False):
            url = f"sqlite:///{path}"
            if path.name == "ftui.db" and not create:
                reason = "no such database (run something first, or check the path)"
            with pytest.raises(StoreError) as err:
                Store(url, create=create)
            assert str(err.value) == f"--db {url}: {reason}"
    assert text.read_text() == "not a database\n" * 10, "nothing written to a file that is not ours"


def test_bad_urls_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match=r"^--db nonsense: not a database URL"):
        Store("nonsense")
    with pytest.raises(StoreError) as err:
        Store("postgresql+psycopg://nobody@127.0.0.1:1/ftui", lock_timeout=0)
    message = str(err.value)
    assert message.startswith("--db postgresql+psycopg://nobody@127.0.0.1:1/ftui: ") and "\n" not in message


@contextmanager
def _unprivileged() -> Iterator[None]:
    """File permissions apply inside (root drops its effective ids to ``nobody`` and takes them back)."""
    if os.geteuid() != 0:
        yield
        return
    os.setegid(65534)
    os.seteuid(65534)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)


def _refusal(url: str, *, create: bool) -> str:
    """The one line opening the store at ``url`` fails with, with permissions applying."""
    with _unprivileged():
        try:
            Store(url, create=create).list_runs()
        except StoreError as exc:
            return str(exc)
    raise AssertionError(f"{url} opened")


def _shared_folder() -> Path:
    """A folder the unprivileged child can reach: in /tmp itself (pytest's folders, and the session's
    ``TMPDIR`` inside them, are private to root)."""
    folder = Path(tempfile.mkdtemp(prefix="ftui-store-perm-", dir="/tmp"))
    folder.chmod(0o755)
    return folder


def test_read_only_file_and_unwritable_folder_are_one_line() -> None:
    folder = _shared_folder()
    try:
        db = folder / "ftui.db"
        url = f"sqlite:///{db}"
        Store(url).close()
        db.chmod(0o644)  # readable by the child, writable by its owner only; folder 0755
        assert _refusal(url, create=True) == f"--db {url}: {db} is read-only (ftui needs to write to it)"
        db.chmod(0o666)
        assert _refusal(url, create=True) == (f"--db {url}: folder {folder} is not writable (SQLite keeps its "
                                              "-wal and -shm files beside the database)")
        fresh = folder / "sub" / "ftui.db"
        (folder / "sub").mkdir(mode=0o755)
        assert _refusal(f"sqlite:///{fresh}", create=True) == (
            f"--db sqlite:///{fresh}: cannot create {fresh}: folder {folder / 'sub'} is not writable")
        deeper = folder / "sub" / "new" / "ftui.db"
        assert _refusal(f"sqlite:///{deeper}", create=True) == (
            f"--db sqlite:///{deeper}: cannot create folder {deeper.parent}: Permission denied")
        db.chmod(0o600)
        assert _refusal(url, create=False) == f"--db {url}: cannot read {db} (permission denied)"
        assert sorted(p.name for p in folder.iterdir()) == ["ftui.db", "sub"], "nothing created on refusal"
    finally:
        subprocess.run(["rm", "-rf", str(folder)], check=True)


def test_a_second_store_in_one_process_keeps_the_first_ones_locks(tmp_path: Path) -> None:
    """Opening a second store on the same SQLite file (the dashboard does, to record a detached watcher)
    must not drop the first one's POSIX locks: with them gone, another process's last close deleted the
    -shm file and every later query of the first store failed with "disk I/O error"."""
    import subprocess
    import sys

    url = f"sqlite:///{tmp_path / 'ftui.db'}"
    first = Store(url)
    run_id = first.create_run(name="a", recipe_text="", recipe_hash="", strategy="single", nproc=1, method="lora",
                              model="m", run_dir="")
    with first.engine.connect() as held:  # a connection of this process stays open, as the app's pool keeps one
        held.exec_driver_sql("SELECT 1").fetchall()
        Store(url).close()  # the second store: checks the file, opens, closes
        code = f"from store import Store; s = Store({url!r}); s.get_run(1); s.close()"
        subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])
        assert (tmp_path / "ftui.db-shm").exists()
        held.exec_driver_sql("SELECT count(*) FROM runs").fetchall()
    run = first.get_run(run_id)
    assert run is not None and run.name == "a"
