"""Model FLOPs utilisation (MFU): the training FLOPs a run achieved over the hardware's peak.

The FLOPs per token come from :mod:`runner.spec.flops`. A peak (:class:`Peak`) is one device's FLOP/s
and where the figure comes from: on GPU the dense (no 2:4 sparsity) vendor datasheet figure per model and
dtype (:data:`PEAK_TFLOPS`, :func:`gpu_peak`); on CPU, where no datasheet holds on a shared virtual
machine, the matmul rate probed in the ranks beside the run, per CPU-second the process ran
(:mod:`runner.analysis.cpu_peak`), which the MFU takes times the CPU-seconds the ranks ran over their steady
steps, not times the devices (:func:`runner.analysis.run_peak.mfu_divisor`). The
orchestrator stores the peak in the run's summary (``summary.mfu_peak``, :meth:`Peak.to_json`) when the
run ends, so ``ftui compare`` needs no benchmark. An MFU above 100% means the peak (or the FLOP count) is
wrong: :func:`trustworthy` says so, and it is never shown.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any

# Dense peak TFLOP/s by GPU model and dtype (vendor datasheets; tensor cores with fp32 accumulate for
# 16-bit; "fp32" is the non-tensor-core rate torch uses by default, "tf32" needs allow_tf32; "fp8": the float8
# tensor cores of Ada and Hopper, what train.precision = "fp8" runs its Linear layers on).
# Keys are matched against the NVML device name in order, so the more specific come first.
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H100 PCIe": {"fp8": 1513.0, "bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.2},
    "H100": {"fp8": 1978.9, "bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9},  # SXM
    "H200": {"fp8": 1978.9, "bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9},
    "A100": {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
    "L40S": {"fp8": 733.0, "bf16": 362.1, "fp16": 362.1, "tf32": 183.0, "fp32": 91.6},
    "L4": {"fp8": 242.5, "bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3},
    "A10G": {"bf16": 70.0, "fp16": 70.0, "tf32": 35.0, "fp32": 31.2},
    "A10": {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2},
    "RTX A6000": {"bf16": 154.8, "fp16": 154.8, "tf32": 77.4, "fp32": 38.7},
    "RTX 4090": {"bf16": 165.2, "fp16": 165.2, "tf32": 82.6, "fp32": 82.6},
    "RTX 3090": {"bf16": 71.0, "fp16": 71.0, "tf32": 35.6, "fp32": 35.6},
    "V100": {"fp16": 125.0, "fp32": 15.7},
    "T4": {"fp16": 65.0, "fp32": 8.1},
}



@dataclass(frozen=True)
class Peak:
    """Peak FLOP/s of one device, and where the figure comes from.

    Attributes:
        flops: FLOP/s of one device (a GPU, or one rank's threads on CPU), or FLOP per CPU-second the process
            ran (``per_cpu_second``).
        source: One line: where the figure comes from.
        kind: ``probe`` (CPU: probed in the ranks beside the run), ``datasheet`` (GPU table), ``given`` (a
            flag, the recipe) or ``measured`` (CPU: a benchmark after the run, as runs recorded before the
            probe stored it; no MFU is computed against it: it did not share the run's load).
        dtype: The dtype the peak holds for (``fp32``, ``bf16``, ``fp16``), when known.
        threads: Torch threads of one rank (CPU).
        measured_at: Unix time of the measurement (CPU: the run's end).
        fingerprint: :attr:`runner.analysis.cpu_peak.Fingerprint.key` of the machine measured (CPU).
        machine: :meth:`runner.analysis.cpu_peak.Fingerprint.describe` of that machine.
        size: Square matrix size of the matmuls measured.
        spread: (min, median, max) FLOP/s over the probe's windows (a benchmark's repeats).
        load: The host's 1-minute load average when a benchmark measured it (none for a probe).
        omp_wait: How the run's OpenMP threads waited (CPU: :func:`runner.spec.openmp.wait_words`, ``yield``): the
            conditions of the probe and of the training alike; None when not recorded.
        per_cpu_second: ``flops`` is FLOPs per CPU-second the process ran (CPU: probed beside the run since
            ftui counted the ranks' CPU-seconds), not per second of one device.
    """

    flops: float
    source: str
    kind: str = "given"
    dtype: str | None = None
    threads: int | None = None
    measured_at: float | None = None
    fingerprint: str | None = None
    machine: str | None = None
    size: int | None = None
    spread: tuple[float, float, float] | None = field(default=None, compare=False)
    load: float | None = field(default=None, compare=False)
    omp_wait: str | None = field(default=None, compare=False)
    per_cpu_second: bool = False

    def to_json(self) -> dict[str, Any]:
        """A JSON object for the run's summary and the cache."""
        out = asdict(self)
        out["spread"] = list(self.spread) if self.spread else None
        return out

    @classmethod
    def from_json(cls, data: Any) -> Peak | None:
        """The peak stored by :meth:`to_json`; None for anything else (an old or damaged entry)."""
        if not isinstance(data, dict) or not isinstance(data.get("flops"), (int, float)) or data["flops"] <= 0:
            return None
        spread = data.get("spread")
        try:
            return cls(
                flops=float(data["flops"]), source=str(data.get("source") or ""), kind=str(data.get("kind") or "given"),
                dtype=data.get("dtype"), threads=_int(data.get("threads")), measured_at=_float(data.get("measured_at")),
                fingerprint=data.get("fingerprint"), machine=data.get("machine"), size=_int(data.get("size")),
                load=_float(data.get("load")), omp_wait=_str(data.get("omp_wait")),
                per_cpu_second=data.get("per_cpu_second") is True,
                spread=(float(spread[0]), float(spread[1]), float(spread[2]))
                if isinstance(spread, list) and len(spread) == 3 else None,
            )
        except (TypeError, ValueError):
            return None

    def figure(self) -> str:
        """The rate with its dtype and threads: ``52.1 GFLOP/s bf16, 1 thread``, ``118.0 GFLOP per CPU-second
        fp32, 2 threads``."""
        parts = [rate_text(self.flops, self.per_cpu_second)]
        if self.dtype:
            parts[0] += f" {self.dtype}"
        if self.threads:
            parts.append(f"{self.threads} thread{'s' if self.threads != 1 else ''}")
        return ", ".join(parts)

    def provenance(self) -> str:
        """How the rate was had: ``probed beside the run``, ``measured after the run 2026-11-23``..."""
        if self.kind == "probe":
            return "probed beside the run" + (f", {self.waits()}" if self.omp_wait else "")
        if self.kind == "measured" and self.measured_at:
            words = "measured after the run " + time.strftime("%Y-%m-%d", time.gmtime(self.measured_at))
            if self.load is not None and self.load > (os.cpu_count() or 1):
                words += f", busy host (load {self.load:.1f})"
            return words
        return self.kind

    def waits(self) -> str:
        """``OpenMP waits yield``: how the run's OpenMP threads waited, or empty when not recorded."""
        return f"OpenMP waits {self.omp_wait}" if self.omp_wait else ""

    def label(self) -> str:
        """A short cell: ``52.1 GFLOP/s bf16, 1 thread, probed beside the run, OpenMP waits yield``."""
        return f"{self.figure()}, {self.provenance()}"


def _int(v: Any) -> int | None:
    return int(v) if isinstance(v, (int, float)) else None


def _float(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) else None


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) and v else None


def flops_text(flops: float) -> str:
    """``52.1 GFLOP/s`` or ``1.2 TFLOP/s``."""
    return f"{flops / 1e12:.1f} TFLOP/s" if flops >= 1e12 else f"{flops / 1e9:.1f} GFLOP/s"


def rate_text(flops: float, per_cpu_second: bool = False, short: bool = False) -> str:
    """:func:`flops_text`, or per CPU-second: ``118.0 GFLOP per CPU-second`` (``short``: ``118.0 GFLOP/CPU-s``)."""
    if not per_cpu_second:
        return flops_text(flops)
    unit = "/CPU-s" if short else " per CPU-second"
    return f"{flops / 1e12:.1f} TFLOP{unit}" if flops >= 1e12 else f"{flops / 1e9:.1f} GFLOP{unit}"


@dataclass(frozen=True)
class Mfu:
    """The MFU of a run.

    Attributes:
        flops_per_token: Training FLOPs per token (forward and backward).
        achieved_flops: ``flops_per_token * tokens_per_s``: FLOP/s over all devices.
        peak: Peak FLOP/s of one device (or FLOP per CPU-second).
        devices: Devices the run used, or (a per-CPU-second peak) the CPUs its ranks ran over their steady
            steps: CPU-seconds over wall seconds (:func:`runner.analysis.run_peak.mfu_divisor`).
        mfu: ``achieved_flops / (peak * devices)``, a fraction.
    """

    flops_per_token: float
    achieved_flops: float
    peak: Peak
    devices: float
    mfu: float


def compute_mfu(fpt: float, tokens_per_s: float, peak: Peak, devices: float) -> Mfu:
    """MFU of a run that trained ``tokens_per_s`` tokens per second over ``devices`` devices (or, against a
    per-CPU-second peak, CPUs ran: then ``tokens_per_s x seconds`` over ``P x CPU-seconds``, the same ratio)."""
    achieved = fpt * tokens_per_s
    return Mfu(flops_per_token=fpt, achieved_flops=achieved, peak=peak, devices=devices,
               mfu=achieved / (peak.flops * devices) if devices > 0 else float("inf"))


def trustworthy(mfu: float) -> bool:
    """Whether an MFU can be shown: above 100% the peak (or the FLOP count) is wrong, not the run fast."""
    return 0.0 <= mfu <= 1.0


def gpu_peak(device_name: str, dtype: str) -> Peak | None:
    """The datasheet peak of a GPU by its NVML name (``NVIDIA H100 80GB HBM3``) and dtype (bf16 falls
    back to the fp16 rate on GPUs without bf16, such as the T4)."""
    name = device_name.upper().replace("NVIDIA", "").replace("GEFORCE", "")
    for model, table in PEAK_TFLOPS.items():
        if _matches(model.upper(), name):
            tflops = table.get(dtype) or (table.get("fp16") if dtype == "bf16" else None)
            if tflops is None:
                return None
            return Peak(tflops * 1e12, f"{model} {dtype} dense datasheet peak ({tflops:g} TFLOP/s)",
                        kind="datasheet", dtype=dtype)
    return None


def _matches(model: str, name: str) -> bool:
    # "A10" must not match "A100"; "L4" must not match "L40S": whole-token match on the model.
    return re.search(rf"(?<![A-Z0-9]){re.escape(model)}(?![0-9A-Z])", name) is not None
