"""The records the store hands out: frozen dataclasses, never ORM rows, and what a run's update may set.

A run's columns are declared once, by :class:`store.models.Run`; :class:`RunInfo` and :class:`RunUpdate`
repeat them for mypy, and a test (tests/unit/test_store_records.py) checks them against the model field for
field. A sample's fields are the probe's own records (:mod:`runner.hardware.records`) plus the row id.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypedDict

from runner.hardware.records import DeviceSample, ProcessGpuMemory
from runner.spec.summary import RunSummary


class RunUpdate(TypedDict, total=False):
    """The columns of a run that :meth:`Store.update_run` may set (the recipe and identity are fixed).

    Each is a field of :class:`RunInfo` of the same type (a test checks it), except ``summary``: the
    writer's piece of the summary, by :class:`runner.spec.summary.RunSummary`'s attribute names.
    """

    name: str
    sweep_id: str | None
    status: str
    distributed_type: str | None
    device_type: str | None
    host: str
    run_dir: str
    pgid: int | None
    pgid_started: float | None
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
    summary: dict[str, Any]
    """Merged into the stored summary (keys given replace those keys), never replacing it whole."""
    tags: list[str]
    note: str
    watcher_pid: int | None
    watcher_host: str | None
    stop_requested_at: datetime | None
    nnodes: int | None
    slurm_job_id: str | None


RUN_UPDATE_KEYS = frozenset(RunUpdate.__annotations__)


@dataclass(frozen=True)
class RunInfo:
    """A run as readers get it: one field per column of :class:`store.models.Run` (a test checks that they
    match), the summary parsed into its typed record."""

    id: int
    uid: str
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
    summary: RunSummary = field(default_factory=RunSummary)
    tags: list[str] = field(default_factory=list)
    note: str = ""
    resumed_from: int | None = None
    pgid_started: float | None = None
    """The launcher's start time (psutil ``create_time``); None for a run recorded without it."""
    watcher_pid: int | None = None
    watcher_host: str | None = None
    stop_requested_at: datetime | None = None
    run_key: str | None = None
    """Multi-node runs: the key their node agents share (:mod:`store.nodes`)."""
    nnodes: int | None = None
    slurm_job_id: str | None = None


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
class NamedMetricPoint:
    """One named value of one step (``eval/loss`` at step 50); ``value`` None where it was not finite."""

    step: int
    name: str
    value: float | None
    time: float


@dataclass(frozen=True)
class SampleInfo(DeviceSample):
    """A stored device reading: the probe's own record (one sample record in the project) plus its row id."""

    id: int = 0
    """Row id: increases with every write, so a reader can ask for what came after it."""
    node: int | None = None
    """The node of a multi-node run whose agent read it (``run_nodes.slot``); None on one machine."""


@dataclass(frozen=True)
class ProcessSampleInfo(ProcessGpuMemory):
    """A stored per-process GPU memory reading: the probe's own record plus its row id."""

    id: int = 0
    """Row id: increases with every write, so a reader can ask for what came after it."""
    node: int | None = None
    """The node of a multi-node run whose agent read it (``run_nodes.slot``); None on one machine."""


@dataclass(frozen=True)
class EventInfo:
    source: str
    seq: int
    type: str
    time: float
    payload: dict[str, Any]
