"""The probe the telemetry sampler calls: NVML devices (real or scripted) plus the rank processes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from runner.hardware.fake import FakeNvml
from runner.hardware.nvml import NvmlBackend
from runner.hardware.processes import ProcessProbe, ProcessTree
from runner.hardware.records import DeviceSample, ProcessGpuMemory

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
