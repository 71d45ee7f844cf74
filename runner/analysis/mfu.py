"""Model FLOPs utilisation (MFU): the training FLOPs a run achieved over the hardware's peak.

FLOPs per token follow the PaLM paper (appendix B) as nanoGPT's ``estimate_mfu`` writes it:
``6 N + 12 L H Q T`` for N parameters, L layers, H heads of size Q and a context of T tokens. The
``6 N`` is 2 N for the forward matmuls, 2 N for the gradient with respect to the inputs and 2 N for
the gradient with respect to the weights. Frozen weights (the base model under LoRA) skip the last
one, so a LoRA run costs ``4 N_frozen + 6 N_trainable``. The attention term has no weights and is
paid in full either way: backward must still carry gradients through every layer to the adapters.

Peaks are dense (no 2:4 sparsity) vendor datasheet figures per GPU model and dtype. On CPU there is
no datasheet that holds on a shared virtual machine, so the peak is *measured*: a matmul benchmark
taken as a peak (warm-up, several matrix sizes, repeats, best of them), once per machine fingerprint
(CPU model, cores, ISA flags, torch version: never the hostname, which virtual machines share), dtype
and thread count, cached in :func:`runner.spec.paths.cache_dir` and re-measured when older than
:data:`PEAK_MAX_AGE_S`. The orchestrator stores the peak it used in the run's summary
(``summary["mfu_peak"]``, :meth:`Peak.to_json`) after the run, so ``ftui compare`` needs no benchmark.
An MFU above 100% means the peak is wrong: :func:`trustworthy` says so, and compare re-measures once.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# Dense peak TFLOP/s by GPU model and dtype (vendor datasheets; tensor cores with fp32 accumulate for
# 16-bit; "fp32" is the non-tensor-core rate torch uses by default, "tf32" needs allow_tf32).
# Keys are matched against the NVML device name in order, so the more specific come first.
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H100 PCIe": {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.2},
    "H100": {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9},  # SXM
    "H200": {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9},
    "A100": {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
    "L40S": {"bf16": 362.1, "fp16": 362.1, "tf32": 183.0, "fp32": 91.6},
    "L4": {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3},
    "A10G": {"bf16": 70.0, "fp16": 70.0, "tf32": 35.0, "fp32": 31.2},
    "A10": {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2},
    "RTX A6000": {"bf16": 154.8, "fp16": 154.8, "tf32": 77.4, "fp32": 38.7},
    "RTX 4090": {"bf16": 165.2, "fp16": 165.2, "tf32": 82.6, "fp32": 82.6},
    "RTX 3090": {"bf16": 71.0, "fp16": 71.0, "tf32": 35.6, "fp32": 35.6},
    "V100": {"fp16": 125.0, "fp32": 15.7},
    "T4": {"fp16": 65.0, "fp32": 8.1},
}

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
DTYPES = ("fp32", "bf16", "fp16")
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


# ---------------------------------------------------------------------- peaks


@dataclass(frozen=True)
class Peak:
    """Peak FLOP/s of one device, and where the figure comes from.

    Attributes:
        flops: FLOP/s of one device (a GPU, or one rank's threads on CPU).
        source: One line: where the figure comes from.
        kind: ``measured`` (CPU benchmark), ``datasheet`` (GPU table) or ``given`` (a flag, the recipe).
        dtype: The dtype the peak holds for (``fp32``, ``bf16``, ``fp16``), when known.
        threads: Torch threads the benchmark used (CPU).
        measured_at: Unix time of the measurement (CPU).
        fingerprint: :attr:`Fingerprint.key` of the machine measured (CPU).
        machine: :meth:`Fingerprint.describe` of that machine.
        size: Matrix size that reached the peak.
        spread: (min, median, max) FLOP/s over the repeats at that size.
        load: The host's 1-minute load average when measured (a busy host measures low).
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
                load=_float(data.get("load")),
                spread=(float(spread[0]), float(spread[1]), float(spread[2]))
                if isinstance(spread, list) and len(spread) == 3 else None,
            )
        except (TypeError, ValueError):
            return None

    def label(self) -> str:
        """A short cell: ``52.1 GFLOP/s bf16, 1 thread, measured 2026-11-23``."""
        parts = [_flops_text(self.flops)]
        if self.dtype:
            parts[0] += f" {self.dtype}"
        if self.threads:
            parts.append(f"{self.threads} thread{'s' if self.threads != 1 else ''}")
        if self.kind == "measured" and self.measured_at:
            parts.append("measured " + time.strftime("%Y-%m-%d", time.gmtime(self.measured_at)))
            if self.load is not None and self.load > (os.cpu_count() or 1):
                parts.append(f"busy host (load {self.load:.1f})")
        else:
            parts.append(self.kind)
        return ", ".join(parts)


def _int(v: Any) -> int | None:
    return int(v) if isinstance(v, (int, float)) else None


def _float(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) else None


def _flops_text(flops: float) -> str:
    return f"{flops / 1e12:.1f} TFLOP/s" if flops >= 1e12 else f"{flops / 1e9:.1f} GFLOP/s"


