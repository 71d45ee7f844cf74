"""What every command of the headless CLI shares: exit codes, the one usage-error type, argument types,
opening the store, and the console.

Bad input of any command is a :class:`UsageError`: ``main`` prints it as one line and exits with
:attr:`ExitCode.USAGE`. Exit codes are the CLI's contract with scripts.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from enum import IntEnum
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    from rich.console import Console

    from store import Store


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


def one_line_errors(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """argparse prints usage plus the error; ftui's contract is one line and exit 2."""

    def error(message: str) -> NoReturn:
        raise UsageError(message)

    parser.error = error  # type: ignore[method-assign]
    return parser


def db_option(parser: argparse.ArgumentParser) -> None:
    """``--db URL`` on a parser (every command takes it, before or after the command name)."""
    parser.add_argument("--db", default=argparse.SUPPRESS, metavar="URL",
                        help="database URL (default: $FTUI_DB, else SQLite in the ftui data folder)")


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive finite number, got {text}")
    return value


def seconds_at_least(low: float) -> Callable[[str], float]:
    """An argparse type: seconds in [low, 1 day]; nan, inf and words are refused."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if not low <= value <= 86400:
            raise argparse.ArgumentTypeError(f"expected seconds between {low:g} and 86400, got {text!r}")
        return value

    return parse


def open_store(args: argparse.Namespace, *, create: bool) -> Store:
    """The store named by ``--db`` (default: ``$FTUI_DB``, else SQLite in the data folder).

    ``create``: commands that record runs create a missing database; read commands refuse a missing one
    named by ``--db`` or ``$FTUI_DB`` in one line (a mistyped path must not leave an empty database behind
    and show "no runs"). The default database is created on first use by any command.
    """
    import os

    from runner.spec.paths import FolderError, default_db_url, home, make_private_dir
    from store import Store, StoreError

    chosen = getattr(args, "db", None) or os.environ.get("FTUI_DB")
    try:
        if not chosen:
            make_private_dir(home())  # the data folder is created mode 0700 (before SQLite creates it)
        return Store(chosen or default_db_url(), create=create or not chosen)
    except (StoreError, FolderError) as exc:
        raise UsageError(str(exc)) from None


def console(stderr: bool = False) -> Console:
    """A rich console for the CLI's output. Text that comes from a run or a user is passed to it as
    ``rich.text.Text`` (or with ``markup=False``), never as markup."""
    from rich.console import Console

    return Console(stderr=stderr, highlight=False)
