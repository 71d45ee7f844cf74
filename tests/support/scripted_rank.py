"""A scripted rank: a training script that trains nothing, for ``ftui run --script`` (every rank runs it
under ``runner.rank.script_run``, launched by the real ``accelerate launch``), so that the watcher, the
launcher and the signals between them are tested without importing torch in the ranks.

Rank 0 reports a step every ``--step-s`` seconds through :mod:`runner.track` (the journal the watcher
reads), up to ``--steps``; every rank stays alive meanwhile. Like ftui's trainer, a SIGTERM lets the rank
finish its step, "save" until the file ``--save-until`` exists (at once without it), journal its ``end``
(``stopped``) and exit 0; a second SIGTERM ends it at once (mid-save). Rank 0 writes ``<save-until>.saving``
when its save begins, so a test knows the save is in flight. With ``--hang-at N`` every rank stops after
step N and waits, idle, in :func:`hang_here` (a hang in a known function, for the stacks) until it is
stopped.

    ftui run --script tests/support/scripted_rank.py --strategy ddp --nproc 2 -- --steps 100000
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path

SCRIPT = Path(__file__).resolve()
"""This file, for ``ftui run --script``."""


def main(argv: list[str]) -> int:
    from runner import track

    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--step-s", type=float, default=0.2)
    parser.add_argument("--hang-at", type=int, default=0)
    parser.add_argument("--save-until", type=Path, default=None,
                        help="a stop's save lasts until this file exists (a second SIGTERM cuts it)")
    args = parser.parse_args(argv)
    stop = threading.Event()

    def on_term(*_: object) -> None:
        if stop.is_set():
            os._exit(143)  # a second SIGTERM: at once, as the trainer does
        stop.set()

    signal.signal(signal.SIGTERM, on_term)
    track.start(total_steps=args.steps, world_size=int(os.environ.get("WORLD_SIZE", "1")))
    for step in range(1, args.steps + 1):
        track.log({"loss": 3.0 / step, "tokens": 64 * step}, step=step)
        if step == args.hang_at:
            hang_here(stop)
        if stop.wait(args.step_s):
            _save(args.save_until)  # the stop checkpoint being written
            track.finish("stopped")
            return 0
    return 0


def hang_here(stop: threading.Event) -> None:
    """Wait, idle, until the rank is stopped: no step, no event, no CPU (what a rank stuck in a
    collective looks like from outside)."""
    stop.wait()


def _save(until: Path | None) -> None:
    if until is None:
        return
    if os.environ.get("RANK", "0") == "0":
        until.with_name(until.name + ".saving").touch()
    released = threading.Event()
    while not released.wait(0.05):  # polls a file the test writes: no length of time is assumed
        if until.exists():
            released.set()


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
