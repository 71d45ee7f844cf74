"""The database schema (SQLAlchemy 2.0 typed declarative models).

Portable SQL only (SQLite and PostgreSQL): JSON columns through SQLAlchemy's ``JSON`` type, times as
timezone-naive UTC ``DateTime``, byte counts as 64-bit integers.

Every change here is a migration in ``store/migrations/versions/`` (a test compares the migrated schema with
these models on both backends).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship


class Base(DeclarativeBase):
    pass


BIG = BigInteger().with_variant(Integer(), "sqlite")
"""Byte and token counts: PostgreSQL's INTEGER stops at 2 GiB; SQLite's INTEGER is already 64-bit (and a
distinct BIGINT there would only be a rename)."""


class Run(Base):
    __tablename__ = "runs"
    __table_args__ = (
        Index("ix_runs_status", "status"),
        Index("ix_runs_sweep", "sweep_id"),
        UniqueConstraint("uid", name="uq_runs_uid"),
        UniqueConstraint("run_key", name="uq_runs_run_key"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    uid: Mapped[str] = mapped_column(String(32))
    """Globally unique, never reused (ids restart in a fresh database; this names the run folder)."""
    name: Mapped[str] = mapped_column(String(200))
    sweep_id: Mapped[str | None] = mapped_column(String(64), default=None)
    recipe_text: Mapped[str] = mapped_column(Text)
    recipe_hash: Mapped[str] = mapped_column(String(64))
    recipe_source: Mapped[str | None] = mapped_column(String(1000), default=None)
    strategy: Mapped[str] = mapped_column(String(32))
    nproc: Mapped[int] = mapped_column(Integer)
    method: Mapped[str] = mapped_column(String(16))
    model: Mapped[str] = mapped_column(String(500))
    status: Mapped[str] = mapped_column(String(16))
    """created | running | completed | failed | stopped"""
    distributed_type: Mapped[str | None] = mapped_column(String(32), default=None)
    """What accelerate reported in effect (from the start event), not what was asked for."""
    device_type: Mapped[str | None] = mapped_column(String(16), default=None)
    host: Mapped[str] = mapped_column(String(255))
    run_dir: Mapped[str] = mapped_column(String(1000))
    pgid: Mapped[int | None] = mapped_column(Integer, default=None)
    """The launcher's process group (the launcher's pid: it leads the group)."""
    pgid_started: Mapped[float | None] = mapped_column(Float, default=None)
    """The launcher's start time (psutil ``create_time``, seconds since the epoch): with ``pgid``, what
    tells the launcher from a later process given the same pid."""
    created_at: Mapped[datetime] = mapped_column(DateTime)
    started_at: Mapped[datetime | None] = mapped_column(DateTime, default=None)
    ended_at: Mapped[datetime | None] = mapped_column(DateTime, default=None)
    exit_code: Mapped[int | None] = mapped_column(Integer, default=None)
    error: Mapped[str | None] = mapped_column(Text, default=None)
    # Summary figures (measured, from the trainer's end event), as columns so lists can sort.
    total_steps: Mapped[int | None] = mapped_column(Integer, default=None)
    steps_done: Mapped[int | None] = mapped_column(Integer, default=None)
    train_seconds: Mapped[float | None] = mapped_column(Float, default=None)
    tokens_per_s: Mapped[float | None] = mapped_column(Float, default=None)
    final_loss: Mapped[float | None] = mapped_column(Float, default=None)
    peak_mem_bytes: Mapped[int | None] = mapped_column(BIG, default=None)
    mean_util: Mapped[float | None] = mapped_column(Float, default=None)
    summary: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    """Everything else: per-rank memory, params, telemetry summaries, estimates."""
    tags: Mapped[list[str]] = mapped_column(JSON, default=list)
    note: Mapped[str] = mapped_column(Text, default="")
    resumed_from: Mapped[int | None] = mapped_column(
        ForeignKey("runs.id", ondelete="SET NULL", name="fk_runs_resumed_from"), default=None
    )
    """The run this one continues from (its checkpoint), if any."""
    watcher_pid: Mapped[int | None] = mapped_column(Integer, default=None)
    """The process supervising the run (the orchestrator), on ``watcher_host``; for ``ftui recover``."""
    watcher_host: Mapped[str | None] = mapped_column(String(255), default=None)
    stop_requested_at: Mapped[datetime | None] = mapped_column(DateTime, default=None)
    """Set by whoever asks the run to stop (the TUI, another host); the watcher polls it."""
    run_key: Mapped[str | None] = mapped_column(String(255), default=None)
    """What the node agents of one multi-node run share to find its row (``--run-key``, the rendezvous id,
    ``slurm-<job id>``); None for a one-machine run. A finished run's key gets ``#<id>`` appended."""
    nnodes: Mapped[int | None] = mapped_column(Integer, default=None)
    """Machines the run spans (None: one)."""
    slurm_job_id: Mapped[str | None] = mapped_column(String(32), default=None)
    """The SLURM job running it (``ftui slurm --submit``)."""

    metrics: Mapped[list[Metric]] = relationship(
        back_populates="run", cascade="all, delete-orphan", passive_deletes=True, foreign_keys="Metric.run_id"
    )


