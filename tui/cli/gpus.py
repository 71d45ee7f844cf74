"""``ftui gpus``: the devices now (like nvidia-smi / gpustat); ``--watch`` refreshes."""

from __future__ import annotations

import argparse
import time
from typing import Any

from tui.cli.common import db_option


def add_parser(sub: Any) -> None:
    gpus = sub.add_parser("gpus", help="show the GPUs now (or the host's CPU/memory without NVML)")
    gpus.add_argument("--watch", nargs="?", const=1.0, type=_seconds, metavar="SECONDS",
                      help="refresh every SECONDS (default 1) until Ctrl-C")
    db_option(gpus)  # unused, but every command takes --db (scripts pass it everywhere)
    gpus.set_defaults(handler=cmd_gpus)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0.05 <= value <= 3600:  # also refuses nan and inf
        raise argparse.ArgumentTypeError(f"expected seconds between 0.05 and 3600, got {text!r}")
    return value


def cmd_gpus(args: argparse.Namespace) -> int:
    from rich.console import Console

    from runner.watch.host import probe_for

    probe = probe_for(getattr(args, "fake_gpus", 0))
    console = Console(highlight=False)
    if not args.watch:
        probe.sample({})  # psutil's CPU% needs a baseline reading
        time.sleep(0.2)
        console.print(_render(probe, console.width))
        return 0
    from rich.live import Live

    with Live(_render(probe, console.width), console=console, auto_refresh=False) as live:
        while True:
            time.sleep(args.watch)
            live.update(_render(probe, console.width), refresh=True)


def _render(probe: Any, width: int) -> Any:
    from tui.render.gpus import format_gpus

    return format_gpus(probe, width=width)
