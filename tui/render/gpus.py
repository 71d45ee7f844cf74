"""The devices as a rich table (``ftui gpus``): GPUs from NVML, or the host and ranks from psutil."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from rich import box
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
    width: int | None = None,
) -> RenderableType:
    """A gpustat-like table of the GPUs, or the host when NVML is unavailable.

    Args:
        probe: Where to read from.
        pids_by_rank: The run's ranks, to label GPU processes with their rank.
        samples: Readings to show instead of reading now (e.g. the latest batch of a sampler,
            whose CPU% baselines a fresh read would disturb).
        procs: GPU processes to show with ``samples``.
        width: the terminal's columns: under 110 the processes are listed below the GPUs, not beside.

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
    narrow = width is not None and width < 110
    # The source is said once, in the title: at 80 columns a source under every header took 5 header lines.
    table = Table(title=Text(f"GPUs on {gpus[0].host} · every figure: {src}"), title_justify="left",
                  box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    table.add_column("GPU", justify="right", no_wrap=True)
    table.add_column("name", no_wrap=True)
    table.add_column("util\n%", justify="right", no_wrap=True)
    table.add_column("memory GiB\nused/total", justify="right", no_wrap=True)
    table.add_column("temp\n°C", justify="right", no_wrap=True)
    table.add_column("power W\nnow/limit", justify="right", no_wrap=True)
    table.add_column("SM\nMHz", justify="right", no_wrap=True)
    if not narrow:
        table.add_column("processes\n(pid: GiB)", overflow="fold")
    limits = {i.index: i.power_limit_w for i in probe.nvml.gpu_infos()}
    for s in gpus:
        on_gpu = [p for p in procs if p.gpu_index == s.index]
        listed = ", ".join(
            f"{p.pid}{'' if p.rank is None else f' (rank {p.rank})'}: {_gib(p.used_bytes)}" for p in on_gpu
        )
        limit = limits.get(s.index)
        power = _num(s.power_w) + ("" if limit is None or s.power_w is None else f"/{limit:.0f}")
        name = s.name.removeprefix("NVIDIA ") if narrow else s.name
        table.add_row(*text_row(
            str(s.index),
            name,
            _num(s.util_pct),
            f"{_gib(s.mem_used)}/{_gib(s.mem_total)}",
            _num(s.temp_c),
            power,
            _num(s.sm_clock_mhz),
            *([] if narrow else [listed or "-"]),
        ))
    if not narrow:
        return table
    # At 80 columns the processes are a list of their own below (as nvidia-smi prints them).
    listing = Table(title=Text(f"GPU processes · {src}"), title_justify="left", box=box.SIMPLE_HEAD,
                    pad_edge=False, show_edge=False)
    for header in ("GPU", "pid", "rank", "GPU memory GiB"):
        listing.add_column(header, justify="right", no_wrap=True)
    for p in procs:
        listing.add_row(str(p.gpu_index), str(p.pid), "-" if p.rank is None else str(p.rank), _gib(p.used_bytes))
    return Group(table, listing if procs else Text(f"no GPU processes ({src})", style="dim"))


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
