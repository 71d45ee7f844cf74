"""The figures of one stored run that a comparison reads: its model's dimensions, its memory estimate, its
utilisation, its devices, and the peak FLOP/s its MFU is measured against.

Each reads the run's typed record (:class:`store.RunInfo`, its summary a
:class:`runner.spec.summary.RunSummary`); only a run stored without a figure makes one of them do work
(read a model config, run the planner, measure a CPU peak).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import psutil

from runner.analysis import cpu_peak
from runner.analysis.mfu import Peak, gpu_peak, run_dtype
from runner.planner import estimate, inputs_from_recipe, shape_from_config
from runner.spec.builtin import tiny_llama_config
from runner.spec.flops import dims_from_config
from runner.spec.recipe import parse_recipe
from runner.spec.summary import CPU_CORE_UNIT, GPU_UTIL_UNIT, busiest_peak, cpu_threads_unit
from store import RunInfo, SampleInfo


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
        if model == "builtin:tiny-llama":
            cfg: Any = tiny_llama_config()
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


def device_count(run: RunInfo) -> int:
    """Devices a run computed on: the distinct GPUs of its ``device_map`` (model parallel: one process, several
    GPUs) when it has one on GPUs, else its world size (processes), at least 1."""
    device_map = run.summary.device_map
    if device_map is not None:
        gpus = set()
        for value in device_map.values():  # 0, "0", "cuda:1"; "cpu" and "disk" are not compute devices
            text = str(value).removeprefix("cuda:")
            if text.isdigit():
                gpus.add(int(text))
        if gpus:
            return len(gpus)
    return max(1, int(run.summary.world_size or run.nproc or 1))


def stored_flops_per_token(run: RunInfo) -> float | None:
    """FLOPs per token stored with the run at its start (:func:`runner.spec.flops.run_flops_per_token`), or None
    (a run recorded without them: compare then derives them from the model's dimensions)."""
    value = run.summary.flops_per_token
    return float(value) if value is not None and value > 0 else None


def default_peak(run: RunInfo, recipe: Mapping[str, Any], peak_tflops: float | None = None,
                 samples: Sequence[SampleInfo] = ()) -> Peak | None:
    """The peak FLOP/s of one of the run's devices, in the dtype it trained in.

    In order: ``peak_tflops`` when given; the recipe's ``launch.peak_tflops``; the peak the run stored
    when it ended (``summary.mfu_peak``: no benchmark, no torch import); the datasheet figure of its
    GPU; on CPU, for a run stored without its peak, the cached (or measured now) matmul peak of this
    machine for the run's dtype and threads, flagged as measured at compare time.
    """
    if peak_tflops:
        return Peak(peak_tflops * 1e12, f"given (--peak-tflops {peak_tflops:g})")
    in_recipe = recipe.get("launch", {}).get("peak_tflops")
    if in_recipe:
        return Peak(float(in_recipe) * 1e12, f"given (recipe launch.peak_tflops {float(in_recipe):g})")
    stored = Peak.from_json(run.summary.mfu_peak)
    if stored is not None:
        return stored
    dtype = run_dtype(recipe.get("train", {}).get("precision", "fp32"))
    gpu_names = [s.name for s in samples if s.kind == "gpu"]
    if run.device_type == "cuda" or gpu_names:
        return gpu_peak(gpu_names[0], dtype) if gpu_names else None
    if run.device_type != "cpu":
        return None
    peak = cpu_peak.cpu_peak(run_threads(run), dtype)
    note = "measured by compare, not stored with the run"
    here = socket.gethostname()
    if run.host and run.host != here:  # the benchmark runs where ``ftui compare`` runs
        note += f"; on {here}, not on the run's host {run.host}: give --peak-tflops for that host"
    return replace(peak, source=f"{peak.source} ({note})")


def run_threads(run: RunInfo) -> int:
    """Torch threads each rank of a CPU run used: recorded at start, else what the orchestrator gives
    (the physical cores shared out over the processes)."""
    stored = run.summary.threads
    if stored is not None and stored > 0:
        return stored
    cores = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    return max(1, cores // max(1, run.nproc))


def remeasured_peak(run: RunInfo, peak: Peak, cache: Any = None) -> tuple[Peak | None, str]:
    """Measure once more the CPU peak that gave a run an MFU above 100%.

    Only a measured peak of this very machine (same fingerprint) can be measured again here; a cache
    entry newer than ``peak`` is the re-measurement already made (by an earlier compare), so a bad
    run costs one benchmark, not one per compare.

    Returns:
        The new peak (None when it cannot be re-measured here) and one line saying what was done.
    """
    if peak.kind != "measured" or not peak.dtype or not peak.threads:
        return None, f"the {peak.kind} peak cannot be re-measured: check it (--peak-tflops)"
    here = cpu_peak.machine_fingerprint()
    if peak.fingerprint != here.key:
        return None, (f"the peak was measured on another machine ({peak.machine or peak.fingerprint}), "
                      "it cannot be re-measured here")
    newer = cpu_peak.read_cache(cache).get(cpu_peak.cache_key(here.key, peak.dtype, peak.threads))
    if newer is not None and (newer.measured_at or 0) > (peak.measured_at or 0):
        again = newer
    else:
        again = cpu_peak.cpu_peak(peak.threads, peak.dtype, cache, remeasure=True)
    return again, f"re-measured once ({peak.label()} gave MFU > 100%; now {again.label()})"


def peak_note(run: RunInfo, recipe: Mapping[str, Any], samples: Sequence[SampleInfo] = ()) -> str:
    """Why :func:`default_peak` found no peak for a run: names the GPU and suggests ``--peak-tflops``."""
    precision = recipe.get("train", {}).get("precision", "fp32")
    gpu_names = sorted({s.name for s in samples if s.kind == "gpu" and s.name})
    if gpu_names:
        return (f"no datasheet peak for {', '.join(gpu_names)} in {precision} (runner.analysis.mfu.PEAK_TFLOPS); "
                "give --peak-tflops")
    if run.device_type == "cuda":
        return "GPU model unknown (no NVML samples stored for the run); give --peak-tflops"
    return f"no peak FLOP/s known for device type {run.device_type or '?'}; give --peak-tflops"
