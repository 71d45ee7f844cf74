"""Opening a database: the engine, the checks before connecting, SQLite's settings, and lock retries.

A problem is one line for the user, ``--db URL: reason`` (:class:`StoreError`). SQLite write
transactions begin IMMEDIATE (they queue for the write lock instead of failing when another writer
committed after they read); a call that still finds the database locked is retried whole, with backoff,
for up to the lock timeout (:func:`retry_locked`).
"""

from __future__ import annotations

import functools
import json
import math
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from sqlalchemy import Connection, Engine, create_engine, event, make_url
from sqlalchemy.exc import OperationalError

from runner.hardware.disks import is_full, is_no_space, no_space

_R = TypeVar("_R")


class StoreError(RuntimeError):
    """A store problem phrased for the user: one line, ``--db URL: reason``."""


LOCK_TIMEOUT_S = 120.0
"""How long a store call waits out another client's lock before it gives up (``FTUI_DB_LOCK_TIMEOUT``)."""
_BUSY_TIMEOUT_MS = 10_000
"""SQLite's own wait per statement (at most the lock timeout); the retry loop around each call covers
the rest of the budget."""
_LOCK_WORDS = ("database is locked", "database table is locked", "database is busy", "deadlock detected",
               "could not serialize access")



def lock_timeout_from_env() -> float:
    """``FTUI_DB_LOCK_TIMEOUT`` in seconds, or :data:`LOCK_TIMEOUT_S`."""
    text = os.environ.get("FTUI_DB_LOCK_TIMEOUT", "")
    try:
        return max(0.0, float(text)) if text else LOCK_TIMEOUT_S
    except ValueError:
        raise StoreError(f"FTUI_DB_LOCK_TIMEOUT: expected seconds, got {text!r}") from None


def is_lock_error(exc: OperationalError) -> bool:
    """Whether a driver error says another client holds a lock (worth retrying the transaction)."""
    message = str(exc.orig or exc).lower()
    return any(word in message for word in _LOCK_WORDS)


RETRY_FIRST_DELAY_S = 0.05
"""The first pause of :func:`retry_locked` after a locked call; each next pause doubles, up to
:data:`RETRY_MAX_DELAY_S`."""
RETRY_MAX_DELAY_S = 1.0


def retry_delays(first: float = RETRY_FIRST_DELAY_S, most: float = RETRY_MAX_DELAY_S) -> Iterator[float]:
    """The backoff of :func:`retry_locked`: ``first``, doubled each time, capped at ``most``."""
    delay = first
    while True:
        yield delay
        delay = min(delay * 2, most)


def retry_locked(call: Callable[[], _R], url: str, lock_timeout: float, *,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> _R:
    """Run ``call`` (one whole transaction), again while the database is locked, for up to ``lock_timeout``
    seconds on ``clock``, pausing (``sleep``) with backoff (:func:`retry_delays`) between tries.

    Raises:
        StoreError: Still locked by another client when the time is up.
    """
    deadline = clock() + lock_timeout
    delays = retry_delays()
    while True:
        try:
            return call()
        except OperationalError as exc:
            if full_disk(url, exc):  # one line naming the disk, not the driver's traceback
                raise StoreError(describe_error(url, exc)) from None
            if not is_lock_error(exc):
                raise
            left = deadline - clock()
            if left <= 0:
                raise StoreError(
                    f"--db {url}: database still locked by another program after "
                    f"{lock_timeout:g} s (FTUI_DB_LOCK_TIMEOUT)"
                ) from None
            sleep(min(next(delays), left))


def database_path(url: str) -> Path | None:
    """The file of an SQLite database (None for a server, memory, or a URL that does not parse)."""
    try:
        parsed = make_url(url)
    except Exception:  # noqa: BLE001
        return None
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database or "")


def full_disk(url: str, exc: BaseException) -> bool:
    """Whether a driver error comes from a full disk: SQLite's "database or disk is full", or its "disk I/O
    error" (what a full disk gives while the -wal or -shm file is made) where the database's disk is full."""
    if is_no_space(exc):
        return True
    path = database_path(url)
    return path is not None and "disk i/o error" in str(exc).lower() and is_full(path)


def describe_error(url: str, exc: BaseException) -> str:
    """``--db URL: reason`` in one line for a driver error met while opening or reading a database."""
    reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    lower = reason.lower()
    if "file is not a database" in lower:
        reason = "not an SQLite database (file is not a database)"
    elif "readonly database" in lower or "read-only" in lower:
        reason = "read-only database (ftui needs to write to it, and SQLite to its -wal/-shm files beside it)"
    elif full_disk(url, exc):
        path = database_path(url)
        reason = no_space(path) if path is not None else "no space left on the database server's disk"
    elif "unable to open database file" in lower:
        reason = "cannot open the database file (check the path, and that its folder is writable)"
    # SQLAlchemy appends "(Background on this error at: ...)" on a line of its own: dropped above.
    return f"--db {url}: {reason}"


