"""Telemetry over a run: a sampling thread, the run's utilisation summary, and a hang detector.

The :class:`Sampler` reads a :class:`runner.hardware.Probe` on a fixed monotonic schedule and hands
batches to one sink (the store's writer). :func:`summarise` turns a run's samples into the figures of
the strategy comparison table, and :class:`HangDetector` notices a run that is alive but idle.

Times in samples, step events and windows are wall-clock seconds (``time.time()``); the schedule
itself runs on ``time.monotonic()`` so clock adjustments do not bunch or skip readings.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, TypedDict

from runner.hardware import DeviceSample, ProcessGpuMemory

__all__ = [
    "CPU_CORE_UNIT",
    "GPU_UTIL_UNIT",
    "DeviceStats",
    "DeviceSummary",
    "HangDetector",
    "OverallStats",
    "Sampler",
    "Summary",
    "cpu_threads_unit",
    "summarise",
]

log = logging.getLogger(__name__)

Sink = Callable[[list[DeviceSample], list[ProcessGpuMemory]], None]
"""Receives each batch: ``sink(samples, procs)``. Called on the sampler's thread only."""


class SupportsSample(Protocol):
    """What the sampler needs of a probe (:class:`runner.hardware.Probe`)."""

    def sample(
        self, pids_by_rank: Mapping[int, int]
    ) -> tuple[list[DeviceSample], list[ProcessGpuMemory]]: ...


# --------------------------------------------------------------------------------------------------
# Sampler


class Sampler:
    """Reads a probe every ``interval_s`` on a daemon thread and flushes batches to a sink.

    Reading ``k`` is due at ``start + k * interval_s`` (monotonic), so the rate does not drift with
    the cost of each reading; when a reading overruns, the missed slots are skipped, not bunched.
    Flushes follow the same slot grid (every ``flush_every_s`` of slot time), plus one on stop.
    A probe or sink exception is logged (with its traceback the first time) and sampling goes on.

    Args:
        probe: The probe to read.
        pids_provider: Returns rank -> pid of the run's live ranks; called before each reading, so
            ranks may appear as they start.
        sink: Receives ``(samples, procs)`` batches, every ``flush_every_s`` and on :meth:`stop`.
        interval_s: Seconds between readings.
        flush_every_s: Seconds between flushes.
    """

    def __init__(
        self,
        probe: SupportsSample,
        pids_provider: Callable[[], Mapping[int, int]],
        sink: Sink,
        *,
        interval_s: float = 0.5,
        flush_every_s: float = 1.0,
    ) -> None:
        if interval_s <= 0 or flush_every_s < 0:
            raise ValueError("interval_s must be > 0 and flush_every_s >= 0")
        self.probe = probe
        self.pids_provider = pids_provider
        self.sink = sink
        self.interval_s = interval_s
        self.flush_every_s = flush_every_s
        self.readings = 0
        """Readings taken so far."""
        self.skipped = 0
        """Schedule slots skipped because a reading overran."""
        self.errors = 0
        """Probe and sink exceptions caught."""
        self.thread_cpu_s = 0.0
        """CPU seconds the sampling thread has used (``time.thread_time()``): its own overhead."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._samples: list[DeviceSample] = []
        self._procs: list[ProcessGpuMemory] = []
        self._logged: set[str] = set()

    def start(self) -> None:
        """Start the sampling thread (once)."""
        if self._thread is not None:
            raise RuntimeError("Sampler already started")
        self._thread = threading.Thread(target=self._run, name="ftui-sampler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop sampling, flush what is left to the sink and join the thread.

        Args:
            timeout: Seconds to wait for the thread (a probe stuck in a driver call may hold it).
        """
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def __enter__(self) -> Sampler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        cpu0 = time.thread_time()
        start = last_flush = time.monotonic()
        k = 0
        while True:
            self._read()
            # Flush on the schedule's slot times, not on measured ones, whose jitter would let a
            # flush slip by a whole interval now and then.
            slot = start + k * self.interval_s
            if slot - last_flush >= self.flush_every_s - 1e-9:
                self._flush()
                last_flush = slot
            self.thread_cpu_s = time.thread_time() - cpu0
            now = time.monotonic()
            k += 1
            due = start + k * self.interval_s
            if due < now:  # overran: skip to the next slot still ahead
                behind = math.floor((now - start) / self.interval_s) + 1
                self.skipped += behind - k
                k, due = behind, start + behind * self.interval_s
            if self._stop.wait(due - now):
                break
        self._flush()
        self.thread_cpu_s = time.thread_time() - cpu0

    def _read(self) -> None:
        try:
            samples, procs = self.probe.sample(dict(self.pids_provider()))
        except Exception as exc:
            self._failed("probe", exc)
            return
        self.readings += 1
        self._samples.extend(samples)
        self._procs.extend(procs)

    def _flush(self) -> None:
        if not self._samples and not self._procs:
            return
        samples, procs = self._samples, self._procs
        self._samples, self._procs = [], []
        try:
            self.sink(samples, procs)
        except Exception as exc:
            self._failed("sink", exc)

    def _failed(self, where: str, exc: Exception) -> None:
        self.errors += 1
        key = f"{where}:{type(exc).__name__}"
        if key in self._logged:
            return
        self._logged.add(key)
        log.exception("telemetry %s failed (further %s errors are counted, not logged)", where, key)


