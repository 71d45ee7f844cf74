"""A run's summary: the typed record the orchestrator writes into ``runs.summary`` and every view reads.

The summary is a JSON column written in pieces (the store merges them). Its keys are declared here once, as
the attributes of :class:`RunSummary`, the record the store hands out; nested parts keep their JSON shape as
TypedDicts (:class:`RankFigures`, :class:`EstimateSummary`, :class:`TelemetrySummary`). The stored JSON carries
its shape's version (``schema``, :data:`SCHEMA`); :func:`upgrade` brings an older shape up to date, once, where
the store reads it, so no reader handles old shapes. The rules that derive figures from the record (the
busiest rank's peak memory, a rank's model-state bytes) are one function each here, so no reader
re-implements them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, NotRequired, TypedDict


class PhasePeaks(TypedDict, total=False):
    """Peak bytes per phase of a training step."""

    forward: int
    backward: int
    optimizer: int


class StepSplitFigures(TypedDict):
    """One profiled step's seconds by kind (:class:`runner.rank.step_split.StepSplit`)."""

    wall_s: float
    compute_s: float
    comm_s: float
    data_s: float
    other_s: float
    source: str


class HeapCheck(TypedDict):
    """CPU: glibc's heap (``mallinfo2``: ``uordblks + hblkhd``) beside the live tensors over the measured steps
    (:meth:`runner.rank.memtrack.LiveTensorPeaks.heap_figures`). What the heap kept beyond tensors is the maths
    library's (oneDNN's primitive cache under bf16, MKL's buffers under fp32) and the runtime's; it is not in
    ``peak_tensor_bytes``."""

    heap_growth_bytes: int
    tensor_growth_bytes: int
    beyond_tensors_bytes: int
    span: str


class GpuLibrary(TypedDict):
    """GPU: what a rank holds beyond its tensors at the end of the measured steps
    (:meth:`runner.rank.memtrack.CudaPeaks.library_figures`): the CUDA context and libraries outside the
    allocator (NVML's memory of the process minus ``torch.cuda.memory_reserved``) and the allocator's reserve
    (peak reserved minus peak allocated); ``beyond_tensors_bytes`` is their sum."""

    process_bytes: int
    reserved_bytes: int
    outside_allocator_bytes: int
    allocator_reserve_bytes: int
    beyond_tensors_bytes: int
    span: str


def library_measured(figures: RankFigures) -> int | None:
    """What a rank measured beyond its tensors over its measured steps (CPU: ``heap_check``; GPU:
    ``gpu_library``), or None (a run recorded before the figure, whose heap check spans one forward only)."""
    check: Mapping[str, Any] = figures.get("gpu_library") or figures.get("heap_check") or {}
    value = check.get("beyond_tensors_bytes")
    return None if value is None else int(value)


