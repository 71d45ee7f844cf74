"""Where ftui keeps its files: the database, run folders and caches.

``FTUI_HOME`` moves all of them (tests and CI use it); otherwise the platform's user data and cache
folders are used (``~/.local/share/ftui``, ``~/.cache/ftui`` on Linux).
"""

from __future__ import annotations

import os
from pathlib import Path


def home() -> Path:
    """The data folder: the default SQLite database and the run folders live here."""
    env = os.environ.get("FTUI_HOME")
    if env:
        return Path(env).expanduser()
    from platformdirs import user_data_path

    return user_data_path("ftui", appauthor=False)


def cache_dir() -> Path:
    """Caches that can be rebuilt (the builtin tokenizer)."""
    env = os.environ.get("FTUI_HOME")
    if env:
        return Path(env).expanduser() / "cache"
    from platformdirs import user_cache_path

    return user_cache_path("ftui", appauthor=False)


def runs_dir() -> Path:
    """The parent folder of every run folder."""
    return home() / "runs"


def default_db_url() -> str:
    """``FTUI_DB`` if set, else a SQLite file in :func:`home`."""
    env = os.environ.get("FTUI_DB")
    if env:
        return env
    return f"sqlite:///{home() / 'ftui.db'}"