@dataclass(frozen=True)
class Mfu:
    """The MFU of a run.

    Attributes:
        flops_per_token: Training FLOPs per token (forward and backward).
        achieved_flops: ``flops_per_token * tokens_per_s``: FLOP/s over all devices.
        peak: Peak FLOP/s of one device.
        devices: Devices the run used.
        mfu: ``achieved_flops / (peak * devices)``, a fraction.
    """

    flops_per_token: float
    achieved_flops: float
    peak: Peak
    devices: int
    mfu: float


def flops_per_token(params: int, layers: int, heads: int, head_dim: int, seq_len: int,
                    trainable_params: int | None = None) -> float:
    """Training FLOPs per token: ``6N + 12 L H Q T``, or ``4 N_frozen + 6 N_trainable + 12 L H Q T``.

    Args:
        params: Every parameter of the model (N).
        layers: Decoder layers (L).
        heads: Attention heads (H).
        head_dim: Size of one head (Q).
        seq_len: Tokens per sequence (T).
        trainable_params: Parameters that get gradients; None means all (full fine-tuning).

    Returns:
        FLOPs per trained token.
    """
    trainable = params if trainable_params is None else min(trainable_params, params)
    frozen = params - trainable
    return float(4 * frozen + 6 * trainable + 12 * layers * heads * head_dim * seq_len)


def dims_from_config(cfg: Any, seq_len: int) -> dict[str, int] | None:
    """What :func:`flops_per_token` needs of a transformers config: layers, heads, head size, context
    length and the input-embedding parameters to leave out of N; None when the config lacks them.

    The trainer stores this in the run's summary (``model_dims``) so that compare never imports
    transformers to read a config.
    """
    heads = int(getattr(cfg, "num_attention_heads", 0) or 0)
    hidden = int(getattr(cfg, "hidden_size", 0) or 0)
    head_dim = int(getattr(cfg, "head_dim", 0) or 0) or (hidden // heads if heads else 0)
    layers = int(getattr(cfg, "num_hidden_layers", 0) or 0)
    if not (heads and head_dim and layers and seq_len):
        return None
    # The input embedding is a lookup, not a matmul: it costs no FLOPs (PaLM counts non-embedding N).
    # Tied, the same matrix is the output head (a matmul) and stays in N; untied, the output head stays
    # in N and the input embedding (vocab x hidden) leaves it.
    tied = bool(getattr(cfg, "tie_word_embeddings", False))
    embedding = 0 if tied else int(getattr(cfg, "vocab_size", 0) or 0) * hidden
    return {"layers": layers, "heads": heads, "head_dim": head_dim, "seq_len": int(seq_len),
            "embedding_params": embedding}


def run_flops_per_token(method: str, params: Any, trainable_params: Any,
                        dims: Any) -> float | None:
    """FLOPs per trained token of a run from what its start event reports (parameter counts and
    :func:`dims_from_config`'s ``model_dims``); None when any is missing. Stored with the run
    (``summary["flops_per_token"]``) so that compare computes MFU from stored figures alone.

    Args:
        method: ``full`` (every parameter trained) or an adapter method (``lora``...).
        params: Every parameter of the model.
        trainable_params: Parameters that get gradients (ignored for ``full``).
        dims: ``model_dims`` (layers, heads, head_dim, seq_len, embedding_params).
    """
    if not isinstance(params, int) or not params or not isinstance(dims, dict):
        return None
    if not all(isinstance(dims.get(k), int) for k in ("layers", "heads", "head_dim", "seq_len")):
        return None
    trainable = trainable_params if method != "full" and isinstance(trainable_params, int) else None
    matmul_params = params - int(dims.get("embedding_params", 0) or 0)
    return flops_per_token(matmul_params, dims["layers"], dims["heads"], dims["head_dim"], dims["seq_len"],
                           trainable)


def compute_mfu(fpt: float, tokens_per_s: float, peak: Peak, devices: int) -> Mfu:
    """MFU of a run that trained ``tokens_per_s`` tokens per second over ``devices`` devices."""
    achieved = fpt * tokens_per_s
    return Mfu(flops_per_token=fpt, achieved_flops=achieved, peak=peak, devices=devices,
               mfu=achieved / (peak.flops * max(1, devices)))


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


# ---------------------------------------------------------------------- measuring a CPU peak


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
    import torch

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
    from runner.spec.paths import cache_dir

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
                f"(median {_flops_text(mid)}, min {_flops_text(lo)}), load {load if load is None else round(load, 1)}, "
                f"on {fp.describe()} [{fp.key}]"),
        kind="measured", dtype=dtype, threads=threads, measured_at=time.time(), fingerprint=fp.key,
        machine=fp.describe(), size=m.size, spread=m.spread, load=load,
    )
    _write_cache(peak, cache)
    return peak


def run_dtype(precision: str | None) -> str:
    """The dtype a run's matmuls ran in: ``train.precision`` (``fp32``, ``bf16``, ``fp16``)."""
    return precision if precision in DTYPES else "fp32"


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
