"""Which devices of one machine a run takes, as the run queue counts them (docs/running.md, "Queue").

Two runs of one host that take a device in common never run at once from the queue: on GPUs, a device is
one GPU (``gpu:ID``, by the id the ranks see it by); on CPU the whole machine is one device (``cpu``),
because every rank of every run shares the same cores and memory. Pure: this host's figures are read by
:func:`runner.watch.host.run_devices`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

CPU = "cpu"
"""The one device of a run on CPU: the machine's cores, shared by every rank."""


def devices_taken(nproc: int, on_cpu: bool, visible: Sequence[str]) -> list[str]:
    """The devices ``nproc`` processes of one run take on one machine.

    Args:
        nproc: the run's processes on this machine (one per GPU).
        on_cpu: the ranks train on CPU.
        visible: the GPU ids the ranks see, in order (``launch.gpus``, else ``CUDA_VISIBLE_DEVICES``, else
            every GPU by index); rank ``k`` takes the ``k``-th.

    Returns:
        ``["cpu"]`` on CPU (or with no GPU visible); else ``gpu:ID`` for each of the first ``nproc`` ids.
    """
    if on_cpu or not visible:
        return [CPU]
    return [f"gpu:{device}" for device in list(visible)[:nproc]]


def visible_ids(listed: Sequence[int] | None, cuda_visible: str | None, gpu_count: int) -> list[str]:
    """The GPU ids a run's ranks see, in order: ``launch.gpus`` where the recipe lists them (the launch sets
    ``CUDA_VISIBLE_DEVICES`` to them), else the ``CUDA_VISIBLE_DEVICES`` it is started under, else every GPU
    of the machine by index."""
    if listed is not None:
        return [str(index) for index in listed]
    if cuda_visible is not None:
        return [part.strip() for part in cuda_visible.split(",") if part.strip()]
    return [str(index) for index in range(gpu_count)]


def conflicts(wanted: Sequence[str], held: Iterable[Sequence[str] | None]) -> bool:
    """Whether a run taking ``wanted`` would share a device with any of ``held`` (the devices of runs already
    running or waiting ahead of it). A run whose devices are not known (None: recorded before the store
    kept them) is taken to hold every device."""
    want = set(wanted)
    return any(devices is None or want & set(devices) for devices in held)
