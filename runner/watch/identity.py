"""Who watches a run: the process that records it (``ftui run``, the background watcher), written to
the store so that ``ftui stop`` can signal it and ``ftui recover`` knows on which host to look; and the
checks that a recorded pid is still that process (not a pid reused by another program)."""

from __future__ import annotations

import os
import socket
from typing import Any

import psutil

from store import Store


def watcher_identity(pid: int | None = None) -> dict[str, Any]:
    """Who watches a run, as ``update_run`` keyword arguments: the ``watcher_pid``/``watcher_host``
    columns, and the summary fields ``ftui stop`` reads (pid and start time, so that a reused pid is
    not taken for the watcher)."""
    pid = pid if pid is not None else os.getpid()
    try:
        created: float | None = psutil.Process(pid).create_time()
    except psutil.Error:
        created = None
    host = socket.gethostname()
    return {"watcher_pid": pid, "watcher_host": host,
            "summary": {"orchestrator_pid": pid, "orchestrator_create_time": created, "orchestrator_host": host}}


def record_watcher(store: Store, run_id: int, pid: int | None = None, **columns: Any) -> None:
    """Record the watcher of a run, with other ``runs`` columns (``status``, ``pgid``...); a store that
    fails now is not fatal (the journal has the launch, and recover uses the watcher lock, not these)."""
    fields = watcher_identity(pid)
    try:
        store.update_run(run_id, **{**fields, **columns})
    except Exception:  # noqa: BLE001
        pass


def watcher_host(run: Any) -> str:
    """The host whose processes watch (and run) ``run``."""
    return str(getattr(run, "watcher_host", None) or run.summary.orchestrator_host or run.host)


def watcher_alive(pid: int | None, create_time: float | None) -> bool:
    """Whether the watcher recorded for a run (pid and process start time) is still that process
    on this host (a pid reused by another program is not)."""
    if not pid:
        return False
    try:
        proc = psutil.Process(int(pid))
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return create_time is None or abs(proc.create_time() - float(create_time)) < 0.5
    except (psutil.Error, ValueError):
        return False

