"""The headless command line (``ftui``): argparse, one module per command group, no Textual.

``python -m tui.cli`` and the ``ftui`` entry point both run :func:`main`.
"""

from tui.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
