"""The telemetry of one watched run: the sampler thread (:class:`runner.watch.telemetry.Sampler`), its
queue to the writer (the watcher's thread: the run folder first, then the store) and the hang rule
(:class:`HangRule`, on an injectable wall clock)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from queue import SimpleQueue
from typing import Any

from runner.hardware import DeviceSample, Probe, ProcessGpuMemory
from runner.hardware.disks import write_problem
from runner.spec import events as ev
from runner.watch.journal import SAMPLES_FILE, append_samples
from runner.watch.prepare import Prepared
from runner.watch.stream import Recorder, RunStream, store_problem
from runner.watch.telemetry import HangDetector, Sampler
from store import Store
from store.nodes import ingest_node_samples

Batch = tuple[list[DeviceSample], list[ProcessGpuMemory]]

Clock = Callable[[], float]
"""Wall-clock seconds (``time.time``): step events and samples carry wall-clock times."""

HANG_CHECK_S = 1.0
"""Seconds between two looks of the hang rule at the recent readings."""


class HangRule:
    """The documented hang rule over time: flag a hang (:class:`runner.watch.telemetry.HangDetector`: no
    sign of progress anywhere for ``hang_after_s``: no trainer event, every rank and GPU idle), at most every
    ``check_every_s``; a hang still there ``hang_after_s`` after it was flagged (so ``2 x hang_after_s``
    without progress) stops the run.

    Args:
        hang_after_s: seconds without progress before a hang is flagged, and again before it stops the run.
        started_at: wall-clock launch time (the first sign of progress).
        clock: the wall clock (``time.time``; tests drive their own).
        check_every_s: seconds between two checks.
    """

    def __init__(self, hang_after_s: float, started_at: float, clock: Clock = time.time,
                 check_every_s: float = HANG_CHECK_S) -> None:
        self.hang_after_s = hang_after_s
        self.clock = clock
        self.check_every_s = check_every_s
        self.detector = HangDetector(hang_after_s=hang_after_s, window_s=min(30.0, hang_after_s), started_at=started_at)
        self.last_check: float | None = None
        self.flagged: dict[str, Any] | None = None
        """The hang flagged and not over yet: its event (``last_progress`` among it) and ``flagged_at``."""
        self.reason: str | None = None
        """Why the run was stopped for a hang (set once, by :meth:`should_stop`)."""

    @property
    def started_at(self) -> float | None:
        return self.detector.started_at

    def check(self, last_event_time: float | None, ended: bool, recent: Iterable[DeviceSample]) -> dict[str, Any] | None:
        """Look at the recent readings when a check is due; the ``hang`` event when a new hang is flagged.

        Args:
            last_event_time: time of the trainer's latest event (any type), None before the first.
            ended: the run's end event came.
            recent: the recent telemetry readings.
        """
        now = self.clock()
        self._unflag_on_progress(last_event_time)
        if ended or (self.last_check is not None and now - self.last_check < self.check_every_s):
            return None
        self.last_check = now
        event = self.detector.check(now, last_event_time, recent)
        self._unflag_on_progress(last_event_time)
        if event is not None:
            self.flagged = {**event, "flagged_at": now}
        return event

    def _unflag_on_progress(self, last_event_time: float | None) -> None:
        if self.flagged is not None and self.detector.last_progress(last_event_time) != self.flagged["last_progress"]:
            self.flagged = None  # a sign of progress came: the episode is over

    def should_stop(self, last_event_time: float | None, ended: bool) -> str | None:
        """The reason to stop the run (once): a flagged hang still there ``hang_after_s`` after the flag."""
        self._unflag_on_progress(last_event_time)
        flagged = self.flagged
        if flagged is None or ended or self.reason is not None:
            return None
        now = self.clock()
        if now - flagged["flagged_at"] < self.hang_after_s:
            return None
        since = now - flagged["last_progress"]
        self.reason = f"hang: no progress for {since:.0f} s (no event from the trainer, every device idle)"
        return self.reason


class RunTelemetry:
    """The sampler of one run, its queue to the writer and the hang detector; ``interval_s`` 0: off."""

    def __init__(self, store: Store, prepared: Prepared, probe: Probe | None, interval_s: float,
                 hang_after_s: float, launched: float, clock: Clock = time.time,
                 hang_check_s: float = HANG_CHECK_S) -> None:
        self.store = store
        self.run_id = prepared.run_id
        self.run_dir = prepared.run_dir
        self.node = prepared.node
        self.queue: SimpleQueue[Batch] = SimpleQueue()
        self.recent: deque[Any] = deque(maxlen=2000)
        self.sampler: Sampler | None = None
        self.unsaved: Batch = ([], [])
        self.unwritten: Batch = ([], [])
        """Readings ``samples.jsonl`` did not take yet (its disk full)."""
        self.file_error: str | None = None
        """Why ``samples.jsonl`` could not be written, while it cannot."""
        self.store_error: str | None = None
        self.hang = HangRule(hang_after_s, launched, clock=clock, check_every_s=hang_check_s)
        if interval_s <= 0:
            return
        self.sampler = Sampler(
            probe if probe is not None else Probe(),
            lambda: ev.read_rank_pids(self.run_dir),
            lambda samples, procs: self.queue.put((samples, procs)),
            interval_s=interval_s,
            flush_every_s=1.0,
        )
        self.sampler.start()

    def poll(self, stream: RunStream, recorder: Recorder) -> dict[str, Any] | None:
        """Write what was sampled; flag a hang (journaled, and passed to the stream's callback). The
        ``hang`` record when one was flagged now."""
        if self.sampler is None:
            return None
        self._write()
        event = self.hang.check(stream.last_event_time, stream.end is not None, self.recent)
        if event is None:
            return None
        record = recorder.emit("hang", **event)
        if stream.on_event is not None:
            stream.on_event(record)
        return record

    @property
    def hang_reason(self) -> str | None:
        return self.hang.reason

    def hang_stop(self, stream: RunStream) -> bool:
        """Whether the hang rule stops the run now (:meth:`HangRule.should_stop`; its reason: :attr:`hang_reason`)."""
        return self.hang.should_stop(stream.last_event_time, stream.end is not None) is not None

    def _write(self) -> None:
        samples: list[DeviceSample] = []
        procs: list[ProcessGpuMemory] = []
        while not self.queue.empty():
            more, more_procs = self.queue.get()
            samples.extend(more)
            procs.extend(more_procs)
        if (samples or procs) and self.run_id is not None:
            self._append(samples, procs)  # the run folder first: the store is a projection
            self.recent.extend(samples)
            self.unsaved[0].extend(samples)
            self.unsaved[1].extend(procs)
        if (self.unsaved[0] or self.unsaved[1]) and self.run_id is not None:
            try:  # idempotent by time, so a batch that failed is simply offered again
                if self.node is not None:  # several machines: each node's readings under its own number
                    ingest_node_samples(self.store, self.run_id, self.node.slot, *self.unsaved)
                else:
                    self.store.ingest_samples(self.run_id, *self.unsaved)
            except Exception as exc:  # noqa: BLE001 (samples.jsonl has them; see RunStream.flush)
                self.store_error = store_problem(self.store, exc)
                return
            self.unsaved, self.store_error = ([], []), None

    def _append(self, samples: list[DeviceSample], procs: list[ProcessGpuMemory]) -> None:
        """Append to ``samples.jsonl`` what it has not taken yet, then this batch. A disk that does not take
        them ends nothing: they wait (and go to the store meanwhile, which recover reads by time)."""
        self.unwritten[0].extend(samples)
        self.unwritten[1].extend(procs)
        try:
            append_samples(self.run_dir, *self.unwritten)
        except OSError as exc:
            self.file_error = write_problem(self.run_dir / SAMPLES_FILE, exc)
            return
        self.unwritten, self.file_error = ([], []), None

    def close(self) -> None:
        """Stop the sampler and write what it read last."""
        if self.sampler is None:
            return
        self.sampler.stop()
        self._write()
