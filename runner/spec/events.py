"""The run folder and its event journal: the contract between the trainer and the orchestrator.

A run folder holds everything needed to understand, re-ingest or resume a run without the database:

    recipe.toml          the resolved recipe the trainer reads
    accelerate.yaml      the generated accelerate config (absent when the recipe names its own)
    launch.json          argv, env and config path, as built
    events.jsonl         the journal: one JSON object per line, written by rank 0 only
    orchestrator.jsonl   the orchestrator's own events, journaled before the store (runner.watch.journal)
    samples.jsonl        telemetry samples, appended per batch (runner.watch.journal)
    watcher.lock         flock-ed by the process watching the run (runner.service.recover)
    launcher.log         stdout/stderr of ``accelerate launch`` itself
    logs/rank{N}.log     stdout/stderr of each rank
    ranks/{N}.pid        the pid of each rank, written as the rank starts
    stacks/rank{N}.txt   each rank's Python stacks, dumped on request (runner.spec.stacks)
    output/              the saved adapter or model

    checkpoints/step-NNNNNNNN/   resumable checkpoints (``runner.spec.checkpoint``), each with ``ftui.json``

Every event carries ``seq`` (0, 1, 2, ... within the run: its stable id), ``type`` and ``time``
(unix seconds). Types written by the trainer (rank 0):

- ``phase``: what the trainer is doing now, where no step comes for a while: ``phase`` and ``detail`` (a
  few words for a person: the model, the strategy, the step). Before step 1: ``"tokenizing"``,
  ``"loading_model"``, ``"preparing"``, ``"resuming"`` (each starts where the previous one ends; ``start``
  follows the last); ``"compiling"`` after ``start`` with ``train.compile``: the first step, whose forward and
  backward compile each decoder layer (its ``step`` event ends it); between steps: ``"evaluating"`` (a
  ``metrics`` event ends it) and ``"saving"`` (a checkpoint, ended by its ``checkpoint`` event, or the final
  model, ended by ``end``). Each is a sign of progress for the watcher's hang rule.

- ``start``: world size, distributed type in effect, params, total steps, ... and ``start_step`` (0, or
  the checkpoint's step when resumed) with ``resumed_from`` (the checkpoint folder or null),
  ``resume_seconds`` (wall time of restoring it, or null) and ``process_started`` (rank 0's process
  start on this clock: :mod:`runner.spec.first_step`).
- ``step``: ``step`` (global, 1-based; a resumed run goes on at N+1), ``epoch``, ``loss``, ``lr``,
  ``grad_norm``, ``tokens`` (cumulative, from the checkpoint's count when resumed), ``step_time``,
  ``tokens_per_s``, and ``skipped: true`` on a step whose update was dropped (``train.on_nan = "skip"``).
- ``memory``: each rank's allocator figures, gathered in the step's collective, at step 1, then at
  most every ``MEMORY_EVERY_S`` seconds, and at the last step: ``step`` and ``ranks``, a list by rank
  of ``{"rank", "source", ...}``: source ``"torch.cuda"`` gives ``allocated_bytes``,
  ``reserved_bytes``, ``peak_allocated_bytes`` of the rank's device; source ``"rss"`` (CPU, where torch
  has no allocator statistics) gives the process's ``rss_bytes`` (now, /proc) and ``peak_rss_bytes``
  (getrusage).
- ``checkpoint``: ``step``, ``path``, ``seconds`` (wall time of the save, barriers included),
  ``bytes`` (files written), ``reason`` (``"every"`` or ``"stop"``), ``removed`` (older ones pruned).
- ``error``: ``message`` (one line); for a non-finite loss also ``reason`` (``"nan_loss"`` or
  ``"too_many_skipped"``), ``step`` and ``value`` (``"nan"``, ``"inf"``, ``"-inf"``).
- ``precision``: after the first optimizer step, the dtypes of rank 0's live tensors: ``params``,
  ``frozen_params``, ``compute``, ``optimizer_state``, ``master`` (null without an fp32 master copy).
- ``loss_scale``: fp16 only, when the dynamic loss scale drops: ``step``, ``old``, ``new``.
- ``kernels``: after the first step, what rank 0 ran it with: ``attention`` (the live model's
  ``config._attn_implementation``) and ``compile`` (null, or ``mode``, compiled ``layers``, Dynamo's
  ``graphs`` and ``graph_breaks``, and the compile phase's ``seconds``).
- ``metrics``: ``step``, ``rank`` and ``values``, a map of metric name to float (or null): any named
  per-step values (``eval/loss``, ``eval/perplexity``, ``train/*``, a user's own), stored in the
  ``named_metrics`` table (:class:`MetricsEvent`, :func:`metrics_event`).
- ``eval_samples``: ``step`` and ``samples``, ``[{"prompt", "completion"}]`` generated at an evaluation.
- ``end``: ``status`` (completed / stopped / failed), ``steps``, ``train_seconds``, ``tokens``,
  ``tokens_per_s`` (steady state: this run's steps after the memory-metered ones; null when every step
  was metered), ``window_tokens_per_s`` (every step of this run), ``steady_steps``, ``steady_seconds``,
  ``steady_cpu_seconds`` (CPU: every rank's process over its steady steps), ``final_loss``, ``saved``,
  ``ranks``, ``skipped``,
  ``checkpoint`` (the newest complete one, or null).

The orchestrator adds its own (``launch``, ``exit``, ``hang``) to the store only. JSON has no NaN or
infinity (and SQLite's json functions refuse them): the writer turns non-finite floats into null.

The orchestrator journals its own events (``launch``, ``attach``, ``rank_exit``, ``hang``, ``stacks``,
``hang_stop``, ``stop_requested``, ``stop``, ``watcher_error``, ``exit``) in ``orchestrator.jsonl`` with their own ``seq``
(:mod:`runner.watch.journal`). ``launch`` holds the argv, the process group (``pgid``, ``pgid_started``: the
launcher's psutil create time, which proves the group the run's), ``launcher_started`` (the launcher's
process start on the clock of the journals' times: where the time to first step starts,
:mod:`runner.spec.first_step`) and the watcher (``watcher_pid``, ``watcher_started``, ``watcher_host``).
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NotRequired, TypedDict

EVENTS_FILE = "events.jsonl"
RECIPE_FILE = "recipe.toml"
ACCELERATE_FILE = "accelerate.yaml"
LAUNCH_FILE = "launch.json"
LAUNCHER_LOG = "launcher.log"
ENERGY_COUNTER = "energy_counter"
"""The watcher's event with the CPU's RAPL counters (:func:`runner.hardware.rapl.read_counters`), ``at``
the launch (``start``) and at the exit (``end``): the ledger's CPU energy."""
OUTPUT_DIR = "output"

