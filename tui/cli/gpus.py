"""``ftui gpus``: the devices now (like nvidia-smi / gpustat); ``--watch`` refreshes."""

from __future__ import annotations

import argparse
import time

from rich.console import Console
from rich.live import Live

from runner.watch.host import probe_for
from tui.render.gpus import format_gpus


def cmd_gpus(args: argparse.Namespace) -> int:
    probe = probe_for(getattr(args, "fake_gpus", 0))
    console = Console(highlight=False)
    if not args.watch:
        probe.sample({})  # psutil's CPU% needs a baseline reading
        time.sleep(0.2)
        console.print(format_gpus(probe, width=console.width))
        return 0
    with Live(format_gpus(probe, width=console.width), console=console, auto_refresh=False) as live:
        while True:
            time.sleep(args.watch)
            live.update(format_gpus(probe, width=console.width), refresh=True)
