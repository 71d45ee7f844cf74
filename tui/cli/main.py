"""The ``ftui`` command line: one parser, one module per command group, registered explicitly.

With no command it opens the Textual app. That is the CLI's one import of the app, deferred into
:func:`_open_app` so that ``ftui run`` and ``ftui --help`` never import textual (or torch): the
import-linter contract in pyproject.toml lists it as the one exception.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

from tui.cli.common import ExitCode, UsageError, db_option, one_line_errors

COMMANDS: tuple[str, ...] = (
    "tui.cli.run",       # run
    "tui.cli.stop",      # stop
    "tui.cli.runs",      # runs, show
    "tui.cli.gpus",      # gpus
    "tui.cli.estimate",  # estimate
    "tui.cli.compare",   # compare, sweep
    "tui.cli.recover",   # recover
    "tui.cli.db",        # db upgrade, db current
    "tui.cli.slurm",     # slurm
)
"""The command modules, in the order ``--help`` lists them. Each has ``add_parser(subparsers)`` and
imports its heavy dependencies inside its handlers, so that building the parser stays fast."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``ftui`` with ``argv``; return the exit code (:class:`ExitCode`)."""
    try:
        parser = build_parser()
        args = parse(parser, list(sys.argv[1:] if argv is None else argv))
        handler: Callable[[argparse.Namespace], int] | None = getattr(args, "handler", None)
        if handler is None:
            return _open_app(args)
        return int(handler(args))
    except UsageError as exc:
        print(f"ftui: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Parse ``argv``; for ``ftui run``, what follows ``--`` is the script's own arguments
    (``args.script_args``), never read as ftui's."""
    if "--" in argv:
        cut = argv.index("--")
        args = parser.parse_args(argv[:cut])
        if hasattr(args, "script_args"):
            args.script_args = argv[cut + 1:]
            return args
    return parser.parse_args(argv)


def build_parser() -> argparse.ArgumentParser:
    """The whole command line."""
    parser = argparse.ArgumentParser(
        prog="ftui",
        description="Plan, launch, watch and compare fine-tuning runs. With no command: the dashboard.",
    )
    db_option(parser)
    parser.add_argument("--fake-gpus", type=int, default=0, metavar="N", help="show N scripted GPUs (demo mode)")
    parser.add_argument("--notify", action="store_true",
                        help="dashboard: bell and desktop notification when a run ends (b toggles it)")
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")
    for module in COMMANDS:
        importlib.import_module(module).add_parser(sub)
    # Bad arguments of any command are one line (``ftui: ...``) and exit 2, like every other bad input.
    for command in (parser, *sub.choices.values()):
        one_line_errors(command)
    return parser


def _open_app(args: argparse.Namespace) -> int:
    from tui.app import run_app  # the CLI's one import of the Textual app (see the module docstring)
    from tui.cli.common import console, open_store
    from tui.cli.recover import recover_quietly

    try:  # runs whose watcher died (runner.service.recover); the app says itself what is wrong with the store
        recover_quietly(open_store(args, create=True), console(stderr=True))
    except UsageError:
        pass
    return run_app(db_url=getattr(args, "db", None), fake_gpus=args.fake_gpus, notify_on_end=args.notify)
