"""How many devices a run needs and which strategy to use, from the memory estimate (the seed's decision flow)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from runner.planner.error_band import Band, band_of, widest_band
from runner.planner.inputs import EstimateInput, Method, Strategy
from runner.planner.memory import GIB, breakdown_json, estimate
from runner.planner.switches import switch_lines
from runner.spec import strategies as table

Fit = Literal["fits", "might not fit", "does not fit"]
"""The planner's fit verdict with its error band (:func:`fit_verdict`)."""


def fit_band(key: str, band: Band | None) -> tuple[float, str]:
    """The error band a fit is judged with, as a fraction, and where it comes from: ``band``, the largest
    error measured for the family and strategy ``key`` (:func:`runner.planner.error_band.band_for`); one
    never measured (None) takes the widest band measured for any, as its own error is unknown."""
    if band is not None:
        return abs(band.worst_pct) / 100, band.sentence()
    wide = widest_band()
    if wide is None:
        return 0.0, f"{key}: never measured, and no band shipped"
    return abs(wide.worst_pct) / 100, (f"{key}: never measured; the widest band measured stands in "
                                       f"({wide.sentence()})")


def fit_verdict(need_bytes: int, budget_bytes: int, band: float) -> Fit:
    """Whether an estimate of ``need_bytes`` per device fits ``budget_bytes``: ``fits`` when it does even
    ``band`` over the estimate, ``does not fit`` when it does not even ``band`` under it, else ``might not
    fit`` (the budget lies within the estimate's error)."""
    if need_bytes + need_bytes * band <= budget_bytes:
        return "fits"
    if need_bytes - need_bytes * band > budget_bytes:
        return "does not fit"
    return "might not fit"


def _fits(inp: EstimateInput, gpu_mem_bytes: int) -> bool:
    return estimate(inp).total <= gpu_mem_bytes


def _at(inp: EstimateInput, strategy: Strategy, n_gpus: int) -> EstimateInput:
    row = table.get(strategy)
    one_device = row.max_procs == 1 and not row.layer_split
    n = 1 if one_device else n_gpus
    engine = row.with_engine(inp.engine if inp.engine in row.engine_names() else "auto")
    # Context parallelism runs under FSDP2 only, over a divisor of the devices; ZeRO-Infinity under DeepSpeed's ZeRO-3.
    cp = inp.cp_size if engine.accelerate_type == "FSDP" and n % inp.cp_size == 0 else 1
    zero = engine.engine_row()
    nvme = inp.nvme_offload and engine.accelerate_type == "DEEPSPEED" and zero is not None and zero.stage == 3
    return replace(inp, strategy=strategy, n_devices=n, cp_size=cp, nvme_offload=nvme)


def gpus_needed(inp: EstimateInput, gpu_mem_bytes: int, max_gpus: int = 1024) -> int | None:
    """The fewest devices on which ``inp.strategy`` fits, or ``None`` if none up to ``max_gpus`` does.

    Args:
        inp: The run (its ``n_devices`` is ignored).
        gpu_mem_bytes: Memory of one device.
        max_gpus: Largest device count tried.

    Returns:
        The minimum device count, or ``None``.
    """
    if not table.get(inp.strategy).shards:  # replicated: more devices never help
        return 1 if _fits(replace(inp, n_devices=1), gpu_mem_bytes) else None
    lo, hi = 1, max_gpus
    if not _fits(replace(inp, n_devices=hi), gpu_mem_bytes):
        return None
    while lo < hi:  # memory per device never grows with the device count
        mid = (lo + hi) // 2
        if _fits(replace(inp, n_devices=mid), gpu_mem_bytes):
            hi = mid
        else:
            lo = mid + 1
    return lo


@dataclass(frozen=True)
class Recommendation:
    """A strategy (and method) to run with, and why.

    Attributes:
        strategy: The recommended strategy, or ``None`` when nothing fits.
        reason: One sentence with the numbers.
        fits: For the requested method, whether each strategy fits on ``n_gpus`` devices.
        method: The fine-tuning method the recommendation is for (may be cheaper than asked).
    """

    strategy: Strategy | None
    reason: str
    fits: dict[str, bool] = field(hash=False)
    method: Method = "full"


def _gib(x: float) -> str:
    """A size in GiB, or in MiB below a tenth of one (a tiny model's states are not "0.0 GiB")."""
    return f"{x / GIB:.1f} GiB" if x >= GIB / 10 or x == 0 else f"{x / 2**20:.1f} MiB"


