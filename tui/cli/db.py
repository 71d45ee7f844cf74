"""``ftui db upgrade`` (bring the store's schema to this ftui's revision) and ``ftui db current``."""

from __future__ import annotations

import argparse
from typing import Any

from tui.cli.common import ExitCode, UsageError, db_option


def add_parser(sub: Any) -> None:
    db = sub.add_parser("db", help="the store's schema version: upgrade it, or show it")
    db_option(db)
    db.set_defaults(handler=lambda args: _usage(db))
    actions = db.add_subparsers(title="actions", metavar="ACTION")
    upgrade = actions.add_parser("upgrade", help="upgrade the database to this ftui's schema (creates it if missing)")
    db_option(upgrade)
    upgrade.set_defaults(handler=cmd_upgrade)
    current = actions.add_parser("current", help="print the database's schema revision")
    db_option(current)
    current.set_defaults(handler=cmd_current)


def _usage(parser: argparse.ArgumentParser) -> int:
    raise UsageError("db: give an action: upgrade or current")


def _url(args: argparse.Namespace) -> str:
    from runner.spec.paths import default_db_url

    return getattr(args, "db", None) or default_db_url()


def cmd_upgrade(args: argparse.Namespace) -> int:
    from store import StoreError, migrate

    url = _url(args)
    try:
        before, after = migrate.upgrade(url)
    except StoreError as exc:
        raise UsageError(str(exc)) from None
    note = " (created)" if before is None else " (already current)" if before == after else ""
    print(f"{url}: schema {before or 'none'} -> {after}{note}")
    return ExitCode.OK


def cmd_current(args: argparse.Namespace) -> int:
    from store import StoreError, migrate

    url = _url(args)
    try:
        revision = migrate.current(url)
    except StoreError as exc:
        raise UsageError(str(exc)) from None
    newest = f"this ftui knows up to {migrate.HEAD}"
    print(f"{url}: schema {revision or 'none (no ftui tables)'} ({newest})")
    return ExitCode.OK
