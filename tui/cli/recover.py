"""``ftui recover``: give runs whose watcher died a true status, or a new watcher (``runner.service.recover``)."""

from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.text import Text

from runner.service.queue import restart_runner
from runner.service.recover import Recovered, recover_all
from store import Store
from tui.cli.common import console, open_store
from tui.cli.exits import ExitCode


def cmd_recover(args: argparse.Namespace) -> int:
    store = open_store(args, create=False)
    done = recover_all(store, attach=not args.no_attach, fake_gpus=getattr(args, "fake_gpus", 0))
    runner = None if args.no_attach else restart_runner(store)  # entries that wait with no runner alive
    if args.format == "json":
        print(json.dumps([r.__dict__ for r in done], indent=2))
        return ExitCode.OK
    out = console()
    if not done and runner is None:
        out.print("nothing to recover: every running run has a live watcher")
    for line in recovered_lines(done):
        out.print(line)
    if runner is not None:
        out.print(f"queue: started this host's queue runner (pid {runner}) for the entries that wait", markup=False)
    return ExitCode.OK


def recovered_lines(done: list[Recovered], prefix: str = "") -> list[Text]:
    """One line per recovered run, as text (run text is never markup)."""
    return [Text(f"{prefix}run {r.run_id}: {r.action} -> {r.status}" + (f" ({r.detail})" if r.detail else ""))
            for r in done]


def recover_quietly(store: Store, out: Console | None = None) -> None:
    """The check every ``ftui`` and ``ftui run`` runs as it starts; prints a line per run it changed."""
    try:
        done = [r for r in recover_all(store) if r.action in ("finished", "attached", "error")]
    except Exception:  # noqa: BLE001 (never keep ftui from starting; `ftui recover` says why)
        return
    if out is not None:
        for line in recovered_lines(done, prefix="recover: "):
            out.print(line)
