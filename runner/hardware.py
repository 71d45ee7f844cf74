"""Hardware probes: NVIDIA GPUs through NVML, rank processes and the host through psutil.

This is the only module that imports ``pynvml`` (ruff's banned-api refuses it elsewhere), the way
nvitop keeps NVML behind ``nvitop/api/libnvml.py``. Three things hold here:

* Every NVML field is read through :func:`nvml_query`, which turns any ``NVMLError`` (a field the
  board does not support, a lost GPU, a function an old driver lacks) into ``None``. A driver quirk
  shows as a blank cell, never as a crash in the middle of a run.
* :class:`NvmlBackend` runs the same code on the real library and on :class:`FakeNvml`, a scripted
  stand-in with the same low-level functions, so tests and the ``--fake-gpus`` demo exercise the real
  paths. :class:`FakeNvml` is the only fake in the project.
* :class:`ProcessProbe` is the CPU fallback: a second real implementation that reports, per rank, the
  CPU% and RSS of the rank's process tree. :class:`Probe` combines both, and the telemetry sampler
  (``runner/telemetry.py``) calls :meth:`Probe.sample` on a fixed schedule.

All sample times are wall-clock seconds (``time.time()``), the clock of the training events they are
lined up with.
"""

from __future__ import annotations

import logging
import math
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, TypeVar

import psutil
import pynvml
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

__all__ = [
    "DeviceSample",
    "FakeGpu",
    "FakeNvml",
    "GpuInfo",
    "NvmlBackend",
    "Probe",
    "ProcessGpuMemory",
    "ProcessProbe",
    "ProcessTree",
    "check_gpus_free",
    "format_gpus",
    "nvml_query",
    "visible_mapping",
]

log = logging.getLogger(__name__)

GIB = 1 << 30
_T = TypeVar("_T")

SOURCE_LABELS = {"nvml": "NVML", "fake-nvml": "fake NVML", "psutil": "psutil"}
"""How each ``source`` value is written in tables."""


# --------------------------------------------------------------------------------------------------
# Records


@dataclass(frozen=True)
class DeviceSample:
    """One reading of one device: a GPU, a rank's process tree, or the host.

    Attributes:
        time: Wall-clock time of the reading (``time.time()``).
        host: Host name of the machine read.
        kind: ``"gpu"``, ``"rank"`` or ``"host"``.
        index: Physical GPU index (NVML order, not ``CUDA_VISIBLE_DEVICES`` order) for ``"gpu"``,
            the rank number for ``"rank"``, -1 for ``"host"``.
        name: GPU model, ``"rank N"`` or ``"host CPU (N cores)"``.
        util_pct: ``"gpu"``: NVML utilisation, the percent of the last sample period during which a
            kernel ran (0-100). ``"rank"``: CPU time of the rank process and its descendants as a
            percent of ONE core (``top`` semantics; 250 means two and a half cores busy). ``"host"``:
            busy percent of all cores (0-100). ``None`` when unreadable, and for a rank on its first
            reading (CPU% needs a previous one).
        mem_used: Bytes: GPU memory used (``"gpu"``), RSS of the rank process alone (``"rank"``;
            forked workers share pages with it, so summing their RSS would count memory twice),
            host memory in use, total minus available (``"host"``).
        mem_total: Bytes: GPU memory, or host memory for ``"rank"`` and ``"host"``.
        power_w: Board power draw in watts (GPUs only).
        temp_c: GPU core temperature in degrees Celsius (GPUs only).
        sm_clock_mhz: Current SM clock (GPUs only).
        source: ``"nvml"``, ``"fake-nvml"`` or ``"psutil"``.
        pid: The rank's process id for ``"rank"``, else ``None``.
    """

    time: float
    host: str
    kind: str
    index: int
    name: str
    util_pct: float | None
    mem_used: int | None
    mem_total: int | None
    power_w: float | None
    temp_c: float | None
    sm_clock_mhz: int | None
    source: str
    pid: int | None


@dataclass(frozen=True)
class ProcessGpuMemory:
    """GPU memory held by one process, as NVML lists compute processes.

    Attributes:
        time: Wall-clock time of the reading.
        host: Host name.
        gpu_index: Physical GPU index.
        pid: Process id as NVML reports it (the host's PID namespace).
        rank: The run's rank whose process tree holds ``pid``; ``None`` for a process outside the
            run (another user's job, or any process when NVML sees PIDs of another namespace, as
            in a container without the host PID namespace).
        used_bytes: GPU memory used by the process; ``None`` when the driver does not say.
        source: ``"nvml"`` or ``"fake-nvml"``.
    """

    time: float
    host: str
    gpu_index: int
    pid: int
    rank: int | None
    used_bytes: int | None
    source: str


@dataclass(frozen=True)
class GpuInfo:
    """The static facts of one GPU, for listings.

    Attributes:
        index: Physical GPU index.
        name: Model name, ``"N/A"`` when unreadable.
        uuid: ``GPU-...`` UUID, the stable identity ``CUDA_VISIBLE_DEVICES`` also accepts.
        mem_total: Bytes of GPU memory.
        power_limit_w: Enforced power limit in watts.
        source: ``"nvml"`` or ``"fake-nvml"``.
    """

    index: int
    name: str
    uuid: str | None
    mem_total: int | None
    power_limit_w: float | None
    source: str


