"""Compare runs side by side: the figures of each run, speed-ups against a baseline, the recipe diff.

:func:`build_comparison` is pure (stored runs and their metrics in, a :class:`Comparison` out);
:func:`load_comparison` reads the store and resolves MFU peaks (those the runs stored; no benchmark).
The figures of each run come from :mod:`runner.analysis.run_figures`; rendering lives in
``tui/render/compare.py``.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from runner.analysis import verdict
from runner.analysis.ledger import Figures
from runner.analysis.ledger import figures as ledger_figures
from runner.analysis.mfu import Peak, compute_mfu, trustworthy
from runner.analysis.noise import NoiseFloor, Training, host_other_util, measured_floor
from runner.analysis.recipe_diff import parsed_recipe, recipe_diff
from runner.analysis.run_figures import (
    Kernels,
    estimated_memory,
    kernels,
    mem_measured,
    model_dims,
    utilisation,
)
from runner.analysis.run_peak import (
    default_peak,
    device_count,
    mfu_divisor,
    mfu_words,
    over_100_note,
    peak_note,
    stored_flops_per_token,
    unknown_device_note,
)
from runner.analysis.shard_verdict import run_verdict
from runner.spec import layout, strategies
from runner.spec.flops import flops_per_token
from store import MetricPoint, NamedMetricPoint, RunInfo, SampleInfo, Store
from store.rollup import downsample_points


@dataclass(frozen=True)
class RunRow:
    """The figures of one run (None where unknown)."""

    run_id: int
    name: str
    strategy: str
    method: str
    devices: int
    device_type: str | None
    micro_batch: int | None
    grad_accum: int | None
    global_batch: int | None
    cpu_util: float | None
    """CPU % of the rank's torch threads (mean over ranks), or CPU% of one core when ``cpu_threads`` is None."""
    cpu_threads: int | None
    """Torch threads of each rank (the divisor of ``cpu_util``)."""
    gpu_busy: float | None
    """NVML GPU busy % (time a kernel ran), mean over GPUs: a different unit from ``cpu_util``."""
    util_min: float | None
    """Lowest device's mean utilisation (same unit as the run's ``cpu_util`` or ``gpu_busy``)."""
    util_max: float | None
    util_source: str
    train_seconds: float | None
    tokens_per_s: float | None
    tokens_per_s_per_device: float | None
    mfu: float | None
    achieved_tflops: float | None
    peak_source: str | None
    peak_flops: float | None
    """Peak FLOP/s of one device that MFU divides by, or FLOP per CPU-second (``peak_per_cpu_second``)."""
    peak_dtype: str | None
    peak_threads: int | None
    peak_kind: str | None
    """``probe`` (CPU: probed beside the run), ``datasheet`` (GPU) or ``given`` (--peak-tflops, the recipe)."""
    peak_measured_at: str | None
    """ISO date-time (UTC) the CPU peak was measured (the run's end, for a probe)."""
    peak_fingerprint: str | None
    peak_label: str
    """``40.6 GFLOP/s fp32, 2 threads, probed beside the run``, or ``-``."""
    peak_per_cpu_second: bool
    """The peak is FLOPs per CPU-second the process ran (CPU): the MFU divides by it x the CPUs ran."""
    mfu_basis: str
    """How the MFU was had (:func:`runner.analysis.run_peak.mfu_words`), or empty without one."""
    mem_measured: int | None
    mem_measured_source: str
    mem_estimated: int | None
    mem_estimated_source: str
    final_loss: float | None
    best_loss: float | None
    status: str
    reason: str | None
    note: str | None
    speedup: float | None = None
    """tokens/s of this run over the baseline's (same tokens per step: the same as time ratio)."""
    grid: str = ""
    """The sweep's grid values for this run (``train.batch_size=2``), empty outside a grid."""
    mfu_note: str | None = None
    """Why MFU is '-' for a run that completed (an unknown GPU model, no model config, MFU > 100%...)."""
    mfu_rejected: float | None = None
    """An MFU above 100% that was not shown (the peak cannot be right), as a fraction."""
    final_eval_loss: float | None = None
    """``eval/loss`` at the run's last evaluation (measured over the whole eval set)."""
    best_eval_loss: float | None = None
    """The lowest ``eval/loss`` of the run."""
    script: bool = False
    """A script run (``launch.script``): a figure it did not report is "not reported", not unknown."""
    host_other_util: float | None = None
    """Host CPU % (all cores) used by other work during the run (:func:`runner.analysis.noise.host_other_util`)."""
    first_step: dict[str, Any] | None = None
    """Time to first step, broken down (:func:`runner.spec.first_step.breakdown`, stored by the watcher)."""
    training: Training = field(default_factory=Training)
    """What the run trains (model, data, global batch, ...): runs are compared only when these match."""
    sharding: str = "not measured"
    sharding_line: str = ""
    """Is its strategy's promised sharding in effect: in short, and kind by kind (``runner.analysis.shard_verdict``)."""
    mesh: str = ""
    """An ``hsdp`` run's mesh, replicate x shard (``2x2``: what its rank found in effect, else its recipe's);
    empty for other strategies."""
    ledger: Figures | None = None
    """Device-hours, energy, cost and tokens per joule and per unit of cost (:mod:`runner.analysis.ledger`)."""
    kernels: Kernels | None = None
    """The attention implementation and torch.compile in effect (None: the trainer did not record them)."""

    @property
    def strategy_label(self) -> str:
        """``hsdp 2x2``: the strategy with its mesh (the name alone for other strategies)."""
        return f"{self.strategy} {self.mesh}" if self.mesh else self.strategy


