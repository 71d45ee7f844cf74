"""The MFU of one stored run: its devices, its FLOPs per token, the peak FLOP/s it is measured against and
why a run has none (:func:`default_peak`, :func:`peak_note`), and the MFU from what the run stored
(:func:`stored_mfu`, ``ftui show``). Light: no planner, no torch (``ftui show`` imports it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from runner.analysis.mfu import Peak, compute_mfu, flops_text, gpu_peak, trustworthy
from runner.spec.flops import run_dtype
from store import RunInfo, SampleInfo


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
    when it ended (``summary.mfu_peak``: no benchmark, no torch import) unless it is a CPU benchmark taken
    after the run (:func:`unshared_peak`); the datasheet figure of its GPU. A CPU run has no other peak:
    one measured now did not share its load (:func:`peak_note` says why there is none).
    """
    if peak_tflops:
        return Peak(peak_tflops * 1e12, f"given (--peak-tflops {peak_tflops:g})")
    in_recipe = recipe.get("launch", {}).get("peak_tflops")
    if in_recipe:
        return Peak(float(in_recipe) * 1e12, f"given (recipe launch.peak_tflops {float(in_recipe):g})")
    stored = Peak.from_json(run.summary.mfu_peak)
    if stored is not None and not unshared_peak(stored):
        return stored
    dtype = run_dtype(recipe.get("train", {}).get("precision", "fp32"))
    gpu_names = [s.name for s in samples if s.kind == "gpu"]
    if run.device_type == "cuda" or gpu_names:
        return gpu_peak(gpu_names[0], dtype) if gpu_names else None
    return None


def unshared_peak(peak: Peak) -> bool:
    """Whether ``peak`` is a CPU benchmark taken after its run (``kind: measured``, as runs recorded before
    the probe beside the run stored): its load was not the run's, so no MFU is computed against it."""
    return peak.kind == "measured"


def over_100_note(peak: Peak) -> str:
    """What an MFU above 100% says about ``peak`` (such an MFU is never shown)."""
    if peak.kind == "probe":
        return ("the run's FLOP/s exceed the matmul rate probed beside it: the FLOP count or the probe's "
                "matrix size does not fit this model")
    return "check the peak (--peak-tflops)"


def differing_peaks(rows: Iterable[tuple[int, str | None, int | None, float | None, str | None]]) -> list[str]:
    """One line per dtype and thread count that runs of one table hold different peaks for, saying why;
    ``rows`` is (run id, peak dtype, peak threads, peak FLOP/s, peak kind) per run."""
    groups: dict[tuple[str, int | None], list[tuple[int, float, str | None]]] = {}
    for run_id, dtype, threads, flops, kind in rows:
        if dtype and flops:
            groups.setdefault((dtype, threads), []).append((run_id, flops, kind))
    out = []
    for (dtype, threads), runs in groups.items():
        if len({flops_text(f) for _, f, _ in runs}) < 2:  # as printed: a difference a reader can see
            continue
        why = ("each probed beside its own run, under that run's load" if all(k == "probe" for _, _, k in runs)
               else "each run's own (probed beside it, its GPU's datasheet, or given)")
        who = ", ".join(f"run {rid} {flops_text(f)}" for rid, f, _ in runs)
        unit = f", {threads} thread{'s' if threads != 1 else ''}" if threads else ""
        out.append(f"MFU peaks differ for {dtype}{unit} ({who}): {why}")
    return out


def stored_mfu(run: RunInfo) -> tuple[float | None, str]:
    """A completed run's MFU from what it stored (FLOPs per token, tokens/s, its peak: ``ftui show``), and
    the peak it is measured against, or why there is none (``ftui compare`` also takes a given peak and
    derives what an older run did not store)."""
    if run.status != "completed" or not run.tokens_per_s:
        return None, "the run did not complete with a throughput"
    peak = Peak.from_json(run.summary.mfu_peak)
    if peak is None or unshared_peak(peak):
        return None, peak_note(run, {})
    fpt = stored_flops_per_token(run)
    if fpt is None:
        return None, "FLOPs per token not stored with the run (ftui compare derives them)"
    devices = device_count(run)
    m = compute_mfu(fpt, run.tokens_per_s, peak, devices)
    if not trustworthy(m.mfu):
        return None, f"MFU > 100% against {peak.label()} x {devices} device(s): {over_100_note(peak)}"
    return m.mfu, f"FLOPs/token x tokens/s / (peak x {devices} device{'s' if devices != 1 else ''})"


def peak_note(run: RunInfo, recipe: Mapping[str, Any], samples: Sequence[SampleInfo] = ()) -> str:
    """Why :func:`default_peak` found no peak for a run: names the GPU, or what the CPU run lacks, and
    suggests ``--peak-tflops``."""
    precision = recipe.get("train", {}).get("precision", "fp32")
    stored = run.summary.mfu_peak or {}
    old = Peak.from_json(stored)
    if old is not None and unshared_peak(old):
        return (f"its CPU peak ({old.label()}) was measured after the run, under load the run did not share: "
                "no MFU against it (runs since probe the peak beside the run); give --peak-tflops")
    if stored.get("error"):
        return f"the peak probe beside the run measured nothing ({stored['error']}); give --peak-tflops"
    if run.device_type == "cpu":
        return ("no CPU peak measured beside the run (recorded before ftui probed it in the ranks, or a script's "
                "run, whose ranks ftui does not start); give --peak-tflops")
    gpu_names = sorted({s.name for s in samples if s.kind == "gpu" and s.name})
    if gpu_names:
        return (f"no datasheet peak for {', '.join(gpu_names)} in {precision} (runner.analysis.mfu.PEAK_TFLOPS); "
                "give --peak-tflops")
    if run.device_type == "cuda":
        return "GPU model unknown (no NVML samples stored for the run); give --peak-tflops"
    return unknown_device_note(run)


def unknown_device_note(run: RunInfo) -> str:
    """No peak for the run's device type (or none recorded)."""
    if not run.device_type:
        return "no peak FLOP/s: the run recorded no device type; give --peak-tflops"
    return f"no peak FLOP/s known for device type {run.device_type}; give --peak-tflops"