# --------------------------------------------------------------------------------------------------
# Summary


class DeviceStats(TypedDict):
    """Figures of one device over one span (see :func:`summarise` for the definitions)."""

    n: int
    util_mean: float | None
    util_peak: float | None
    mem_peak: int | None
    power_mean_w: float | None


class DeviceSummary(TypedDict):
    """One device over the whole run and over the active window."""

    kind: str
    index: int
    name: str
    source: str
    threads: int | None
    """Torch threads of the rank (rank devices, when known): its CPU% of one core over this is its
    CPU % of its threads."""
    whole: DeviceStats
    active: DeviceStats | None


class OverallStats(TypedDict):
    """The run as one figure per column of the comparison table."""

    kind: str | None
    devices: int
    util_mean: float | None
    util_peak: float | None
    util_min: float | None
    """The lowest device's ``util_mean`` (same unit as ``util_mean``): with ``util_max``, the spread over
    ranks or GPUs that the mean hides (FSDP1 LoRA keeps all adapter state on rank 0)."""
    util_max: float | None
    util_unit: str
    """What ``util_*`` measure: :data:`GPU_UTIL_UNIT`, ``CPU % of its N threads (psutil)``, or
    :data:`CPU_CORE_UNIT` when the ranks' threads are unknown."""
    threads: int | None
    """Torch threads of each rank (CPU runs), the divisor of the rank figures."""
    power_mean_w: float | None
    power_total_w: float | None
    mem_peak: int | None


class Summary(TypedDict):
    """What :func:`summarise` returns."""

    devices: dict[str, DeviceSummary]
    whole: OverallStats
    active: OverallStats | None
    window: tuple[float, float] | None


GPU_UTIL_UNIT = "GPU busy % (NVML: time a kernel ran, not FLOPs)"
CPU_CORE_UNIT = "CPU % of one core (psutil)"


def cpu_threads_unit(threads: int) -> str:
    """``CPU % of its 2 threads (psutil)``: a rank's CPU% of one core over its torch threads."""
    return f"CPU % of its {threads} thread{'s' if threads != 1 else ''} (psutil)"


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
              threads: int | None = None) -> Summary:
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
    return Summary(
        devices=devices,
        whole=_overall(whole, threads),
        active=_overall(active, threads) if active_window is not None else None,
        window=active_window,
    )


# --------------------------------------------------------------------------------------------------
# Hang detection


class HangDetector:
    """Flags a run that is alive but idle: no training step for a while and devices doing nothing.

    A device (rank process or GPU) is idle when every reading it has in the last ``window_s``
    seconds is below ``idle_util_pct``. The detector fires when no step has come for
    ``hang_after_s`` and at least one device is idle, once per episode: it fires again only
    after a new step or after every device has been busy again. A collective stuck with the GPU
    spinning at 100% (a classic NCCL hang) is not idle, so it is not flagged here.

    Args:
        hang_after_s: Seconds without a step before a hang is suspected.
        idle_util_pct: Utilisation under which a device counts as idle (GPU %, or CPU% of one
            core for a rank).
        window_s: How far back readings are looked at.
        started_at: Wall-clock launch time, used as the reference before the first step (a hang
            in start-up, such as a rendezvous that never completes); ``None`` ignores start-up.
    """

    def __init__(
        self,
        hang_after_s: float = 120.0,
        idle_util_pct: float = 5.0,
        window_s: float = 30.0,
        started_at: float | None = None,
    ) -> None:
        self.hang_after_s = hang_after_s
        self.idle_util_pct = idle_util_pct
        self.window_s = window_s
        self.started_at = started_at
        self._episode: float | None = None  # the reference time of the episode already reported

    def check(
        self, now: float, last_step_time: float | None, samples: Iterable[DeviceSample]
    ) -> dict[str, Any] | None:
        """Look at the latest readings; return an event dict when a new hang episode starts.

        Args:
            now: Current wall-clock time.
            last_step_time: Wall-clock time of the last step event, ``None`` before the first.
            samples: Recent samples (older ones than ``window_s`` are ignored); rank and GPU
                samples count, host samples do not.

        Returns:
            ``{"event": "hang_suspected", "time", "since_step_s", "last_step_time",
            "idle": ["rank:0", ...], "busy": [...], "max_util_pct"}`` once per episode, else
            ``None``.
        """
        reference = last_step_time if last_step_time is not None else self.started_at
        if reference is None:
            return None
        peaks: dict[str, float] = {}
        for s in samples:
            if s.kind in ("rank", "gpu") and s.util_pct is not None and now - s.time <= self.window_s:
                key = f"{s.kind}:{s.index}"
                peaks[key] = max(peaks.get(key, 0.0), s.util_pct)
        idle = sorted(k for k, u in peaks.items() if u < self.idle_util_pct)
        busy = sorted(k for k, u in peaks.items() if u >= self.idle_util_pct)
        if self._episode is not None and (self._episode != reference or not idle):
            self._episode = None  # a step came, or everything is working again: episode over
        stalled = now - reference >= self.hang_after_s
        if not stalled or not idle or self._episode is not None:
            return None
        self._episode = reference
        return {
            "event": "hang_suspected",
            "time": now,
            "since_step_s": round(now - reference, 1),
            "last_step_time": last_step_time,
            "idle": idle,
            "busy": busy,
            "max_util_pct": max(peaks.values()),
        }