@dataclass(frozen=True)
class Comparison:
    """Runs side by side."""

    rows: list[RunRow]
    baseline_id: int | None
    fastest_id: int | None
    recipe_diff: dict[str, list[str]]
    """Dotted recipe key to each run's value (in row order), only keys whose values differ."""
    curves: dict[int, list[tuple[int, float]]] = field(default_factory=dict)
    """Run id to (step, loss)."""
    timelines: dict[int, dict[str, list[tuple[float, float | None, int | None]]]] = field(default_factory=dict)
    """Run id to device key (``gpu:0``, ``rank:1``) to (seconds since the run's first sample, util %, memory)."""
    sweep_id: str | None = None
    eval_curves: dict[int, list[tuple[int, float]]] = field(default_factory=dict)
    """Run id to (step, eval loss)."""
    named: dict[int, dict[str, float | None]] = field(default_factory=dict)
    """Run id to each named metric's last value (``eval/*``, ``train/*``, user metrics)."""
    samples: dict[int, list[dict[str, str]]] = field(default_factory=dict)
    """Run id to its last evaluation's samples (``[{"prompt", "completion"}]``)."""
    hosts: dict[int, str] = field(default_factory=dict)
    """Run id to the host it ran on (the report's provenance)."""
    models: dict[int, str] = field(default_factory=dict)
    data: dict[int, str] = field(default_factory=dict)
    """Run id to the recipe's ``data.source``."""
    lr_curves: dict[int, list[tuple[int, float]]] = field(default_factory=dict)
    """Run id to (step, learning rate)."""
    grad_curves: dict[int, list[tuple[int, float]]] = field(default_factory=dict)
    """Run id to (step, gradient norm before clipping)."""
    tokens_curves: dict[int, list[tuple[int, float]]] = field(default_factory=dict)
    """Run id to (step, tokens/s of that step over all devices)."""
    memory_curves: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    """Run id to (step, measured peak memory of its busiest rank so far): the figure the table shows."""
    memory_source: str = ""
    """Where :attr:`memory_curves` come from (``measured: live-tensor peak``)."""
    rss_curves: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    """Run id to (step, largest rank's process RSS): for runs whose memory events measured nothing else."""
    windows: dict[int, tuple[float, float]] = field(default_factory=dict)
    """Run id to its training window (first step to last) in the seconds of its timeline."""
    floor: NoiseFloor | None = None
    """The run-to-run spread of tokens/s measured from stored repeats on the runs' hosts (or None)."""

    def row(self, run_id: int | None) -> RunRow | None:
        return next((r for r in self.rows if r.run_id == run_id), None)

    def label(self, row: RunRow) -> str:
        """``ddp x2`` (plus the grid values), unique enough to name a run in a sentence."""
        return verdict.label(row)

    def speedup_sentences(self) -> list[str]:
        """Each configuration against the baseline's: ``ddp x2 (run 2) 1.9x faster than single (run 1): ...``
        only beyond the run-to-run spread, else the ratio and why it is not a verdict."""
        base = self.row(self.baseline_id)
        found = verdict.groups(self.rows)
        home = next((g for g in found if base is not None and base in g.rows), None)
        if home is None:
            return []
        floor = verdict.repeat_floor(found) or self.floor
        return [verdict.pair_sentence(g, home, floor) for g in found if g is not home]

    def decision(self) -> verdict.Verdict:
        """The verdict: use one run, or a tie, or why the runs cannot be compared (:mod:`runner.analysis.verdict`)."""
        return verdict.decide(self.rows, self.floor)

    def recommendation(self) -> str:
        """One line: the verdict with its numbers, what did not complete, and a busy host's caution."""
        return verdict.recommendation(self.rows, self.floor)

    @property
    def recommended_id(self) -> int | None:
        """The run the verdict recommends (None for a tie, runs that cannot be compared, or nothing to tell)."""
        return self.decision().run_id


