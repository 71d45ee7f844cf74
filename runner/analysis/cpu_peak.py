"""The peak FLOP/s of a CPU, measured: a matmul benchmark taken as a peak, and its cache.

No datasheet figure holds on a shared virtual machine, so the peak is *measured* (warm-up, several
matrix sizes, repeats, best of them), once per machine fingerprint (CPU model, cores, ISA flags, torch
version: never the hostname, which virtual machines share), dtype and thread count, cached in
:func:`runner.spec.paths.cache_dir` and re-measured when older than :data:`PEAK_MAX_AGE_S`.
:func:`peak_for_run` picks a run's peak: the datasheet on GPU (:func:`runner.analysis.mfu.gpu_peak`),
this benchmark on CPU.
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

from runner.analysis.mfu import DTYPES, Peak, flops_text, gpu_peak, run_dtype
from runner.spec.paths import cache_dir

CPU_PEAK_SOURCE = "measured matmul peak (CPU)"
PEAK_CACHE_FILE = "mfu-cpu-peaks.json"
PEAK_CACHE_VERSION = 2
PEAK_MAX_AGE_S = 7 * 24 * 3600.0
"""A cached CPU peak older than this is measured again (a kernel, BIOS or microcode update moves it)."""
PEAK_BUSY_MAX_AGE_S = 3600.0
"""A peak measured while the host's load average exceeded its cores (others computing: it comes out
low) is kept only this long."""
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
    """What decides a CPU's matmul peak. Virtual machines share hostnames; they do not share this."""

    cpu_model: str
    logical_cores: int
    physical_cores: int | None
    isa: tuple[str, ...]
    torch: str

    @property
    def key(self) -> str:
        """A short stable hash of the fields (the cache key and what a run's summary records)."""
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



# ---------------------------------------------------------------------- the cache


def _cache_path(cache: Path | str | None) -> Path:
    return (Path(cache) if cache is not None else cache_dir()) / PEAK_CACHE_FILE


def cache_key(fingerprint: str, dtype: str, threads: int) -> str:
    """``<fingerprint>|bf16|threads=2``: one cached peak per machine, dtype and thread count."""
    return f"{fingerprint}|{dtype}|threads={threads}"


def read_cache(cache: Path | str | None = None) -> dict[str, Peak]:
    """Every cached peak by :func:`cache_key`; an unreadable or old-format file reads as empty."""
    try:
        data = json.loads(_cache_path(cache).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("version") != PEAK_CACHE_VERSION:
        return {}
    peaks = {}
    for key, value in (data.get("peaks") or {}).items():
        peak = Peak.from_json(value)
        if peak is not None:
            peaks[str(key)] = peak
    return peaks


def _write_cache(peak: Peak, cache: Path | str | None) -> None:
    path = _cache_path(cache)
    assert peak.fingerprint and peak.dtype and peak.threads
    peaks = read_cache(cache)  # re-read: another run may have added a peak meanwhile
    peaks[cache_key(peak.fingerprint, peak.dtype, peak.threads)] = peak
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"version": PEAK_CACHE_VERSION,
                               "peaks": {k: p.to_json() for k, p in sorted(peaks.items())}}, indent=2) + "\n")
    os.replace(tmp, path)  # atomic: two runs ending together never leave half a file


def cached_cpu_peak(threads: int, dtype: str = "fp32", cache: Path | str | None = None,
                    max_age_s: float = PEAK_MAX_AGE_S, now: float | None = None) -> Peak | None:
    """The cached peak of this machine for ``dtype`` and ``threads`` when fresh (younger than
    ``max_age_s``, or :data:`PEAK_BUSY_MAX_AGE_S` when measured on a busy host), else None (no torch)."""
    fp = machine_fingerprint()
    peak = read_cache(cache).get(cache_key(fp.key, dtype, threads))
    now = time.time() if now is None else now
    if peak is None or peak.measured_at is None:
        return None
    if peak.load is not None and peak.load > fp.logical_cores:
        max_age_s = min(max_age_s, PEAK_BUSY_MAX_AGE_S)
    return None if now - peak.measured_at > max_age_s else peak


def cpu_peak(threads: int, dtype: str = "fp32", cache: Path | str | None = None, *,
             max_age_s: float = PEAK_MAX_AGE_S, remeasure: bool = False,
             sizes: tuple[int, ...] = PEAK_SIZES, repeats: int = PEAK_REPEATS) -> Peak:
    """The CPU peak for ``threads`` torch threads in ``dtype`` on this machine.

    Read from the cache (a folder; default :func:`runner.spec.paths.cache_dir`) when an entry for this
    machine's fingerprint, dtype and threads is younger than ``max_age_s``; otherwise measured with
    :func:`measure_cpu_peak` and cached.

    Args:
        threads: Torch intra-op threads of one rank.
        dtype: ``fp32``, ``bf16`` or ``fp16``: the precision the run's matmuls ran in.
        cache: The cache folder.
        max_age_s: Older entries are measured again.
        remeasure: Measure even when a fresh entry exists (a peak that gave MFU > 100%).
        sizes: Matrix sizes to try (tests use small ones).
        repeats: Repeats per size.

    Returns:
        The peak, with its fingerprint, time of measurement, size and spread.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    threads = max(1, threads)
    if not remeasure:
        fresh = cached_cpu_peak(threads, dtype, cache, max_age_s)
        if fresh is not None:
            return fresh
    fp = machine_fingerprint()
    m = measure_cpu_peak(threads, dtype, sizes=sizes, repeats=repeats)
    lo, mid, _ = m.spread
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    peak = Peak(
        flops=m.flops,
        source=(f"{CPU_PEAK_SOURCE}, {dtype} {m.size}x{m.size}, {threads} thread(s), best of {len(m.rates[m.size])} "
                f"(median {flops_text(mid)}, min {flops_text(lo)}), load {load if load is None else round(load, 1)}, "
                f"on {fp.describe()} [{fp.key}]"),
        kind="measured", dtype=dtype, threads=threads, measured_at=time.time(), fingerprint=fp.key,
        machine=fp.describe(), size=m.size, spread=m.spread, load=load,
    )
    _write_cache(peak, cache)
    return peak



def peak_for_run(device_type: str | None, precision: str | None, threads: int | None,
                 gpu_names: list[str] | None = None, cache: Path | str | None = None) -> Peak | None:
    """The peak of one device of a run, to store in its summary when it ends (``summary["mfu_peak"]``).

    Args:
        device_type: ``cpu`` or ``cuda`` (the trainer's ``start`` event).
        precision: ``train.precision``: bf16 runs are measured against the bf16 peak.
        threads: Torch threads one rank ran with (CPU).
        gpu_names: NVML names of the run's GPUs.
        cache: The CPU peak cache folder.

    Returns:
        The datasheet peak of the first GPU, the CPU peak (cached, or measured now: call this after the
        run, never during it), or None when unknown.
    """
    dtype = run_dtype(precision)
    if device_type == "cuda" or gpu_names:
        return gpu_peak(gpu_names[0], dtype) if gpu_names else None
    if device_type != "cpu" or not threads:
        return None
    return cpu_peak(threads, dtype, cache)
