"""``ftui`` with no command: the Textual app (:mod:`tui.app`).

This module is the CLI's one import of the app; :mod:`tui.cli.main` loads it only when no command is
given, so that ``ftui run`` and ``ftui --help`` never import textual. The import-linter contract in
pyproject.toml lists it as the one exception.
"""

from __future__ import annotations

import argparse

from tui.app import run_app
from tui.cli.common import console, open_store
from tui.cli.exits import UsageError
from tui.cli.recover import recover_quietly


def cmd_dashboard(args: argparse.Namespace) -> int:
    try:  # runs whose watcher died (runner.service.recover); the app says itself what is wrong with the store
        recover_quietly(open_store(args, create=True), console(stderr=True))
    except UsageError:
        pass
    return run_app(db_url=getattr(args, "db", None), fake_gpus=args.fake_gpus, notify_on_end=args.notify)