# ---------------------------------------------------------------------- figures


def speedups(tokens_per_s: Sequence[float | None], baseline: int) -> list[float | None]:
    """Each throughput over the baseline's (index ``baseline``); None where either is unknown."""
    base = tokens_per_s[baseline] if 0 <= baseline < len(tokens_per_s) else None
    return [None if (t is None or not base) else t / base for t in tokens_per_s]


def best_loss(metrics: Sequence[MetricPoint]) -> float | None:
    losses = [m.loss for m in metrics if m.loss is not None]
    return min(losses) if losses else None


def _recipe(run: RunInfo) -> dict[str, Any]:
    try:
        return parsed_recipe(run.recipe_text)
    except tomllib.TOMLDecodeError:
        return {}


def _mfu_note(run: RunInfo, peak: Peak | None, peak_note: str | None, dims: Mapping[str, Any] | None) -> str | None:
    """Why a completed run with a throughput has no MFU."""
    if run.status != "completed" or not run.tokens_per_s:
        return None
    if peak is None:
        return peak_note or unknown_device_note(run)
    if stored_flops_per_token(run) is not None:
        return None
    if dims is None:
        return f"model dimensions unknown (the config of {run.model} cannot be read offline)"
    if not run.summary.params:
        return "parameter count not stored by the trainer"
    return None


