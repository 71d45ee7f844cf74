"""The Textual app (``ftui`` with no command): screens, widgets, messages. It reads only the store."""

from tui.app.app import FtuiApp, make_app, run_app

__all__ = ["FtuiApp", "make_app", "run_app"]
