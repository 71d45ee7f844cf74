"""A performance model of a plan's candidates: tokens/s of a strategy at a process count and micro-batch, from
what the plan measured on this host. Pure: figures in, predictions out.

**Inputs** (:func:`fit`, from the plan's completed trials and their profiled step, :mod:`runner.analysis.time_split`):

* *compute seconds per token* of the whole model on one rank's device: the step's compute share times the
  step's time, over the tokens the rank computed (the single and data-parallel trials, whose ranks each run
  the whole model); measured per process count. At a count not measured it comes from the nearest one
  measured: unchanged where each rank has a device of its own (GPUs), scaled by the count where the ranks
  share the host (CPU: the host's compute rate summed over its ranks is taken as constant);
* *overhead seconds per micro-batch*: the data and other shares of the same trials (Python between ops, the
  batch), per process count like the compute;
* *collective latency and bandwidth*: the communication share of the multi-process data-parallel trials
  against the bytes and calls each step must move (:func:`traffic`, from the model's parameter and gradient
  bytes the ranks counted), fitted by least squares as ``seconds = calls x latency + bytes / bandwidth``.
  The share counts waiting on a slower rank too: the bandwidth is what the run got, not the wire's.

**Formulas** (:func:`predict`, per optimizer step of one rank; ``a`` accumulation, ``b`` micro-batch, ``T``
tokens per row, ``c`` compute seconds per token, ``o`` overhead per micro-batch, ``n`` processes):

* single and data parallel: compute ``a b T c``, overhead ``a o``; tokens per step ``n a b T``;
* traffic of data parallel (:func:`traffic`): the gradients' ring all-reduce, ``2 (n-1)/n`` of their bytes
  once a step (ZeRO's reduce-scatter plus all-gather moves the same); with the parameters sharded (FSDP,
  ZeRO-3) each micro-batch gathers ``(n-1)/n`` of them twice (forward, backward; once when kept gathered),
  one call per layer each;
* a layer split over ``p`` stages with ``m`` micro-batches per step (``pp``; naive ``mp``: ``m = 1``, so its
  stages run one after another): each stage computes ``1/p`` of the batch, and the pipeline's bubble adds the
  fraction ``(p-1)/(m+p-1)`` of the step idle (GPipe and 1F1B alike); the fill and drain path sends one
  micro-batch's activations ``2 (p-1)`` times (forward, backward);
* tensor parallel over ``t``: each rank computes ``1/t`` of the matmuls and all-reduces one micro-batch's
  activations 4 times a layer (2 forward, 2 backward);
* tokens/s: tokens per step over compute + bubble + communication + overhead.

**Not modelled**: compute overlapping communication (DDP's buckets, FSDP's prefetch: the sum is an upper
bound of the step), a micro-batch's effect on the device's efficiency (compute per token is taken as
constant: larger micro-batches only amortise the overhead and traffic), activation checkpointing's recompute
beyond what the measured trials did, offload's host traffic, hybrid sharding's two levels (``hsdp`` is taken
as FSDP over all its processes), and load from other work on the host.

**Error**: each raced candidate's prediction is also made from a fit without that candidate's trials (held
out), and its error against the measured median is that one's (:func:`held_out`), so the error is never of a
figure the model was fitted to.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from runner.spec import strategies as table
from runner.spec.summary import error_pct


@dataclass(frozen=True)
class Workload:
    """What one row of a step computes and moves, whatever the layout."""

    param_bytes: int
    """Every parameter of the model times its element's bytes (what sharded parameters are gathered from)."""
    grad_bytes: int
    """The trainable parameters' gradients, bytes (what data parallel reduces)."""
    layers: int
    hidden: int
    """Width of the activations between layers (heads x head size)."""
    seq_len: int
    act_bytes: int
    """Bytes of one activation element (4 for fp32, 2 for bf16 or fp16)."""
    source: str


