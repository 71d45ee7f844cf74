"""``ftui ARGS`` through ``tui.cli.main.main`` in the test's own process, as a fresh ``ftui`` process runs it,
without an interpreter's start-up (about 0.75 s of CPU per command: the interpreter, sqlalchemy and the
handler's imports).

What a fresh process has that this one must give the call, and takes back after it:

- the environment (``FTUI_HOME``, ``FTUI_DB``, ...) and the working folder, set for the call and restored
  after (what the command itself sets in ``os.environ`` goes with them);
- no terminal: rich and argparse ask ``os.get_terminal_size`` for the width, which here answers as for a
  process whose stdin, stdout and stderr are pipes (80 columns unless ``COLUMNS`` says otherwise);
- stdout and stderr of its own, read back as text (a rich console made during the call writes there);
- logging with no handler (a warning goes to stderr, as Python's last resort prints it) and the
  interpreter's default warning filters (a warning printed to stderr each time, as in a fresh process);
- every database engine the call opened is disposed of after it (a process's exit closes them; here an
  open SQLite file would stay open, and a tmpfs holding it could not be unmounted);
- ``SystemExit`` (``--help``) is its exit code.

Only commands that neither train nor start processes run here (:data:`IN_PROCESS`, and the dry runs of
:data:`DRY_RUNS`); ``Ftui.run`` runs the rest as real subprocesses.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import logging
import os
import sys
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

IN_PROCESS = frozenset({"runs", "show", "compare", "report", "estimate", "db", "gpus"})
"""Commands that read the store or the host and start no process: ``ftui run``, ``resume``, ``sweep``,
``stop``, ``recover``, ``slurm`` and the dashboard fork, signal or train, and stay real subprocesses."""
DRY_RUNS = frozenset({"run", "sweep"})
"""Commands that print what they would launch, and launch nothing, with ``--dry-run``."""
NOT_IN_PROCESS_FLAGS = {"estimate": "--probe", "gpus": "--watch"}
"""Flags that turn a read command into one that trains (the batch-size finder) or never ends."""

_DEFAULT_FILTERS: tuple[tuple[str, type[Warning], str], ...] = (
    ("default", DeprecationWarning, "__main__"),
    ("ignore", DeprecationWarning, ""),
    ("ignore", PendingDeprecationWarning, ""),
    ("ignore", ImportWarning, ""),
    ("ignore", ResourceWarning, ""),
)
"""A fresh interpreter's warning filters (the Python documentation, "Default Warning Filter"), in order."""


@functools.cache
def command_names() -> frozenset[str]:
    """Every command of ``ftui`` (the parser's sub-commands)."""
    from tui.cli.parser import build_parser

    actions = build_parser()._actions
    return frozenset(next(a.choices for a in actions if isinstance(a, argparse._SubParsersAction)))


def command_of(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names (its first word that is one), None for the dashboard."""
    return next((word for word in argv if word in command_names()), None)


def refusal(argv: Sequence[str]) -> str | None:
    """Why ``argv`` must run in a real process (None: it may run here)."""
    command = command_of(argv)
    own = list(argv[:argv.index("--")]) if "--" in argv else list(argv)  # after "--": a script's arguments
    if command in DRY_RUNS and "--dry-run" in own:
        return None
    if command not in IN_PROCESS:
        return f"ftui {command or '(the dashboard)'} trains, forks or signals: run it with Ftui.run"
    flag = NOT_IN_PROCESS_FLAGS.get(command)
    if flag is not None and flag in argv:
        return f"ftui {command} {flag} trains or never ends: run it with Ftui.run"
    return None


@contextlib.contextmanager
def environment(env: Mapping[str, str]) -> Iterator[None]:
    """``os.environ`` is exactly ``env`` inside; what it was, after (whatever the call set in it)."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _no_terminal(fd: int = 1) -> os.terminal_size:
    raise OSError(25, "Inappropriate ioctl for device")  # what a pipe answers (ENOTTY)


@contextlib.contextmanager
def fresh_process_state() -> Iterator[None]:
    """No terminal, no logging handler, the default warning filters, and the database engines the call
    opens disposed of after it (see the module's docstring)."""
    from sqlalchemy import Engine, event

    opened: dict[int, Engine] = {}

    def seen(connection: Any) -> None:
        opened[id(connection.engine)] = connection.engine

    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int, file: Any = None,
             line: str | None = None) -> None:
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))

    root = logging.getLogger()
    handlers, terminal_size = root.handlers[:], os.get_terminal_size
    event.listen(Engine, "engine_connect", seen)
    root.handlers[:] = []
    os.get_terminal_size = _no_terminal  # type: ignore[assignment]
    try:
        with warnings.catch_warnings():
            warnings.resetwarnings()
            for action, category, module in reversed(_DEFAULT_FILTERS):
                warnings.filterwarnings(action, category=category, module=module)  # type: ignore[arg-type]
            warnings.showwarning = show
            yield
    finally:
        os.get_terminal_size = terminal_size
        root.handlers[:] = handlers
        event.remove(Engine, "engine_connect", seen)
        for engine in opened.values():
            engine.dispose()


def call_main(argv: Sequence[str]) -> int:
    """``main(argv)``'s exit code, ``SystemExit`` (``--help``) included."""
    from tui.cli.main import main

    try:
        return main(list(argv))
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)


def run_ftui(argv: Sequence[str], env: Mapping[str, str], cwd: Path) -> tuple[int, str, str]:
    """``ftui ARGV`` in this process with ``env`` as its environment and ``cwd`` as its folder: the exit
    code, stdout and stderr. Refused (AssertionError) for a command that must run in a real process."""
    why = refusal(argv)
    if why is not None:
        raise AssertionError(why)
    out, err = io.StringIO(), io.StringIO()
    with environment(env), contextlib.chdir(cwd), fresh_process_state(), \
            contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = call_main(argv)
    return code, out.getvalue(), err.getvalue()
