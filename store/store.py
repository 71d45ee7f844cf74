"""The store: one object owning the engine and sessions; readers get frozen dataclasses, never rows.

One writer per run (the orchestrator) writes in batches; SQLite runs in WAL mode so readers (the TUI,
``ftui runs``) never block it. Ingesting the journal is idempotent: events carry their journal
``seq`` and a repeated ingest skips what is already stored, so a run can be re-ingested from its
folder with no duplicate or missing rows.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, delete, event, func, select
from sqlalchemy.orm import Session, sessionmaker

from runner.hardware.records import DeviceSample
from store.models import Base, DeviceSampleRow, Event, Metric, ProcessSampleRow, Run

TERMINAL = ("completed", "failed", "stopped")


class StoreError(RuntimeError):
    """A store problem phrased for the user (names the database)."""


@dataclass(frozen=True)
class RunInfo:
    id: int
    name: str
    sweep_id: str | None
    recipe_text: str
    recipe_hash: str
    recipe_source: str | None
    strategy: str
    nproc: int
    method: str
    model: str
    status: str
    distributed_type: str | None
    device_type: str | None
    host: str
    run_dir: str
    pgid: int | None
    created_at: datetime
    started_at: datetime | None
    ended_at: datetime | None
    exit_code: int | None
    error: str | None
    total_steps: int | None
    steps_done: int | None
    train_seconds: float | None
    tokens_per_s: float | None
    final_loss: float | None
    peak_mem_bytes: int | None
    mean_util: float | None
    summary: dict[str, Any] = field(default_factory=dict)
    tags: list[str] = field(default_factory=list)
    note: str = ""


@dataclass(frozen=True)
class MetricPoint:
    step: int
    time: float
    loss: float | None
    lr: float | None
    grad_norm: float | None
    tokens: int | None
    step_time: float | None
    tokens_per_s: float | None


@dataclass(frozen=True)
class SampleInfo(DeviceSample):
    """A stored device reading: the probe's own record (one sample record in the project) plus its row id."""

    id: int = 0
    """Row id: increases with every write, so a reader can ask for what came after it."""


@dataclass(frozen=True)
class ProcessSampleInfo:
    id: int
    time: float
    host: str
    gpu_index: int
    pid: int
    rank: int | None
    used_bytes: int | None
    source: str


@dataclass(frozen=True)
class EventInfo:
    source: str
    seq: int
    type: str
    time: float
    payload: dict[str, Any]


def utcnow() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


def _frozen(cls: type[Any], row: Any) -> Any:
    return cls(**{f.name: getattr(row, f.name) for f in fields(cls)})


