"""Where ftui keeps its files: the database, run folders and caches.

``FTUI_HOME`` moves all of them (tests and CI use it); otherwise the platform's user data and cache
folders are used (``~/.local/share/ftui``, ``~/.cache/ftui`` on Linux).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

PRIVATE_MODE = 0o700
"""Mode of the folders ftui creates: run folders hold recipes, logs and weights (only the user)."""


class FolderError(OSError):
    """A folder ftui needs cannot be created or written; one line naming it."""


def home() -> Path:
    """The data folder: the default SQLite database and the run folders live here."""
    env = os.environ.get("FTUI_HOME")
    if env:
        return Path(env).expanduser()
    from platformdirs import user_data_path

    return user_data_path("ftui", appauthor=False)


def cache_dir() -> Path:
    """Caches that can be rebuilt (the builtin tokenizer, tokenized data, the CPU's measured peak):
    ``FTUI_CACHE`` when set (a local disk while the data folder is shared, or one warm cache for many
    homes), else ``cache/`` in ``FTUI_HOME``, else the user's cache folder."""
    cache = os.environ.get("FTUI_CACHE")
    if cache:
        return Path(cache).expanduser()
    env = os.environ.get("FTUI_HOME")
    if env:
        return Path(env).expanduser() / "cache"
    from platformdirs import user_cache_path

    return user_cache_path("ftui", appauthor=False)


def runs_dir() -> Path:
    """The parent folder of every run folder."""
    return home() / "runs"


def plans_dir() -> Path:
    """Where each plan of this host keeps its record and its background process's output
    (:mod:`runner.service.plan_record`)."""
    return home() / "plans"


def default_db_url() -> str:
    """``FTUI_DB`` if set, else a SQLite file in :func:`home`."""
    env = os.environ.get("FTUI_DB")
    if env:
        return env
    return f"sqlite:///{home() / 'ftui.db'}"


def new_run_uid() -> str:
    """A run id unique for ever, across databases and hosts, for a run the store gave no ``uid``
    (a dry run, or a store without the column): UTC time to the second plus 32 random bits
    (``20261123-144501-3f9a0c1e``). It names the run folder, so two stores sharing one data folder
    never write into the same one."""
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
    make_private_dir(folder)  # mode 0700: recipes, logs and weights are the user's
    return folder
def make_private_dir(path: Path) -> Path:
    """Create ``path`` and its missing parents with mode 0700 (only the user); existing folders are left
    as they are. ``Path.mkdir(parents=True)`` gives the parents the default mode, so each level is
    made here.

    Raises:
        FolderError: a level cannot be created (no permission, a file in the way, read-only disk).
    """
    path = Path(path)
    missing: list[Path] = []
    for level in (path, *path.parents):
        if level.is_dir():
            break
        missing.append(level)
    for level in reversed(missing):
        if level.exists():
            raise FolderError(f"{level}: not a folder")
        try:
            level.mkdir(mode=PRIVATE_MODE, exist_ok=True)
            os.chmod(level, PRIVATE_MODE)  # mkdir's mode is masked by the umask
        except OSError as exc:
            raise FolderError(f"{level}: cannot create the folder ({exc.strerror or exc})") from None
    return path


def check_runs_dir(root: Path | None = None) -> Path:
    """Make sure run folders can be written under ``root`` (default :func:`runs_dir`), creating the
    data folder and the runs folder (mode 0700) if needed; checked before a run is recorded, so that an
    unwritable ``FTUI_HOME`` leaves no run behind.

    Raises:
        FolderError: one line naming the folder (and ``FTUI_HOME`` when it is set).
    """
    root = Path(root) if root is not None else runs_dir()
    hint = " (FTUI_HOME)" if os.environ.get("FTUI_HOME") else ""
    try:
        make_private_dir(root)
        with tempfile.TemporaryFile(dir=root):
            pass
    except FolderError as exc:
        raise FolderError(f"{exc}{hint}") from None
    except OSError as exc:
        raise FolderError(f"{root}: cannot write run folders here ({exc.strerror or exc}){hint}") from None
    return root