EXIT_NO_SPACE = 28
"""What a rank exits with when it failed because a disk was full (ENOSPC's number): the one word that
reaches the watcher when the full disk is the one holding the rank's log (torch elastic's report, or the
launcher's own exit code for one process)."""


def rank_log(run_dir: Path, rank: int) -> Path:
    """The log file of one rank."""
    return run_dir / "logs" / f"rank{rank}.log"


def rank_pid_file(run_dir: Path, rank: int) -> Path:
    """The pid file one rank writes as it starts."""
    return run_dir / "ranks" / f"{rank}.pid"


def read_rank_pids(run_dir: Path) -> dict[int, int]:
    """The pids the ranks of a run wrote so far, by rank."""
    pids: dict[int, int] = {}
    folder = run_dir / "ranks"
    if not folder.is_dir():
        return pids
    for entry in folder.glob("*.pid"):
        try:
            pids[int(entry.stem)] = int(entry.read_text().strip())
        except (ValueError, OSError):
            continue  # being written right now; the next poll gets it
    return pids


def finite_json(value: Any) -> Any:
    """``value`` with every non-finite float (NaN, +-inf) replaced by None, in dicts, lists and tuples
    at any depth; everything else as is."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite_json(v) for v in value]
    return value


# ---------------------------------------------------------------------- the trainer's events, typed
#
# Each event the trainer writes is one of these TypedDicts, built where it is emitted (mypy checks every key
# and type there) and read back by the orchestrator with :func:`typed`. ``seq`` and ``time`` are added by
# :class:`JournalWriter`.


class StartEvent(TypedDict):
    """The first event: what is in effect (accelerate's distributed type, world size), and the run's size."""

    type: Literal["start"]
    world_size: int
    distributed_type: str
    strategy: str
    device: str
    device_type: str
    mixed_precision: str
    threads: int
    """``torch.get_num_threads()`` of the rank: divides its CPU% and picks the CPU peak for MFU."""
    model_dims: dict[str, int] | None
    """:func:`runner.spec.flops.dims_from_config`: what FLOPs per token need, so compare reads no model config."""
    fsdp_version: int | None
    params: int
    trainable_params: int
    local_param_numel: int
    rows: int
    context_length: int
    total_steps: int
    steps_per_epoch: int
    tokens_per_step: int
    device_map: dict[str, Any] | None
    pids: list[int]
    start_step: int
    resumed_from: str | None
    resume_seconds: float | None
    engine: NotRequired[str]
    """What implements the strategy (``runner.spec.strategies``: accelerate, deepspeed, torch)."""
    sharding: NotRequired[dict[str, Any]]
    """:func:`runner.rank.sharding.in_effect`: engine, ZeRO stage, offload and what it is, read from the prepared
    model and optimizer of rank 0 (a mismatch with the strategy asked for fails the run before this)."""
    data: NotRequired[dict[str, Any]]
    """The data step (:meth:`runner.data.prepare.DataSet.info`): format, cache key, cached, seconds, eval rows."""
    process_started: NotRequired[float | None]
    """Rank 0's process start (unix seconds, :func:`runner.hardware.processes.started_wall`): where its imports
    start (:mod:`runner.spec.first_step`)."""
    parallel: NotRequired[dict[str, Any]]
    """Pipeline or tensor-parallel runs (runner/rank/pipeline.py): ``kind``, stages or tp size, micro-batches,
    schedule, which layers each process holds."""


Phase = Literal["tokenizing", "loading_model", "preparing", "resuming", "compiling", "evaluating", "saving"]

PHASE_WORDS: dict[str, str] = {
    "tokenizing": "tokenizing the data",
    "loading_model": "loading the model",
    "preparing": "preparing the strategy",
    "resuming": "restoring the checkpoint",
    "compiling": "compiling the layers",
    "evaluating": "evaluating",
    "saving": "saving",
}
"""Each phase as a person says it (the CLI's progress line and the Monitor share these words)."""


class PhaseEvent(TypedDict):
    """The trainer entered a phase: the silent minutes of loading and preparing before step 1, an
    evaluation or a save between steps."""

    type: Literal["phase"]
    phase: Phase
    detail: str


def phase_words(event: dict[str, Any]) -> str:
    """``"loading the model (builtin:tiny-llama)"``: a phase event in words, for any front end."""
    words = PHASE_WORDS.get(str(event.get("phase")), str(event.get("phase")))
    detail = event.get("detail")
    return f"{words} ({detail})" if detail else words


class StepEvent(TypedDict):
    """One optimizer step (every ``train.log_every`` steps, and notable ones)."""

    type: Literal["step"]
    step: int
    epoch: int
    loss: float | None
    lr: float
    grad_norm: float | None
    tokens: int
    step_time: float
    tokens_per_s: float
    skipped: NotRequired[bool]


class MemoryEvent(TypedDict):
    """Each rank's allocator figures (see the module docstring for the keys per source)."""

    type: Literal["memory"]
    step: int
    ranks: list[dict[str, Any]]


class CheckpointEvent(TypedDict):
    """A complete checkpoint was written (``runner.spec.checkpoint``)."""

    type: Literal["checkpoint"]
    step: int
    path: str
    seconds: float
    bytes: int
    reason: Literal["every", "stop"]
    removed: list[str]


class ErrorEvent(TypedDict):
    """Why a rank failed: one line, and for a non-finite value the reason, step and value."""

    type: Literal["error"]
    message: str
    rank: NotRequired[int]
    reason: NotRequired[str]
    step: NotRequired[int]
    value: NotRequired[str]


class ProbeRank(TypedDict):
    """One rank's matmul probes through its steady steps: the FLOP/s of each, and the seconds between each
    probe and the one before it (the span of training it stands for), or why it failed."""

    rank: int
    rates: list[float]
    """FLOPs over the wall seconds of each probe."""
    seconds: list[float]
    """``seconds[i]`` is the training between probes ``i`` and ``i + 1`` (one fewer than ``rates``)."""
    cpu_rates: NotRequired[list[float]]
    """FLOPs over the CPU-seconds the process ran in each probe (``time.process_time()``, every thread)."""
    steady_seconds: NotRequired[float]
    """The rank's wall seconds over its steady steps (what tokens/s covers; probes and evaluations left out)."""
    steady_cpu_seconds: NotRequired[float]
    """The CPU-seconds the rank's process ran over those same steps (probes and evaluations left out)."""
    error: NotRequired[str]


class PeakProbe(TypedDict):
    """The CPU matmul rate probed in every rank between its steady steps (:mod:`runner.rank.peak_probe`):
    the peak its MFU divides by, taken under the run's own load, step by step."""

    dtype: str
    threads: int
    """Torch threads of each rank (the run's own)."""
    size: int
    """The square matrix size of the probe's matmuls."""
    window_s: float
    """The least seconds of one probe (its rate is its FLOPs over its wall time)."""
    ranks: list[ProbeRank]
    omp_wait: NotRequired[str]
    """How the ranks' OpenMP threads waited (:func:`runner.spec.openmp.wait_words`: ``yield``, ``spin``...): the
    probe's and the training's conditions."""


class EndEvent(TypedDict):
    """The last event: how the training ended and what every rank measured."""

    type: Literal["end"]
    status: Literal["completed", "stopped", "failed"]
    steps: int
    train_seconds: float
    tokens: int
    tokens_per_s: float | None
    """Steady state: the unmetered steps (:mod:`runner.rank.throughput`); None when there were none."""
    window_tokens_per_s: NotRequired[float | None]
    """Every step of this run, the memory-metered ones included."""
    steady_steps: NotRequired[int]
    """The unmetered steps ``tokens_per_s`` is measured over."""
    steady_seconds: NotRequired[float | None]
    """Rank 0's wall seconds over those steps (what ``tokens_per_s`` divides by)."""
    steady_cpu_seconds: NotRequired[float | None]
    """CPU runs that completed: the CPU-seconds every rank's process ran over its steady steps, summed over the
    ranks (``time.process_time()``; probes and evaluations left out): what a CPU run's MFU divides by."""
    final_loss: float | None
    saved: str | None
    ranks: list[dict[str, Any]]
    """One :class:`runner.spec.summary.RankFigures` per rank."""
    skipped: int
    checkpoint: str | None
    peak_probe: NotRequired[PeakProbe]
    """CPU runs that completed: the matmul rate probed beside the run (the MFU peak's measurement)."""


class PrecisionEvent(TypedDict):
    """The precision rank 0 really trained in, read from its live tensors after the first optimizer step
    (:func:`runner.rank.sharding.precision_in_effect`)."""

    type: Literal["precision"]
    step: int
    params: str | None
    """Dtype of the trainable weights (local shards)."""
    frozen_params: str | None
    compute: str | None
    """Output dtype of the Linear layers in the first forward."""
    optimizer_state: str | None
    master: str | None
    """fp32 master copy's dtype (DeepSpeed), None when the optimizer updates the weights themselves."""
    source: str
    switches: NotRequired[dict[str, Any]]
    """:func:`runner.rank.gpu_switches.in_effect`: the cp mesh's size, ``Float8Linear`` modules
    (``fp8_linears``), whether the forward's saved tensors went to the host (``activation_offload``)."""


class CompileInEffect(TypedDict):
    """``train.compile`` as it ran (:mod:`runner.rank.compiling`)."""

    mode: str
    layers: int
    """Decoder layers compiled (the live modules' ``_compiled_call_impl``)."""
    graphs: int
    """Graphs Dynamo compiled by the end of the first step (its ``unique_graphs`` counter)."""
    graph_breaks: int
    """Graph breaks Dynamo met (each splits a layer's graph in two)."""
    seconds: float | None
    """Wall time of the compile phase: the first step, compilation included."""


class KernelsEvent(TypedDict):
    """The kernels rank 0 ran its first step with, read from the live model and Dynamo's counters."""

    type: Literal["kernels"]
    step: int
    attention: str | None
    """The live model's ``config._attn_implementation`` (what transformers dispatches to)."""
    compile: CompileInEffect | None
    """None: the layers were not compiled."""
    source: str


class LossScaleEvent(TypedDict):
    """fp16's dynamic loss scale dropped at this step (an overflow: the update was skipped by the scaler)."""

    type: Literal["loss_scale"]
    step: int
    old: float
    new: float


class MetricsEvent(TypedDict):
    """Named values of one step: ``train/*``, ``eval/*`` or a user's own metrics (any name, one float each).

    The store keeps each value as a row of ``named_metrics`` (:meth:`store.Store.named_metrics`); a
    non-finite value is stored as None. Build one with :func:`metrics_event`, which checks the names.
    """

    type: Literal["metrics"]
    rank: int
    step: int
    values: dict[str, float | None]


class EvalSamplesEvent(TypedDict):
    """What the model generated for each of ``eval.prompts`` at one evaluation (rank 0, greedy)."""

    type: Literal["eval_samples"]
    step: int
    samples: list[dict[str, str]]
    """``{"prompt", "completion"}`` in the order of ``eval.prompts``."""


TrainerEvent = (PhaseEvent | StartEvent | StepEvent | MemoryEvent | CheckpointEvent | ErrorEvent | EndEvent | MetricsEvent
                | EvalSamplesEvent | PrecisionEvent | LossScaleEvent | KernelsEvent)
TRAINER_EVENT_TYPES = frozenset({"phase", "start", "step", "memory", "checkpoint", "error", "end", "metrics", "eval_samples",
                                 "precision", "loss_scale", "kernels"})

METRIC_NAME_MAX = 200
"""Longest metric name the store keeps (``named_metrics.name``)."""


def metrics_event(step: int, values: dict[str, Any], rank: int = 0) -> MetricsEvent:
    """A checked :class:`MetricsEvent`: names are non-empty strings of at most :data:`METRIC_NAME_MAX`
    characters, values numbers (bools refused), turned into floats; non-finite ones become None.

    Raises:
        ValueError: a bad name or a value that is not a number, named.
    """
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"metrics: step must be an integer >= 0, got {step!r}")
    out: dict[str, float | None] = {}
    for name, value in values.items():
        if not isinstance(name, str) or not name.strip() or len(name) > METRIC_NAME_MAX:
            raise ValueError(f"metrics: a name must be 1 to {METRIC_NAME_MAX} characters, got {name!r}")
        if value is None:
            out[name] = None
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            try:
                value = float(value)  # a 0-d tensor or numpy scalar
            except (TypeError, ValueError):
                raise ValueError(f"metrics: {name}: not a number: {value!r}") from None
        number = float(value)
        out[name] = number if math.isfinite(number) else None
    return MetricsEvent(type="metrics", rank=rank, step=step, values=out)


def typed(event: dict[str, Any]) -> TrainerEvent | None:
    """A journal line read back as the trainer's typed event (None for a type the trainer does not write)."""
    if event.get("type") not in TRAINER_EVENT_TYPES:
        return None
    return event  # type: ignore[return-value]  # the writer built it from the TypedDict of its type


def append_whole(fd: int, data: bytes) -> None:
    """Append ``data`` to the file open at ``fd`` (``O_APPEND``) whole or not at all: a write the disk
    cannot take (full, an I/O error) is cut back off the file, so that no torn line is left for the next
    one to run on from.

    Raises:
        OSError: the write failed; the file is as it was.
    """
    size = os.fstat(fd).st_size
    done = 0
    try:
        while done < len(data):
            done += os.write(fd, data[done:])
    except OSError:
        if done:
            try:  # shrinking needs no room
                os.ftruncate(fd, size)
            except OSError:
                pass
        raise


class JournalWriter:
    """Appends events to ``events.jsonl``, each write whole or not at all (:func:`append_whole`), so that
    lines from a crashing process are whole or absent, never torn.

    A write the disk does not take ends nothing: the events wait, in order, and go with the next one
    (:attr:`unwritten`); the first failure is said once on stderr (the rank's log)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self._seq = 0
        self.unwritten: list[str] = []
        """Lines the disk did not take yet."""
        self.failed: OSError | None = None
        """The last write error, while the disk takes nothing."""

    def emit(self, type_: str, **payload: Any) -> dict[str, Any]:
        import time

        record = {"seq": self._seq, "type": type_, "time": time.time(), **payload}
        self._seq += 1
        try:
            line = json.dumps(record, separators=(",", ":"), allow_nan=False)
        except ValueError:  # a NaN or infinity somewhere: JSON (and SQLite's json1) has none
            record = finite_json(record)
            line = json.dumps(record, separators=(",", ":"), allow_nan=False)
        self.unwritten.append(line + "\n")
        self._write()
        return record

    def _write(self) -> None:
        if self._fd is None or not self.unwritten:
            return
        try:
            append_whole(self._fd, "".join(self.unwritten).encode())
        except OSError as exc:
            if self.failed is None:
                try:
                    print(f"ftui: cannot write {self.path} ({exc.strerror}); events kept until it can", file=sys.stderr,
                          flush=True)
                except OSError:
                    pass
            self.failed = exc
            return
        self.unwritten, self.failed = [], None

    def write(self, event: TrainerEvent) -> dict[str, Any]:
        """Append one typed trainer event (the checked path; :meth:`emit` is the untyped one)."""
        payload = {k: v for k, v in event.items() if k != "type"}
        return self.emit(event["type"], **payload)

    def close(self) -> None:
        """Write what waits (a last try), sync and close."""
        if self._fd is None:
            return
        self._write()
        fd, self._fd = self._fd, None
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)


@dataclass
class JournalReader:
    """Tails ``events.jsonl`` incrementally; only complete lines are returned.

    A journal cut short under the reader (log rotation's copytruncate, ``truncate -s 0``) is read again from
    its start: what the writer appends after the cut is new (the store skips what it has by ``seq``)."""

    path: Path
    _offset: int = 0
    _partial: bytes = field(default=b"", repr=False)

    def read_new(self) -> list[dict[str, Any]]:
        """Events appended since the last call (possibly none)."""
        try:
            with open(self.path, "rb") as fh:
                if os.fstat(fh.fileno()).st_size < self._offset:  # cut short: the writer goes on from its new end
                    self._offset, self._partial = 0, b""
                fh.seek(self._offset)
                chunk = fh.read()
        except FileNotFoundError:
            return []
        if not chunk:
            return []
        self._offset += len(chunk)
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()
        events: list[dict[str, Any]] = []
        for line in lines:
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue  # a foreign line; the journal is ours alone, so this is noise
            if isinstance(event, dict) and "type" in event:
                events.append(event)
        return events
