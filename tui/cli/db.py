"""``ftui db upgrade`` (bring the store's schema to this ftui's revision), ``ftui db current`` and ``ftui db
rebuild`` (record the run folders' runs that the store lacks: :mod:`runner.service.rebuild`)."""

from __future__ import annotations

import argparse
import json

from rich.text import Text

from runner.service.rebuild import rebuild
from runner.spec.paths import default_db_url, runs_dir
from store import StoreError, migrate
from tui.cli.common import console, open_store
from tui.cli.exits import ExitCode, UsageError
from tui.cli.recover import recover_quietly


def cmd_no_action(args: argparse.Namespace) -> int:
    """``ftui db`` alone."""
    raise UsageError("db: give an action: upgrade, current or rebuild")


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


def cmd_rebuild(args: argparse.Namespace) -> int:
    """``ftui db rebuild``: the runs of the run folders that the store lacks, recorded from their journals;
    then the usual recover settles those the folders show unfinished."""
    root = args.runs_dir or runs_dir()
    if not root.is_dir():
        raise UsageError(f"--runs-dir {root}: no such folder")
    store = open_store(args, create=True)
    done = rebuild(store, root)
    out = console(stderr=args.format == "json")
    recover_quietly(store, out)
    if args.format == "json":
        print(json.dumps([{"run_dir": str(r.run_dir), "run_id": r.run_id, "action": r.action, "detail": r.detail}
                          for r in done], indent=2))
        return ExitCode.OK
    for r in done:  # folder names and reasons are the user's text: never markup
        out.print(Text(f"{r.run_dir.name}: {r.action}" + (f" as run {r.run_id}" if r.run_id is not None else "")
                       + (f" ({r.detail})" if r.detail else "")), soft_wrap=True)
    added = sum(r.action == "added" for r in done)
    out.print(Text(f"{store.url}: {added} run(s) added from {len(done)} run folder(s) in {root}"), soft_wrap=True)
    return ExitCode.OK
