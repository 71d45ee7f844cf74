"""The store: one object owning the engine and sessions; readers get frozen dataclasses, never rows.

One writer per run (the orchestrator) writes in batches; SQLite runs in WAL mode so readers (the TUI,
``ftui runs``) never block it. Ingesting the journal is idempotent: events carry their journal
``seq`` and a repeated ingest skips what is already stored, so a run can be re-ingested from its
folder with no duplicate or missing rows.

Every public call is one transaction. SQLite write transactions begin IMMEDIATE (they queue for the
write lock instead of failing when another writer committed after they read); a call that still finds
the database locked (another client holding it past the 10 s busy timeout) is retried whole, with
backoff, for up to ``lock_timeout`` seconds, so a slow ``sqlite3`` shell or backup never ends a run's
supervision. Opening checks the database (see :func:`store.engine.open_engine`) and upgrades its schema
(:mod:`store.migrate`).
"""

from __future__ import annotations

import functools
import math
import socket
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import fields
from datetime import UTC, datetime
from typing import Any, Concatenate, ParamSpec, TypeVar, Unpack, cast

from sqlalchemy import (
    Engine,
    Table,
    bindparam,
    delete,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.orm import Session, sessionmaker

from runner.spec.summary import SCHEMA, RunSummary, upgrade
from store.curves import (
    Curve,
    read_curves,
    read_named_curves,
    read_named_last,
    write_named_rollups,
    write_rollups,
)
from store.engine import (
    StoreError,
    describe_error,
    lock_timeout_from_env,
    open_engine,
    retry_locked,
)
from store.ids import new_uid
from store.migrate import NoDatabase, SchemaError, ensure_current
from store.models import (
    DeviceSampleRow,
    Event,
    Metric,
    MetricRollup,
    NamedMetric,
    NamedMetricRollup,
    ProcessSampleRow,
    Run,
)
from store.records import (
    RUN_UPDATE_KEYS,
    EventInfo,
    MetricPoint,
    NamedMetricPoint,
    ProcessSampleInfo,
    RunInfo,
    RunUpdate,
    SampleInfo,
)

_P = ParamSpec("_P")
_R = TypeVar("_R")




def _table(model: type[Any]) -> Table:
    """The Core table of a model (for executemany inserts)."""
    return cast(Table, model.__table__)


def utcnow() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


def _frozen(cls: type[Any], row: Any) -> Any:
    return cls(**{f.name: getattr(row, f.name) for f in fields(cls)})


def _run_info(row: Run) -> RunInfo:
    """The frozen record of a run row, its summary brought to the current shape and typed."""
    values = {f.name: getattr(row, f.name) for f in fields(RunInfo)}
    return RunInfo(**{**values, "summary": RunSummary.from_json(row.summary)})


def _retrying(method: Callable[Concatenate[Store, _P], _R]) -> Callable[Concatenate[Store, _P], _R]:
    """Retry a store method (one whole transaction) while the database is locked (see ``lock_timeout``)."""

    @functools.wraps(method)
    def call(self: Store, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        return self._retrying_call(lambda: method(self, *args, **kwargs))

    return call


class Store:
    """Access to the ftui database at ``url`` (any SQLAlchemy URL; SQLite by default).

    Opening checks the database and brings its schema up to date (see :mod:`store.migrate`). Every call
    is one transaction, retried while another client holds a lock, for up to ``lock_timeout`` seconds.

    Args:
        url: A SQLAlchemy URL (``sqlite:///path``, ``postgresql+psycopg://...``).
        create: Create the database when there is none (commands that record runs). Read commands pass
            False: a missing SQLite file is refused rather than created empty.
        lock_timeout: Seconds a call waits for another client's lock before raising :class:`StoreError`
            (default ``FTUI_DB_LOCK_TIMEOUT`` or 120).

    Raises:
        StoreError: One line ``--db URL: reason`` (no such database, a folder, not a database, read-only,
            unreachable, newer than this code).
    """

    def __init__(self, url: str, *, create: bool = True, lock_timeout: float | None = None) -> None:
        self.url = url
        self.lock_timeout = lock_timeout_from_env() if lock_timeout is None else lock_timeout
        self.engine: Engine = open_engine(url, create=create, lock_timeout=self.lock_timeout)
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)
        # SQLite: a write transaction takes the write lock when it begins (BEGIN IMMEDIATE), so it waits in
        # the busy handler instead of failing at once when it first reads and then finds another writer
        # committed meanwhile (WAL's SQLITE_BUSY_SNAPSHOT, which no timeout retries).
        self._writes = sessionmaker(self.engine.execution_options(ftui_write=True), expire_on_commit=False)
        self.schema_change: tuple[str | None, str] | None = None
        """(from, to) revisions when opening upgraded the database (from None: it was created)."""
        try:
            self.schema_change = self._retrying_call(lambda: ensure_current(self.engine, create=create))
        except NoDatabase:
            self.engine.dispose()
            raise StoreError(f"--db {url}: no such database (run something first, or check the path)") from None
        except SchemaError as exc:
            self.engine.dispose()
            raise StoreError(f"--db {url}: {exc}") from None
        except StoreError:
            self.engine.dispose()
            raise
        except Exception as exc:  # noqa: BLE001 (any driver problem becomes one line)
            self.engine.dispose()
            raise StoreError(describe_error(url, exc)) from None

    def _retrying_call(self, call: Callable[[], _R]) -> _R:
        """Run ``call`` (one whole transaction), again while the database is locked, up to the budget."""
        return retry_locked(call, self.url, self.lock_timeout)

    @contextmanager
    def _begin(self) -> Iterator[Session]:
        """A read transaction."""
        with self.sessions.begin() as session:
            yield session

    @contextmanager
    def _write(self) -> Iterator[Session]:
        """A write transaction (holds SQLite's write lock from its first statement)."""
        with self._writes.begin() as session:
            yield session

    # ------------------------------------------------------------------ runs

    @_retrying
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
        resumed_from: int | None = None,
        uid: str | None = None,
        created_at: datetime | None = None,
        host: str | None = None,
    ) -> int:
        """Record a new run (status ``created``, a fresh :func:`store.ids.new_uid` uid) and return its id.

        Args:
            resumed_from: Id of the run this one continues from (its checkpoint).
            uid, created_at, host: the run's own, when it is recorded again from its folder
                (``ftui db rebuild``); default a new uid, now and this host.
        """
        with self._write() as s:
            run = Run(
                uid=uid or new_uid(),
                resumed_from=resumed_from,
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
                host=host or socket.gethostname(),
                run_dir=run_dir,
                created_at=created_at or utcnow(),
                total_steps=total_steps,
                summary={**(summary or {}), "schema": SCHEMA},
                tags=[],
                note="",
            )
            s.add(run)
            s.flush()
            return run.id

    @_retrying
    def update_run(self, run_id: int, **values: Unpack[RunUpdate]) -> None:
        """Set columns of a run; ``summary`` is merged into the stored summary, not replaced.

        Raises:
            TypeError: A key that is not an updatable column (see :class:`RunUpdate`): a misspelled
                column is a bug, never silently dropped.
            StoreError: No such run.
        """
        unknown = sorted(set(values) - RUN_UPDATE_KEYS)
        if unknown:
            raise TypeError(f"update_run: not an updatable run column: {', '.join(unknown)} "
                            f"(updatable: {', '.join(sorted(RUN_UPDATE_KEYS))})")
        summary = values.get("summary")
        columns = {key: value for key, value in values.items() if key != "summary"}
        with self._write() as s:
            run = s.get(Run, run_id)
            if run is None:
                raise StoreError(f"run {run_id}: no such run in {self.url}")
            for key, value in columns.items():
                setattr(run, key, value)
            if summary:
                run.summary = {**upgrade(run.summary or {}), **summary, "schema": SCHEMA}

    @_retrying
    def get_run(self, run_id: int) -> RunInfo | None:
        with self._begin() as s:
            run = s.get(Run, run_id)
            return None if run is None else _run_info(run)

    @_retrying
    def get_runs(self, run_ids: Sequence[int]) -> list[RunInfo]:
        """The runs with these ids that exist, in one query (compare reads tens of runs)."""
        with self._begin() as s:
            return [_run_info(r) for r in s.scalars(select(Run).where(Run.id.in_(list(run_ids))))]

    @_retrying
    def get_run_by_uid(self, uid: str) -> RunInfo | None:
        """The run whose globally unique ``uid`` this is (what names its folder)."""
        with self._begin() as s:
            run = s.scalars(select(Run).where(Run.uid == uid)).first()
            return None if run is None else _run_info(run)

    @_retrying
    def list_runs(self, status: str | None = None, sweep_id: str | None = None,
                  limit: int | None = None, sweep_prefix: str | None = None) -> list[RunInfo]:
        """Every run, newest first (the newest ``limit`` of them when given); ``sweep_prefix``: only the runs
        of the sweeps whose id starts with it (``plan-``: every plan's trials)."""
        with self._begin() as s:
            query = select(Run).order_by(Run.id.desc())
            if status:
                query = query.where(Run.status == status)
            if sweep_id:
                query = query.where(Run.sweep_id == sweep_id)
            if sweep_prefix:
                query = query.where(Run.sweep_id.startswith(sweep_prefix, autoescape=True))
            if limit is not None:
                query = query.limit(limit)
            return [_run_info(r) for r in s.scalars(query)]

    @_retrying
    def sweeps(self, prefix: str = "") -> list[tuple[str, int, int]]:
        """The sweep ids that start with ``prefix``, each with how many runs it holds and the id of its newest
        run, the most recently added to first (one grouped query: no run is read)."""
        with self._begin() as s:
            newest = func.max(Run.id)
            query = (select(Run.sweep_id, func.count(Run.id), newest)
                     .where(Run.sweep_id.startswith(prefix, autoescape=True))
                     .group_by(Run.sweep_id).order_by(newest.desc()))
            return [(str(sweep), int(n), int(last)) for sweep, n, last in s.execute(query)]

    @_retrying
    def count_runs(self, status: str | None = None) -> int:
        """How many runs there are (with ``status`` when given), without reading them."""
        with self._begin() as s:
            query = select(func.count(Run.id))
            if status:
                query = query.where(Run.status == status)
            return int(s.scalar(query) or 0)

    @_retrying
    def delete_run(self, run_id: int) -> bool:
        with self._write() as s:
            for table in (Metric, MetricRollup, NamedMetric, NamedMetricRollup, Event, DeviceSampleRow, ProcessSampleRow):
                s.execute(delete(table).where(table.run_id == run_id))
            return s.execute(delete(Run).where(Run.id == run_id)).rowcount > 0  # type: ignore[attr-defined,no-any-return]

    # ------------------------------------------------------------------ events and metrics

    @_retrying
    def ingest(self, run_id: int, events: Sequence[dict[str, Any]], source: str = "trainer") -> int:
        """Store journal events (and the metrics of the trainer's step events); skip any already stored.

        The trainer's ``metrics`` events (:class:`runner.spec.events.MetricsEvent`) become rows of the named
        metrics (:meth:`named_metrics`), written in the same transaction: the one batched writer of
        named values. A name reported twice for one step keeps the later value.

        Args:
            run_id: the run.
            events: records of one journal, in ``seq`` order.
            source: ``trainer`` (``events.jsonl``) or ``orchestrator`` (``orchestrator.jsonl``).

        Returns the number of events newly stored.
        """
        if not events:
            return 0
        with self._write() as s:
            last = s.scalar(
                select(func.max(Event.seq)).where(Event.run_id == run_id, Event.source == source)
            )
            fresh = [e for e in events if last is None or int(e["seq"]) > last]
            if not fresh:
                return 0
            # Core executemany, not one ORM object per row: about 4x the rows per second (BENCHMARKS.md,
            # "Store at scale"); the rows and their values are the same.
            event_rows = [{"run_id": run_id, "source": source, "seq": int(e["seq"]), "type": e["type"],
                           "time": e["time"],
                           "payload": {k: v for k, v in e.items() if k not in ("seq", "type", "time")}}
                          for e in fresh]
            metric_rows = [
                {"run_id": run_id, "step": int(e["step"]), "time": float(e["time"]), "loss": e.get("loss"),
                 "lr": e.get("lr"), "grad_norm": e.get("grad_norm"), "tokens": e.get("tokens"),
                 "step_time": e.get("step_time"), "tokens_per_s": e.get("tokens_per_s")}
                for e in fresh if e["type"] == "step" and source == "trainer"
            ]
            s.execute(insert(_table(Event)), event_rows)
            if source == "trainer":
                _add_named(s, run_id, [e for e in fresh if e["type"] == "metrics"])
            if metric_rows:
                s.execute(insert(_table(Metric)), metric_rows)
                write_rollups(s, run_id, metric_rows)
                run = s.get(Run, run_id)
                if run is not None:
                    run.steps_done = max([int(e["step"]) for e in fresh if e["type"] == "step"] + [run.steps_done or 0])
            return len(fresh)

    @_retrying
    def add_event(self, run_id: int, type_: str, time: float, payload: dict[str, Any]) -> None:
        """Store an orchestrator event (launch, exit, hang, ...)."""
        with self._write() as s:
            seq = s.scalar(
                select(func.count(Event.id)).where(Event.run_id == run_id, Event.source == "orchestrator")
            )
            s.add(Event(run_id=run_id, source="orchestrator", seq=int(seq or 0), type=type_, time=time, payload=payload))

    @_retrying
    def metrics(self, run_id: int, after_step: int | None = None, last: int | None = None) -> list[MetricPoint]:
        """Per-step metrics of a run, by step; only those after ``after_step`` when given (live views),
        only the newest ``last`` when given."""
        with self._begin() as s:
            query = select(Metric).where(Metric.run_id == run_id)
            if after_step is not None:
                query = query.where(Metric.step > after_step)
            if last is not None:
                newest = [_frozen(MetricPoint, r) for r in s.scalars(query.order_by(Metric.step.desc()).limit(last))]
                return newest[::-1]
            return [_frozen(MetricPoint, r) for r in s.scalars(query.order_by(Metric.step))]

    @_retrying
    def curves(self, run_ids: Sequence[int], name: str = "loss", points: int = 400) -> dict[int, Curve]:
        """Each run's ``name`` curve (``loss``, ``lr``, ``grad_norm``, ``tokens_per_s``) downsampled to
        about ``points`` points from the stored per-block summaries (:mod:`store.rollup`): a few hundred
        rows per run whatever its length, keeping each group's first, last, lowest and highest point.
        Every metric row stays stored; :meth:`metrics` reads them all."""
        with self._begin() as s:
            return read_curves(s, run_ids, name, points)

    @_retrying
    def named_metrics(self, run_id: int, names: Iterable[str] | None = None,
                      after_step: int | None = None) -> list[NamedMetricPoint]:
        """Named per-step values of a run (see :class:`runner.spec.events.MetricsEvent`), by step then name.

        Args:
            run_id: the run.
            names: only these names (exact); None for every name.
            after_step: only steps after this one (live views).
        """
        with self._begin() as s:
            query = select(NamedMetric).where(NamedMetric.run_id == run_id)
            if names is not None:
                query = query.where(NamedMetric.name.in_(list(names)))
            if after_step is not None:
                query = query.where(NamedMetric.step > after_step)
            query = query.order_by(NamedMetric.step, NamedMetric.name)
            return [_frozen(NamedMetricPoint, r) for r in s.scalars(query)]

    @_retrying
    def named_curves(self, run_ids: Sequence[int], names: Iterable[str] | None = None,
                     points: int = 400) -> dict[int, dict[str, Curve]]:
        """Each run's named metrics (all, or only ``names``) downsampled to about ``points`` points each
        from their per-block summaries, as :meth:`curves` reads the per-step columns; by run id, then
        name. A curve's last point is the metric's last value. :meth:`named_metrics` reads every row."""
        with self._begin() as s:
            return read_named_curves(s, run_ids, list(names) if names is not None else None, points)

    @_retrying
    def named_last(self, run_ids: Sequence[int]) -> dict[int, dict[str, tuple[int, float]]]:
        """Each run's named metrics' last finite value and its step, by run id then name, from their
        summaries (one row per run and name)."""
        with self._begin() as s:
            return read_named_last(s, run_ids)

    @_retrying
    def metric_names(self, run_id: int) -> list[str]:
        """The names of the named metrics a run has, sorted."""
        with self._begin() as s:
            query = select(NamedMetric.name).where(NamedMetric.run_id == run_id).distinct().order_by(NamedMetric.name)
            return list(s.scalars(query))

    @_retrying
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
        # Rows as plain dicts first: a retried transaction must not find its iterators spent.
        device = [{c: getattr(x, c, None) for c in device_cols} for x in samples]
        procs = [{c: getattr(x, c, None) for c in proc_cols} for x in processes]
        self._add_sample_rows(run_id, device, procs)

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

    @_retrying
    def _add_sample_rows(self, run_id: int, device: list[dict[str, Any]], procs: list[dict[str, Any]]) -> None:
        with self._write() as s:
            s.add_all(DeviceSampleRow(run_id=run_id, **row) for row in device)
            s.add_all(ProcessSampleRow(run_id=run_id, **row) for row in procs)

    @_retrying
    def samples(self, run_id: int, after_id: int | None = None) -> list[SampleInfo]:
        """Device samples of a run in write order; only rows after ``after_id`` when given."""
        with self._begin() as s:
            query = select(DeviceSampleRow).where(DeviceSampleRow.run_id == run_id)
            if after_id is not None:
                query = query.where(DeviceSampleRow.id > after_id).order_by(DeviceSampleRow.id)
            else:
                query = query.order_by(DeviceSampleRow.time, DeviceSampleRow.id)
            return [_frozen(SampleInfo, r) for r in s.scalars(query)]

    @_retrying
    def process_samples(self, run_id: int, after_id: int = 0) -> list[ProcessSampleInfo]:
        """GPU memory per process of a run (NVML), in write order, after ``after_id``."""
        with self._begin() as s:
            query = (select(ProcessSampleRow)
                     .where(ProcessSampleRow.run_id == run_id, ProcessSampleRow.id > after_id)
                     .order_by(ProcessSampleRow.id))
            return [_frozen(ProcessSampleInfo, r) for r in s.scalars(query)]

    def close(self) -> None:
        self.engine.dispose()


