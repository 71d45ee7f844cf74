"""The scripted GPUs: :class:`FakeNvml` has the low-level functions of ``pynvml`` that :class:`NvmlBackend`
calls, driven by a script of values per tick, so tests and the ``--fake-gpus`` demo run the real NVML code
paths. It is the only fake in the project (the hardware boundary)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml

from runner.hardware.records import GIB

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
        compute_capability: CUDA compute capability (an H100's, 9.0, by default).
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
    compute_capability: tuple[int, int] = (9, 0)


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

    def nvmlDeviceGetCudaComputeCapability(self, handle: _FakeHandle) -> tuple[int, int]:  # noqa: N802
        return self._gpu(handle, "nvmlDeviceGetCudaComputeCapability")[0].compute_capability

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
