"""Facts of this host a launch depends on: CPU or GPU, how many GPUs, threads per rank, a free port,
and the telemetry probe; whether a hub model can be had (:func:`runner.planner.hub.hub_model_problem`). Detected once per command (:func:`runner.hardware.hostfacts.current`), through
NVML, never torch, so that ``ftui run`` starts fast."""

from __future__ import annotations

import os
import socket

from runner.hardware import Probe
from runner.hardware.hostfacts import current
from runner.spec import layout
from runner.spec.devices import devices_taken, visible_ids
from runner.spec.recipe import Recipe


def cuda_device_count() -> int:
    """GPUs the trainer will see (NVML)."""
    return current().visible_gpus


def runs_on_cpu(recipe: Recipe) -> bool:
    """Whether the ranks will train on CPU (no CUDA device visible, or the recipe asks for CPU)."""
    if recipe.launch.device == "cpu":
        return True
    if recipe.launch.device == "cuda":
        return False
    return cuda_device_count() == 0


def nproc_over_host(recipe: Recipe) -> str | None:
    """Why the recipe's processes per machine are more than this host has devices for (None: they fit):
    :func:`runner.spec.layout.host_nproc_problem` with this host's GPUs (those of ``launch.gpus`` where it
    lists them) and cores. The pre-flight refuses it unless forced; Compose asks it as the form changes."""
    facts = current()
    listed = recipe.launch.gpus
    gpus = len(listed) if listed is not None else facts.visible_gpus
    return layout.host_nproc_problem(recipe.launch.nproc, runs_on_cpu(recipe), gpus, facts.cpu_cores,
                                     listed=listed is not None)


def run_devices(recipe: Recipe) -> list[str]:
    """The devices of this host a run of ``recipe`` takes, started now (under this process's
    ``CUDA_VISIBLE_DEVICES``): :func:`runner.spec.devices.devices_taken`. Recorded in the run's summary; the
    queue starts no run on a device that a live run of this host takes."""
    visible = visible_ids(recipe.launch.gpus, os.environ.get("CUDA_VISIBLE_DEVICES"), current().gpu_count)
    return devices_taken(recipe.launch.nproc, runs_on_cpu(recipe), visible)


def cpu_threads(recipe: Recipe) -> int | None:
    """Threads per rank on CPU: the physical cores shared out (accelerate defaults to 1)."""
    if not runs_on_cpu(recipe):
        return None
    return max(1, current().cpu_cores // recipe.launch.nproc)


def free_port() -> int:
    """A TCP port free right now on this host, for the rendezvous of one run."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def probe_for(fake_gpus: int = 0) -> Probe:
    """The telemetry probe: real NVML + psutil, or ``fake_gpus`` scripted GPUs (demo mode)."""
    return Probe.fake(fake_gpus) if fake_gpus else Probe()