def recommend(inputs: EstimateInput, gpu_mem_bytes: int, n_gpus: int, on_host: bool = False) -> Recommendation:
    """Pick a strategy the seed's way: replicate when one device holds a copy, else shard as little as fits.

    If the model states plus one micro-batch fit on one device: ``ddp`` for speed (``single`` with one
    GPU). Else ``zero2`` when sharding optimizer states and grads suffices, else ``fsdp`` (weights sharded
    too, same memory as ``zero3``). ``mp`` always runs but leaves GPUs idle; it is recommended only when no
    data-parallel strategy fits and the layer split does. If a full fine-tune fits nowhere, LoRA is tried,
    then QLoRA.

    Args:
        inputs: The run (its strategy and device count are ignored).
        gpu_mem_bytes: Memory of one GPU.
        n_gpus: GPUs available.
        on_host: No GPU: the processes train on the CPU and ``gpu_mem_bytes`` is the host's memory (the
            reason's words).

    Returns:
        The recommendation.
    """
    fits: dict[str, bool] = {s: _fits(_at(inputs, s, n_gpus), gpu_mem_bytes) for s in table.names()}
    methods: list[Method] = [inputs.method]
    if inputs.method == "full":
        methods += ["lora", "qlora"]
    elif inputs.method == "lora":
        methods.append("qlora")
    order: list[Strategy] = ["ddp" if n_gpus > 1 else "single"]
    if n_gpus > 1:
        order += ["zero2", "fsdp", "mp"]
    for method in methods:
        inp = replace(inputs, method=method)
        for s in order:
            est = estimate(_at(inp, s, n_gpus))
            if est.total > gpu_mem_bytes:
                continue
            what = {"full": "full fine-tuning", "lora": "LoRA", "qlora": "QLoRA"}[method]
            if method != inputs.method:
                what += f" (a {inputs.method} fine-tune fits nowhere)"
            if on_host:
                unit, where = "process", "host memory"
            else:
                unit, where = "GPU", f"each of {n_gpus} GPUs" if n_gpus > 1 else "the GPU"
            reason = (
                f"{inputs.precision} {what} with {s} needs {_gib(est.total)} per {unit} "
                f"(model states {_gib(est.model_states)}, activations {_gib(est.activations)}), "
                f"within the {_gib(gpu_mem_bytes)} of {where}."
            )
            if s not in table.names(launchable=True):
                fsdp = estimate(_at(inp, "fsdp", n_gpus))
                reason += (
                    f" `ftui run` cannot launch {s} yet (launch.strategy takes {', '.join(table.names(launchable=True))})"
                    + (f"; fsdp fits too, at {_gib(fsdp.total)} per {unit}." if fsdp.total <= gpu_mem_bytes else ".")
                )
            return Recommendation(s, reason, fits, method)
    best = min(estimate(_at(replace(inputs, method=methods[-1]), s, n_gpus)).total for s in order)
    reason = (
        f"Nothing fits: even {methods[-1]} needs {_gib(best)} per {'process' if on_host else 'GPU'} against "
        f"{_gib(gpu_mem_bytes)} " + ("of host memory" if on_host else f"on {n_gpus} GPU(s)")
        + "; add GPUs, shorten sequences, or enable gradient checkpointing or offload."
    )
    return Recommendation(None, reason, fits, inputs.method)


def estimate_report(
    base_inputs: EstimateInput, gpu_mem_bytes: int, n_gpus: int, strategies: Sequence[Strategy] | None = None,
    on_host: bool = False,
) -> dict[str, Any]:
    """A JSON-ready report of every strategy and the recommendation.

    Args:
        base_inputs: The run (strategy and device count are set per entry).
        gpu_mem_bytes: Memory of one GPU.
        n_gpus: GPUs available (``single`` uses one).
        strategies: Strategies to report (default: every row of the strategy table).
        on_host: No GPU: ``gpu_mem_bytes`` is the host's memory (see :func:`recommend`).

    Returns:
        ``{"strategies": {name: {"per_device_bytes": {...}, "fits": bool, "gpus_needed": int | None,
        "error_band": {...} | None}},
        "recommendation": {"strategy": ..., "reason": ...}}``.
    """
    out: dict[str, Any] = {}
    for s in strategies if strategies is not None else table.names():
        inp = _at(base_inputs, s, n_gpus)
        est = estimate(inp)
        band = band_of(inp, s)
        out[s] = {
            "per_device_bytes": breakdown_json(est),
            "fits": est.total <= gpu_mem_bytes,
            "gpus_needed": gpus_needed(inp, gpu_mem_bytes),
            "error_band": None if band is None else asdict(band),
        }
    rec = recommend(base_inputs, gpu_mem_bytes, n_gpus, on_host)
    own = estimate(base_inputs)  # the switches' effect on the run as given (its own strategy)
    return {"strategies": out, "recommendation": {"strategy": rec.strategy, "reason": rec.reason},
            "switches": switch_lines(base_inputs, own.offloaded, own.nvme)}
