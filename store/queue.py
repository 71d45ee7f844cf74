"""The run queue in the store (``ftui queue``): entries in line per host, the run each became, and the
changes of state the host's one queue runner makes (:mod:`runner.service.queue_runner`).

An entry goes ``queued`` -> ``running`` (claimed by the runner: a conditional update, so an entry removed
meanwhile is never started) -> ``done`` when its run ended, or ``failed`` when it could not be started.
Removing is a conditional delete that never takes a ``running`` entry, so a removal and a claim racing for
one entry cannot both win. Entries are in line by id, oldest first. Every call is one transaction,
retried while the database is locked, like the store's own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, select, update

from runner.spec.status import DONE, NOT_STARTED, QUEUED, STARTED
from store.models import QueueEntry, Run
from store.store import Store, utcnow


@dataclass(frozen=True)
class QueueEntryInfo:
    """A queue entry as readers get it: the columns of :class:`store.models.QueueEntry`, and the status of
    its run, read with it."""

    id: int
    name: str
    recipe_text: str
    recipe_source: str | None
    host: str
    workdir: str
    visible_devices: str | None
    devices: list[str]
    options: dict[str, Any]
    status: str
    run_id: int | None
    error: str | None
    created_at: datetime
    started_at: datetime | None
    ended_at: datetime | None
    run_status: str | None = None
    """Its run's status (``runs.status``); None when it has no run (waiting, not started, run deleted)."""


COLUMNS = tuple(c.name for c in QueueEntry.__table__.columns)


def _info(row: QueueEntry, run_status: str | None) -> QueueEntryInfo:
    values = {name: getattr(row, name) for name in COLUMNS}
    return QueueEntryInfo(**{**values, "devices": list(row.devices or []), "options": dict(row.options or {})},
                          run_status=run_status)


def add_entry(store: Store, *, name: str, recipe_text: str, recipe_source: str | None, host: str, workdir: str,
              visible_devices: str | None, devices: Sequence[str], options: dict[str, Any]) -> int:
    """Put a run at the end of the queue (status ``queued``); its id."""

    def write() -> int:
        with store._write() as s:
            row = QueueEntry(name=name, recipe_text=recipe_text, recipe_source=recipe_source, host=host,
                             workdir=workdir, visible_devices=visible_devices, devices=list(devices),
                             options=dict(options), status=QUEUED, created_at=utcnow())
            s.add(row)
            s.flush()
            return row.id

    return store._retrying_call(write)


def entries(store: Store, host: str | None = None, statuses: Sequence[str] | None = None) -> list[QueueEntryInfo]:
    """The entries (of ``host``, with one of ``statuses``, when given) in line order: oldest first."""

    def read() -> list[QueueEntryInfo]:
        with store._begin() as s:
            query = select(QueueEntry, Run.status).outerjoin(Run, Run.id == QueueEntry.run_id).order_by(QueueEntry.id)
            if host is not None:
                query = query.where(QueueEntry.host == host)
            if statuses is not None:
                query = query.where(QueueEntry.status.in_(list(statuses)))
            return [_info(row, status) for row, status in s.execute(query)]

    return store._retrying_call(read)


def get_entry(store: Store, entry_id: int) -> QueueEntryInfo | None:
    """One entry, or None when there is no such entry."""

    def read() -> QueueEntryInfo | None:
        with store._begin() as s:
            found = s.execute(select(QueueEntry, Run.status).outerjoin(Run, Run.id == QueueEntry.run_id)
                              .where(QueueEntry.id == entry_id)).first()
            return None if found is None else _info(*found)

    return store._retrying_call(read)


def remove_entry(store: Store, entry_id: int) -> tuple[QueueEntryInfo | None, bool]:
    """Take an entry out of the queue unless it is ``running`` (its run must be stopped instead).

    Returns:
        (the entry as it was, or None when there is no such entry; whether it was removed).
    """

    def write() -> tuple[QueueEntryInfo | None, bool]:
        with store._write() as s:
            found = s.execute(select(QueueEntry, Run.status).outerjoin(Run, Run.id == QueueEntry.run_id)
                              .where(QueueEntry.id == entry_id)).first()
            if found is None:
                return None, False
            gone = s.execute(delete(QueueEntry).where(QueueEntry.id == entry_id, QueueEntry.status != STARTED))
            return _info(*found), bool(gone.rowcount)  # type: ignore[attr-defined]

    return store._retrying_call(write)


def claim(store: Store, entry_id: int) -> bool:
    """Mark a ``queued`` entry ``running`` (the runner is about to start it); False when it is not queued
    any more (removed meanwhile)."""

    def write() -> bool:
        with store._write() as s:
            done = s.execute(update(QueueEntry).where(QueueEntry.id == entry_id, QueueEntry.status == QUEUED)
                             .values(status=STARTED, started_at=utcnow()))
            return bool(done.rowcount)  # type: ignore[attr-defined]

    return store._retrying_call(write)


def attach_run(store: Store, entry_id: int, run_id: int) -> None:
    """Record the run a ``running`` entry became."""
    _set(store, entry_id, run_id=run_id)


def finish(store: Store, entry_id: int, status: str, error: str | None = None, ended_at: datetime | None = None,
           run_id: int | None = None) -> None:
    """An entry's end: ``done`` (its run ended) or ``failed`` (it could not be started, ``error`` says why)."""
    if status not in (DONE, NOT_STARTED):
        raise ValueError(f"finish: an entry ends {DONE} or {NOT_STARTED}, not {status}")
    values: dict[str, Any] = {"status": status, "error": error, "ended_at": ended_at or utcnow()}
    if run_id is not None:
        values["run_id"] = run_id
    _set(store, entry_id, **values)


def _set(store: Store, entry_id: int, **values: Any) -> None:
    def write() -> None:
        with store._write() as s:
            s.execute(update(QueueEntry).where(QueueEntry.id == entry_id).values(**values))

    store._retrying_call(write)