class Metric(Base):
    __tablename__ = "metrics"
    __table_args__ = (UniqueConstraint("run_id", "step", name="uq_metrics_run_step"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(Integer)
    time: Mapped[float] = mapped_column(Float)
    loss: Mapped[float | None] = mapped_column(Float)
    lr: Mapped[float | None] = mapped_column(Float, default=None)
    grad_norm: Mapped[float | None] = mapped_column(Float, default=None)
    tokens: Mapped[int | None] = mapped_column(BIG, default=None)
    step_time: Mapped[float | None] = mapped_column(Float, default=None)
    tokens_per_s: Mapped[float | None] = mapped_column(Float, default=None)

    run: Mapped[Run] = relationship(back_populates="metrics")


class NamedMetric(Base):
    """Any named per-step value (``train/*``, ``eval/*``, a user's own), beside the fixed columns of
    :class:`Metric`; one row per (run, step, name), written from the trainer's ``metrics`` events."""

    __tablename__ = "named_metrics"
    __table_args__ = (
        UniqueConstraint("run_id", "name", "step", name="uq_named_metrics_run_name_step"),
        Index("ix_named_metrics_run_step", "run_id", "step"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(Integer)
    name: Mapped[str] = mapped_column(String(200))
    value: Mapped[float | None] = mapped_column(Float)
    """None for a non-finite value (JSON, and so the journal, has no NaN)."""
    time: Mapped[float] = mapped_column(Float)


class DeviceSampleRow(Base):
    __tablename__ = "device_samples"
    __table_args__ = (Index("ix_device_samples_run_time", "run_id", "time"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    time: Mapped[float] = mapped_column(Float)
    host: Mapped[str] = mapped_column(String(255))
    kind: Mapped[str] = mapped_column(String(8))
    """gpu | rank | host"""
    index: Mapped[int] = mapped_column(Integer)
    name: Mapped[str] = mapped_column(String(200))
    util_pct: Mapped[float | None] = mapped_column(Float, default=None)
    mem_used: Mapped[int | None] = mapped_column(BIG, default=None)
    mem_total: Mapped[int | None] = mapped_column(BIG, default=None)
    power_w: Mapped[float | None] = mapped_column(Float, default=None)
    temp_c: Mapped[float | None] = mapped_column(Float, default=None)
    sm_clock_mhz: Mapped[int | None] = mapped_column(Integer, default=None)
    pid: Mapped[int | None] = mapped_column(Integer, default=None)
    source: Mapped[str] = mapped_column(String(16))
    """nvml | psutil | fake-nvml"""
    node: Mapped[int | None] = mapped_column(Integer, default=None)
    """The node (``run_nodes.slot``) whose agent read it; None for a one-machine run."""


class ProcessSampleRow(Base):
    __tablename__ = "process_samples"
    __table_args__ = (Index("ix_process_samples_run_time", "run_id", "time"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    time: Mapped[float] = mapped_column(Float)
    host: Mapped[str] = mapped_column(String(255))
    gpu_index: Mapped[int] = mapped_column(Integer)
    pid: Mapped[int] = mapped_column(Integer)
    rank: Mapped[int | None] = mapped_column(Integer, default=None)
    used_bytes: Mapped[int | None] = mapped_column(BIG, default=None)
    source: Mapped[str] = mapped_column(String(16))
    node: Mapped[int | None] = mapped_column(Integer, default=None)
    """The node (``run_nodes.slot``) whose agent read it; None for a one-machine run."""


class Event(Base):
    __tablename__ = "events"
    __table_args__ = (
        UniqueConstraint("run_id", "source", "seq", name="uq_events_run_source_seq"),
        Index("ix_events_run", "run_id"),
        Index("ix_events_run_type", "run_id", "type"),  # one type of a long run's events (eval samples)
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    source: Mapped[str] = mapped_column(String(16))
    """trainer (the run's journal, seq is the journal's) | orchestrator"""
    seq: Mapped[int] = mapped_column(Integer)
    type: Mapped[str] = mapped_column(String(32))
    time: Mapped[float] = mapped_column(Float)
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)


class _RollupColumns:
    """The columns of one block of one series: its ends and extremes (``store/rollup.py``)."""

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(200))
    span: Mapped[int] = mapped_column(Integer)
    """Block size in steps (``store.rollup.SPANS``)."""
    block: Mapped[int] = mapped_column(Integer)
    """``step // span``."""
    count: Mapped[int] = mapped_column(Integer)
    first_step: Mapped[int] = mapped_column(Integer)
    first_value: Mapped[float] = mapped_column(Float)
    last_step: Mapped[int] = mapped_column(Integer)
    last_value: Mapped[float] = mapped_column(Float)
    min_step: Mapped[int] = mapped_column(Integer)
    min_value: Mapped[float] = mapped_column(Float)
    max_step: Mapped[int] = mapped_column(Integer)
    max_value: Mapped[float] = mapped_column(Float)


class MetricRollup(_RollupColumns, Base):
    """Per run, metric and block of steps: the block's ends and extremes (``store/rollup.py``).

    Written by the same transaction as the metric rows they summarise; the rows are never thinned."""

    __tablename__ = "metric_rollups"
    __table_args__ = (UniqueConstraint("run_id", "name", "span", "block", name="uq_metric_rollups_key"),)


class NamedMetricRollup(_RollupColumns, Base):
    """The same summaries for the named metrics (:class:`NamedMetric`): per run, name and block of steps.

    A table of its own, so that a named metric called ``loss`` never mixes with the ``loss`` column."""

    __tablename__ = "named_metric_rollups"
    __table_args__ = (UniqueConstraint("run_id", "name", "span", "block", name="uq_named_metric_rollups_key"),)


class RunNode(Base):
    """One machine of a multi-node run: its node agent (``ftui run --nnodes``), where it runs, how it ended."""

    __tablename__ = "run_nodes"
    __table_args__ = (UniqueConstraint("run_id", "slot", name="uq_run_nodes_run_slot"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    slot: Mapped[int] = mapped_column(Integer)
    """Order of joining (0 created the run row); not the torch node rank, which c10d assigns."""
    node_rank: Mapped[int | None] = mapped_column(Integer, default=None)
    """torch's node rank (``GROUP_RANK``), read from the ranks once they started."""
    ranks: Mapped[list[int]] = mapped_column(JSON, default=list)
    """The global ranks that run on this node."""
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    """The node agent's pid on ``host``."""
    run_dir: Mapped[str] = mapped_column(String(1000), default="")
    status: Mapped[str] = mapped_column(String(16))
    """running | completed | failed | stopped"""
    error: Mapped[str | None] = mapped_column(Text, default=None)
    exit_code: Mapped[int | None] = mapped_column(Integer, default=None)
    joined_at: Mapped[datetime] = mapped_column(DateTime)
    heartbeat_at: Mapped[datetime] = mapped_column(DateTime)
    """Renewed by the agent every few seconds: a node whose heartbeat stopped is taken for dead."""
    ended_at: Mapped[datetime | None] = mapped_column(DateTime, default=None)
    fault_at: Mapped[float | None] = mapped_column(Float, default=None)
    """When this node first saw a rank of its own fail (wall clock): the earliest fault is the root cause."""
    checkpoints: Mapped[list[int] | None] = mapped_column(JSON, default=None)
    """The checkpoint steps this node's folder holds complete (its manifest says so and every listed file is
    there with its size), oldest first; written by its agent as they turn complete, and again by
    ``ftui resume`` from what is on the disk then. None: never recorded (a row that migration 0006 gave the column)."""


class StopRequestRow(Base):
    """A request to stop a run, written by whoever asks (``ftui stop``, the TUI, a node agent) and polled by
    every node agent of the run: how a stop reaches processes on other machines."""

    __tablename__ = "stop_requests"
    __table_args__ = (Index("ix_stop_requests_run", "run_id"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    requested_at: Mapped[datetime] = mapped_column(DateTime)
    kill: Mapped[bool] = mapped_column(Boolean, default=False)
    by: Mapped[str] = mapped_column(String(255))
    """Who asked: ``ftui stop on HOST``, ``node 1 (HOST)``, ``the dashboard on HOST``."""


class QueueEntry(Base):
    """One run in the queue of its host (``ftui queue add``): the resolved recipe and how to start it,
    waiting for the devices it takes, then the run the host's queue runner started (``run_id``), or why
    it could not (``error``)."""

    __tablename__ = "queue_entries"
    __table_args__ = (Index("ix_queue_entries_host_status", "host", "status"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    recipe_text: Mapped[str] = mapped_column(Text)
    """The recipe as checked when it was queued, its flags applied (what runs, whatever its file says later)."""
    recipe_source: Mapped[str | None] = mapped_column(String(1000), default=None)
    host: Mapped[str] = mapped_column(String(255))
    """The host whose queue runner starts it (where it was queued)."""
    workdir: Mapped[str] = mapped_column(String(1000))
    """The folder it was queued from: a script's working folder, as ``ftui run`` there would give it."""
    visible_devices: Mapped[str | None] = mapped_column(String(1000), default=None)
    """``CUDA_VISIBLE_DEVICES`` where it was queued (None: unset); the run is started under it."""
    devices: Mapped[list[str]] = mapped_column(JSON, default=list)
    """The devices the run takes (:mod:`runner.spec.devices`)."""
    options: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    """How the run is started and watched, the flags of ``ftui run`` that are not recipe fields
    (``runner.service.queue.QueueOptions``)."""
    status: Mapped[str] = mapped_column(String(16))
    """queued | running | done | failed (``runner.spec.status``)"""
    run_id: Mapped[int | None] = mapped_column(
        ForeignKey("runs.id", ondelete="SET NULL", name="fk_queue_entries_run"), default=None)
    error: Mapped[str | None] = mapped_column(Text, default=None)
    """Why it could not start (one line)."""
    created_at: Mapped[datetime] = mapped_column(DateTime)
    started_at: Mapped[datetime | None] = mapped_column(DateTime, default=None)
    ended_at: Mapped[datetime | None] = mapped_column(DateTime, default=None)