# --------------------------------------------------------------------------------------------------
# The one NVML helper

# nvidia-ml-py raises this (not an NVMLError) when an unversioned function such as
# nvmlDeviceGetComputeRunningProcesses maps to a versioned symbol the installed driver lacks.
_LIBRARY_MISMATCH: type[Exception] = getattr(pynvml, "NVMLLibraryMismatchError", pynvml.NVMLError)

_reported: set[tuple[str, str]] = set()
_reported_lock = threading.Lock()


def _report_once(func_name: str, what: str) -> None:
    # A field the board does not support fails on every tick: say it once, not twice a second.
    with _reported_lock:
        if (func_name, what) in _reported:
            return
        _reported.add((func_name, what))
    log.debug("NVML %s: %s; the field reads as empty", func_name, what)


def nvml_query(func: Callable[..., _T] | None, *args: Any, default: _T | None = None) -> _T | None:
    """Call one NVML function, turning any NVML failure into ``default``.

    Args:
        func: The NVML function (``pynvml.nvmlDeviceGetPowerUsage`` or the same name on a
            :class:`FakeNvml`); ``None`` stands for a function this binding does not have.
        *args: Its arguments, usually a device handle first.
        default: What a failure reads as.

    Returns:
        The function's result, or ``default`` when it raised ``pynvml.NVMLError`` (not supported,
        GPU lost, function missing from an old driver, library not initialised...) or
        ``NVMLLibraryMismatchError`` (a driver older than the binding), or when it is missing.
        Each distinct failure is logged once at debug level.
    """
    name = getattr(func, "__name__", "?")
    if func is None:
        return default
    try:
        return func(*args)
    except (pynvml.NVMLError, _LIBRARY_MISMATCH) as exc:
        _report_once(name, type(exc).__name__)
        return default


def _text(value: object) -> str | None:
    # Older nvidia-ml-py returns bytes for names and UUIDs, newer ones str.
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


# --------------------------------------------------------------------------------------------------
# Process tree: which pid belongs to which rank


