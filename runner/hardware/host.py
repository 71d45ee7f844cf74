"""Facts and checks about this host's GPUs before a launch: busy or short of memory, and the
``CUDA_VISIBLE_DEVICES`` mapping from CUDA index to physical GPU."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from runner.hardware.probe import Probe
from runner.hardware.records import GIB

# --------------------------------------------------------------------------------------------------
# Views and checks


def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / GIB:.1f}"


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
