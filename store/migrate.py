"""Schema versions: the database records its Alembic revision; the store upgrades an older one in place.

Revisions live in ``store/migrations/versions/`` (shipped inside the package, so an installed ftui can
upgrade its own database). A database made before migrations existed (ftui's tables, no version table) is
recognised, stamped at :data:`BASELINE` and upgraded. A database newer than this code is refused, never
touched. An upgrade runs in one transaction under a lock (SQLite ``BEGIN IMMEDIATE``, a PostgreSQL advisory
lock), so two processes opening an old database at once upgrade it once.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection, Engine, inspect, text

from store.engine import StoreError, describe_error, lock_timeout_from_env, open_engine, retry_locked

if TYPE_CHECKING:  # Alembic is imported only to upgrade: it costs ~0.3 s, and most opens find the schema current
    from alembic.config import Config
    from alembic.script import ScriptDirectory

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
VERSION_TABLE = "ftui_alembic_version"
"""Not Alembic's default ``alembic_version``: a shared PostgreSQL database may hold another program's."""
REVISIONS = ("0001", "0002", "0003", "0004", "0005", "0006", "0007", "0008", "0009")
"""Every revision this code knows, oldest first (a test checks it against ``migrations/versions``)."""
BASELINE = REVISIONS[0]
HEAD = REVISIONS[-1]
_ADVISORY_LOCK = 0x66747569  # "ftui": serialises upgrades across PostgreSQL clients


class SchemaError(RuntimeError):
    """The database's schema cannot be used by this code (the message is one line, without the URL)."""


class NoDatabase(SchemaError):
    """The database holds no ftui tables and the caller asked not to create them."""


def script_directory() -> ScriptDirectory:
    """The migration scripts shipped with this ftui."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config(None))


def alembic_config(connection: Connection | None) -> Config:
    """An Alembic config for the shipped scripts, running on ``connection`` (the caller's transaction)."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = connection
    return config


def stored_revision(connection: Connection) -> str | None:
    """The revision recorded in the database, or None (no version table, or an empty one)."""
    if not inspect(connection).has_table(VERSION_TABLE):
        return None
    return connection.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar()


def _state(connection: Connection) -> tuple[str | None, bool]:
    """(stored revision, whether ftui's pre-migration tables are present)."""
    return stored_revision(connection), inspect(connection).has_table("runs")


def _check_known(revision: str | None) -> None:
    if revision is not None and revision not in REVISIONS:
        raise SchemaError(f"database schema {revision} is newer than this ftui (knows up to {HEAD}); upgrade ftui")


def ensure_current(engine: Engine, *, create: bool = True) -> tuple[str | None, str] | None:
    """Bring the database at ``engine`` to :data:`HEAD`; return (from, to) when it changed anything.

    Args:
        engine: The store's engine (for SQLite, one whose ``ftui_write`` connections begin IMMEDIATE).
        create: Create the tables in a database that has none; when False such a database raises
            :class:`NoDatabase` (read commands never create a store).

    Raises:
        SchemaError: The database is newer than this code.
    """
    with engine.connect() as conn:  # the common case, already current: one read, no lock
        revision, has_runs = _state(conn)
        conn.rollback()
    if revision == HEAD:
        return None
    _check_known(revision)
    if revision is None and not has_runs and not create:
        raise NoDatabase("holds no ftui data")
    return _upgrade_locked(engine)


def _upgrade_locked(engine: Engine) -> tuple[str | None, str] | None:
    from alembic import command

    sqlite = engine.dialect.name == "sqlite"
    with engine.execution_options(ftui_write=True).connect() as conn:
        if sqlite:
            # A batch migration rebuilds ``runs`` (copy, drop, rename): with foreign keys on, the drop
            # would cascade into every metric and event. The pragma only works outside a transaction.
            _raw_sqlite(conn, "PRAGMA foreign_keys=OFF")
        try:
            with conn.begin():
                if not sqlite:
                    conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _ADVISORY_LOCK})
                revision, has_runs = _state(conn)  # again, under the lock: another process may have won
                _check_known(revision)
                if revision == HEAD:
                    return None
                config = alembic_config(conn)
                if revision is None and has_runs:
                    command.stamp(config, BASELINE)
                    revision = BASELINE
                command.upgrade(config, HEAD)
                if sqlite:
                    broken = conn.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
                    if broken:
                        raise SchemaError(f"upgrade left {len(broken)} broken foreign keys; nothing was changed")
            return revision, HEAD
        finally:
            if sqlite:
                _raw_sqlite(conn, "PRAGMA foreign_keys=ON")


def _raw_sqlite(conn: Connection, sql: str) -> None:
    """Run ``sql`` on the driver connection itself, outside SQLAlchemy's transaction."""
    driver = conn.connection.driver_connection
    assert driver is not None
    driver.execute(sql)


def upgrade(url: str) -> tuple[str | None, str]:
    """Upgrade the database at ``url`` to this code's newest revision (``ftui db upgrade``).

    Creates the store when there is none (like ``ftui run``).

    Returns:
        (revision before, revision after): before is None for a database that had no ftui tables, and
        equals after when there was nothing to do.

    Raises:
        StoreError: One line naming the database (unreachable, not a database, newer than this code).
    """
    timeout = lock_timeout_from_env()
    engine = open_engine(url, create=True, lock_timeout=timeout)
    try:
        return retry_locked(lambda: ensure_current(engine), url, timeout) or (HEAD, HEAD)
    except SchemaError as exc:
        raise StoreError(f"--db {url}: {exc}") from None
    except StoreError:
        raise
    except Exception as exc:  # noqa: BLE001 (any driver problem becomes one line)
        raise StoreError(describe_error(url, exc)) from None
    finally:
        engine.dispose()


def current(url: str) -> str | None:
    """The revision of the database at ``url``, without changing it (None: it holds no ftui tables).

    A database from before migrations (ftui's tables, no version table) is at :data:`BASELINE`.

    Raises:
        store.StoreError: No such database, or it cannot be reached or read (one line naming it).
    """
    engine = open_engine(url, create=False)
    try:
        with engine.connect() as conn:
            revision, has_runs = _state(conn)
        return BASELINE if revision is None and has_runs else revision
    except Exception as exc:  # noqa: BLE001 (any driver problem becomes one line)
        raise StoreError(describe_error(url, exc)) from None
    finally:
        engine.dispose()
