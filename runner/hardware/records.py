"""The records the probes produce: one device reading, one process's GPU memory, one GPU's identity.

All times are wall-clock seconds (``time.time()``), the clock of the training events they are lined up with."""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1 << 30

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
        compute_capability: CUDA compute capability ``(major, minor)`` (NVML), None when unreadable.
    """

    index: int
    name: str
    uuid: str | None
    mem_total: int | None
    power_limit_w: float | None
    source: str
    compute_capability: tuple[int, int] | None = None
