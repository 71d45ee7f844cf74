"""A run's summary: the typed record the orchestrator writes into ``runs.summary`` and every view reads.

The summary is a JSON column, so its keys are the contract between the writer (runner/watch/orchestrator.py,
runner/service/sweep.py) and the readers (runner/analysis/compare.py, tui/render/report.py, the Textual screens). They are
declared here once, with the rules that derive figures from them (one function per rule: the busiest
rank's peak memory, a rank's model-state bytes), so no reader re-implements them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypedDict


class PhasePeaks(TypedDict, total=False):
    """Peak bytes per phase of a training step."""

    forward: int
    backward: int
    optimizer: int


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
    heap_check: dict[str, Any]
    """CPU: glibc heap growth beside tensor growth over the first forward (a cross-check)."""
    peak_rss_bytes: int
    """getrusage peak resident set of the rank's process (CPU: includes the ~600 MB runtime). Not a
    training-memory figure: it is shown as "peak RSS", never as "measured" memory."""
    rss_baseline_bytes: int | None
    """The process's RSS before the model was built (the runtime: Python, torch, libraries)."""
    peak_allocated_bytes: int
    """``torch.cuda.max_memory_allocated`` over the run (GPU only)."""
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
    error: str


class RunSummary(TypedDict, total=False):
    """Every key a run's summary may hold. Written in pieces (the store merges them)."""

    # at prepare time
    estimate: EstimateSummary
    # from the trainer's start event
    params: int
    trainable_params: int
    local_param_numel: int
    world_size: int
    tokens_per_step: int
    mixed_precision: str
    engine: str
    sharding: dict[str, Any]
    """What the trainer found in effect (:func:`runner.rank.sharding.in_effect`): engine, stage, offload, how."""
    precision: dict[str, Any]
    """The trainer's ``precision`` event: dtypes of params, compute, optimizer state, master (measured)."""
    loss_scale_drops: int
    """fp16: how many times the dynamic loss scale dropped (``loss_scale`` events)."""
    device_map: dict[str, Any] | None
    pids: list[int]
    threads: int
    """Torch intra-op threads of each rank (``torch.get_num_threads()`` at start)."""
    model_dims: dict[str, int] | None
    """:func:`runner.analysis.mfu.dims_from_config` of the model trained: layers, heads, head_dim, seq_len,
    embedding_params (what MFU's FLOPs per token need)."""
    # the process that watches the run
    orchestrator_pid: int
    # from the trainer's end event, at the end
    train_seconds: float | None
    tokens_per_s: float | None
    final_loss: float | None
    tokens: int | None
    steps: int | None
    ranks: list[RankFigures]
    saved: str | None
    skipped: int | None
    """Optimizer steps dropped for a non-finite loss or gradient norm (``train.on_nan = "skip"``)."""
    checkpoint: str | None
    """The newest complete checkpoint the run wrote (``runner.spec.checkpoint``), or None."""
    first_step_time: float | None
    last_step_time: float | None
    telemetry: dict[str, Any]
    """runner.watch.telemetry.summarise's result, plus ``rank_gpu_mem_peak``."""
    mfu_peak: dict[str, Any] | None
    """The peak FLOP/s of one device that the run's MFU is measured against (:meth:`runner.analysis.mfu.Peak.to_json`:
    flops, source, kind, dtype, threads, measured_at, fingerprint, machine, size, spread, load), taken after
    the run on the machine that ran it; ``{"error": ...}`` when it could not be had."""
    # a resumed run (``ftui resume``): the run and checkpoint it continues
    resumed_from: dict[str, Any]
    # sweeps and the batch-size finder
    refused: bool
    sweep_note: str
    sweep_grid: str
    find_batch: dict[str, Any]


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
    peak (:func:`rank_peak`); for a summary written before that existed, model states plus the saved
    activations of one forward (None when neither was measured)."""
    peak, _ = rank_peak(rank)
    if peak is not None:
        return peak
    if rank.get("activation_bytes") is None:
        return None
    return model_state_bytes(rank) + int(rank.get("activation_bytes") or 0)
