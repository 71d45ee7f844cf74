"""The peak FLOP/s of a CPU, measured beside the run, and the machine it was measured on.

No datasheet figure holds on a shared virtual machine, and no figure measured at another time holds
either: what a rank computes per second is its share of the cores, which moves with the other load. So a
CPU run's peak is the matmul probe its ranks took right before its first step and after its last
(:mod:`runner.rank.peak_probe`), turned into a :class:`~runner.analysis.mfu.Peak` here
(:func:`peak_from_probe`: FLOPs per CPU-second the process ran), with the machine's fingerprint (CPU model, cores, ISA flags, torch version:
never the hostname, which virtual machines share). :func:`peak_for_run` picks a run's peak: the datasheet
on GPU (:func:`runner.analysis.mfu.gpu_peak`), the probe on CPU. :func:`measure_cpu_peak` is the
benchmark of the machine's best matmul rate (``bench/bench_cpu_peak.py``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from runner.analysis.mfu import Peak, gpu_peak, rate_text
from runner.spec.events import PeakProbe, ProbeRank
from runner.spec.flops import run_dtype

PROBE_SOURCE = "matmul probe in the ranks (CPU)"
"""The first clause of a CPU peak's source (what ``ftui show`` and compare's footnotes print)."""
PEAK_SIZES = (256, 512, 1024, 2048)
"""Square matmul sizes tried in turn, stopping when two sizes in a row gain under 3% on the best before: small
sizes are bound by caches and thread start-up, so the rate grows with the size until it reaches the
peak (see BENCHMARKS.md, ``bench/bench_cpu_peak.py``)."""
PEAK_GAIN = 1.03
PEAK_REPEATS = 5
# ISA flags that change what a matmul can reach (vector width, bf16/fp16 dot products, AMX tiles).
_ISA_FLAGS = ("avx", "avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "amx_bf16",
              "amx_tile", "amx_fp16", "asimd", "sve", "bf16")


# ---------------------------------------------------------------------- the machine


@dataclass(frozen=True)
class Fingerprint:
    """What decides a CPU's matmul rate. Virtual machines share hostnames; they do not share this."""

    cpu_model: str
    logical_cores: int
    physical_cores: int | None
    isa: tuple[str, ...]
    torch: str

    @property
    def key(self) -> str:
        """A short stable hash of the fields (what a run's summary records)."""
        text = json.dumps(asdict(self), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def describe(self) -> str:
        """``AMD EPYC, 2 cores (2 physical), avx2+avx512f+avx512_bf16, torch 2.13.0+cpu``."""
        isa = "+".join(self.isa) or "no vector ISA flags"
        return (f"{self.cpu_model}, {self.logical_cores} cores ({self.physical_cores or '?'} physical), "
                f"{isa}, torch {self.torch}")


def machine_fingerprint(cpuinfo: str | None = None) -> Fingerprint:
    """This machine's :class:`Fingerprint`, read from ``/proc/cpuinfo`` (no torch import: the torch
    version comes from the installed package's metadata).

    Args:
        cpuinfo: The text of ``/proc/cpuinfo``; read from the file when None.
    """
    import platform
    from importlib import metadata

    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip() not in fields:
            fields[name.strip()] = value.strip()
    model = fields.get("model name") or fields.get("Model") or platform.processor() or platform.machine()
    # family/model/stepping tell apart CPUs that a VM names only "AMD EPYC".
    ids = "/".join(fields[k] for k in ("cpu family", "model", "stepping") if k in fields)
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    try:
        version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        version = "absent"
    try:
        import psutil

        physical = psutil.cpu_count(logical=False)
    except ImportError:  # pragma: no cover (psutil is a dependency)
        physical = None
    return Fingerprint(cpu_model=f"{model} ({ids})" if ids else model, logical_cores=os.cpu_count() or 1,
                       physical_cores=physical, isa=tuple(f for f in _ISA_FLAGS if f in flags), torch=version)





@dataclass(frozen=True)
class PeakMeasurement:
    """One benchmark: FLOP/s of every repeat at every size; the peak is the best of them."""

    dtype: str
    threads: int
    rates: dict[int, list[float]]
    """Matrix size to the FLOP/s of each repeat."""

    @property
    def size(self) -> int:
        """The size whose best repeat is the highest."""
        return max(self.rates, key=lambda n: max(self.rates[n]))

    @property
    def flops(self) -> float:
        """The peak: the best repeat of the best size."""
        return max(self.rates[self.size])

    @property
    def spread(self) -> tuple[float, float, float]:
        """(min, median, max) over the repeats at :attr:`size`."""
        rates = sorted(self.rates[self.size])
        return rates[0], rates[len(rates) // 2], rates[-1]


def measure_cpu_peak(threads: int, dtype: str = "fp32", sizes: tuple[int, ...] = PEAK_SIZES,
                     repeats: int = PEAK_REPEATS, min_repeat_s: float = 0.05) -> PeakMeasurement:
    """Measure the matmul peak of ``threads`` torch threads on this machine, as a peak.

    Sizes are tried in order, stopping once two sizes in a row are under :data:`PEAK_GAIN` times the
    best before them (the rate has stopped growing: the peak is reached). For each size: warm-up (first call, then the kernels and thread pool spun up for ``min_repeat_s``),
    then ``repeats`` repeats, each timing as many ``n x n`` matmuls as fill ``min_repeat_s`` (timer
    noise stays below 1%). The best repeat counts, because a shared host only ever slows a benchmark
    down; the spread is kept so a reader can see how noisy the host was.

    Args:
        threads: Torch intra-op threads (what one rank ran with).
        dtype: ``fp32``, ``bf16`` or ``fp16``.
        sizes: Square matrix sizes to try.
        repeats: Timed repeats per size.
        min_repeat_s: Least seconds of one repeat.

    Returns:
        The rates of every repeat; ``.flops`` is the peak.
    """
    import torch  # deferred: only a measurement needs it, and it is heavy

    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    before = torch.get_num_threads()
    torch.set_num_threads(max(1, threads))
    rates: dict[int, list[float]] = {}
    try:
        with torch.inference_mode():
            for n in sizes:
                a = torch.randn(n, n).to(torch_dtype)
                b = torch.randn(n, n).to(torch_dtype)
                out = torch.empty(n, n, dtype=torch_dtype)
                calls = _calls_for(functools.partial(torch.mm, a, b, out=out), min_repeat_s)  # the warm-up
                rates[n] = []
                for _ in range(max(1, repeats)):
                    t0 = time.perf_counter()
                    for _ in range(calls):
                        torch.mm(a, b, out=out)
                    rates[n].append(2.0 * n**3 * calls / (time.perf_counter() - t0))
                # Two sizes in a row without a gain: the peak is reached (one could be the noise of a
                # shared host).
                if len(rates) >= 3 and all(_gain(rates, k) < PEAK_GAIN for k in list(rates)[-2:]):
                    break
    finally:
        torch.set_num_threads(before)
    return PeakMeasurement(dtype=dtype, threads=max(1, threads), rates=rates)


def _gain(rates: dict[int, list[float]], size: int) -> float:
    """Best rate at ``size`` over the best of the sizes tried before it."""
    before = [max(r) for k, r in rates.items() if k < size]
    return max(rates[size]) / max(before) if before else float("inf")


def _calls_for(call: Any, seconds: float) -> int:
    """Run ``call`` for about ``seconds`` (the warm-up) and return how many calls fill that time."""
    call()
    n, t0 = 0, time.perf_counter()
    while True:
        call()
        n += 1
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds:
            return max(1, round(n * seconds / elapsed))



# ---------------------------------------------------------------------- the peak beside the run


def rank_peak(rank: ProbeRank, per_cpu_second: bool = False) -> float | None:
    """One rank's peak over its steady steps: each span between two probes rated at the mean of its ends,
    weighted by its seconds; a single probe is its own rate; None when it measured nothing.
    ``per_cpu_second``: the probes' FLOPs per CPU-second (``cpu_rates``), else per wall second (``rates``)."""
    rates = _rates(rank, per_cpu_second)
    seconds = [float(s) for s in rank.get("seconds") or []]
    if not rates or any(r <= 0 for r in rates):
        return None
    if len(rates) == 1 or len(seconds) != len(rates) - 1 or sum(seconds) <= 0:
        return sum(rates) / len(rates)
    return sum(s * (a + b) / 2 for s, a, b in zip(seconds, rates, rates[1:], strict=False)) / sum(seconds)


def _rates(rank: ProbeRank, per_cpu_second: bool) -> list[float]:
    """A rank's probe rates, per CPU-second or per wall second."""
    return [float(r) for r in (rank.get("cpu_rates") if per_cpu_second else rank.get("rates")) or []]


def per_cpu_second(probe: PeakProbe) -> bool:
    """Whether the ranks measured their probes per CPU-second and their steady CPU-seconds (every run since
    ftui counted them; an older journal holds wall-clock rates only)."""
    ranks = [r for r in probe["ranks"] if r.get("rates")]
    return bool(ranks) and all(r.get("cpu_rates") and r.get("steady_cpu_seconds") is not None for r in ranks)


def peak_from_probe(probe: PeakProbe, measured_at: float, fingerprint: Fingerprint | None = None) -> Peak:
    """The peak of a CPU run from the matmul probes its ranks took between its steady steps
    (:mod:`runner.rank.peak_probe`): each rank's time-weighted rate (:func:`rank_peak`), the mean over the
    ranks, under the run's own load step by step. The rate is FLOPs per CPU-second the process ran when the
    ranks measured it (:func:`per_cpu_second`: the MFU then divides by it times the CPU-seconds the ranks
    ran, :func:`runner.analysis.run_peak.mfu_divisor`), else FLOP/s of one rank (peak x ranks is their sum).

    Args:
        probe: The end event's ``peak_probe``.
        measured_at: Unix time of the run's end (the last probe was taken moments before).
        fingerprint: The machine's; default this one's (the watcher runs on the run's host).

    Raises:
        ValueError: No rank measured anything (each rank's error is in the message).
    """
    per_cpu = per_cpu_second(probe)
    peaks = [p for p in (rank_peak(r, per_cpu) for r in probe["ranks"]) if p is not None]
    if not peaks:
        errors = sorted({str(r["error"]) for r in probe["ranks"] if r.get("error")})
        raise ValueError(f"the peak probe measured nothing: {'; '.join(errors) or 'no probes'}")
    fp = fingerprint or machine_fingerprint()
    rates = [r for rank in probe["ranks"] for r in _rates(rank, per_cpu)]
    flops = sum(peaks) / len(peaks)
    dtype, threads, n = probe["dtype"], int(probe["threads"]), int(probe["size"])
    per_rank = max(len(rank.get("rates") or []) for rank in probe["ranks"])
    unit = "per CPU-second the process ran" if per_cpu else "per wall second"
    source = (f"{PROBE_SOURCE}, {unit}, {dtype} {n}x{n}, {threads} thread(s), {per_rank} probe(s) of >= "
              f"{probe['window_s'] * 1000:g} ms per rank through the steady steps, time-weighted, mean over "
              f"{len(peaks)} rank(s) (min {rate_text(min(rates), per_cpu)}, max {rate_text(max(rates), per_cpu)}), "
              f"on {fp.describe()} [{fp.key}]")
    return Peak(flops=flops, source=source, kind="probe", dtype=dtype, threads=threads, measured_at=measured_at,
                fingerprint=fp.key, machine=fp.describe(), size=n, spread=(min(rates), flops, max(rates)),
                omp_wait=probe.get("omp_wait"), per_cpu_second=per_cpu)


def peak_for_run(device_type: str | None, probe: PeakProbe | None, precision: str | None,
                 gpu_names: list[str] | None = None, measured_at: float | None = None) -> Peak | None:
    """The peak of one device of a run, to store in its summary when it ends (``summary["mfu_peak"]``).

    Args:
        device_type: ``cpu`` or ``cuda`` (the trainer's ``start`` event).
        probe: The end event's ``peak_probe`` (CPU runs that completed).
        precision: ``train.precision``: bf16 runs are measured against the bf16 peak.
        gpu_names: NVML names of the run's GPUs.
        measured_at: Unix time of the run's end; default now.

    Returns:
        The datasheet peak of the first GPU, the CPU peak probed beside the run, or None when unknown (a
        CPU run without a probe has no peak: one measured at another time did not share its load).
    """
    if device_type == "cuda" or gpu_names:
        return gpu_peak(gpu_names[0], run_dtype(precision)) if gpu_names else None
    if device_type != "cpu" or probe is None:
        return None
    return peak_from_probe(probe, time.time() if measured_at is None else measured_at)