class RankFigures(TypedDict, total=False):
    """What one rank measured about itself (the trainer's ``end`` event, one entry per rank)."""

    rank: int
    pid: int
    param_bytes: int
    """Exact bytes of the rank's local parameter tensors (a sharded tensor counts its local shard)."""
    grad_bytes: int
    optimizer_bytes: int
    master_bytes: int
    """DeepSpeed's fp32 master partition of the rank (0 where the optimizer updates the weights themselves)."""
    param_gathered_bytes: int
    """DeepSpeed ZeRO-3: the whole parameters the rank holds gathered beside its partitions (those under
    the persistence threshold), counted in ``param_bytes``; 0 elsewhere."""
    param_whole_bytes: int
    """The whole model's parameters as the rank counts them: each at its global size (a DTensor's
    ``numel()``, ZeRO-3's ``ds_numel``, FSDP1's flat parameter's count) times the bytes of its element.
    The ``*_whole_bytes`` are what each local figure is a share of (:mod:`runner.analysis.shard_verdict`);
    a run recorded without them has its sharding "not measured"."""
    grad_whole_bytes: int
    """The trainable parameters' elements times the bytes of the rank's gradient element."""
    optimizer_whole_bytes: int
    """The trainable parameters' elements times the optimizer-state bytes per element the rank measured
    (absent where the rank holds no state)."""
    master_whole_bytes: int
    """The trainable parameters' elements times the bytes of the rank's master element (0: no master)."""
    activation_bytes: int
    """Bytes autograd saved for backward during one forward (saved-tensor hooks), deduplicated. The quantity
    the activation formula was first fitted to: a detail, not the peak."""
    peak_tensor_bytes: int
    """The independent measurement (runner/rank/memtrack.py): the peak bytes of live tensors over the measured
    steps (CPU: a TorchDispatchMode tracking storages; GPU: the CUDA allocator's peak allocated)."""
    phase_peaks: PhasePeaks
    """The same peak per phase of the measured steps."""
    phase_reserved: PhasePeaks
    """GPU only: the allocator's peak reserved bytes per phase."""
    memory_source: str
    """How ``peak_tensor_bytes`` was measured."""
    measured_steps: int
    heap_check: HeapCheck
    gpu_library: GpuLibrary
    peak_rss_bytes: int
    """getrusage peak resident set of the rank's process (CPU: includes the ~600 MB runtime). Not a
    training-memory figure: it is shown as "peak RSS", never as "measured" memory."""
    rss_baseline_bytes: int | None
    """The process's RSS before the model was built (the runtime: Python, torch, libraries)."""
    peak_allocated_bytes: int
    """``torch.cuda.max_memory_allocated`` over the run (GPU only)."""
    step_split: StepSplitFigures
    """Where the rank's profiled step went (runner/rank/step_split.py)."""
    peak_reserved_bytes: int
    source: str


class EstimateSummary(TypedDict, total=False):
    """The planner's estimate for one device of the run, made at prepare time."""

    per_device_bytes: dict[str, Any]
    """``runner.planner.breakdown_json``: the parts (adding up to ``total``, the peak), ``phases``,
    ``peak_phase``, ``activations_stored`` and ``approximate`` when the architecture is not modelled."""
    strategy: str
    n_devices: int
    micro_batch: int
    seq_len: int
    model: str
    precision: str
    param_dtype: str
    device: str
    approximate: str
    band_key: str
    """``family/strategy`` (:func:`runner.planner.error_band.band_key`) of the error band."""
    error_band: dict[str, Any] | None
    """:class:`runner.planner.error_band.Band` of that key, None when the grid never measured it."""
    library: dict[str, Any]
    """The maths library's line (:class:`runner.spec.library.LibraryTerm`): bytes per process measured on
    this host by ``ftui estimate --library`` (from its cache), or why not; never in ``per_device_bytes``."""
    error: str


class DeviceStats(TypedDict):
    """Figures of one device over one span (see :func:`runner.analysis.utilisation.summarise`)."""

    n: int
    util_mean: float | None
    util_peak: float | None
    mem_peak: int | None
    power_mean_w: float | None


class DeviceSummary(TypedDict):
    """One device over the whole run and over the active window."""

    kind: str
    index: int
    name: str
    source: str
    threads: int | None
    """Torch threads of the rank (rank devices, when known): its CPU% of one core over this is its
    CPU % of its threads."""
    whole: DeviceStats
    active: DeviceStats | None


class OverallStats(TypedDict):
    """The run as one figure per column of the comparison table."""

    kind: str | None
    devices: int
    util_mean: float | None
    util_peak: float | None
    util_min: float | None
    """The lowest device's ``util_mean`` (same unit as ``util_mean``): with ``util_max``, the spread over
    ranks or GPUs that the mean hides (FSDP1 LoRA keeps all adapter state on rank 0)."""
    util_max: float | None
    util_unit: str
    """What ``util_*`` measure: :data:`GPU_UTIL_UNIT`, ``CPU % of its N threads (psutil)``, or
    :data:`CPU_CORE_UNIT` when the ranks' threads are unknown."""
    threads: int | None
    """Torch threads of each rank (CPU runs), the divisor of the rank figures."""
    power_mean_w: float | None
    power_total_w: float | None
    mem_peak: int | None