def build_row(run: RunInfo, metrics: Sequence[MetricPoint], peak: Peak | None,
              dims: Mapping[str, Any] | None, grid: str = "", peak_note: str | None = None) -> RunRow:
    """The figures of one run (pure, apart from a memory estimate computed from the recipe).

    ``peak_note`` says why ``peak`` is None (shown as the reason MFU is '-'). An MFU above 100% is never
    shown: ``mfu`` is None, ``mfu_rejected`` holds it and ``mfu_note`` says why.
    """
    recipe = _recipe(run)
    train = recipe.get("train", {})
    micro = train.get("batch_size")
    ga = train.get("grad_accum")
    devices = device_count(run)
    global_batch = strategies.recipe_global_batch(run.strategy, recipe, run.nproc)
    tps = run.tokens_per_s
    mfu = achieved = rejected = None
    peak_source = peak.source if peak else None
    params = run.summary.params
    mfu_why = None
    basis = ""
    fpt = stored_flops_per_token(run)
    if fpt is None and dims and params:
        trainable = run.summary.trainable_params if run.method != "full" else None
        matmul_params = int(params) - int(dims.get("embedding_params", 0))
        fpt = flops_per_token(matmul_params, dims["layers"], dims["heads"], dims["head_dim"], dims["seq_len"], trainable)
    divisor = mfu_divisor(run, peak) if peak else None
    if tps and peak and fpt and divisor is not None and divisor.count is not None:
        m = compute_mfu(fpt, tps, peak, divisor.count)
        achieved = m.achieved_flops / 1e12
        if trustworthy(m.mfu):
            mfu, basis = m.mfu, mfu_words(peak, divisor)
        else:  # never printed: a figure above 100% says the peak is wrong, not that the run was fast
            rejected = m.mfu
            mfu_why = (f"MFU > 100% against {peak.label()} x {divisor.words}: peak not trustworthy; "
                         f"{over_100_note(peak)}")
    elif tps and fpt and divisor is not None:
        mfu_why = divisor.words  # its peak is per CPU-second, and the CPU-seconds were not stored
    util = utilisation(run)
    measured_at = None
    if peak and peak.measured_at:
        measured_at = datetime.fromtimestamp(peak.measured_at, UTC).isoformat(timespec="seconds")
    mem, mem_source = mem_measured(run)
    est, est_source = estimated_memory(run, recipe, dims)
    reason = (run.summary.ended or run.error) if run.status != "completed" else None  # a stop: its checkpoint
    data = recipe.get("data", {})
    training = Training(model=run.model or None, data=_text(data.get("source")), global_batch=global_batch,
                        seq_len=data.get("context_length"), precision=_text(train.get("precision")),
                        method=run.method or None)
    return RunRow(
        run_id=run.id, name=run.name, strategy=run.strategy, method=run.method, devices=devices,
        device_type=run.device_type, micro_batch=micro, grad_accum=ga, global_batch=global_batch,
        cpu_util=util.cpu, cpu_threads=util.threads, gpu_busy=util.gpu, util_min=util.low, util_max=util.high,
        util_source=util.source, train_seconds=run.train_seconds,
        tokens_per_s=tps, tokens_per_s_per_device=tps / devices if tps else None,
        mfu=mfu, achieved_tflops=achieved, peak_source=peak_source,
        peak_flops=peak.flops if peak else None, peak_dtype=peak.dtype if peak else None,
        peak_threads=peak.threads if peak else None, peak_kind=peak.kind if peak else None,
        peak_measured_at=measured_at, peak_fingerprint=peak.fingerprint if peak else None,
        peak_label=peak.label() if peak else "-", peak_per_cpu_second=bool(peak and peak.per_cpu_second),
        mfu_basis=basis,
        mem_measured=mem, mem_measured_source=mem_source, mem_estimated=est, mem_estimated_source=est_source,
        final_loss=run.final_loss, best_loss=best_loss(metrics), status=run.status, reason=reason,
        note=run.summary.sweep_note, grid=grid or (run.summary.sweep_grid or ""),
        mfu_note=mfu_why or (None if mfu is not None else _mfu_note(run, peak, peak_note, dims)),
        mfu_rejected=rejected, script=bool(recipe.get("launch", {}).get("script")),
        host_other_util=host_other_util(run.summary.telemetry), first_step=run.summary.time_to_first_step,
        training=training, mesh=_mesh(run, recipe), ledger=ledger_figures(run.summary),
        sharding=(shards := run_verdict(run.strategy, run.summary)).short(), sharding_line=shards.line(),
        kernels=kernels(run.summary.kernels),
    )