class Store:
    """Access to the ftui database at ``url`` (any SQLAlchemy URL; SQLite by default)."""

    def __init__(self, url: str) -> None:
        self.url = url
        if url.startswith("sqlite:///"):
            path = Path(url.removeprefix("sqlite:///"))
            if str(path) not in ("", ":memory:"):
                try:
                    path.parent.mkdir(parents=True, exist_ok=True)
                except OSError as exc:
                    raise StoreError(f"--db {url}: cannot create {path.parent}: {exc.strerror}") from None
        try:
            self.engine: Engine = create_engine(url)
        except Exception as exc:  # noqa: BLE001 (any driver or URL problem becomes one line)
            raise StoreError(f"--db {url}: {exc}") from None
        if self.engine.dialect.name == "sqlite":
            event.listen(self.engine, "connect", _sqlite_pragmas)
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)
        try:
            Base.metadata.create_all(self.engine)
        except Exception as exc:  # noqa: BLE001
            # SQLAlchemy appends "(Background on this error at: ...)" on a line of its own.
            reason = str(getattr(exc, "orig", None) or exc).splitlines()[0]
            raise StoreError(f"--db {url}: cannot open database: {reason}") from None

    @contextmanager
    def _begin(self) -> Iterator[Session]:
        with self.sessions.begin() as session:
            yield session

    # ------------------------------------------------------------------ runs

    def create_run(
        self,
        *,
        name: str,
        recipe_text: str,
        recipe_hash: str,
        strategy: str,
        nproc: int,
        method: str,
        model: str,
        run_dir: str,
        recipe_source: str | None = None,
        sweep_id: str | None = None,
        total_steps: int | None = None,
        summary: dict[str, Any] | None = None,
    ) -> int:
        """Record a new run (status ``created``) and return its id."""
        with self._begin() as s:
            run = Run(
                name=name,
                sweep_id=sweep_id,
                recipe_text=recipe_text,
                recipe_hash=recipe_hash,
                recipe_source=recipe_source,
                strategy=strategy,
                nproc=nproc,
                method=method,
                model=model,
                status="created",
                host=socket.gethostname(),
                run_dir=run_dir,
                created_at=utcnow(),
                total_steps=total_steps,
                summary=summary or {},
                tags=[],
                note="",
            )
            s.add(run)
            s.flush()
            return run.id

    def update_run(self, run_id: int, **values: Any) -> None:
        """Set columns of a run; ``summary`` is merged into the stored summary, not replaced."""
        with self._begin() as s:
            run = s.get(Run, run_id)
            if run is None:
                raise StoreError(f"run {run_id}: no such run in {self.url}")
            summary = values.pop("summary", None)
            for key, value in values.items():
                setattr(run, key, value)
            if summary:
                run.summary = {**(run.summary or {}), **summary}

    def get_run(self, run_id: int) -> RunInfo | None:
        with self._begin() as s:
            run = s.get(Run, run_id)
            return None if run is None else _frozen(RunInfo, run)

    def list_runs(self, status: str | None = None, sweep_id: str | None = None) -> list[RunInfo]:
        """Every run, newest first."""
        with self._begin() as s:
            query = select(Run).order_by(Run.id.desc())
            if status:
                query = query.where(Run.status == status)
            if sweep_id:
                query = query.where(Run.sweep_id == sweep_id)
            return [_frozen(RunInfo, r) for r in s.scalars(query)]

    def delete_run(self, run_id: int) -> bool:
        with self._begin() as s:
            for table in (Metric, Event, DeviceSampleRow, ProcessSampleRow):
                s.execute(delete(table).where(table.run_id == run_id))
            return s.execute(delete(Run).where(Run.id == run_id)).rowcount > 0  # type: ignore[attr-defined,no-any-return]

    # ------------------------------------------------------------------ events and metrics

    def ingest(self, run_id: int, events: Sequence[dict[str, Any]], source: str = "trainer") -> int:
        """Store journal events (and the metrics of the trainer's step events); skip any already stored.

        Args:
            run_id: the run.
            events: records of one journal, in ``seq`` order.
            source: ``trainer`` (``events.jsonl``) or ``orchestrator`` (``orchestrator.jsonl``).

        Returns the number of events newly stored.
        """
        if not events:
            return 0
        with self._begin() as s:
            last = s.scalar(
                select(func.max(Event.seq)).where(Event.run_id == run_id, Event.source == source)
            )
            fresh = [e for e in events if last is None or int(e["seq"]) > last]
            for e in fresh:
                payload = {k: v for k, v in e.items() if k not in ("seq", "type", "time")}
                s.add(Event(run_id=run_id, source=source, seq=int(e["seq"]), type=e["type"], time=e["time"], payload=payload))
                if e["type"] == "step" and source == "trainer":
                    s.add(
                        Metric(
                            run_id=run_id,
                            step=int(e["step"]),
                            time=float(e["time"]),
                            loss=e.get("loss"),
                            lr=e.get("lr"),
                            grad_norm=e.get("grad_norm"),
                            tokens=e.get("tokens"),
                            step_time=e.get("step_time"),
                            tokens_per_s=e.get("tokens_per_s"),
                        )
                    )
            if fresh:
                run = s.get(Run, run_id)
                steps = [int(e["step"]) for e in fresh if e["type"] == "step"]
                if run is not None and steps:
                    run.steps_done = max(steps + [run.steps_done or 0])
            return len(fresh)

    def add_event(self, run_id: int, type_: str, time: float, payload: dict[str, Any]) -> None:
        """Store an orchestrator event (launch, exit, hang, ...)."""
        with self._begin() as s:
            seq = s.scalar(
                select(func.count(Event.id)).where(Event.run_id == run_id, Event.source == "orchestrator")
            )
            s.add(Event(run_id=run_id, source="orchestrator", seq=int(seq or 0), type=type_, time=time, payload=payload))

    def metrics(self, run_id: int, after_step: int | None = None) -> list[MetricPoint]:
        """Per-step metrics of a run, by step; only those after ``after_step`` when given (live views)."""
        with self._begin() as s:
            query = select(Metric).where(Metric.run_id == run_id).order_by(Metric.step)
            if after_step is not None:
                query = query.where(Metric.step > after_step)
            return [_frozen(MetricPoint, r) for r in s.scalars(query)]

    def events(self, run_id: int, type_: str | None = None) -> list[EventInfo]:
        with self._begin() as s:
            query = select(Event).where(Event.run_id == run_id).order_by(Event.time, Event.id)
            if type_:
                query = query.where(Event.type == type_)
            return [_frozen(EventInfo, r) for r in s.scalars(query)]

    # ------------------------------------------------------------------ telemetry

    def add_samples(self, run_id: int, samples: Iterable[Any], processes: Iterable[Any] = ()) -> None:
        """Store device samples and per-process GPU memory (objects with the columns' attributes)."""
        device_cols = [c.name for c in DeviceSampleRow.__table__.columns if c.name not in ("id", "run_id")]
        proc_cols = [c.name for c in ProcessSampleRow.__table__.columns if c.name not in ("id", "run_id")]
        with self._begin() as s:
            s.add_all(DeviceSampleRow(run_id=run_id, **{c: getattr(x, c) for c in device_cols}) for x in samples)
            s.add_all(ProcessSampleRow(run_id=run_id, **{c: getattr(x, c) for c in proc_cols}) for x in processes)

    def ingest_samples(self, run_id: int, samples: Sequence[Any], processes: Sequence[Any] = ()) -> int:
        """Like :meth:`add_samples`, but idempotent: readings not newer than the newest stored one of
        their table are skipped (batches are stored whole, in time order). Returns rows added."""
        with self._begin() as s:
            last_d = s.scalar(select(func.max(DeviceSampleRow.time)).where(DeviceSampleRow.run_id == run_id))
            last_p = s.scalar(select(func.max(ProcessSampleRow.time)).where(ProcessSampleRow.run_id == run_id))
        fresh = [x for x in samples if last_d is None or x.time > last_d]
        fresh_p = [x for x in processes if last_p is None or x.time > last_p]
        if fresh or fresh_p:
            self.add_samples(run_id, fresh, fresh_p)
        return len(fresh) + len(fresh_p)

    def samples(self, run_id: int, after_id: int | None = None) -> list[SampleInfo]:
        """Device samples of a run in write order; only rows after ``after_id`` when given."""
        with self._begin() as s:
            query = select(DeviceSampleRow).where(DeviceSampleRow.run_id == run_id)
            if after_id is not None:
                query = query.where(DeviceSampleRow.id > after_id).order_by(DeviceSampleRow.id)
            else:
                query = query.order_by(DeviceSampleRow.time, DeviceSampleRow.id)
            return [_frozen(SampleInfo, r) for r in s.scalars(query)]

    def process_samples(self, run_id: int, after_id: int = 0) -> list[ProcessSampleInfo]:
        """GPU memory per process of a run (NVML), in write order, after ``after_id``."""
        with self._begin() as s:
            query = (select(ProcessSampleRow)
                     .where(ProcessSampleRow.run_id == run_id, ProcessSampleRow.id > after_id)
                     .order_by(ProcessSampleRow.id))
            return [_frozen(ProcessSampleInfo, r) for r in s.scalars(query)]

    def close(self) -> None:
        self.engine.dispose()


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=10000")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()
