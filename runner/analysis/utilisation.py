"""A run's utilisation: its device samples summarised per device and overall, whole run and active window.

The figures of the strategy comparison table and the run's summary (``summary.telemetry``); the record's
shape (:class:`runner.spec.summary.TelemetrySummary`) and the units are declared in
:mod:`runner.spec.summary`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from runner.hardware import DeviceSample
from runner.spec.summary import (
    CPU_CORE_UNIT,
    GPU_UTIL_UNIT,
    DeviceStats,
    DeviceSummary,
    OverallStats,
    TelemetrySummary,
    cpu_threads_unit,
)


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _stats(samples: Sequence[DeviceSample]) -> DeviceStats:
    util = [s.util_pct for s in samples if s.util_pct is not None]
    mem = [s.mem_used for s in samples if s.mem_used is not None]
    power = [s.power_w for s in samples if s.power_w is not None]
    return DeviceStats(
        n=len(samples),
        util_mean=_mean(util),
        util_peak=max(util) if util else None,
        mem_peak=max(mem) if mem else None,
        power_mean_w=_mean(power),
    )


def _overall(per_device: Sequence[tuple[str, DeviceStats]], threads: int | None = None) -> OverallStats:
    # The run's compute devices: GPUs when there are any, else the ranks (CPU runs); never the host.
    kinds = {kind for kind, _ in per_device}
    kind = "gpu" if "gpu" in kinds else "rank" if "rank" in kinds else None
    chosen = [st for k, st in per_device if k == kind and st["n"]]
    # A rank's sample is CPU% of one core: a rank with 2 threads busy shows 200%. Over its threads it
    # reads like a GPU's busy % (100% = every thread it was given ran all the time).
    scale = 1.0 / threads if kind == "rank" and threads else 1.0
    unit = GPU_UTIL_UNIT if kind == "gpu" else cpu_threads_unit(threads) if threads else CPU_CORE_UNIT
    utils = [u * scale for st in chosen if (u := st["util_mean"]) is not None]
    peaks = [u * scale for st in chosen if (u := st["util_peak"]) is not None]
    powers = [p for st in chosen if (p := st["power_mean_w"]) is not None]
    mems = [m for st in chosen if (m := st["mem_peak"]) is not None]
    return OverallStats(
        kind=kind,
        devices=len(chosen),
        util_mean=_mean(utils),
        util_peak=max(peaks) if peaks else None,
        util_min=min(utils) if utils else None,
        util_max=max(utils) if utils else None,
        util_unit=unit if kind else "-",
        threads=threads if kind == "rank" else None,
        power_mean_w=_mean(powers),
        power_total_w=sum(powers) if powers else None,
        mem_peak=max(mems) if mems else None,
    )


def summarise(samples: Iterable[DeviceSample], active_window: tuple[float, float] | None,
              threads: int | None = None) -> TelemetrySummary:
    """Summarise a run's samples per device and overall, for the whole run and its active window.

    Definitions (every mean skips ``None`` readings):

    * **util_mean** of a device: the arithmetic mean of its ``util_pct`` samples in the span. The
      sampler reads at a fixed interval, so this equals the time-weighted mean up to the missing
      readings. Units follow :class:`runner.hardware.DeviceSample`: GPU %, or for a rank CPU% of
      one core (raw, as sampled).
    * **util_peak**: the largest ``util_pct`` sample; **mem_peak**: the largest ``mem_used``
      sample in bytes; **power_mean_w**: the arithmetic mean of ``power_w`` samples.
    * **overall** (``whole`` / ``active``): over the run's compute devices, the GPUs when any GPU
      sample exists, else the ranks; the host sample is never included. ``util_mean`` is the
      unweighted mean of the devices' ``util_mean`` (each device counts once however many samples
      it has); ``util_min``/``util_max`` the lowest and highest of them (the spread over ranks);
      ``util_peak`` the largest device peak. For ranks with ``threads`` known, these four are divided
      by ``threads`` (CPU % of the rank's threads, ``util_unit`` says which unit); ``power_mean_w`` the mean of the devices' mean power, ``power_total_w`` their sum
      (the average draw of all the run's GPUs together); ``mem_peak`` the largest device peak.
    * The **active window** ``(first_step_time, last_step_time)`` keeps samples with
      ``first <= time <= last`` (closed interval): start-up (loading, compiling) and the final save
      are left out, so strategies compare on their training phase only.

    Args:
        samples: Samples of one run, in any order; may mix hosts.
        active_window: Wall-clock times of the first and last training step, or ``None``.
        threads: Torch intra-op threads each rank ran with (the trainer's ``start`` event), for CPU
            runs; None leaves rank figures in CPU% of one core.

    Returns:
        ``devices`` keyed ``"kind:index"`` (``"host/kind:index"`` when several hosts appear),
        ``whole`` and ``active`` overall figures, and the ``window`` used. ``active`` is ``None``
        without a window; a device's ``active`` is ``None`` likewise.
    """
    groups: dict[tuple[str, str, int], list[DeviceSample]] = {}
    for s in samples:
        groups.setdefault((s.host, s.kind, s.index), []).append(s)
    several_hosts = len({host for host, _, _ in groups}) > 1
    kind_order = {"gpu": 0, "rank": 1, "host": 2}

    devices: dict[str, DeviceSummary] = {}
    whole: list[tuple[str, DeviceStats]] = []
    active: list[tuple[str, DeviceStats]] = []
    for host, kind, index in sorted(groups, key=lambda g: (g[0], kind_order.get(g[1], 3), g[1], g[2])):
        group = groups[(host, kind, index)]
        whole_stats = _stats(group)
        active_stats = None
        if active_window is not None:
            lo, hi = active_window
            active_stats = _stats([s for s in group if lo <= s.time <= hi])
            active.append((kind, active_stats))
        whole.append((kind, whole_stats))
        key = f"{host}/{kind}:{index}" if several_hosts else f"{kind}:{index}"
        devices[key] = DeviceSummary(
            kind=kind,
            index=index,
            name=group[-1].name,
            source=group[-1].source,
            threads=threads if kind == "rank" else None,
            whole=whole_stats,
            active=active_stats,
        )
    return TelemetrySummary(
        devices=devices,
        whole=_overall(whole, threads),
        active=_overall(active, threads) if active_window is not None else None,
        window=active_window,
    )
