"""The CLI's contract with scripts: the exit codes, and the one usage-error type.

Bad input of any command is a :class:`UsageError`: :func:`tui.cli.main.main` prints it as one line and
exits with :attr:`ExitCode.USAGE`.
"""

from __future__ import annotations

from enum import IntEnum
from typing import NoReturn


class ExitCode(IntEnum):
    """What ``ftui`` exits with."""

    OK = 0
    FAILED = 1
    """The run (or the batch-size search) failed."""
    USAGE = 2
    """Bad input: one line naming the field or file; nothing was changed."""
    INTERRUPTED = 130
    """Ctrl-C, SIGTERM or SIGHUP: the run was stopped."""


class UsageError(Exception):
    """Bad input: printed as one line (``ftui: ...``), exit code 2."""


def fail(message: str) -> NoReturn:
    """Raise the usage error ``message``."""
    raise UsageError(message)
