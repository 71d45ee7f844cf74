"""Hardware probes: NVIDIA GPUs through NVML, rank processes and the host through psutil.

The package is split on its seams:

* ``records``: the records every probe produces (:class:`DeviceSample`, :class:`ProcessGpuMemory`,
  :class:`GpuInfo`);
* ``nvml``: the only module that imports ``pynvml``; every field read through :func:`nvml_query`, so a
  driver quirk is a blank cell, never a crash;
* ``fake``: :class:`FakeNvml`, scripted GPUs with the low-level NVML functions (the one fake in the project);
* ``processes``: the CPU fallback, per-rank CPU% and RSS of each rank's process tree through psutil;
* ``probe``: :class:`Probe`, the two combined, which the telemetry sampler calls on a fixed schedule;
* ``host``: checks before a launch (busy GPUs, free memory, the CUDA_VISIBLE_DEVICES mapping).

Nothing here imports rich or textual: tables of devices are drawn by ``tui/render/gpus.py``.
"""

from runner.hardware.fake import FakeGpu, FakeNvml
from runner.hardware.host import check_gpus_free, visible_mapping
from runner.hardware.nvml import NvmlBackend, nvml_query
from runner.hardware.probe import Probe
from runner.hardware.processes import ProcessProbe, ProcessTree
from runner.hardware.records import GIB, SOURCE_LABELS, DeviceSample, GpuInfo, ProcessGpuMemory

__all__ = [
    "GIB",
    "SOURCE_LABELS",
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
    "nvml_query",
    "visible_mapping",
]
