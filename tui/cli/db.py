"""``ftui db upgrade`` (bring the store's schema to this ftui's revision) and ``ftui db current``."""

from __future__ import annotations

import argparse

from runner.spec.paths import default_db_url
from store import StoreError, migrate
from tui.cli.exits import ExitCode, UsageError


def cmd_no_action(args: argparse.Namespace) -> int:
    """``ftui db`` alone."""
    raise UsageError("db: give an action: upgrade or current")


def _url(args: argparse.Namespace) -> str:
    return getattr(args, "db", None) or default_db_url()


def cmd_upgrade(args: argparse.Namespace) -> int:
    url = _url(args)
    try:
        before, after = migrate.upgrade(url)
    except StoreError as exc:
        raise UsageError(str(exc)) from None
    note = " (created)" if before is None else " (already current)" if before == after else ""
    print(f"{url}: schema {before or 'none'} -> {after}{note}")
    return ExitCode.OK


def cmd_current(args: argparse.Namespace) -> int:
    url = _url(args)
    try:
        revision = migrate.current(url)
    except StoreError as exc:
        raise UsageError(str(exc)) from None
    newest = f"this ftui knows up to {migrate.HEAD}"
    print(f"{url}: schema {revision or 'none (no ftui tables)'} ({newest})")
    return ExitCode.OK
