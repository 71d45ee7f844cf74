"""``ftui recover``: give runs whose watcher died a true status, or a new watcher (``runner.service.recover``)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from tui.cli.common import ExitCode, console, db_option, open_store


def add_parser(sub: Any) -> None:
    rec = sub.add_parser(
        "recover", help="re-attach or finish runs whose watcher died",
        description="Runs left 'running' by a watcher that died (ftui killed, a reboot): re-read their run "
                    "folders into the store, then re-attach a watcher if the ranks still train, else set the "
                    "status the journal and the processes say. Safe to run any time, and twice.")
    rec.add_argument("--no-attach", action="store_true", help="do not start a watcher for runs still training")
    rec.add_argument("--format", choices=["text", "json"], default="text")
    db_option(rec)
    rec.set_defaults(handler=cmd_recover)


def cmd_recover(args: argparse.Namespace) -> int:
    from runner.service.recover import recover_all

    store = open_store(args, create=False)
    done = recover_all(store, attach=not args.no_attach, fake_gpus=getattr(args, "fake_gpus", 0))
    if args.format == "json":
        print(json.dumps([r.__dict__ for r in done], indent=2))
        return ExitCode.OK
    out = console()
    if not done:
        out.print("nothing to recover: every running run has a live watcher")
    for line in recovered_lines(done):
        out.print(line)
    return ExitCode.OK


def recovered_lines(done: list[Any], prefix: str = "") -> list[Any]:
    """One line per recovered run, as text (run text is never markup)."""
    from rich.text import Text

    return [Text(f"{prefix}run {r.run_id}: {r.action} -> {r.status}" + (f" ({r.detail})" if r.detail else ""))
            for r in done]


def recover_quietly(store: Any, out: Any = None) -> None:
    """The check every ``ftui`` and ``ftui run`` runs as it starts; prints a line per run it changed."""
    from runner.service.recover import recover_all

    try:
        done = [r for r in recover_all(store) if r.action in ("finished", "attached", "error")]
    except Exception:  # noqa: BLE001 (never keep ftui from starting; `ftui recover` says why)
        return
    if out is not None:
        for line in recovered_lines(done, prefix="recover: "):
            out.print(line)
