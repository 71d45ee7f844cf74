"""What the commands' handlers share: opening the store named by ``--db``, and the console."""

from __future__ import annotations

import argparse
import os

from rich.console import Console

from runner.spec.paths import FolderError, default_db_url, home, make_private_dir
from store import Store, StoreError
from tui.cli.exits import UsageError


def open_store(args: argparse.Namespace, *, create: bool) -> Store:
    """The store named by ``--db`` (default: ``$FTUI_DB``, else SQLite in the data folder).

    ``create``: commands that record runs create a missing database; read commands refuse a missing one
    named by ``--db`` or ``$FTUI_DB`` in one line (a mistyped path must not leave an empty database behind
    and show "no runs"). The default database is created on first use by any command.
    """
    chosen = getattr(args, "db", None) or os.environ.get("FTUI_DB")
    try:
        if not chosen:
            make_private_dir(home())  # the data folder is created mode 0700 (before SQLite creates it)
        return Store(chosen or default_db_url(), create=create or not chosen)
    except (StoreError, FolderError) as exc:
        raise UsageError(str(exc)) from None


def settle_abandoned(store: Store) -> None:
    """Before a read: the runs of this host left ``running`` or ``created`` by a watcher that died are
    settled as ``ftui recover --no-attach`` settles them (their end from the journal; a run whose ranks
    still live stays ``running``), so a read never shows a run running whose processes are gone. A read
    goes on whatever this meets (a read-only database, say)."""
    if not any(store.list_runs(status=status, limit=1) for status in ("running", "created")):
        return
    from runner.service.recover import recover_all  # deferred: pydantic, only when a run may be abandoned

    try:
        recover_all(store, attach=False)
    except Exception:  # noqa: BLE001 (the read is what was asked; recovery is a courtesy of it)
        return


def console(stderr: bool = False) -> Console:
    """A rich console for the CLI's output. Text that comes from a run or a user is passed to it as
    ``rich.text.Text`` (or with ``markup=False``), never as markup."""
    return Console(stderr=stderr, highlight=False)