def _mesh(run: RunInfo, recipe: Mapping[str, Any]) -> str:
    """``2x2`` for an hsdp run (:func:`runner.spec.layout.stored_mesh`), else empty."""
    sizes = layout.stored_mesh(run.strategy, run.nproc, recipe.get("launch") or {}, run.summary.sharding)
    return layout.mesh_text(sizes) if sizes is not None else ""


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def build_comparison(
    runs: Sequence[RunInfo],
    metrics: Mapping[int, Sequence[MetricPoint]],
    peaks: Mapping[int, Peak | None] | None = None,
    dims: Mapping[int, Mapping[str, Any] | None] | None = None,
    baseline_id: int | None = None,
    samples: Mapping[int, Sequence[SampleInfo]] | None = None,
    sweep_id: str | None = None,
    peak_notes: Mapping[int, str] | None = None,
    named: Mapping[int, Sequence[NamedMetricPoint]] | None = None,
    eval_samples: Mapping[int, list[dict[str, str]]] | None = None,
    floor: NoiseFloor | None = None,
) -> Comparison:
    """Put runs side by side (in the given order).

    Args:
        runs: The runs.
        metrics: Per-step metrics by run id (for the best loss and the loss curves).
        peaks: Peak FLOP/s per device by run id (MFU is '-' without one).
        dims: Model dimensions by run id (:func:`model_dims`).
        baseline_id: The run speed-ups are measured against; default the first run that has a throughput.
        samples: Telemetry samples by run id, for the timelines.
        sweep_id: The sweep the runs belong to, if any.
        peak_notes: By run id, why its peak is None (:func:`peak_note`).
        named: Named per-step metrics by run id (eval loss curves, final and best eval loss).
        eval_samples: By run id, the samples of its last evaluation.
        floor: The run-to-run spread measured on the runs' hosts (:func:`runner.analysis.noise.measured_floor`).

    Returns:
        The comparison; ``fastest_id`` is the completed run with the highest tokens/s.

    Raises:
        ValueError: ``baseline_id`` is not one of ``runs``.
    """
    peaks = peaks or {}
    dims = dims or {}
    notes = peak_notes or {}
    rows = [build_row(r, metrics.get(r.id, []), peaks.get(r.id), dims.get(r.id), peak_note=notes.get(r.id))
            for r in runs]
    if baseline_id is not None and not any(r.run_id == baseline_id for r in rows):
        raise ValueError(f"baseline run {baseline_id} is not one of the compared runs")
    if baseline_id is None:
        baseline_id = next((r.run_id for r in rows if r.tokens_per_s), rows[0].run_id if rows else None)
    index = next((i for i, r in enumerate(rows) if r.run_id == baseline_id), 0)
    ratios = speedups([r.tokens_per_s for r in rows], index)
    rows = [replace(r, speedup=s) for r, s in zip(rows, ratios, strict=True)]
    done = [r for r in rows if r.status == "completed" and r.tokens_per_s]
    fastest = max(done, key=lambda r: r.tokens_per_s or 0.0).run_id if done else None
    curves = {r.id: [(m.step, m.loss) for m in metrics.get(r.id, []) if m.loss is not None] for r in runs}
    timelines = {r.id: timeline(samples.get(r.id, [])) for r in runs} if samples else {}
    named = named or {}
    eval_curves = {r.id: [(p.step, p.value) for p in named.get(r.id, [])
                          if p.name == EVAL_LOSS and p.value is not None] for r in runs}
    rows = [replace(r, final_eval_loss=eval_curves[r.run_id][-1][1] if eval_curves.get(r.run_id) else None,
                  best_eval_loss=min(v for _, v in eval_curves[r.run_id]) if eval_curves.get(r.run_id) else None)
            for r in rows]
    last = {r.id: {p.name: p.value for p in named.get(r.id, [])} for r in runs}
    windows = {}
    for r in runs:  # the training window in the timeline's seconds, so device charts line up with the loss
        window = r.summary.telemetry["window"] if r.summary.telemetry is not None else None
        compute = [s.time for s in (samples or {}).get(r.id, []) if s.kind in ("gpu", "rank")]
        if window and compute and all(isinstance(v, int | float) for v in window):
            gpu = any(s.kind == "gpu" for s in (samples or {}).get(r.id, []))
            t0 = min(s.time for s in (samples or {}).get(r.id, []) if s.kind == ("gpu" if gpu else "rank"))
            windows[r.id] = (float(window[0]) - t0, float(window[1]) - t0)
    return Comparison(rows=rows, baseline_id=baseline_id, fastest_id=fastest,
                      recipe_diff=recipe_diff([r.recipe_text for r in runs]),
                      curves=curves, timelines=timelines, sweep_id=sweep_id,
                      hosts={r.id: r.host for r in runs if r.host}, models={r.id: r.model for r in runs},
                      data={r.id: str(_recipe(r).get("data", {}).get("source", "-")) for r in runs},
                      lr_curves={r.id: [(m.step, m.lr) for m in metrics.get(r.id, []) if m.lr is not None]
                                 for r in runs},
                      grad_curves={r.id: [(m.step, m.grad_norm) for m in metrics.get(r.id, [])
                                          if m.grad_norm is not None] for r in runs},
                      tokens_curves={r.id: [(m.step, m.tokens_per_s) for m in metrics.get(r.id, [])
                                            if m.tokens_per_s is not None] for r in runs},
                      windows=windows,
                      eval_curves={k: v for k, v in eval_curves.items() if v},
                      named={k: v for k, v in last.items() if v}, samples=dict(eval_samples or {}), floor=floor)


def timeline(samples: Sequence[SampleInfo]) -> dict[str, list[tuple[float, float | None, int | None]]]:
    """Per compute device (GPUs, else ranks), (seconds since the first sample, util %, memory bytes)."""
    gpu = any(s.kind == "gpu" for s in samples)
    keep = [s for s in samples if s.kind == ("gpu" if gpu else "rank")]
    if not keep:
        return {}
    t0 = min(s.time for s in keep)
    out: dict[str, list[tuple[float, float | None, int | None]]] = {}
    for s in sorted(keep, key=lambda s: s.time):
        out.setdefault(f"{s.kind}:{s.index}", []).append((s.time - t0, s.util_pct, s.mem_used))
    return out


