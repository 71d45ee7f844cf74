"""A run's summary: the typed record the orchestrator writes into ``runs.summary`` and every view reads.

The summary is a JSON column, so its keys are the contract between the writer (runner/orchestrator.py,
runner/sweep.py) and the readers (runner/compare.py, tui/render/report.py, the Textual screens). They are
declared here once, with the rules that derive figures from them (one function per rule: the busiest
rank's peak memory, a rank's model-state bytes), so no reader re-implements them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypedDict


class RankFigures(TypedDict, total=False):
    """What one rank measured about itself (the trainer's ``end`` event, one entry per rank)."""

    rank: int
    pid: int
    param_bytes: int
    """Exact bytes of the rank's local parameter tensors (a sharded tensor counts its local shard)."""
    grad_bytes: int
    optimizer_bytes: int
    activation_bytes: int
    """Bytes autograd saved for backward during one forward (saved-tensor hooks), deduplicated."""
    peak_rss_bytes: int
    """getrusage peak resident set of the rank's process (CPU: includes the ~600 MB runtime)."""
    peak_allocated_bytes: int
    """``torch.cuda.max_memory_allocated`` (GPU only)."""
    peak_reserved_bytes: int
    source: str


class EstimateSummary(TypedDict, total=False):
    """The planner's estimate for one device of the run, made at prepare time."""

    per_device_bytes: dict[str, int]
    strategy: str
    n_devices: int
    micro_batch: int
    seq_len: int
    model: str
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
    device_map: dict[str, Any] | None
    pids: list[int]
    threads: int
    """Torch intra-op threads of each rank (``torch.get_num_threads()`` at start)."""
    model_dims: dict[str, int] | None
    """:func:`runner.mfu.dims_from_config` of the model trained: layers, heads, head_dim, seq_len,
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
    """The newest complete checkpoint the run wrote (``runner.checkpoint``), or None."""
    first_step_time: float | None
    last_step_time: float | None
    telemetry: dict[str, Any]
    """runner.telemetry.summarise's result, plus ``rank_gpu_mem_peak``."""
    mfu_peak: dict[str, Any] | None
    """The peak FLOP/s of one device that the run's MFU is measured against (:meth:`runner.mfu.Peak.to_json`:
    flops, source, kind, dtype, threads, measured_at, fingerprint, machine, size, spread, load), taken after
    the run on the machine that ran it; ``{"error": ...}`` when it could not be had."""
    # a resumed run (``ftui resume``): the run and checkpoint it continues
    resumed_from: dict[str, Any]
    # sweeps and the batch-size finder
    refused: bool
    sweep_note: str
    sweep_grid: str
    find_batch: dict[str, Any]


def rank_peak(rank: Mapping[str, Any]) -> tuple[int | None, str]:
    """A rank's peak memory and where it comes from: the CUDA allocator's peak on GPU, else the
    process's peak RSS (getrusage)."""
    if rank.get("peak_allocated_bytes"):
        return int(rank["peak_allocated_bytes"]), "CUDA allocator peak"
    if rank.get("peak_rss_bytes"):
        return int(rank["peak_rss_bytes"]), "getrusage peak RSS"
    return None, "not measured"


def busiest_peak(ranks: Iterable[Mapping[str, Any]]) -> tuple[int | None, str]:
    """The largest :func:`rank_peak` over the ranks (what a device must hold), with its source."""
    best: tuple[int | None, str] = (None, "not measured")
    for rank in ranks:
        peak, source = rank_peak(rank)
        if peak is not None and (best[0] is None or peak > best[0]):
            best = (peak, source)
    return best


def model_state_bytes(rank: Mapping[str, Any]) -> int:
    """Parameters + gradients + optimizer state a rank held (exact tensor bytes)."""
    return sum(int(rank.get(k) or 0) for k in ("param_bytes", "grad_bytes", "optimizer_bytes"))


def trained_bytes(rank: Mapping[str, Any]) -> int | None:
    """Model states plus the activations of one forward: what the batch-size finder compares with its
    budget on CPU (None when the rank measured no activations)."""
    if rank.get("activation_bytes") is None:
        return None
    return model_state_bytes(rank) + int(rank.get("activation_bytes") or 0)
