"""Telemetry over a run: a sampling thread and a hang detector.

The :class:`Sampler` reads a :class:`runner.hardware.Probe` on a fixed monotonic schedule and hands
batches to one sink (the store's writer), and :class:`HangDetector` notices a run that is alive and makes
no progress anywhere.
The run's utilisation summary is :func:`runner.analysis.utilisation.summarise`.

Times in samples, step events and windows are wall-clock seconds (``time.time()``); the schedule
itself runs on ``time.monotonic()`` so clock adjustments do not bunch or skip readings.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from runner.hardware import DeviceSample, ProcessGpuMemory

__all__ = ["HangDetector", "Sampler"]

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
# Hang detection


class HangDetector:
    """Flags a run that is alive and makes no progress anywhere.

    A sign of progress is an event from the trainer (a step, a phase such as tokenizing or loading, a
    checkpoint, metrics: ``last_event_time``) or a reading of a rank or GPU at or above ``idle_util_pct``
    (its time). The limit counts from the latest sign of the run as a whole: one rank working (rank 0
    tokenizing at 70% CPU while rank 1 waits at a barrier) keeps the run alive. The detector fires when
    the latest sign is ``hang_after_s`` old and the last ``window_s`` hold readings to judge by, once per
    episode: again only after a new sign of progress. A collective stuck with the GPU spinning at 100%
    (a classic NCCL hang) counts as busy, so it is left to NCCL's own timeout (``runner.watch.crash``).

    Args:
        hang_after_s: Seconds without any sign of progress before a hang is suspected.
        idle_util_pct: Utilisation under which a device counts as idle (GPU %, or CPU% of one
            core for a rank).
        window_s: How far back readings are looked at for the ``idle`` and ``busy`` lists.
        started_at: Wall-clock launch time, the first sign of progress (a hang in start-up, such as a
            rendezvous that never completes); ``None`` ignores start-up.
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
        self.last_busy: float | None = None
        """Time of the latest reading of a busy rank or GPU seen so far."""
        self._episode: float | None = None  # the last sign of progress of the episode already reported

    def note(self, samples: Iterable[DeviceSample]) -> None:
        """Take the busy readings among ``samples`` as signs of progress."""
        for s in samples:
            if (s.kind in ("rank", "gpu") and s.util_pct is not None and s.util_pct >= self.idle_util_pct
                    and (self.last_busy is None or s.time > self.last_busy)):
                self.last_busy = s.time

    def last_progress(self, last_event_time: float | None) -> float | None:
        """The latest sign of progress: the trainer's last event, a busy reading, or the launch."""
        signs = [t for t in (last_event_time, self.last_busy, self.started_at) if t is not None]
        return max(signs) if signs else None

    def check(
        self, now: float, last_event_time: float | None, samples: Iterable[DeviceSample]
    ) -> dict[str, Any] | None:
        """Look at the latest readings; return an event dict when a new hang episode starts.

        Args:
            now: Current wall-clock time.
            last_event_time: Wall-clock time of the trainer's last event, ``None`` before the first.
            samples: Recent samples; rank and GPU samples count, host samples do not.

        Returns:
            ``{"event": "hang_suspected", "time", "since_progress_s", "last_progress", "last_event_time",
            "idle": ["rank:0", ...], "busy": [...], "max_util_pct"}`` once per episode, else ``None``.
        """
        samples = list(samples)
        self.note(samples)
        reference = self.last_progress(last_event_time)
        if reference is None:
            return None
        peaks: dict[str, float] = {}
        for s in samples:
            if s.kind in ("rank", "gpu") and s.util_pct is not None and now - s.time <= self.window_s:
                key = f"{s.kind}:{s.index}"
                peaks[key] = max(peaks.get(key, 0.0), s.util_pct)
        if self._episode is not None and self._episode != reference:
            self._episode = None  # a sign of progress came: episode over
        if now - reference < self.hang_after_s or not peaks or self._episode is not None:
            return None
        self._episode = reference
        return {
            "event": "hang_suspected",
            "time": now,
            "since_progress_s": round(now - reference, 1),
            "last_progress": reference,
            "last_event_time": last_event_time,
            "idle": sorted(k for k, u in peaks.items() if u < self.idle_util_pct),
            "busy": sorted(k for k, u in peaks.items() if u >= self.idle_util_pct),
            "max_util_pct": max(peaks.values()),
        }