class TelemetrySummary(TypedDict):
    """A run's utilisation (:func:`runner.analysis.utilisation.summarise`), as stored in its summary."""

    devices: dict[str, DeviceSummary]
    whole: OverallStats
    active: OverallStats | None
    window: tuple[float, float] | list[float] | None
    """The active window (first step, last step), wall clock; a list once stored as JSON."""
    rank_gpu_mem_peak: NotRequired[dict[str, int]]
    """GPU memory peak of each rank's own processes (NVML), added by the orchestrator."""


class StacksReport(TypedDict):
    """The ranks' Python stacks, asked for by the watcher (``runner.watch.stacks``; the ``stacks`` event)."""

    cause: str
    """``hang`` or ``collective timeout``."""
    ranks: dict[str, str | None]
    """Rank -> where its main thread was (``all_reduce (runner/rank/loop.py:412)``), None: no answer."""
    summary: str
    """The one line: ``rank 1 in all_reduce (...); rank 0 in tokenize (...)``."""
    folder: str
    """The run's ``stacks`` folder: the full dumps, one file per rank."""


class LedgerSummary(TypedDict):
    """A run's device-hours and energy (:func:`runner.analysis.ledger.account`), as stored in its summary."""

    devices: int | None
    devices_kind: str | None
    """``gpu`` or ``rank``: what a device is for this run (its GPUs, else its ranks)."""
    devices_source: str
    wall_s: float | None
    """Seconds from the watcher's launch event to its exit event."""
    window: str
    """The span ``device_hours`` counts, in words."""
    device_hours: float | None
    active_device_hours: float | None
    """The same devices over the telemetry's active window (first step to last)."""
    gpu_energy_j: float | None
    gpu_energy_source: str
    """Where ``gpu_energy_j`` comes from, or why it is None."""
    cpu_energy_j: float | None
    cpu_energy_source: str


GPU_UTIL_UNIT = "GPU busy % (NVML: time a kernel ran, not FLOPs)"
CPU_CORE_UNIT = "CPU % of one core (psutil)"


def cpu_threads_unit(threads: int) -> str:
    """``CPU % of its 2 threads (psutil)``: a rank's CPU% of one core over its torch threads."""
    return f"CPU % of its {threads} thread{'s' if threads != 1 else ''} (psutil)"


SCHEMA = 2
"""The version of the summary's shape, stored in it as ``schema`` (a summary without it is version 1).

Version 2: the telemetry's overall figures of a CPU run are in CPU % of each rank's threads and say their
unit (``util_unit``, ``threads``); version 1 held them in CPU % of one core, without a unit.
"""


def upgrade(data: Mapping[str, Any]) -> dict[str, Any]:
    """A stored summary in the shape of :data:`SCHEMA`, whatever version wrote it (``schema`` left out).

    Args:
        data: The JSON object of ``runs.summary``.

    Returns:
        A new dict; ``data`` is not changed.
    """
    out = {k: v for k, v in data.items() if k != "schema"}
    version = data.get("schema") or 1
    if version < 2:
        out = _upgrade_1_to_2(out)
    return out


