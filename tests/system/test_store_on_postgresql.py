"""The store's tests, again on a real PostgreSQL server.

Every test of the modules below that takes ``db_url`` runs here a second time, with ``db_url`` a fresh
database on the session's server (tests/support/postgres.py) instead of a SQLite file. The tests are the
same functions, collected under this module's name with their module as a prefix, so the two backends
can never drift apart in what they are held to.
"""

from __future__ import annotations

import inspect
from types import ModuleType

import pytest

from tests.integration import test_nodes, test_store_concurrency, test_store_scale
from tests.support.postgres import new_pg_database
from tests.unit import (
    test_named_metrics,
    test_store,
    test_store_migrations,
    test_store_nodes,
    test_store_queue,
)

MODULES: tuple[ModuleType, ...] = (test_store, test_store_migrations, test_named_metrics, test_store_nodes,
                                   test_store_queue, test_store_concurrency, test_store_scale, test_nodes)


def _store_tests(module: ModuleType) -> dict[str, object]:
    """The module's tests that take ``db_url``, named ``test_<module>__<test>``."""
    short = module.__name__.rsplit(".", 1)[-1].removeprefix("test_")
    found: dict[str, object] = {}
    for name, obj in vars(module).items():
        if name.startswith("test_") and callable(obj) and "db_url" in inspect.signature(obj).parameters:
            found[f"test_{short}__{name.removeprefix('test_')}"] = obj
    return found


for _module in MODULES:
    globals().update(_store_tests(_module))


@pytest.fixture
def db_url(pg_server: str) -> str:
    """A fresh, empty database on the session's PostgreSQL server."""
    return new_pg_database(pg_server)


def test_every_store_module_brings_its_tests() -> None:
    """A module that lost its ``db_url`` tests (renamed fixture, moved file) would silently test nothing here."""
    for module in MODULES:
        assert any(name.startswith("test_") for name in _store_tests(module)), module.__name__
