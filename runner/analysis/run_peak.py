"""The MFU of one stored run: its devices, its FLOPs per token, the peak FLOP/s it is measured against and
why a run has none (:func:`default_peak`, :func:`peak_note`), what the peak is multiplied by
(:func:`mfu_divisor`: the devices, or on CPU the CPUs the ranks ran over their steady steps) and the MFU
from what the run stored (:func:`stored_mfu`, ``ftui show``). Light: no planner, no torch (``ftui show``
imports it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from runner.analysis.mfu import Peak, compute_mfu, gpu_peak, rate_text, trustworthy
from runner.spec.flops import run_dtype
from runner.spec.summary import RunSummary
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


@dataclass(frozen=True)
class Divisor:
    """What one peak is multiplied by in a run's MFU, and the words a reader checks it by.

    Attributes:
        count: The devices, or (a peak per CPU-second) the CPUs the ranks ran over their steady steps; None
            when the run did not store them (``words`` says so).
        words: ``2 devices``; ``0.52 CPU the rank ran over its steady steps``.
        ranks: The run's processes (whose CPU-seconds are summed).
    """

    count: float | None
    words: str
    ranks: int = 1


def ran_cpus(summary: RunSummary) -> float | None:
    """The CPUs a run's ranks ran over their steady steps: the CPU-seconds their processes ran, summed over
    the ranks, over rank 0's wall seconds of those steps (both measured in the ranks); None when not stored."""
    cpu, wall = summary.steady_cpu_seconds, summary.steady_seconds
    return cpu / wall if cpu is not None and cpu > 0 and wall else None


def mfu_divisor(run: RunInfo, peak: Peak) -> Divisor:
    """What ``peak`` is multiplied by in the run's MFU: its devices, or, for a peak per CPU-second the process
    ran (CPU runs: :func:`runner.analysis.cpu_peak.peak_from_probe`), the CPUs its ranks ran over their steady
    steps. On a shared CPU the neighbours set how much CPU a run gets; what is the run's own is what each
    CPU-second it ran turned into, so its MFU is its FLOPs over (FLOPs per CPU-second x CPU-seconds ran)."""
    devices = device_count(run)
    if not peak.per_cpu_second:
        return Divisor(devices, f"{devices} device{'s' if devices != 1 else ''}", devices)
    cpus = ran_cpus(run.summary)
    if cpus is None:
        return Divisor(None, "its peak is per CPU-second, and the run stored no CPU-seconds over its steady steps",
                       devices)
    who = "the rank ran" if devices == 1 else f"its {devices} ranks ran"
    return Divisor(cpus, f"{cpus:.2f} CPU {who} over {'its' if devices == 1 else 'their'} steady steps", devices)


def mfu_words(peak: Peak, divisor: Divisor) -> str:
    """How an MFU was had, in words a reader can check: ``FLOPs/token x tokens/s / (peak x 2 devices)``, or per
    CPU-second: ``per CPU-second the rank ran (peak 118.0 GFLOP per CPU-second, probed beside the run, OpenMP
    waits yield; 0.52 CPU the rank ran over its steady steps)``."""
    if not peak.per_cpu_second:
        return f"FLOPs/token x tokens/s / (peak x {divisor.words})"
    ranks = "the rank" if divisor.ranks == 1 else "the ranks"
    return f"per CPU-second {ranks} ran (peak {peak.figure()}, {peak.provenance()}; {divisor.words})"


def over_100_note(peak: Peak) -> str:
    """What an MFU above 100% says about ``peak`` (such an MFU is never shown)."""
    if peak.kind == "probe":
        return ("the run's FLOP/s exceed the matmul rate probed beside it: the FLOP count or the probe's "
                "matrix size does not fit this model")
    return "check the peak (--peak-tflops)"


def differing_peaks(rows: Iterable[tuple[int, str | None, int | None, float | None, str | None, bool]]) -> list[str]:
    """One line per dtype and thread count that runs of one table hold different peaks for, saying why;
    ``rows`` is (run id, peak dtype, peak threads, peak FLOP/s or per CPU-second, peak kind, per CPU-second)
    per run. A peak per CPU-second and one per second are never set side by side as one quantity: the line
    says which runs take which."""
    groups: dict[tuple[str, int | None], list[tuple[int, float, str | None, bool]]] = {}
    for run_id, dtype, threads, flops, kind, per_cpu in rows:
        if dtype and flops:
            groups.setdefault((dtype, threads), []).append((run_id, flops, kind, per_cpu))
    out = []
    for (dtype, threads), runs in groups.items():
        if len({rate_text(f, c) for _, f, _, c in runs}) < 2:  # as printed: a difference a reader can see
            continue
        if len({c for *_, c in runs}) > 1:
            why = ("some per CPU-second the ranks ran, some per second of one device (runs recorded before ftui "
                   "counted the ranks' CPU-seconds): their MFUs are not the same measure")
        elif all(k == "probe" for _, _, k, _ in runs):
            why = "each probed beside its own run, under that run's load"
        else:
            why = "each run's own (probed beside it, its GPU's datasheet, or given)"
        who = ", ".join(f"run {rid} {rate_text(f, c)}" for rid, f, _, c in runs)
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
    divisor = mfu_divisor(run, peak)
    if divisor.count is None:
        return None, divisor.words
    m = compute_mfu(fpt, run.tokens_per_s, peak, divisor.count)
    if not trustworthy(m.mfu):
        return None, f"MFU > 100% against {peak.label()} x {divisor.words}: {over_100_note(peak)}"
    return m.mfu, mfu_words(peak, divisor)


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
