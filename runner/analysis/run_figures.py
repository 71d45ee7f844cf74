"""The figures of one stored run that a comparison reads: its model's dimensions, its memory estimate, its
utilisation (its MFU and the peak it is measured against: :mod:`runner.analysis.run_peak`).

Each reads the run's typed record (:class:`store.RunInfo`, its summary a
:class:`runner.spec.summary.RunSummary`); only a run stored without a figure makes one of them do work
(read a model config, run the planner).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from runner.planner import estimate, inputs_from_recipe, shape_from_config
from runner.spec.builtin import BUILTIN_PREFIX, model_config
from runner.spec.flops import dims_from_config
from runner.spec.recipe import parse_recipe
from runner.spec.summary import CPU_CORE_UNIT, GPU_UTIL_UNIT, busiest_peak, cpu_threads_unit
from store import RunInfo


def model_dims(recipe: Mapping[str, Any], run: RunInfo | None = None) -> dict[str, Any] | None:
    """Layers, heads, head size and context length of a run's model: stored by the trainer in the
    run's summary (``model_dims``: no transformers import), else read from the recipe's model (builtin,
    or a local folder whose config transformers can read offline; ``config`` then holds it); None
    when unknown."""
    stored = run.summary.model_dims if run is not None else None
    if isinstance(stored, Mapping) and all(isinstance(stored.get(k), int) for k in ("layers", "heads", "head_dim", "seq_len")):
        return dict(stored)
    model = recipe.get("model", {}).get("name", "")
    seq = int(recipe.get("data", {}).get("context_length", 0) or 0)
    try:
        if model.startswith(BUILTIN_PREFIX):
            cfg: Any = model_config(model)
        else:
            # Deferred: a heavy library, needed only for a run stored without its dimensions.
            from transformers import AutoConfig

            cfg = AutoConfig.from_pretrained(model, local_files_only=True)
    except Exception:  # noqa: BLE001 (no config here: MFU is shown as '-')
        return None
    dims = dims_from_config(cfg, seq)
    return None if dims is None else {**dims, "config": cfg}


def estimated_memory(run: RunInfo, recipe: Mapping[str, Any], dims: Mapping[str, Any] | None) -> tuple[int | None, str]:
    """Per-device peak bytes predicted for the run: the estimate stored at prepare time
    (``summary["estimate"]["per_device_bytes"]["total"]``, made with the recipe's real dtypes), else
    :func:`runner.planner.estimate` of the stored recipe (through :func:`runner.planner.inputs_from_recipe`,
    so ``model.dtype`` and the LoRA settings count) for a model whose config is at hand."""
    stored = run.summary.estimate
    if stored is not None:
        per_device = stored.get("per_device_bytes")
        if isinstance(per_device, Mapping) and isinstance(per_device.get("total"), (int, float)):
            return int(per_device["total"]), "estimated at prepare time (runner.planner)"
    if dims is None or "config" not in dims or not run.recipe_text:  # dims stored by the trainer carry no config
        return None, "-"
    try:
        parsed = parse_recipe(run.recipe_text, source=f"run {run.id}")
        inp = inputs_from_recipe(parsed, shape=shape_from_config(dims["config"]))
        if run.device_type == "cpu":
            inp = replace(inp, device="cpu")
        return estimate(inp).total, "estimated from the stored recipe (runner.planner)"
    except Exception:  # noqa: BLE001 (an estimate we cannot make is a '-')
        return None, "-"


@dataclass(frozen=True)
class Utilisation:
    """A run's utilisation as compare shows it (see :func:`runner.analysis.utilisation.summarise`)."""

    cpu: float | None
    threads: int | None
    gpu: float | None
    low: float | None
    high: float | None
    source: str


def utilisation(run: RunInfo) -> Utilisation:
    """The run's mean utilisation over its ranks (CPU % of each rank's threads) or GPUs (NVML busy %),
    with the lowest and highest device, from its stored telemetry summary (active window first)."""
    tel = run.summary.telemetry
    overall = (tel["active"] or tel["whole"]) if tel is not None else None
    if overall is None or tel is None:
        return Utilisation(None, None, None, None, None, "-")
    kind = overall["kind"]
    window = "active window" if tel["active"] else "whole run"
    mean, low, high = overall["util_mean"], overall["util_min"], overall["util_max"]
    if (overall["devices"] or 0) < 2:  # a spread needs two devices
        low = high = None
    if kind == "gpu":
        return Utilisation(None, None, mean, low, high, f"{GPU_UTIL_UNIT}, mean over GPUs, {window}")
    if kind != "rank":
        return Utilisation(None, None, None, None, None, "-")
    threads = overall["threads"]
    unit = cpu_threads_unit(threads) if threads else CPU_CORE_UNIT
    return Utilisation(mean, threads, None, low, high, f"{unit}, mean over ranks, {window}")


def mem_measured(run: RunInfo) -> tuple[int | None, str]:
    """The run's measured peak memory (the busiest rank's) and its source, else the stored column."""
    peak, source = busiest_peak(run.summary.ranks)
    if peak is not None:
        return peak, f"{source}, busiest rank"
    return run.peak_mem_bytes, "stored peak"


@dataclass(frozen=True)
class Kernels:
    """The attention implementation and torch.compile a run trained with, as its trainer found them in effect
    (the ``kernels`` event: :func:`runner.rank.compiling.kernels_event`)."""

    attention: str | None
    """The live model's ``config._attn_implementation``."""
    compile_mode: str | None
    """``train.compile_mode`` of compiled layers; None: not compiled."""
    layers: int = 0
    graph_breaks: int = 0
    seconds: float | None = None
    """The compile phase (the first step, compilation included)."""

    def compile_cell(self) -> str:
        """``default, 6 layers, 134s``, or ``off``."""
        if self.compile_mode is None:
            return "off"
        breaks = f", {self.graph_breaks} breaks" if self.graph_breaks else ""
        took = f", {self.seconds:.0f}s" if self.seconds is not None else ""
        return f"{self.compile_mode}, {self.layers} layers{breaks}{took}"

    def words(self) -> str:
        """What differs from transformers' defaults (SDPA, nothing compiled), for a run's label: ``eager``,
        ``compiled``, ``eager, compiled max-autotune``; empty when nothing does."""
        parts = [self.attention] if self.attention not in (None, "sdpa") else []
        if self.compile_mode is not None:
            parts.append("compiled" + ("" if self.compile_mode == "default" else f" {self.compile_mode}"))
        return ", ".join(p for p in parts if p)


def kernels(stored: Mapping[str, Any] | None) -> Kernels | None:
    """The :class:`Kernels` of a run's stored ``kernels`` record (``RunSummary.kernels``), or None when its
    trainer did not record them (older runs, scripts)."""
    if not isinstance(stored, Mapping):
        return None
    compiled = stored.get("compile")
    if not isinstance(compiled, Mapping):
        return Kernels(_text(stored.get("attention")), None)
    seconds = compiled.get("seconds")
    return Kernels(_text(stored.get("attention")), str(compiled.get("mode")), int(compiled.get("layers") or 0),
                   int(compiled.get("graph_breaks") or 0), float(seconds) if isinstance(seconds, int | float) else None)


def _text(value: Any) -> str | None:
    return None if value is None else str(value)