@dataclass(frozen=True)
class Layout:
    """How a candidate runs a step: its processes, batch split and what its strategy splits."""

    strategy: str
    nproc: int
    micro_batch: int
    grad_accum: int
    data_parallel: bool = False
    shards_params: bool = False
    """Data parallel with the parameters sharded: gathered for each micro-batch (FSDP, ZeRO-3)."""
    gathers: int = 2
    """Gathers of sharded parameters per micro-batch (forward and backward; 1 when kept gathered)."""
    stages: int = 1
    """Pipeline stages (a layer split over processes); 1: none."""
    microbatches: int = 1
    """Micro-batches per pipeline step (naive model parallel: 1)."""
    tp: int = 1
    """Processes each weight matrix is split over (tensor parallel); 1: none."""

    def tokens_per_step(self, seq_len: int) -> int:
        """Tokens every process together trains per optimizer step."""
        replicas = self.nproc if self.data_parallel else max(1, self.nproc // (self.tp * self.stages))
        return replicas * self.grad_accum * self.micro_batch * seq_len

    @property
    def whole_model_per_rank(self) -> bool:
        """Each rank runs the whole model on its own rows (single, data parallel): its compute share is the
        model's compute per token."""
        return self.stages == 1 and self.tp == 1


def layout_of(strategy: str, nproc: int, micro_batch: int, grad_accum: int, engine: str = "auto",
              pipeline_microbatches: int | None = None, tp_size: int | None = None) -> Layout:
    """A candidate's :class:`Layout`, from the strategies table (``pipeline_microbatches``:
    ``launch.microbatches``, None: one row each; ``tp_size``: None, every process)."""
    row = table.get(strategy).with_engine(engine)
    pipelined = row.pipelined(nproc)
    m = (row.microbatches or pipeline_microbatches or micro_batch) if pipelined else 1
    return Layout(strategy, nproc, micro_batch, grad_accum, data_parallel=row.data_parallel,
                  shards_params=row.data_parallel and "params" in row.shards, gathers=1 if row.keeps_gathered else 2,
                  stages=nproc if pipelined else 1, microbatches=m,
                  tp=(tp_size or nproc) if row.tensor_parallel else 1)


@dataclass(frozen=True)
class Rate:
    """One rank's compute and overhead at a process count, and the trials measured."""

    compute_s_per_token: float
    overhead_s: float
    """Per micro-batch (Python between ops, preparing the batch)."""
    runs: tuple[int, ...]


@dataclass(frozen=True)
class Device:
    """The host's figures the predictions take (fitted by :func:`fit`, or given)."""

    rates: Mapping[int, Rate]
    """By process count."""
    shares_host: bool
    """The ranks share the host's cores (CPU): a rank's compute slows with the count."""
    bandwidth: float | None
    """Bytes per second a rank moves in a collective; None: no collective measured."""
    latency_s: float
    """Seconds per collective call."""
    source: str

    def rate(self, nproc: int) -> tuple[Rate, str]:
        """The rate at ``nproc`` and where it comes from (measured there, or the nearest count's)."""
        if nproc in self.rates:
            return self.rates[nproc], f"measured at {nproc} process(es)"
        near = min(self.rates, key=lambda k: (abs(k - nproc), k))
        r = self.rates[near]
        if not self.shares_host:
            return r, f"measured at {near} process(es), one device each"
        return (replace(r, compute_s_per_token=r.compute_s_per_token * nproc / near),
                f"measured at {near} process(es), scaled by {nproc}/{near} (the ranks share the host's cores)")


@dataclass(frozen=True)
class Traffic:
    """What one rank moves per optimizer step on the step's critical path."""

    bytes: float
    calls: int


def traffic(work: Workload, lay: Layout) -> Traffic:
    """The bytes and collective calls of a step (see the module's formulas)."""
    n, a = lay.nproc, lay.grad_accum
    moved, calls = 0.0, 0
    if lay.data_parallel and n > 1:
        moved += 2 * (n - 1) / n * work.grad_bytes
        calls += 1
        if lay.shards_params:
            moved += a * lay.gathers * (n - 1) / n * work.param_bytes
            calls += a * lay.gathers * work.layers
    if lay.tp > 1:
        act: float = lay.micro_batch * work.seq_len * work.hidden * work.act_bytes
        moved += a * 4 * work.layers * 2 * (lay.tp - 1) / lay.tp * act
        calls += a * 4 * work.layers
    if lay.stages > 1:
        act = lay.micro_batch / lay.microbatches * work.seq_len * work.hidden * work.act_bytes
        moved += a * 2 * (lay.stages - 1) * act
        calls += a * 2 * (lay.stages - 1)
    return Traffic(moved, calls)


@dataclass(frozen=True)
class Prediction:
    """A candidate's predicted step and tokens/s, with its parts and where its inputs come from."""

    tokens_per_s: float
    step_s: float
    compute_s: float
    bubble_s: float
    comm_s: float
    overhead_s: float
    source: str


def predict(device: Device, work: Workload, lay: Layout) -> Prediction | None:
    """The layout's step and tokens/s on the device (None: it moves data and no bandwidth was measured)."""
    moved = traffic(work, lay)
    if moved.calls and device.bandwidth is None:
        return None
    rate, rate_source = device.rate(lay.nproc)
    a, p, m = lay.grad_accum, lay.stages, lay.microbatches
    whole = a * lay.micro_batch * work.seq_len * rate.compute_s_per_token / lay.tp
    compute = whole / p
    bubble = compute * (p - 1) / m
    overhead = a * rate.overhead_s * (m + p - 1) / p if p > 1 else a * rate.overhead_s
    comm = moved.calls * device.latency_s + (moved.bytes / device.bandwidth if device.bandwidth else 0.0)
    step = compute + bubble + comm + overhead
    parts = [f"compute {rate_source}"]
    if p > 1:
        parts.append(f"pipeline bubble (p-1)/(m+p-1) = {p - 1}/{m + p - 1}")
    if moved.calls:
        parts.append(f"{moved.bytes / 2**20:,.1f} MiB in {moved.calls} collective call(s) a step")
    return Prediction(lay.tokens_per_step(work.seq_len) / step, step, compute, bubble, comm, overhead,
                      "; ".join(parts) + f" ({device.source})")


@dataclass(frozen=True)
class TrialFigures:
    """A raced candidate's measured figures: median steady-state tokens/s and step shares over its trials."""

    label: str
    layout: Layout
    tokens_per_s: float
    shares: Mapping[str, float] | None
    """``compute``, ``comm``, ``data``, ``other`` fractions of the profiled step (None: not profiled)."""
    runs: tuple[int, ...] = ()


@dataclass(frozen=True)
class Fit:
    """The fitted device, or why there is none, and the candidates it was fitted from."""

    device: Device | None
    why: str = ""
    fitted_on: tuple[str, ...] = field(default=())


def _step_s(t: TrialFigures, work: Workload) -> float:
    return t.layout.tokens_per_step(work.seq_len) / t.tokens_per_s


def _rates(trials: Sequence[TrialFigures], work: Workload) -> dict[int, Rate]:
    """Compute and overhead per process count from the whole-model trials (median over them)."""
    per: dict[int, list[tuple[float, float, tuple[int, ...]]]] = {}
    for t in trials:
        if t.shares is None or not t.layout.whole_model_per_rank:
            continue
        step, lay = _step_s(t, work), t.layout
        tokens = lay.grad_accum * lay.micro_batch * work.seq_len
        per.setdefault(lay.nproc, []).append((t.shares["compute"] * step / tokens,
                                              (t.shares["data"] + t.shares["other"]) * step / lay.grad_accum,
                                              t.runs))
    return {n: Rate(statistics.median(c for c, _, _ in got), statistics.median(o for _, o, _ in got),
                    tuple(r for _, _, runs in got for r in runs)) for n, got in per.items()}


def _least_squares(points: Sequence[tuple[Traffic, float]]) -> tuple[float, float]:
    """(latency s, seconds per byte) minimising the squared error of ``calls x latency + bytes x s/B``, both
    kept non-negative (one of them alone where the two together would make one negative)."""
    cc = sum(t.calls ** 2 for t, _ in points)
    bb = sum(t.bytes ** 2 for t, _ in points)
    cb = sum(t.calls * t.bytes for t, _ in points)
    cy = sum(t.calls * y for t, y in points)
    by = sum(t.bytes * y for t, y in points)
    det = cc * bb - cb * cb
    if det > 1e-9 * cc * bb:
        lat, per_byte = (cy * bb - by * cb) / det, (by * cc - cy * cb) / det
        if lat >= 0 and per_byte >= 0:
            return lat, per_byte
    only_bytes = by / bb if bb else 0.0
    only_calls = cy / cc if cc else 0.0
    err_b = sum((y - t.bytes * only_bytes) ** 2 for t, y in points)
    err_c = sum((y - t.calls * only_calls) ** 2 for t, y in points)
    return (0.0, max(0.0, only_bytes)) if err_b <= err_c else (max(0.0, only_calls), 0.0)


def fit(trials: Sequence[TrialFigures], work: Workload, shares_host: bool) -> Fit:
    """The device's figures from the trials (see the module's inputs)."""
    rates = _rates(trials, work)
    if not rates:
        return Fit(None, "no completed single or data-parallel trial with a profiled step to fit compute on")
    points = [(traffic(work, t.layout), t.shares["comm"] * _step_s(t, work)) for t in trials
              if t.shares is not None and t.layout.data_parallel and t.layout.nproc > 1]
    points = [(moved, y) for moved, y in points if moved.calls]
    used = sorted({t.label for t in trials if t.shares is not None and (
        t.layout.whole_model_per_rank)})
    counts = ", ".join(f"{n}: runs {', '.join(map(str, r.runs))}" for n, r in sorted(rates.items()))
    where = f"fitted on {', '.join(used)}; compute per process count ({counts})"
    if not points:
        return Fit(Device(rates, shares_host, None, 0.0, where + "; no collective measured"), fitted_on=tuple(used))
    lat, per_byte = _least_squares(points)
    bandwidth = 1 / per_byte if per_byte > 0 else float("inf")
    words = f"{bandwidth / 1e6:,.0f} MB/s" if per_byte > 0 else "no byte term"
    source = (f"{where}; collectives {lat * 1e3:.2f} ms a call + {words}, least squares over "
              f"{len(points)} data-parallel trial(s)")
    return Fit(Device(rates, shares_host, bandwidth, lat, source), fitted_on=tuple(used))


@dataclass(frozen=True)
class Checked:
    """A raced candidate's measured tokens/s against the model fitted without its trials."""

    label: str
    measured: float
    held_out: Prediction | None
    error_pct: float | None
    why: str = ""


def held_out(trials: Sequence[TrialFigures], work: Workload, shares_host: bool) -> list[Checked]:
    """Each trial's prediction by a fit of the others, and its error (percent of the measured)."""
    out = []
    for t in trials:
        found = fit([o for o in trials if o.label != t.label], work, shares_host)
        pred = predict(found.device, work, t.layout) if found.device is not None else None
        why = found.why if found.device is None else ("" if pred is not None else "no collective measured")
        out.append(Checked(t.label, t.tokens_per_s, pred,
                           error_pct(pred.tokens_per_s, t.tokens_per_s) if pred else None, why))
    return out
