"""Facts about this host that a command asks several times (is this a CPU run? how many GPUs?),
detected once per process: each NVML start costs time, and one ``ftui run`` asks several times."""

from __future__ import annotations

import functools
import os
import socket
from dataclasses import dataclass

from runner.hardware.nvml import NvmlBackend


@dataclass(frozen=True)
class HostFacts:
    """What this host has, as detected once (NVML for GPUs, psutil for cores)."""

    gpu_count: int
    """GPUs NVML lists (0 without a driver), before CUDA_VISIBLE_DEVICES."""
    visible_gpus: int
    """GPUs the trainer will see: ``gpu_count`` limited by CUDA_VISIBLE_DEVICES."""
    cpu_cores: int
    """Physical cores (psutil), else logical ones."""
    hostname: str

    @property
    def has_cuda(self) -> bool:
        """Whether a run here can train on a GPU."""
        return self.visible_gpus > 0


def detect() -> HostFacts:
    """Detect the facts now (one NVML start)."""
    import psutil

    backend = NvmlBackend()
    try:
        count = backend.device_count()
    finally:
        backend.close()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    seen = count if visible is None else min(count, len([v for v in visible.split(",") if v.strip()]))
    cores = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    return HostFacts(gpu_count=count, visible_gpus=seen, cpu_cores=cores, hostname=socket.gethostname())


def current() -> HostFacts:
    """The facts of this host under the ``CUDA_VISIBLE_DEVICES`` in effect now (:func:`facts_for`)."""
    return facts_for(os.environ.get("CUDA_VISIBLE_DEVICES"))


@functools.cache
def facts_for(visible: str | None) -> HostFacts:
    """The facts of this host, detected on first use and then kept for the life of the process, once per
    value of ``CUDA_VISIBLE_DEVICES`` (``visible``, which :func:`detect` reads): a process that changes it
    (a test running commands in its own process) gets the GPUs it now makes visible."""
    return detect()