def _add_named(s: Session, run_id: int, events: Sequence[dict[str, Any]]) -> None:
    """Rows of ``named_metrics`` from ``metrics`` events, in one transaction; a (step, name) already
    stored, or given twice, keeps the last value (so a re-ingest or a repeated report cannot fail)."""
    values: dict[tuple[int, str], tuple[float | None, float]] = {}
    for e in events:
        step, when = int(e["step"]), float(e["time"])
        for name, value in (e.get("values") or {}).items():
            number = float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
            values[(step, str(name))] = (number if number is None or math.isfinite(number) else None, when)
    if not values:
        return
    # Core statements in batches (executemany), like the metric rows: the rows are the same as one ORM
    # object each would give, at several times the rate (BENCHMARKS.md, "Store at scale").
    table = _table(NamedMetric)
    steps = [step for step, _ in values]
    existing = {(r.step, r.name): r.id for r in s.execute(
        select(table.c.id, table.c.step, table.c.name)
        .where(table.c.run_id == run_id, table.c.step >= min(steps), table.c.step <= max(steps)))}
    inserts = [{"run_id": run_id, "step": step, "name": name, "value": value, "time": when}
               for (step, name), (value, when) in values.items() if (step, name) not in existing]
    updates = [{"row_id": existing[key], "value": value, "time": when}
               for key, (value, when) in values.items() if key in existing]
    if inserts:
        s.execute(insert(table), inserts)
    if updates:
        s.connection().execute(update(table).where(table.c.id == bindparam("row_id"))
                               .values(value=bindparam("value"), time=bindparam("time")), updates)
    write_named_rollups(s, run_id, [(step, name, value) for (step, name), (value, _) in values.items()
                                    if (step, name) not in existing],
                        [(step, name, value) for (step, name), (value, _) in values.items() if (step, name) in existing])