# ---------------------------------------------------------------------- from the store


def joined_metrics(store: Store, run: RunInfo, _depth: int = 0) -> list[MetricPoint]:
    """A run's per-step metrics, joined to its parent's when it was resumed from a checkpoint: the parent's
    steps up to the checkpoint's step (recursively, for a chain of resumes), then the run's own steps
    (which go on with the global step numbers, N+1...). A run that was not resumed gets its own."""
    own = store.metrics(run.id)
    if run.resumed_from is None or _depth > 50:
        return own
    parent = store.get_run(run.resumed_from)
    if parent is None:
        return own
    first_own = min((m.step for m in own), default=None)
    resumed = run.summary.resumed_from
    upto = resumed.get("step") if resumed is not None else None
    if not isinstance(upto, int):
        upto = first_own - 1 if first_own is not None else None
    before = [m for m in joined_metrics(store, parent, _depth + 1) if upto is None or m.step <= upto]
    return before + own


EVAL_LOSS = "eval/loss"
"""The named metric a comparison draws as a curve (the others: their last value)."""

CURVE_POINTS = 200
"""Points per loss curve in a comparison: each group of steps keeps its first, lowest, highest and last
loss (``store.rollup``), so the best loss and the curve's shape survive; the rows stay stored."""


CURVE_NAMES = ("loss", "lr", "grad_norm", "tokens_per_s")
"""The per-step figures a comparison draws (each downsampled on its own)."""


def compare_metrics(store: Store, runs: Sequence[RunInfo], points: int = CURVE_POINTS) -> dict[int, list[MetricPoint]]:
    """Each run's loss, lr, gradient norm and tokens/s curves for a comparison, each downsampled to about
    ``points`` points, merged by step (a figure missing at a step is None there).

    Read from the store's per-block summaries (a few hundred rows per run, whatever its length); a
    resumed run's curves are joined to its parent's (:func:`joined_metrics`) and thinned here.
    """
    plain = [r.id for r in runs if r.resumed_from is None]
    stored = {name: store.curves(plain, name, points) if plain else {} for name in CURVE_NAMES}
    out: dict[int, list[MetricPoint]] = {}
    for run in runs:
        by_name: dict[str, list[tuple[int, float]]] = {}
        joined = joined_metrics(store, run) if run.resumed_from is not None else []
        for name in CURVE_NAMES:
            if run.resumed_from is None:
                by_name[name] = list(stored[name][run.id].points)
            else:
                by_name[name] = downsample_points(
                    [(m.step, v) for m in joined if (v := getattr(m, name)) is not None], points)
        steps: dict[int, dict[str, float]] = {}
        for name, pairs in by_name.items():
            for step, value in pairs:
                steps.setdefault(step, {})[name] = value
        out[run.id] = [MetricPoint(step=step, time=0.0, loss=v.get("loss"), lr=v.get("lr"), grad_norm=v.get("grad_norm"),
                                   tokens=None, step_time=None, tokens_per_s=v.get("tokens_per_s"))
                       for step, v in sorted(steps.items())]
    return out


def compare_named(store: Store, runs: Sequence[RunInfo],
                  points: int = CURVE_POINTS) -> dict[int, list[NamedMetricPoint]]:
    """What a comparison shows of the named metrics: each run's eval loss curve, downsampled to about
    ``points`` points (its lowest and last value kept), and the last finite value of every other name,
    both from the store's per-block summaries: a few hundred rows per run, however many steps reported
    them. ``time`` is not set."""
    ids = [r.id for r in runs]
    evals = store.named_curves(ids, [EVAL_LOSS], points)
    last = store.named_last(ids)
    out: dict[int, list[NamedMetricPoint]] = {}
    for run_id in ids:
        out[run_id] = [NamedMetricPoint(step=step, name=name, value=value, time=0.0)
                       for name, (step, value) in last[run_id].items() if name != EVAL_LOSS]
        curve = evals[run_id].get(EVAL_LOSS)
        out[run_id] += [NamedMetricPoint(step=step, name=EVAL_LOSS, value=value, time=0.0)
                        for step, value in (curve.points if curve else [])]
    return out


