"""NVIDIA GPUs through NVML: the only module that imports ``pynvml`` (ruff's banned-api refuses it elsewhere),
the way nvitop keeps NVML behind ``nvitop/api/libnvml.py``.

Every NVML field is read through :func:`nvml_query`, which turns any ``NVMLError`` (a field the board does not
support, a lost GPU, a function an old driver lacks) into ``None``: a driver quirk shows as a blank cell, never
as a crash in the middle of a run. :class:`NvmlBackend` runs the same code on the real library and on
:class:`runner.hardware.fake.FakeNvml`."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import pynvml

from runner.hardware.processes import ProcessTree
from runner.hardware.records import DeviceSample, GpuInfo, ProcessGpuMemory

log = logging.getLogger(__name__)
_T = TypeVar("_T")


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
        capability = self._query("nvmlDeviceGetCudaComputeCapability", handle)
        return GpuInfo(
            index=index,
            name=_text(self._query("nvmlDeviceGetName", handle)) or "N/A",
            uuid=_text(self._query("nvmlDeviceGetUUID", handle)),
            mem_total=None if mem is None else int(mem.total),
            power_limit_w=None if limit_mw is None else limit_mw / 1000.0,
            source=self.source,
            compute_capability=None if capability is None else (int(capability[0]), int(capability[1])),
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
