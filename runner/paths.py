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


def new_run_uid() -> str:
    """A run id unique for ever, across databases and hosts: UTC time to the second plus 32 random
    bits (``20261123-144501-3f9a0c1e``). It names the run folder, so two stores sharing one data
    folder never write into the same one."""
    import secrets
    from datetime import UTC, datetime

    return f"{datetime.now(UTC):%Y%m%d-%H%M%S}-{secrets.token_hex(4)}"


def slug(name: str) -> str:
    """A run name as one safe path component: letters, digits, ``-`` and ``_`` only (so ``../x``,
    ``/abs`` and ``..`` cannot place a folder outside the runs folder), at most 40 characters."""
    keep = "".join(c if c.isalnum() or c in "-_" else "-" for c in name.strip())
    return keep.strip("-")[:40] or "run"


class RunFolderError(RuntimeError):
    """A run folder that cannot be used: one line naming it."""


def claim_run_folder(root: Path, uid: str, name: str) -> Path:
    """Create the folder of a new run, ``root/<uid>-<slug(name)>``, and return it (resolved).

    Raises:
        RunFolderError: the folder already holds a run (a ``launch.json`` or a journal): a run
            folder is never reused; or it would lie outside ``root``.
    """
    root = root.resolve()
    folder = (root / f"{slug(uid)}-{slug(name)}").resolve()
    if folder.parent != root:
        raise RunFolderError(f"run folder {folder}: not directly inside {root}")
    if any((folder / f).exists() for f in ("launch.json", "events.jsonl", "orchestrator.jsonl")):
        raise RunFolderError(f"run folder {folder} already holds a run; a run folder is never reused")
    folder.mkdir(parents=True, exist_ok=True)
    return folder