def _needs_dims(run: RunInfo) -> bool:
    """Whether compare must find the model's dimensions itself (which may import transformers): only for
    a run recorded without them whose MFU or memory estimate needs them."""
    if run.summary.model_dims is not None:
        return True  # stored: reading them costs nothing
    estimate = run.summary.estimate
    no_estimate = not (estimate is not None and isinstance(estimate.get("per_device_bytes"), Mapping))
    mfu_wanted = (run.status == "completed" and bool(run.tokens_per_s) and bool(run.summary.params)
                  and stored_flops_per_token(run) is None)
    return mfu_wanted or no_estimate


def _needs_samples(run: RunInfo, recipe: Mapping[str, Any], peak_tflops: float | None) -> bool:
    """Whether :func:`default_peak`/:func:`peak_note` need the run's samples (a GPU's name)."""
    if run.status != "completed":
        return False
    if peak_tflops or recipe.get("launch", {}).get("peak_tflops"):
        return False
    return Peak.from_json(run.summary.mfu_peak) is None


def load_comparison(store: Store, run_ids: Sequence[int], baseline_id: int | None = None,
                    peak_tflops: float | None = None, sweep_id: str | None = None,
                    with_samples: bool = False) -> Comparison:
    """Read runs from the store (in ``run_ids`` order) and compare them; raise KeyError for a
    missing run.

    Reads what the runs stored (FLOPs per token, model dimensions, peaks, estimates) and each run's loss
    curve downsampled (:func:`compare_metrics`); telemetry samples only for the HTML timelines or a run
    stored without its peak (a GPU's name); model configs only for a run recorded without its dimensions.
    """
    found = {r.id: r for r in store.get_runs(run_ids)}
    missing = next((rid for rid in run_ids if rid not in found), None)
    if missing is not None:
        raise KeyError(missing)
    runs = [found[rid] for rid in run_ids]
    recipes = {r.id: _recipe(r) for r in runs}
    # A resumed run's curve is joined to its parent's (the loss curves and best loss span the whole training).
    metrics = compare_metrics(store, runs)
    samples = {r.id: store.samples(r.id) for r in runs
               if with_samples or _needs_samples(r, recipes[r.id], peak_tflops)}
    dims = {r.id: model_dims(recipes[r.id], r) if _needs_dims(r) else None for r in runs}
    peaks = {r.id: default_peak(r, recipes[r.id], peak_tflops, samples.get(r.id, ())) if r.status == "completed"
             else None for r in runs}
    notes = {r.id: peak_note(r, recipes[r.id], samples.get(r.id, ())) for r in runs if peaks[r.id] is None}
    named = compare_named(store, runs)
    evals = {r.id: last_samples(store, r.id) for r in runs}
    floor = stored_floor(store, runs)
    return build_comparison(runs, metrics, peaks, dims, baseline_id,
                            samples if with_samples else None, sweep_id, peak_notes=notes, named=named,
                            eval_samples={k: v for k, v in evals.items() if v}, floor=floor)


FLOOR_RUNS = 200
"""The newest completed runs searched for repeats that measure the run-to-run spread."""


def stored_floor(store: Store, runs: Sequence[RunInfo]) -> NoiseFloor | None:
    """The run-to-run spread measured on the compared runs' hosts by stored repeats created no later than
    the newest compared run (:func:`runner.analysis.noise.measured_floor`)."""
    hosts = {r.host for r in runs if r.host}
    if not hosts or not runs:
        return None
    return measured_floor(store.list_runs(status="completed", limit=FLOOR_RUNS), hosts, max(r.id for r in runs))


def last_samples(store: Store, run_id: int) -> list[dict[str, str]]:
    """The samples of a run's last evaluation (``eval.prompts``), or none."""
    events = store.events(run_id, "eval_samples")
    if not events:
        return []
    return [{"prompt": str(s.get("prompt", "")), "completion": str(s.get("completion", ""))}
            for s in events[-1].payload.get("samples") or [] if isinstance(s, dict)]


def sweep_run_ids(store: Store, sweep_id: str) -> list[int]:
    """The runs of a sweep, oldest first."""
    return sorted(r.id for r in store.list_runs(sweep_id=sweep_id))
