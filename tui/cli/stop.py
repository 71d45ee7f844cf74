"""``ftui stop ID [--kill]``: stop a run started anywhere on this host (``ftui run`` in another
terminal, or the dashboard), gracefully or at once, and say what was checked; a run on other machines
(several nodes, a SLURM job) through the store's stop requests (:func:`runner.service.stop.request_stop`)."""

from __future__ import annotations

import argparse
from typing import Any

from tui.cli.common import (
    ExitCode,
    UsageError,
    console,
    db_option,
    open_store,
    positive_int,
    seconds_at_least,
)


def add_parser(sub: Any) -> None:
    stop = sub.add_parser(
        "stop", help="stop a running run (graceful; --kill: at once)",
        description="Stop a run on this host: its ranks finish their step, save and exit; after the grace period "
                    "whatever is left gets SIGKILL. Afterwards no process of the run is left (checked).")
    stop.add_argument("run_id", type=positive_int, metavar="ID", help="the run (ftui runs lists them)")
    stop.add_argument("--kill", action="store_true", help="SIGKILL every process of the run now (status failed)")
    stop.add_argument("--grace", type=seconds_at_least(0), default=30.0, metavar="SECONDS",
                      help="seconds the ranks get before SIGKILL (default 30)")
    db_option(stop)
    stop.set_defaults(handler=cmd_stop)


def cmd_stop(args: argparse.Namespace) -> int:
    from runner.service.stop import StopRefused, request_stop

    store = open_store(args, create=False)  # stops a recorded run: a missing --db is a typo
    try:
        result = request_stop(store, args.run_id, kill=args.kill, grace_s=args.grace)
    except StopRefused as exc:
        raise UsageError(str(exc)) from None
    out = console()
    out.print(f"run {result.run_id}: {result.status}", markup=False)
    out.print(result.how, markup=False)
    if result.report is not None and not result.report.verified or result.status == "running":
        return ExitCode.FAILED  # (running: a run elsewhere that did not stop within the wait)
    return ExitCode.OK