def open_engine(url: str, *, create: bool, lock_timeout: float = LOCK_TIMEOUT_S) -> Engine:
    """An engine for ``url`` after checking what can be checked before connecting, then connecting once.

    For SQLite: a missing file is created (mode 0600, missing folders 0700) only when ``create``;
    a folder, a file that is not SQLite, a read-only file (when ``create``: a writing command) or an
    unwritable folder is refused. Every refusal is one line ``--db URL: reason``.

    Raises:
        StoreError: The database cannot be used (see above), the URL is malformed, or the server refuses.
    """
    try:
        parsed = make_url(url)
    except Exception as exc:  # noqa: BLE001
        raise StoreError(f"--db {url}: not a database URL ({exc})") from None
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        _check_sqlite_file(url, Path(parsed.database or ""), create=create)
    try:
        if parsed.get_backend_name() == "sqlite":
            engine = create_engine(url)
        else:
            engine = create_engine(url, json_serializer=_strict_json)
    except Exception as exc:  # noqa: BLE001 (a missing driver or a bad URL becomes one line)
        raise StoreError(f"--db {url}: {exc}") from None
    if engine.dialect.name == "sqlite":
        busy_ms = int(min(_BUSY_TIMEOUT_MS, lock_timeout * 1000))
        event.listen(engine, "connect", functools.partial(sqlite_pragmas, busy_ms=busy_ms))
        event.listen(engine, "begin", _sqlite_begin)
    return engine


def _strict_json(value: Any) -> str:
    """JSON for servers that hold strict JSON (PostgreSQL): NaN and infinities, which Python writes and
    PostgreSQL refuses (a diverged loss, an empty run's final loss), become null."""
    try:
        return json.dumps(value, allow_nan=False)
    except ValueError:
        return json.dumps(_finite(value), allow_nan=False)


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _is_sqlite(path: Path) -> bool:
    """Whether ``path`` holds an SQLite database (an empty file counts: SQLite makes it one).

    Asked through SQLite itself, never with ``open()``: closing any file descriptor of a database file
    drops every POSIX lock this process holds on it (fcntl semantics), so a process that already has a
    connection (the dashboard, which opens a second store to record a detached watcher) would lose its
    locks, another process would take itself for the last connection and delete the -shm file, and every
    later query here would fail with "disk I/O error". SQLite shares one descriptor per file within a
    process and never closes it under a lock.
    """
    import sqlite3

    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.Error:
        return True  # cannot open read-only here (e.g. no -shm access): let the real open say why
    try:
        conn.execute("PRAGMA schema_version").fetchone()
        return True
    except sqlite3.DatabaseError as exc:
        return "not a database" not in str(exc)
    finally:
        conn.close()


def _check_sqlite_file(url: str, path: Path, *, create: bool) -> None:
    def refuse(reason: str) -> NoReturn:
        raise StoreError(f"--db {url}: {reason}")

    if path.is_dir():
        refuse(f"{path} is a folder, not a database file")
    if path.exists():
        if not path.is_file():
            refuse(f"{path} is not a regular file")
        if not os.access(path, os.R_OK, effective_ids=True):
            refuse(f"cannot read {path} (permission denied)")
        if not _is_sqlite(path):
            refuse(f"{path} is not an SQLite database")
        if create and not os.access(path, os.W_OK, effective_ids=True):
            refuse(f"{path} is read-only (ftui needs to write to it)")
        if create and not os.access(path.parent, os.W_OK | os.X_OK, effective_ids=True):
            refuse(f"folder {path.parent} is not writable (SQLite keeps its -wal and -shm files beside the database)")
        return
    if not create:
        refuse("no such database (run something first, or check the path)")
    _make_private_folders(url, path.parent)
    if not os.access(path.parent, os.W_OK | os.X_OK, effective_ids=True):
        refuse(f"cannot create {path}: folder {path.parent} is not writable")
    try:
        # An empty file is a valid empty SQLite database; creating it here sets its mode, and SQLite
        # gives the -wal and -shm files the database file's mode.
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        pass  # another process created it meanwhile
    except OSError as exc:
        refuse(f"cannot create {path}: {exc.strerror}")


def _make_private_folders(url: str, folder: Path) -> None:
    """Create ``folder`` and its missing parents, mode 0700 (run records are the user's own)."""
    missing: list[Path] = []
    probe = folder
    while not probe.exists():
        missing.append(probe)
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise StoreError(f"--db {url}: cannot create folder {folder}: {probe} is a file")
    for each in reversed(missing):
        try:
            each.mkdir(mode=0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            raise StoreError(f"--db {url}: cannot create folder {each}: {exc.strerror}") from None
        os.chmod(each, 0o700)  # mkdir's mode is filtered by the umask


def sqlite_pragmas(dbapi_connection: Any, _record: Any, busy_ms: int = _BUSY_TIMEOUT_MS) -> None:
    """Per-connection SQLite settings: WAL, foreign keys, a busy wait; transactions begun by SQLAlchemy."""
    # The driver's own implicit BEGIN would skip DDL and cannot be IMMEDIATE; _sqlite_begin emits it.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute(f"PRAGMA busy_timeout={int(busy_ms)}")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def _sqlite_begin(conn: Connection) -> None:
    conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get("ftui_write") else "BEGIN")
