"""The devices as a rich table (``ftui gpus``): GPUs from NVML, or the host and ranks from psutil."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from runner.hardware import GIB, SOURCE_LABELS, DeviceSample, Probe, ProcessGpuMemory
from tui.render.plain import row as text_row


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
    table = Table(title=Text(f"GPUs on {gpus[0].host}"), caption=f"source: {src}", title_justify="left")
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
        table.add_row(*text_row(
            str(s.index),
            s.name,
            _num(s.util_pct),
            f"{_gib(s.mem_used)}/{_gib(s.mem_total)}",
            _num(s.temp_c),
            power,
            _num(s.sm_clock_mhz),
            listed or "-",
        ))
    return table


def _cpu_table(samples: Iterable[DeviceSample]) -> Table:
    table = Table(caption="source: psutil; rank CPU% is of one core, host CPU% of all cores")
    table.add_column("device")
    table.add_column("pid", justify="right")
    table.add_column("CPU %\npsutil", justify="right")
    table.add_column("memory GiB\nused/total psutil", justify="right")
    for s in samples:
        if s.kind in ("rank", "host"):
            table.add_row(*text_row(
                s.name, _num(s.pid), _num(s.util_pct, "{:.1f}"), f"{_gib(s.mem_used)}/{_gib(s.mem_total)}"
            ))
    return table