def _upgrade_1_to_2(data: dict[str, Any]) -> dict[str, Any]:
    """Every key of the telemetry's records present (version 1 wrote some only when known), and CPU
    utilisation per thread: the overall figures of a CPU run (CPU % of one core, no spread stored)
    divided by the ranks' threads when the start event gave them."""
    telemetry = data.get("telemetry")
    if not isinstance(telemetry, dict):
        return data
    stored = data.get("threads")
    threads = stored if isinstance(stored, int) and stored > 0 else None
    upgraded: dict[str, Any] = {"devices": {}, "whole": None, "active": None, "window": None, **telemetry}
    upgraded["devices"] = {key: _full(DeviceSummary, {**device, "whole": _full(DeviceStats, device.get("whole")),
                                                      "active": _full(DeviceStats, device.get("active"))})
                           for key, device in (upgraded["devices"] or {}).items() if isinstance(device, dict)}
    for span in ("whole", "active"):
        overall = upgraded[span]
        if not isinstance(overall, dict) or "util_unit" in overall:
            continue
        overall = _full(OverallStats, overall)
        if overall["kind"] == "gpu":
            overall["util_unit"] = GPU_UTIL_UNIT
        elif overall["kind"] == "rank":
            mean = overall["util_mean"]
            overall |= {"util_min": None, "util_max": None, "threads": threads,
                        "util_mean": mean / threads if mean is not None and threads else mean,
                        "util_unit": cpu_threads_unit(threads) if threads else CPU_CORE_UNIT}
        else:
            overall["util_unit"] = "-"
        upgraded[span] = overall
    return {**data, "telemetry": upgraded}


def _full(record: type, value: Any) -> Any:
    """``value`` (a JSON object of the TypedDict ``record``) with every key of the record, None where absent
    (``n`` and ``devices``, counts: 0); a value that is not an object stays as it is."""
    if not isinstance(value, dict):
        return value
    counts = {"n": 0, "devices": 0}
    return {**{key: counts.get(key) for key in record.__annotations__}, **value}


