"""Each rank's output goes to its own log, ``RUN/logs/rank{N}.log`` (:func:`runner.spec.events.rank_log`),
and its Python stacks, on request, to ``RUN/stacks/rank{N}.txt`` (:mod:`runner.spec.stacks`)."""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
from pathlib import Path

from runner.spec import stacks


def redirect_output(log: Path) -> None:
    """Send this process's stdout and stderr (file descriptors 1 and 2 too) to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115


def dump_stacks_on_signal(run_dir: Path, rank: int) -> None:
    """Write every thread's Python stack to ``RUN/stacks/rank{N}.txt`` whenever this process gets
    :data:`runner.spec.stacks.DUMP_SIGNAL` (faulthandler's C-level handler: it answers inside a blocking
    collective too). The header naming this process is written once the handler is registered: the
    watcher signals only the process a header names, so never one that cannot take the signal yet."""
    path = stacks.stacks_file(run_dir, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    out = open(path, "w", encoding="utf-8")  # noqa: SIM115 (kept open for the process's life: faulthandler writes to it)
    faulthandler.register(stacks.DUMP_SIGNAL, file=out, all_threads=True, chain=False)
    out.write(stacks.header(rank, os.getpid(), threading.main_thread().ident or 0))
    out.flush()
