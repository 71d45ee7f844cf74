"""Each rank's output goes to its own log, ``RUN/logs/rank{N}.log`` (:func:`runner.spec.events.rank_log`)."""

from __future__ import annotations

import os
import sys
from pathlib import Path


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