@dataclass(frozen=True)
class RunSummary:
    """Every figure a run's summary may hold (None, or empty, until written).

    Built by the store from the stored JSON (:meth:`from_json`); writers hand the store a dict of these
    attributes' names (:meth:`store.Store.update_run`), which it merges into the stored one.
    """

    # at prepare time
    uid: str | None = None
    estimate: EstimateSummary | None = None
    devices: list[str] | None = None
    """The devices of its host the run takes (``gpu:ID`` each, or ``cpu``: :mod:`runner.spec.devices`); the
    queue starts no run on them while this one is live. None: recorded before runs kept it (every device)."""
    # from the trainer's start event
    params: int | None = None
    trainable_params: int | None = None
    local_param_numel: int | None = None
    world_size: int | None = None
    tokens_per_step: int | None = None
    mixed_precision: str | None = None
    engine: str | None = None
    sharding: dict[str, Any] | None = None
    """What the trainer found in effect (:func:`runner.rank.sharding.in_effect`): engine, stage, offload, how."""
    parallel: dict[str, Any] | None = None
    """Pipeline or tensor parallel layout the trainer ran (the start event's ``parallel``)."""
    precision: dict[str, Any] | None = None
    """The trainer's ``precision`` event: dtypes of params, compute, optimizer state, master (measured)."""
    loss_scale_drops: int | None = None
    """fp16: how many times the dynamic loss scale dropped (``loss_scale`` events)."""
    kernels: dict[str, Any] | None = None
    """The trainer's ``kernels`` event: the attention implementation and torch.compile in effect
    (:func:`runner.rank.compiling.kernels_event`: ``attention``, ``compile``, ``source``)."""
    device_map: dict[str, Any] | None = None
    pids: list[int] | None = None
    threads: int | None = None
    """Torch intra-op threads of each rank (``torch.get_num_threads()`` at start)."""
    model_dims: dict[str, int] | None = None
    """:func:`runner.spec.flops.dims_from_config` of the model trained: layers, heads, head_dim, seq_len,
    embedding_params (what MFU's FLOPs per token need)."""
    flops_per_token: float | None = None
    """:func:`runner.spec.flops.run_flops_per_token` of the run, so compare reads no model config."""
    # the process that watches the run
    orchestrator_pid: int | None = None
    orchestrator_create_time: float | None = None
    orchestrator_host: str | None = None
    stop: str | None = None
    """How a stop was carried out (``ftui stop``, a cancelled SLURM job)."""
    stacks: StacksReport | None = None
    """Where every rank was when the watcher last asked for their stacks (a hang, a collective timeout)."""
    ended: str | None = None
    """A stopped or killed run: the step it ended at and the checkpoint it can resume from, or "no
    checkpoint" (:func:`runner.spec.status.ended_words`)."""
    # from the trainer's end event, at the end
    train_seconds: float | None = None
    tokens_per_s: float | None = None
    """Steady state: tokens/s over the steps after the memory-metered ones (None: every step was metered)."""
    window_tokens_per_s: float | None = None
    """tokens/s over every step of the run, the memory-metered ones included."""
    steady_steps: int | None = None
    """How many unmetered steps ``tokens_per_s`` is measured over."""
    steady_seconds: float | None = None
    """Rank 0's wall seconds over those steps (what ``tokens_per_s`` divides by)."""
    steady_cpu_seconds: float | None = None
    """CPU runs: the CPU-seconds every rank's process ran over its steady steps, summed over the ranks
    (``time.process_time()`` in the rank; its probes and evaluations left out): a CPU run's MFU divides by
    them (:func:`runner.analysis.run_peak.mfu_divisor`). None for GPU runs and runs recorded before."""
    final_loss: float | None = None
    tokens: int | None = None
    steps: int | None = None
    ranks: list[RankFigures] = field(default_factory=list)
    saved: str | None = None
    skipped: int | None = None
    """Optimizer steps dropped for a non-finite loss or gradient norm (``train.on_nan = "skip"``)."""
    checkpoint: str | None = None
    """The newest complete checkpoint the run wrote (``runner.spec.checkpoint``), or None."""
    first_step_time: float | None = None
    time_to_first_step: dict[str, Any] | None = None
    """:func:`runner.spec.first_step.breakdown`: launch to the end of step 1, per stage (the watcher's, at step 1)."""
    last_step_time: float | None = None
    telemetry: TelemetrySummary | None = None
    ledger: LedgerSummary | None = None
    """Device-hours and energy, written at the end (:func:`runner.analysis.ledger.account`)."""
    mfu_peak: dict[str, Any] | None = None
    """The peak FLOP/s of one device that the run's MFU is measured against
    (:meth:`runner.analysis.mfu.Peak.to_json`): on GPU the datasheet's, on CPU the matmul rate probed in
    the ranks right before the first step and after the last (runs recorded before the probe hold a
    benchmark taken after the run, ``kind: measured``, which no MFU is computed against);
    ``{"error": ...}`` when it could not be had."""
    # a resumed run (``ftui resume``): the run and checkpoint it continues
    resumed_from: dict[str, Any] | None = None
    # sweeps and the batch-size finder
    refused: bool | None = None
    sweep_note: str | None = None
    sweep_grid: str | None = None
    committed_by_plan: str | None = None
    """The plan (``ftui plan --commit``) whose winner this run is."""
    continued_from_trial: int | None = None
    """The plan's trial run whose checkpoint the committed run continues (``resumed_from`` has the checkpoint)."""
    started_over: str | None = None
    """Why the committed run starts at step 0 rather than from its trial's checkpoint (one line)."""
    find_batch: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    """Keys this version does not declare (a newer version's, a user's own), kept as stored."""
    stored_keys: frozenset[str] = field(default=frozenset(), compare=False, repr=False)
    """The declared keys the stored JSON holds (so :meth:`to_json` gives back what was stored)."""

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> RunSummary:
        """The record of a stored summary (any version: :func:`upgrade` brings it up to date).

        A declared key whose stored value is not of its JSON type (a list where an object belongs) is
        kept in :attr:`extra`, like an undeclared one, so every attribute holds its declared type.
        """
        current = upgrade(data or {})
        known: dict[str, Any] = {k: v for k, v in current.items()
                 if k in DECLARED and (v is None or isinstance(v, _JSON_TYPES[k]))}
        # A null stored where the record holds a list (an end event without ranks) reads as the empty list.
        values = {k: v for k, v in known.items() if not (v is None and k == "ranks")}
        return cls(**values, extra={k: v for k, v in current.items() if k not in known},
                   stored_keys=frozenset(known))

    def to_json(self) -> dict[str, Any]:
        """The summary as stored (without ``schema``): the keys it was read from, then any set since."""
        out = {f.name: getattr(self, f.name) for f in fields(self)
               if f.name in self.stored_keys or (f.name in DECLARED and getattr(self, f.name) != _default(f))}
        return {**out, **self.extra}


