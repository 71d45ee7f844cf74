"""The headless command line (``ftui``): argparse, one module per command group, no Textual.

:mod:`tui.cli.parser` declares what can be typed; each command's handler lives in its own module and is
imported only when that command runs. ``python -m tui.cli`` and the ``ftui`` entry point both run
:func:`main`.
"""

from tui.cli.main import main
from tui.cli.parser import build_parser

__all__ = ["build_parser", "main"]
