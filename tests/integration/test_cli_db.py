"""``--db`` as a user meets it through the real command line: a bad path is one line and exit 2 (nothing
created), ``ftui db upgrade`` upgrades an old store and says from what to what, a newer store is refused.

What a command prints and its exit code, through the same ``main`` in this process (the real processes'
refusals: tests/integration/test_bad_arguments.py)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa

from store import migrate
from tests.support import CliResult
from tests.support.in_process import run_ftui
from tests.unit.test_store_migrations import _old_database

ROOT = Path(__file__).resolve().parents[2]


def _ftui(home: Path, *args: str) -> CliResult:
    """``ftui ARGS`` with FTUI_HOME=home and no FTUI_DB, as a fresh process runs it (in this process)."""
    env = {k: v for k, v in os.environ.items() if k != "FTUI_DB"} | {"FTUI_HOME": str(home)}
    return CliResult(*run_ftui(args, env, ROOT))


Cli = Callable[..., CliResult]


@pytest.fixture
def cli() -> Cli:
    """``ftui ARGS`` with FTUI_HOME=home and no FTUI_DB, in this process."""
    return _ftui


def _one_line(proc: CliResult) -> str:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    return proc.stderr.strip()


def test_read_commands_refuse_a_bad_db_in_one_line(tmp_path: Path, cli: Cli) -> None:
    home = tmp_path / "home"
    missing = f"sqlite:///{tmp_path / 'typo' / 'ftui.db'}"
    text = tmp_path / "notes.txt"
    text.write_text("hello\n" * 20)
    for argv in (["runs"], ["show", "1"], ["compare", "1"], ["db", "current"]):
        line = _one_line(cli(home, *argv, "--db", missing))
        assert line == f"ftui: --db {missing}: no such database (run something first, or check the path)", argv
        line = _one_line(cli(home, *argv, "--db", f"sqlite:///{tmp_path}"))
        assert line == f"ftui: --db sqlite:///{tmp_path}: {tmp_path} is a folder, not a database file", argv
        line = _one_line(cli(home, *argv, "--db", f"sqlite:///{text}"))
        assert line == f"ftui: --db sqlite:///{text}: {text} is not an SQLite database", argv
    assert not (tmp_path / "typo").exists() and not home.exists(), "a refused read creates nothing"
    assert text.read_text() == "hello\n" * 20


def test_the_default_store_is_created_on_first_use(tmp_path: Path) -> None:
    proc = _ftui(tmp_path, "runs", "--format", "json")
    assert (proc.returncode, proc.stdout.strip()) == (0, "[]"), proc.stderr
    assert (tmp_path / "ftui.db").is_file()


def test_db_upgrade_says_from_what_to_what(tmp_path: Path, cli: Cli) -> None:
    url = f"sqlite:///{tmp_path / 'old' / 'ftui.db'}"
    _old_database(url)
    proc = cli(tmp_path, "db", "current", "--db", url)
    assert proc.stdout.strip() == f"{url}: schema {migrate.BASELINE} (this ftui knows up to {migrate.HEAD})"
    proc = cli(tmp_path, "db", "upgrade", "--db", url)
    assert (proc.returncode, proc.stdout.strip()) == (0, f"{url}: schema {migrate.BASELINE} -> {migrate.HEAD}")
    proc = cli(tmp_path, "--db", url, "db", "upgrade")
    assert proc.stdout.strip() == f"{url}: schema {migrate.HEAD} -> {migrate.HEAD} (already current)"
    proc = cli(tmp_path, "runs", "--db", url, "--format", "json")
    assert proc.returncode == 0 and proc.stdout.count('"name"') == 2, "the old runs are listed after the upgrade"
    fresh = f"sqlite:///{tmp_path / 'new.db'}"
    assert cli(tmp_path, "db", "upgrade", "--db", fresh).stdout.strip() == f"{fresh}: schema none -> {migrate.HEAD} (created)"


def test_a_newer_store_is_refused_by_every_command(tmp_path: Path, cli: Cli) -> None:
    url = f"sqlite:///{tmp_path / 'ftui.db'}"
    assert cli(tmp_path, "db", "upgrade", "--db", url).returncode == 0
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE {migrate.VERSION_TABLE} SET version_num = '0042'"))
    engine.dispose()
    expected = (f"ftui: --db {url}: database schema 0042 is newer than this ftui (knows up to {migrate.HEAD}); "
                "upgrade ftui")
    for argv in (["runs"], ["db", "upgrade"]):
        assert _one_line(cli(tmp_path, *argv, "--db", url)) == expected
    assert cli(tmp_path, "db", "current", "--db", url).stdout.strip().startswith(f"{url}: schema 0042 ")