def _default(f: Any) -> Any:
    return f.default_factory() if callable(f.default_factory) else f.default


def _json_types(annotation: str) -> tuple[type, ...]:
    """The JSON value types an attribute's annotation (a string: postponed evaluation) admits."""
    head = annotation.split("|")[0].split("[")[0].strip()
    if head in ("dict", "EstimateSummary", "TelemetrySummary", "StacksReport", "LedgerSummary"):
        return (dict,)
    return {"list": (list,), "int": (int,), "float": (int, float), "str": (str,), "bool": (bool,)}[head]


DECLARED = frozenset(f.name for f in fields(RunSummary)) - {"extra", "stored_keys"}
"""The keys a summary declares (the attributes of :class:`RunSummary`)."""
_JSON_TYPES = {f.name: _json_types(str(f.type)) for f in fields(RunSummary) if f.name in DECLARED}


MEASURED_CUDA = "measured: CUDA allocator peak"
MEASURED_LIVE = "measured: live-tensor peak"


def rank_peak(rank: Mapping[str, Any]) -> tuple[int | None, str]:
    """A rank's measured peak memory and where it comes from: the CUDA allocator's peak allocated on GPU,
    the peak of live tensor bytes on CPU (runner/rank/memtrack.py). Never RSS: a rank that measured neither
    is "not measured" (its RSS is :func:`rank_rss`)."""
    if rank.get("peak_allocated_bytes"):
        return int(rank["peak_allocated_bytes"]), MEASURED_CUDA
    if rank.get("peak_tensor_bytes"):
        return int(rank["peak_tensor_bytes"]), MEASURED_LIVE
    return None, "not measured"


def error_pct(estimated: float, measured: float | None) -> float | None:
    """An estimate's error in percent of what was measured (positive: the estimate is over); None without a
    measured figure."""
    return (estimated - measured) / measured * 100 if measured else None


def rank_rss(rank: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """A rank's peak resident set (getrusage) and its runtime baseline (RSS before the model was built)."""
    peak, base = rank.get("peak_rss_bytes"), rank.get("rss_baseline_bytes")
    return (int(peak) if peak else None), (int(base) if base else None)


def busiest_peak(ranks: Iterable[Mapping[str, Any]]) -> tuple[int | None, str]:
    """The largest :func:`rank_peak` over the ranks (what a device must hold), with its source."""
    best: tuple[int | None, str] = (None, "not measured")
    for rank in ranks:
        peak, source = rank_peak(rank)
        if peak is not None and (best[0] is None or peak > best[0]):
            best = (peak, source)
    return best


def model_state_bytes(rank: Mapping[str, Any]) -> int:
    """Parameters + gradients + optimizer state + fp32 master a rank held (exact tensor bytes)."""
    return sum(int(rank.get(k) or 0) for k in ("param_bytes", "grad_bytes", "optimizer_bytes", "master_bytes"))


def trained_bytes(rank: Mapping[str, Any]) -> int | None:
    """What a rank needed for training, as the batch-size finder compares it with its budget: the measured
    peak (:func:`rank_peak`); for a rank that measured no peak, model states plus the saved activations of
    one forward (None when neither was measured)."""
    peak, _ = rank_peak(rank)
    if peak is not None:
        return peak
    if rank.get("activation_bytes") is None:
        return None
    return model_state_bytes(rank) + int(rank.get("activation_bytes") or 0)