class ProcessTree:
    """Maps every process of a run's tree to its rank, rescanning the process table sparingly.

    A scan walks the whole process table (about 25 us per process with psutil, so ~25 ms on a busy
    box with 1,000 processes), too much to do twice a second. The map is rebuilt when the rank pids
    change and otherwise at most every ``refresh_s`` seconds; a dataloader worker started in
    between is counted from the next scan on.

    Args:
        refresh_s: Longest age of the cached map, in seconds; 0 rescans on every call.
        clock: Monotonic clock, injectable for tests.
    """

    def __init__(self, refresh_s: float = 5.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.refresh_s = refresh_s
        self._clock = clock
        self._key: tuple[tuple[int, int], ...] | None = None
        self._scanned_at = -math.inf
        self._owners: dict[int, int] = {}

    def owners(self, pids_by_rank: Mapping[int, int]) -> dict[int, int]:
        """Return pid -> rank for the rank processes and all their descendants.

        Args:
            pids_by_rank: rank -> pid of the rank process (or of any process whose tree is that
                rank, such as a per-rank launcher).

        Returns:
            A new dict. A rank pid maps to its own rank even when it is a descendant of another
            rank's pid; a descendant belongs to the nearest rank pid above it.
        """
        key = tuple(sorted(pids_by_rank.items()))
        now = self._clock()
        if key != self._key or now - self._scanned_at >= self.refresh_s:
            self._owners = _scan_owners(pids_by_rank) if pids_by_rank else {}
            self._key = key
            self._scanned_at = now
        return dict(self._owners)


def _scan_owners(pids_by_rank: Mapping[int, int]) -> dict[int, int]:
    children: dict[int, list[int]] = {}
    # One pass over the process table for all ranks (Process.children() is one pass per call).
    for proc in psutil.process_iter(["ppid"]):
        ppid = proc.info.get("ppid")
        if ppid is not None:
            children.setdefault(int(ppid), []).append(int(proc.pid))
    owners = {pid: rank for rank, pid in pids_by_rank.items()}
    for rank, root in pids_by_rank.items():
        stack = list(children.get(root, ()))
        while stack:
            pid = stack.pop()
            if pid in owners:  # another rank's own pid, or already claimed: stop there
                continue
            owners[pid] = rank
            stack.extend(children.get(pid, ()))
    return owners


# --------------------------------------------------------------------------------------------------
# NVML backend


class NvmlBackend:
    """GPU readings through NVML (the real library, or a :class:`FakeNvml` of the same shape).

    NVML is initialised lazily on first use. When that fails (no driver, no GPU) the reason is
    recorded once in :attr:`unavailable_reason` and the backend reports zero devices; no method
    raises for a hardware reason.

    Args:
        lib: The object whose ``nvml*`` functions are called: the ``pynvml`` module (default) or a
            :class:`FakeNvml`.
        host: Host name written into records; defaults to this machine's.
        clock: Wall clock for record times.
    """

    def __init__(
        self,
        lib: Any = None,
        *,
        host: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._lib: Any = pynvml if lib is None else lib
        self.source: str = str(getattr(self._lib, "SOURCE", "nvml"))
        self.host = host or socket.gethostname()
        self._clock = clock
        self._lock = threading.Lock()
        self._initialised = False
        self._handles: list[Any] = []
        self._infos: list[GpuInfo] = []
        self.unavailable_reason: str | None = None
        """``None`` while NVML works (or has not been tried), else why not, e.g.
        ``"no NVML: libnvidia-ml.so.1 not found"``."""
        self.unavailable_detail: str | None = None
        """The reason alone, e.g. ``"libnvidia-ml.so.1 not found"``."""

    # -- set-up ----------------------------------------------------------------------------------

    def _ensure_init(self) -> bool:
        with self._lock:
            if not self._initialised:
                self._initialised = True
                self._init_locked()
            return self.unavailable_reason is None

    def _init_locked(self) -> None:
        try:
            self._lib.nvmlInit()
        except pynvml.NVMLError as exc:
            self._set_unavailable(_init_failure(exc))
            return
        except OSError as exc:  # a broken library file rather than a missing one
            self._set_unavailable(f"cannot load NVML: {exc}")
            return
        count = self._query("nvmlDeviceGetCount", default=0) or 0
        self._handles = [self._query("nvmlDeviceGetHandleByIndex", i) for i in range(count)]
        self._infos = [self._read_info(i, h) for i, h in enumerate(self._handles)]

    def _set_unavailable(self, detail: str) -> None:
        self.unavailable_detail = detail
        self.unavailable_reason = f"no NVML: {detail}"
        log.info("%s; GPU telemetry off, showing host CPU/memory", self.unavailable_reason)

    def _fn(self, name: str) -> Callable[..., Any] | None:
        fn = getattr(self._lib, name, None)
        if fn is None:
            _report_once(name, "missing from this NVML binding")
        return fn

    def _query(self, name: str, *args: Any, default: Any = None) -> Any:
        return nvml_query(self._fn(name), *args, default=default)

    def _handle(self, index: int) -> Any:
        handle = self._handles[index]
        if handle is None:  # unreadable at start-up: try again, it may have come back
            handle = self._handles[index] = self._query("nvmlDeviceGetHandleByIndex", index)
        return handle

    def _read_info(self, index: int, handle: Any) -> GpuInfo:
        if handle is None:
            return GpuInfo(index, "N/A", None, None, None, self.source)
        mem = self._query("nvmlDeviceGetMemoryInfo", handle)
        limit_mw = self._query("nvmlDeviceGetEnforcedPowerLimit", handle)
        return GpuInfo(
            index=index,
            name=_text(self._query("nvmlDeviceGetName", handle)) or "N/A",
            uuid=_text(self._query("nvmlDeviceGetUUID", handle)),
            mem_total=None if mem is None else int(mem.total),
            power_limit_w=None if limit_mw is None else limit_mw / 1000.0,
            source=self.source,
        )

    # -- public ----------------------------------------------------------------------------------

    @property
    def available(self) -> bool:
        """Whether NVML initialised (this initialises it on first use)."""
        return self._ensure_init()

    def device_count(self) -> int:
        """Number of GPUs NVML sees; 0 when NVML is unavailable."""
        return len(self._handles) if self._ensure_init() else 0

    def gpu_infos(self) -> list[GpuInfo]:
        """Static facts per GPU, read once at initialisation; empty when NVML is unavailable."""
        return list(self._infos) if self._ensure_init() else []

    def gpu_samples(self) -> list[DeviceSample]:
        """Read every GPU once.

        Returns:
            One ``kind="gpu"`` sample per GPU. A field that fails reads as ``None``; a GPU that
            was lost keeps its row with every reading ``None``, so the gap shows in the timeline.
        """
        if not self._ensure_init():
            return []
        now = self._clock()
        samples = []
        for info in self._infos:
            handle = self._handle(info.index)
            mem = util = power_mw = temp = clock = None
            if handle is not None:
                mem = self._query("nvmlDeviceGetMemoryInfo", handle)
                util = self._query("nvmlDeviceGetUtilizationRates", handle)
                power_mw = self._query("nvmlDeviceGetPowerUsage", handle)
                temp = self._query("nvmlDeviceGetTemperature", handle, pynvml.NVML_TEMPERATURE_GPU)
                clock = self._query("nvmlDeviceGetClockInfo", handle, pynvml.NVML_CLOCK_SM)
            samples.append(
                DeviceSample(
                    time=now,
                    host=self.host,
                    kind="gpu",
                    index=info.index,
                    name=info.name,
                    util_pct=None if util is None else float(util.gpu),
                    mem_used=None if mem is None else int(mem.used),
                    mem_total=info.mem_total if mem is None else int(mem.total),
                    power_w=None if power_mw is None else power_mw / 1000.0,
                    temp_c=None if temp is None else float(temp),
                    sm_clock_mhz=None if clock is None else int(clock),
                    source=self.source,
                    pid=None,
                )
            )
        return samples

    def process_memory(
        self, pids_by_rank: Mapping[int, int], owners: Mapping[int, int] | None = None
    ) -> list[ProcessGpuMemory]:
        """List the compute processes on every GPU and attribute them to the run's ranks.

        Args:
            pids_by_rank: rank -> pid of each rank process. A GPU process belongs to a rank when
                it is that pid or one of its descendants (a rank that spawns its CUDA work in a
                child is still counted).
            owners: A pid -> rank map already built (:class:`ProcessTree`); when ``None`` the
                process table is scanned now.

        Returns:
            One record per (GPU, process), the run's and everyone else's (``rank=None``); empty
            when NVML is unavailable.
        """
        if not self._ensure_init():
            return []
        if owners is None:
            owners = ProcessTree(refresh_s=0).owners(pids_by_rank)
        now = self._clock()
        records = []
        for info in self._infos:
            handle = self._handle(info.index)
            if handle is None:
                continue
            listed = self._query("nvmlDeviceGetComputeRunningProcesses", handle)
            if listed is None:  # a driver without the _v3 call the binding maps this name to
                listed = self._query("nvmlDeviceGetComputeRunningProcesses_v2", handle, default=[])
            for proc in listed:
                pid = int(proc.pid)
                used = getattr(proc, "usedGpuMemory", None)
                records.append(
                    ProcessGpuMemory(
                        time=now,
                        host=self.host,
                        gpu_index=info.index,
                        pid=pid,
                        rank=owners.get(pid),
                        used_bytes=None if used is None else int(used),
                        source=self.source,
                    )
                )
        return records

    def close(self) -> None:
        """Shut NVML down if it was started; the backend can be initialised again afterwards."""
        with self._lock:
            if self._initialised and self.unavailable_reason is None:
                nvml_query(self._fn("nvmlShutdown"))
            self._initialised = False
            self._handles, self._infos = [], []
            self.unavailable_reason = self.unavailable_detail = None


def _init_failure(exc: Exception) -> str:
    if isinstance(exc, pynvml.NVMLError_LibraryNotFound):
        return "libnvidia-ml.so.1 not found"
    if isinstance(exc, pynvml.NVMLError_DriverNotLoaded):
        return "NVIDIA driver not loaded"
    if isinstance(exc, pynvml.NVMLError_NoPermission):
        return "no permission to use the NVIDIA driver"
    return f"nvmlInit failed: {exc}"


# --------------------------------------------------------------------------------------------------
# The scripted fake

Script = Any
"""A scripted value: a constant, a per-tick sequence (its last value is held) or ``f(tick)``."""


def _at(script: Script, tick: int) -> Any:
    if callable(script):
        return script(tick)
    if isinstance(script, Sequence) and not isinstance(script, str):
        return script[min(tick, len(script) - 1)] if script else None
    return script


@dataclass
class FakeGpu:
    """The script of one fake GPU.

    Attributes:
        name: Model name.
        mem_total: Bytes of memory.
        util: Utilisation percent per tick (constant, sequence or ``f(tick)``).
        mem_used: Bytes used per tick.
        power_w: Power draw in watts per tick.
        temp_c: Temperature per tick.
        sm_clock_mhz: SM clock per tick.
        power_limit_w: Enforced power limit.
        processes: ``(pid, used_bytes or None)`` pairs, or ``f(tick)`` returning them.
        faults: NVML function name -> NVML error code that the function raises for this GPU
            (``{"nvmlDeviceGetPowerUsage": pynvml.NVML_ERROR_NOT_SUPPORTED}``).
        lost_at_tick: From this tick on every call for this GPU raises ``NVMLError_GpuIsLost``.
        uuid: Defaults to a made-up ``GPU-`` UUID derived from the index.
    """

    name: str = "NVIDIA H100 80GB HBM3"
    mem_total: int = 80 * GIB
    util: Script = 0.0
    mem_used: Script = 0
    power_w: Script = 70.0
    temp_c: Script = 35.0
    sm_clock_mhz: Script = 1980
    power_limit_w: float = 700.0
    processes: Script = ()
    faults: dict[str, int] = field(default_factory=dict)
    lost_at_tick: int | None = None
    uuid: str | None = None


@dataclass(frozen=True)
class _FakeHandle:
    index: int


class FakeNvml:
    """A scripted NVML: the low-level ``nvml*`` functions :class:`NvmlBackend` calls, replaying GPUs.

    Errors are the real ``pynvml.NVMLError`` subclasses, so the backend's error handling is the one
    that runs on hardware. Time moves in ticks: by hand with :meth:`advance` (tests), or with the
    clock every ``tick_s`` seconds (the demo).

    Args:
        gpus: One script per GPU, in index order.
        tick_s: Seconds per tick when time drives the script; ``None`` for manual ticks only.
        clock: Monotonic clock used with ``tick_s``.
        init_error: NVML error code that ``nvmlInit`` raises (e.g. ``NVML_ERROR_DRIVER_NOT_LOADED``).
    """

    SOURCE = "fake-nvml"

    def __init__(
        self,
        gpus: Sequence[FakeGpu],
        *,
        tick_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        init_error: int | None = None,
    ) -> None:
        self.gpus = list(gpus)
        self.tick_s = tick_s
        self._clock = clock
        self._t0 = clock()
        self._manual = 0
        self._init_error = init_error
        self.initialised = False
        self.calls = 0
        """Number of ``nvml*`` calls made, to check how much a sampler asks for."""

    # -- script control --------------------------------------------------------------------------

    @property
    def tick(self) -> int:
        """The current tick."""
        timed = 0 if self.tick_s is None else int((self._clock() - self._t0) / self.tick_s)
        return self._manual + timed

    def advance(self, n: int = 1) -> None:
        """Move the script ``n`` ticks on."""
        self._manual += n

    def set_processes(self, index: int, processes: Script) -> None:
        """Replace the processes GPU ``index`` reports (``[(pid, used_bytes), ...]``)."""
        self.gpus[index].processes = processes

    @classmethod
    def demo(cls, n_gpus: int = 8, pids: Sequence[int] = (), tick_s: float | None = 0.5) -> FakeNvml:
        """A training-like box for the ``--fake-gpus N`` demo.

        Each GPU loads for ~10 ticks (low utilisation, memory climbing to ~62 GiB), then trains
        (90-99% with a dip every 40 ticks, an evaluation or checkpoint) while memory stays flat;
        power, temperature and clock follow utilisation. GPUs are slightly out of phase.

        Args:
            n_gpus: Number of GPUs.
            pids: Process ids to show on GPUs 0, 1, ... (one each), holding that GPU's memory.
            tick_s: Seconds per tick (``None``: manual ticks, for benchmarks and tests).
        """

        def util(i: int) -> Callable[[int], float]:
            def f(t: int) -> float:
                t -= i % 3  # ranks start a tick or two apart
                if t < 10:
                    return float(max(0, 3 * t))
                if (t - 10) % 40 >= 36:
                    return 30.0 + 5 * (i % 2)
                return 90.0 + 9 * abs(math.sin(0.7 * t + i))

            return f

        def mem(i: int) -> Callable[[int], int]:
            peak = 62 * GIB + i * 64 * (1 << 20)
            return lambda t: int(GIB // 2 + min(1.0, max(0, t - i % 3) / 20) * (peak - GIB // 2))

        gpus = []
        for i in range(n_gpus):
            u, m = util(i), mem(i)
            gpus.append(
                FakeGpu(
                    util=u,
                    mem_used=m,
                    power_w=lambda t, u=u: 70.0 + 6.0 * u(t),
                    temp_c=lambda t, u=u: min(78.0, 33.0 + 0.4 * t) if u(t) > 50 else 38.0,
                    sm_clock_mhz=lambda t, u=u: 1980 if u(t) > 20 else 345,
                    processes=(lambda t, p=pids[i], m=m: [(p, m(t))]) if i < len(pids) else (),
                    uuid=f"GPU-fa4e0000-0000-4000-8000-{i:012d}",
                )
            )
        return cls(gpus, tick_s=tick_s)

    # -- the NVML surface ------------------------------------------------------------------------

    def _gpu(self, handle: _FakeHandle, func: str) -> tuple[FakeGpu, int]:
        self.calls += 1
        if not self.initialised:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        gpu, tick = self.gpus[handle.index], self.tick
        if gpu.lost_at_tick is not None and tick >= gpu.lost_at_tick:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        if func in gpu.faults:
            raise pynvml.NVMLError(gpu.faults[func])
        return gpu, tick

    def nvmlInit(self) -> None:  # noqa: N802 - NVML's own names
        self.calls += 1
        if self._init_error is not None:
            raise pynvml.NVMLError(self._init_error)
        self.initialised = True

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.calls += 1
        self.initialised = False

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        self.calls += 1
        if not self.initialised:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _FakeHandle:  # noqa: N802
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        handle = _FakeHandle(index)
        self._gpu(handle, "nvmlDeviceGetHandleByIndex")
        return handle

    def nvmlDeviceGetName(self, handle: _FakeHandle) -> str:  # noqa: N802
        return self._gpu(handle, "nvmlDeviceGetName")[0].name

    def nvmlDeviceGetUUID(self, handle: _FakeHandle) -> str:  # noqa: N802
        gpu, _ = self._gpu(handle, "nvmlDeviceGetUUID")
        return gpu.uuid or f"GPU-00000000-0000-4000-8000-{handle.index:012d}"

    def nvmlDeviceGetMemoryInfo(self, handle: _FakeHandle) -> SimpleNamespace:  # noqa: N802
        gpu, tick = self._gpu(handle, "nvmlDeviceGetMemoryInfo")
        used = int(_at(gpu.mem_used, tick))
        return SimpleNamespace(total=gpu.mem_total, used=used, free=gpu.mem_total - used)

    def nvmlDeviceGetUtilizationRates(self, handle: _FakeHandle) -> SimpleNamespace:  # noqa: N802
        gpu, tick = self._gpu(handle, "nvmlDeviceGetUtilizationRates")
        util = int(round(_at(gpu.util, tick)))
        return SimpleNamespace(gpu=util, memory=util // 2)

    def nvmlDeviceGetPowerUsage(self, handle: _FakeHandle) -> int:  # noqa: N802
        gpu, tick = self._gpu(handle, "nvmlDeviceGetPowerUsage")
        return int(_at(gpu.power_w, tick) * 1000)  # milliwatts, as NVML

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: _FakeHandle) -> int:  # noqa: N802
        gpu, _ = self._gpu(handle, "nvmlDeviceGetEnforcedPowerLimit")
        return int(gpu.power_limit_w * 1000)

    def nvmlDeviceGetTemperature(self, handle: _FakeHandle, sensor: int) -> int:  # noqa: N802
        gpu, tick = self._gpu(handle, "nvmlDeviceGetTemperature")
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return int(_at(gpu.temp_c, tick))

    def nvmlDeviceGetClockInfo(self, handle: _FakeHandle, clock_type: int) -> int:  # noqa: N802
        gpu, tick = self._gpu(handle, "nvmlDeviceGetClockInfo")
        if clock_type != pynvml.NVML_CLOCK_SM:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return int(_at(gpu.sm_clock_mhz, tick))

    def nvmlDeviceGetComputeRunningProcesses(self, handle: _FakeHandle) -> list[SimpleNamespace]:  # noqa: N802
        gpu, tick = self._gpu(handle, "nvmlDeviceGetComputeRunningProcesses")
        procs = gpu.processes(tick) if callable(gpu.processes) else gpu.processes
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in procs]


# --------------------------------------------------------------------------------------------------
# CPU fallback


class ProcessProbe:
    """Rank and host readings through psutil: the CPU fallback, also useful next to GPUs.

    CPU% is a rate, so it needs two readings: the ``psutil.Process`` objects are kept between calls
    (``cpu_percent(interval=None)`` measures since the previous call on the same object), and a
    rank's first reading has ``util_pct=None``. Processes that exit are skipped and forgotten.

    Args:
        host: Host name written into samples; defaults to this machine's.
        clock: Wall clock for sample times.
    """

    source = "psutil"

    def __init__(self, host: str | None = None, clock: Callable[[], float] = time.time) -> None:
        self.host = host or socket.gethostname()
        self._clock = clock
        self._lock = threading.Lock()
        self._procs: dict[int, Any] = {}  # pid -> psutil.Process with a cpu_percent baseline
        self._host_times: tuple[float, float] | None = None  # (busy, total) CPU seconds
        self._cores = psutil.cpu_count() or 1
        self._mem_total = int(psutil.virtual_memory().total)

    def sample(
        self, pids_by_rank: Mapping[int, int], owners: Mapping[int, int] | None = None
    ) -> list[DeviceSample]:
        """Read every rank's process tree and the host.

        Args:
            pids_by_rank: rank -> pid of the rank process.
            owners: pid -> rank for the ranks and their descendants (:class:`ProcessTree`); when
                ``None`` the process table is scanned now.

        Returns:
            One ``kind="rank"`` sample per rank whose process is alive, then one ``kind="host"``.
        """
        with self._lock:
            if owners is None:
                owners = ProcessTree(refresh_s=0).owners(pids_by_rank)
            now = self._clock()
            samples = []
            for rank, pid in sorted(pids_by_rank.items()):
                sample = self._rank(now, rank, pid, owners)
                if sample is not None:  # None: the rank's process has exited
                    samples.append(sample)
            # Forget processes that left the tree so their pids can be reused safely.
            for pid in set(self._procs) - set(owners) - set(pids_by_rank.values()):
                del self._procs[pid]
            samples.append(self._host_sample(now))
            return samples

    def _process(self, pid: int) -> tuple[Any, bool]:
        proc = self._procs.get(pid)
        if proc is not None:
            return proc, True
        proc = self._procs[pid] = psutil.Process(pid)
        proc.cpu_percent(None)  # the baseline; the first value means nothing
        return proc, False

    def _rank(self, now: float, rank: int, pid: int, owners: Mapping[int, int]) -> DeviceSample | None:
        try:
            main, primed = self._process(pid)
            with main.oneshot():
                cpu = main.cpu_percent(None)
                rss = int(main.memory_info().rss)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            self._procs.pop(pid, None)
            return None
        for child in (p for p, r in owners.items() if r == rank and p != pid):
            try:
                proc, child_primed = self._process(child)
                value = proc.cpu_percent(None)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                self._procs.pop(child, None)
                continue
            if child_primed:
                cpu += value
        return DeviceSample(
            time=now,
            host=self.host,
            kind="rank",
            index=rank,
            name=f"rank {rank}",
            util_pct=round(cpu, 1) if primed else None,
            mem_used=rss,
            mem_total=self._mem_total,
            power_w=None,
            temp_c=None,
            sm_clock_mhz=None,
            source=self.source,
            pid=pid,
        )

    def _host_sample(self, now: float) -> DeviceSample:
        # Own delta of psutil.cpu_times() rather than psutil.cpu_percent(), whose baseline is one
        # module-wide value that any other caller in the process would move.
        times = psutil.cpu_times()
        total = sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
        busy = total - times.idle - getattr(times, "iowait", 0.0)
        util = None
        if self._host_times is not None:
            d_busy, d_total = busy - self._host_times[0], total - self._host_times[1]
            util = round(100.0 * d_busy / d_total, 1) if d_total > 0 else 0.0
        self._host_times = (busy, total)
        mem = psutil.virtual_memory()
        return DeviceSample(
            time=now,
            host=self.host,
            kind="host",
            index=-1,
            name=f"host CPU ({self._cores} cores)",
            util_pct=util,
            mem_used=int(mem.total - mem.available),
            mem_total=int(mem.total),
            power_w=None,
            temp_c=None,
            sm_clock_mhz=None,
            source=self.source,
            pid=None,
        )


# --------------------------------------------------------------------------------------------------
# The probe the sampler uses


class Probe:
    """GPUs through NVML when there are any, plus ranks and host through psutil, always.

    Args:
        nvml: The GPU backend; defaults to the real NVML.
        processes: The psutil probe; defaults to a new one.
        tree: The shared pid -> rank map (rescanned every 5 s by default).
    """

    def __init__(
        self,
        nvml: NvmlBackend | None = None,
        processes: ProcessProbe | None = None,
        tree: ProcessTree | None = None,
    ) -> None:
        self.nvml = nvml if nvml is not None else NvmlBackend()
        self.processes = processes if processes is not None else ProcessProbe()
        self.tree = tree if tree is not None else ProcessTree()

    @classmethod
    def fake(cls, n_gpus: int = 8, pids: Sequence[int] = ()) -> Probe:
        """A probe over :meth:`FakeNvml.demo` GPUs (the ``--fake-gpus N`` mode) and real processes."""
        return cls(nvml=NvmlBackend(lib=FakeNvml.demo(n_gpus, pids)))

    def sample(self, pids_by_rank: Mapping[int, int]) -> tuple[list[DeviceSample], list[ProcessGpuMemory]]:
        """Take one reading of everything.

        Args:
            pids_by_rank: rank -> pid of the run's rank processes (may be empty).

        Returns:
            ``(samples, procs)``: GPU samples (when NVML sees GPUs), then rank samples, then the
            host sample; and the GPU compute processes attributed to ranks.
        """
        owners = self.tree.owners(pids_by_rank)
        samples: list[DeviceSample] = []
        procs: list[ProcessGpuMemory] = []
        if self.nvml.device_count():
            samples.extend(self.nvml.gpu_samples())
            procs = self.nvml.process_memory(pids_by_rank, owners)
        samples.extend(self.processes.sample(pids_by_rank, owners))
        return samples, procs


# --------------------------------------------------------------------------------------------------
# Views and checks


def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / GIB:.1f}"


def _num(x: float | None, fmt: str = "{:.0f}") -> str:
    return "-" if x is None else fmt.format(x)


def format_gpus(
    probe: Probe,
    pids_by_rank: Mapping[int, int] | None = None,
    *,
    samples: Sequence[DeviceSample] | None = None,
    procs: Sequence[ProcessGpuMemory] | None = None,
) -> RenderableType:
    """A gpustat-like table of the GPUs, or the host when NVML is unavailable.

    Args:
        probe: Where to read from.
        pids_by_rank: The run's ranks, to label GPU processes with their rank.
        samples: Readings to show instead of reading now (e.g. the latest batch of a sampler,
            whose CPU% baselines a fresh read would disturb).
        procs: GPU processes to show with ``samples``.

    Returns:
        A rich renderable. Every number column names its source (NVML, fake NVML or psutil).
    """
    if samples is None:
        samples, procs = probe.sample(pids_by_rank or {})
    procs = procs or []
    gpus = [s for s in samples if s.kind == "gpu"]
    if not gpus:
        why = probe.nvml.unavailable_detail or "NVML sees no GPU"
        message = Text(f"no NVML ({why}): no NVIDIA GPU visible; showing host CPU/memory", style="yellow")
        if probe.nvml.unavailable_reason is None:
            message = Text("NVML sees no GPU; showing host CPU/memory", style="yellow")
        return Group(message, _cpu_table(samples))
    src = SOURCE_LABELS.get(gpus[0].source, gpus[0].source)
    table = Table(title=f"GPUs on {gpus[0].host}", caption=f"source: {src}", title_justify="left")
    table.add_column("GPU", justify="right")
    table.add_column("name")
    table.add_column(f"util %\n{src}", justify="right")
    table.add_column(f"memory GiB\nused/total {src}", justify="right")
    table.add_column(f"temp °C\n{src}", justify="right")
    table.add_column(f"power W\n{src}", justify="right")
    table.add_column(f"SM MHz\n{src}", justify="right")
    table.add_column(f"processes (pid: GiB)\n{src}")
    limits = {i.index: i.power_limit_w for i in probe.nvml.gpu_infos()}
    for s in gpus:
        on_gpu = [p for p in procs if p.gpu_index == s.index]
        listed = ", ".join(
            f"{p.pid}{'' if p.rank is None else f' (rank {p.rank})'}: {_gib(p.used_bytes)}" for p in on_gpu
        )
        limit = limits.get(s.index)
        power = _num(s.power_w) + ("" if limit is None or s.power_w is None else f"/{limit:.0f}")
        table.add_row(
            str(s.index),
            s.name,
            _num(s.util_pct),
            f"{_gib(s.mem_used)}/{_gib(s.mem_total)}",
            _num(s.temp_c),
            power,
            _num(s.sm_clock_mhz),
            listed or "-",
        )
    return table


def _cpu_table(samples: Iterable[DeviceSample]) -> Table:
    table = Table(caption="source: psutil; rank CPU% is of one core, host CPU% of all cores")
    table.add_column("device")
    table.add_column("pid", justify="right")
    table.add_column("CPU %\npsutil", justify="right")
    table.add_column("memory GiB\nused/total psutil", justify="right")
    for s in samples:
        if s.kind in ("rank", "host"):
            table.add_row(
                s.name, _num(s.pid), _num(s.util_pct, "{:.1f}"), f"{_gib(s.mem_used)}/{_gib(s.mem_total)}"
            )
    return table


def check_gpus_free(
    probe: Probe,
    gpu_indices: Iterable[int],
    need_bytes: int | None = None,
    *,
    busy_util_pct: float = 10.0,
    ignore_pids: Iterable[int] = (),
) -> list[str]:
    """Warn about requested GPUs that another job is using or that lack memory.

    Args:
        probe: Where to read from.
        gpu_indices: Physical GPU indices the run will use (map logical ones with
            :func:`visible_mapping`).
        need_bytes: GPU memory the plan needs per GPU; ``None`` skips the memory check.
        busy_util_pct: Utilisation above which a GPU counts as busy.
        ignore_pids: Processes that do not count as "others" (e.g. this run's own).

    Returns:
        Human-readable warnings, empty when every requested GPU looks free.
    """
    wanted = list(gpu_indices)
    if not wanted:
        return []
    if probe.nvml.device_count() == 0:
        why = probe.nvml.unavailable_reason or "NVML sees no GPU"
        return [f"{why}: cannot check that GPU(s) {', '.join(map(str, wanted))} are free"]
    by_index = {s.index: s for s in probe.nvml.gpu_samples()}
    procs = probe.nvml.process_memory({}, owners={})
    ignored = set(ignore_pids)
    warnings = []
    for index in wanted:
        s = by_index.get(index)
        if s is None:
            warnings.append(f"GPU {index} requested but NVML sees only {len(by_index)} GPU(s)")
            continue
        others = [p for p in procs if p.gpu_index == index and p.pid not in ignored]
        if others:
            listed = ", ".join(f"pid {p.pid} ({_gib(p.used_bytes)} GiB)" for p in others)
            warnings.append(f"GPU {index} has {len(others)} other process(es): {listed}")
        if s.util_pct is not None and s.util_pct > busy_util_pct:
            warnings.append(f"GPU {index} is busy: {s.util_pct:.0f}% utilisation")
        if s.mem_used is None or s.mem_total is None:
            warnings.append(f"GPU {index}: memory unreadable, cannot check it is free")
        elif need_bytes is not None and s.mem_total - s.mem_used < need_bytes:
            free = s.mem_total - s.mem_used
            warnings.append(f"GPU {index} has {_gib(free)} GiB free, the plan needs {_gib(need_bytes)} GiB")
    return warnings


def visible_mapping(
    env_cuda_visible_devices: str | None, count: int, uuids: Sequence[str | None] | None = None
) -> list[tuple[int, int]]:
    """Map CUDA's logical device indices to physical (NVML) indices.

    Follows CUDA's reading of ``CUDA_VISIBLE_DEVICES``: unset means every device in order; an
    empty value means none; entries are comma-separated indices or (prefixes of) ``GPU-`` UUIDs,
    and the list ends at the first entry that is invalid, out of range or repeated.

    Args:
        env_cuda_visible_devices: The variable's value, ``None`` when unset.
        count: Number of physical GPUs.
        uuids: Each physical GPU's UUID, to resolve UUID entries (without them a UUID ends the list).

    Returns:
        ``[(logical, physical), ...]`` in logical order.
    """
    if env_cuda_visible_devices is None:
        return [(i, i) for i in range(count)]
    physical: list[int] = []
    for entry in env_cuda_visible_devices.split(","):
        entry = entry.strip()
        index: int | None = None
        if entry.lstrip("-").isdigit():
            index = int(entry)
        elif entry.startswith("GPU-") and uuids is not None:
            matches = [i for i, u in enumerate(uuids) if u is not None and u.startswith(entry)]
            index = matches[0] if len(matches) == 1 else None
        if index is None or not 0 <= index < count or index in physical:
            break
        physical.append(index)
    return list(enumerate(physical))
