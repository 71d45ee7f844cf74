"""The two store backends for tests: a SQLite file, and a real PostgreSQL server started for the session.

The server is Debian's PostgreSQL (``apt-get install postgresql``; .ci/run installs it): initdb in a temp
folder, as the ``postgres`` user when running as root (PostgreSQL refuses to run as root), listening on a
free loopback port. Without the binaries the PostgreSQL cases skip, naming what is missing.

Registered in conftest.py (``pytest_plugins``): a test asks for ``db_url`` and gets a SQLite file;
tests/system/test_store_on_postgresql.py runs every such test again with ``db_url`` on the server.
"""

from __future__ import annotations

import glob
import itertools
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

_counter = itertools.count()


def _pg_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    return Path(found[-1]).parent if found else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _as_server_user(argv: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """A running PostgreSQL server for the session; yields its base URL (no database name)."""
    bindir = _pg_bin()
    if bindir is None:
        pytest.skip("PostgreSQL binaries not found (/usr/lib/postgresql/*/bin/initdb): apt-get install postgresql")
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        pytest.skip("running as root without runuser: cannot start PostgreSQL as a non-root user")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        pytest.skip("psycopg not installed (pip install -e '.[postgres]')")
    root = Path(tempfile.mkdtemp(prefix="ftui-pg-", dir="/tmp"))  # the postgres user reaches it: not in pytest's private folders
    data = root / "data"
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
    port = _free_port()
    subprocess.run(_as_server_user([str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust",
                                    "--no-sync", "-E", "UTF8"]), check=True, capture_output=True)
    options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off"
    subprocess.run(_as_server_user([str(bindir / "pg_ctl"), "-D", str(data), "-o", options, "-l",
                                    str(root / "log"), "-w", "-t", "60", "start"]), check=True, capture_output=True)
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}"
    finally:
        subprocess.run(_as_server_user([str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"]),
                       capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def new_pg_database(base: str) -> str:
    """Create a fresh database on the server at ``base``; return its URL."""
    import psycopg

    name = f"ftui_test_{os.getpid()}_{next(_counter)}"
    dsn = base.replace("postgresql+psycopg://", "postgresql://") + "/postgres"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"{base}/{name}"


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    """A URL of an empty database: a SQLite file under tmp_path."""
    return f"sqlite:///{tmp_path / 'db' / 'ftui.db'}"
