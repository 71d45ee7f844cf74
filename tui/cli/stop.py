"""``ftui stop ID [--kill]``: stop a run started anywhere on this host (``ftui run`` in another
terminal, or the dashboard), gracefully or at once, and say what was checked; a run on other machines
(several nodes, a SLURM job) through the store's stop requests (:func:`runner.service.stop.request_stop`)."""

from __future__ import annotations

import argparse

from runner.service.stop import StopRefused, request_stop
from tui.cli.common import console, open_store
from tui.cli.exits import ExitCode, UsageError


def cmd_stop(args: argparse.Namespace) -> int:
    store = open_store(args, create=False)  # stops a recorded run: a missing --db is a typo
    out = console()

    def say_asked(asked: str) -> None:  # before the wait, which lasts as long as the ranks' save
        out.print(f"run {args.run_id}: {asked}; waiting for it to record the end", markup=False)

    try:
        result = request_stop(store, args.run_id, kill=args.kill, grace_s=args.grace, on_asked=say_asked)
    except StopRefused as exc:
        raise UsageError(str(exc)) from None
    out.print(f"run {result.run_id}: {result.status}", markup=False)
    out.print(result.how, markup=False)
    if result.report is not None and not result.report.verified or result.status == "running":
        return ExitCode.FAILED  # (running: a run elsewhere that did not stop within the wait)
    return ExitCode.OK
