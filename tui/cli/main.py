"""The ``ftui`` command line: parse (:mod:`tui.cli.parser`), then run the command's handler.

A command names its handler as ``"module:function"`` (``set_defaults(handler=...)`` in the parser);
:func:`main` imports that module only now, when the command runs. This is the CLI's one place that loads
a handler: ``ftui --help`` and a mistyped flag never import the store, pydantic, torch or textual, and a
handler module imports what it uses at its top. With no command the handler is
:data:`tui.cli.parser.DASHBOARD`, the Textual app.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

from runner.spec.price import PriceError, configured_price
from tui.cli.exits import ExitCode, UsageError
from tui.cli.parser import DASHBOARD, build_parser, parse

Handler = Callable[[argparse.Namespace], int]


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``ftui`` with ``argv``; return the exit code (:class:`ExitCode`)."""
    try:
        args = parse(build_parser(), list(sys.argv[1:] if argv is None else argv))
        configured_price()  # a bad FTUI_PRICE_PER_DEVICE_HOUR is refused before any command runs
        return int(handler(getattr(args, "handler", DASHBOARD))(args))
    except (UsageError, PriceError) as exc:
        print(f"ftui: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED


def handler(reference: str) -> Handler:
    """The function ``"module:function"`` names, its module imported now."""
    module, _, name = reference.partition(":")
    found: Handler = getattr(importlib.import_module(module), name)
    return found
