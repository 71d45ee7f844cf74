"""Fixtures every level shares, and the level of each test, read from its folder.

- ``tests/unit``: pure functions and the store on SQLite, in-process.
- ``tests/integration``: real subprocesses (the watcher with scripted ranks, the CLI on a store, the
  dashboard under Textual's pilot), no model trained.
- ``tests/e2e``: real ``ftui`` commands training real models on CPU.
- ``tests/system``: the servers and binaries of a real machine: PostgreSQL, SLURM, tmux, Chromium.

Each test gets its level as a marker (``pytest -m unit``); the fast loop is
``python -m pytest tests/unit tests/integration``.

The suite runs on pytest-xdist workers (``-n auto --dist loadgroup`` in pyproject.toml): a session fixture
is made once per worker, so the tests that share something made once go to one worker as a group
(:data:`GROUPS`), and the warm cache is one folder for all workers.
"""

from __future__ import annotations

import gc
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import Ftui, new_home

pytest_plugins = ["tests.support.postgres", "tests.support.slurm_cluster", "tests.support.dashboard",
                  "tests.support.matrix"]

LEVELS = ("unit", "integration", "e2e", "system")
GROUPS = {"matrix": "matrix", "script_runs": "matrix", "slurm_cluster": "slurm"}
"""Fixture -> xdist group: every test of the shared matrix of real runs on one worker (it is trained once;
the your-own-script runs, which one of its tests compares with it, with it), and the one SLURM cluster of
the machine (its daemons, munge) on one worker."""
MAX_WORKERS = 4
"""``-n auto``: a worker per core, at most this many (each two-rank training uses two cores). A third
worker on the 2-core machine did not make the suite faster (docs/testing.md)."""

# OpenMP threads that wait yield their core instead of spinning. ftui gives its CPU ranks this itself; the
# session sets it for its own processes that are not ranks (the workers' in-process torch, the maths-library
# probe), which run while the other worker's ranks train on the same cores: a spinning thread takes the core
# a rank needs (five quickstart steps on a loaded 2-core machine: 17.0 s of CPU spinning, 8.6 s yielding;
# docs/testing.md). Set here, at import, so the workers and the commands they run inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@pytest.fixture(scope="session", autouse=True)
def warm_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One cache folder (``FTUI_CACHE``: the builtin tokenizer, tokenized data, the CPU's measured peak)
    for every home of the session, so each is built once; a test of the cache itself sets its own."""
    shared = os.environ.get("PYTEST_XDIST_WORKER") is not None  # workers share the parent of their basetemps
    path = (tmp_path_factory.getbasetemp().parent / "ftui-cache" if shared else tmp_path_factory.mktemp("ftui-cache"))
    path.mkdir(exist_ok=True)
    saved = os.environ.get("FTUI_CACHE")
    os.environ["FTUI_CACHE"] = str(path)
    yield path
    if saved is None:
        os.environ.pop("FTUI_CACHE", None)
    else:
        os.environ["FTUI_CACHE"] = saved


@pytest.fixture(scope="session", autouse=True)
def session_tmpdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The system's temporary folder for the session (``TMPDIR``, and this process's ``tempfile``): what the
    commands leave there (a dry run's launch files) goes with pytest's own folders."""
    path = tmp_path_factory.mktemp("tmp")
    saved, saved_dir = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"], tempfile.tempdir = str(path), str(path)
    yield path
    tempfile.tempdir = saved_dir
    if saved is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = saved


@pytest.fixture(scope="session")
def ftui(tmp_path_factory: pytest.TempPathFactory) -> Ftui:
    return new_home(tmp_path_factory.mktemp("ftui-home"))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The level marker, and the xdist group: first, before xdist's worker reads the groups into node ids
    (a conftest's hook would otherwise run after the worker plugin's, and every group would be empty)."""
    tests = Path(__file__).parent
    for item in items:
        level = item.path.relative_to(tests).parts[0]
        if level in LEVELS:
            item.add_marker(getattr(pytest.mark, level))
        groups = {GROUPS[name] for name in getattr(item, "fixturenames", ()) if name in GROUPS}
        if groups:
            item.add_marker(pytest.mark.xdist_group(name="+".join(sorted(groups))))


FREEZE_AFTER_MODULES = 50
"""A test that imported at least this many modules (torch, transformers, textual, a planner's models) has its
process's live objects frozen after it (:func:`pytest_runtest_teardown`)."""
_modules_frozen = [0]


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze what collection left alive (the modules the tests import: torch, transformers, textual and their
    objects, millions of them): the garbage collector's full passes (about 25 in a run of ``tests/unit``, and
    pytest's five at the session's end) then skip them. Each walked that whole heap: ``tests/unit`` with
    ``-n 0`` spent 8.2 s of process time in the collector, 4.8 s frozen (``gc.callbacks``; docs/testing.md,
    "What the fast loop pays for")."""
    _freeze()


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After a test that imported many modules (torch or textual on first use), freeze those too."""
    if len(sys.modules) - _modules_frozen[0] >= FREEZE_AFTER_MODULES:
        gc.collect()  # what is garbage now is freed, not frozen
        _freeze()


def _freeze() -> None:
    _modules_frozen[0] = len(sys.modules)
    gc.freeze()


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    return max(1, min(MAX_WORKERS, os.cpu_count() or 1))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """With ``FTUI_REQUIRE_SYSTEM=1`` (``.ci/run`` sets it) a system test that skips fails instead: a
    missing install step must not pass silently."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and item.get_closest_marker("system") and os.environ.get("FTUI_REQUIRE_SYSTEM") == "1":
        report.outcome = "failed"
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.longrepr = f"system test skipped where it must run (FTUI_REQUIRE_SYSTEM=1): {reason}"
