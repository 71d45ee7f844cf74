"""The telemetry of one watched run: the sampler thread (:class:`runner.watch.telemetry.Sampler`), its
queue to the writer (the watcher's thread: the run folder first, then the store) and the hang rule."""

from __future__ import annotations

import time
from collections import deque
from queue import SimpleQueue
from typing import Any

from runner.hardware import DeviceSample, Probe, ProcessGpuMemory
from runner.spec import events as ev
from runner.watch.journal import append_samples
from runner.watch.prepare import Prepared
from runner.watch.stream import Recorder, RunStream
from runner.watch.telemetry import HangDetector, Sampler
from store import Store
from store.nodes import ingest_node_samples

Batch = tuple[list[DeviceSample], list[ProcessGpuMemory]]


class RunTelemetry:
    """The sampler of one run, its queue to the writer and the hang detector; ``interval_s`` 0: off."""

    def __init__(self, store: Store, prepared: Prepared, probe: Probe | None, interval_s: float,
                 hang_after_s: float, launched: float) -> None:
        self.store = store
        self.run_id = prepared.run_id
        self.run_dir = prepared.run_dir
        self.node = prepared.node
        self.queue: SimpleQueue[Batch] = SimpleQueue()
        self.recent: deque[Any] = deque(maxlen=2000)
        self.sampler: Sampler | None = None
        self.last_hang_check = 0.0
        self.hang_after_s = hang_after_s
        self.hang_flagged: dict[str, Any] | None = None
        self.hang_reason: str | None = None
        self.unsaved: Batch = ([], [])
        self.hang = HangDetector(hang_after_s=hang_after_s, window_s=min(30.0, hang_after_s), started_at=launched)
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

    def poll(self, stream: RunStream, recorder: Recorder) -> None:
        """Write what was sampled; flag a hang (journaled, and passed to the stream's callback)."""
        if self.sampler is None:
            return
        now = time.time()
        self._write()
        if self.hang_flagged is not None and stream.last_step_time != self.hang_flagged.get("last_step_time"):
            self.hang_flagged = None  # a step came: the episode is over
        if now - self.last_hang_check >= 1.0 and stream.end is None:
            self.last_hang_check = now
            event = self.hang.check(now, stream.last_step_time, self.recent)
            if event is not None:
                record = recorder.emit("hang", **event)
                self.hang_flagged = {**event, "flagged_at": now, "last_step_time": stream.last_step_time}
                if stream.on_event is not None:
                    stream.on_event(record)

    def hang_stop(self, stream: RunStream) -> bool:
        """The documented rule: a hang still there ``hang_after_s`` after it was flagged (no step,
        devices idle the whole time, so ``2 x hang_after_s`` without a step) stops the run."""
        flagged = self.hang_flagged
        if flagged is None or stream.end is not None or self.hang_reason is not None:
            return False
        now = time.time()
        if now - flagged["flagged_at"] < self.hang_after_s:
            return False
        reference = stream.last_step_time if stream.last_step_time is not None else self.hang.started_at
        since = now - (reference or flagged["flagged_at"])
        self.hang_reason = f"hang: no step for {since:.0f} s, devices idle"
        return True

    def _write(self) -> None:
        samples: list[DeviceSample] = []
        procs: list[ProcessGpuMemory] = []
        while not self.queue.empty():
            more, more_procs = self.queue.get()
            samples.extend(more)
            procs.extend(more_procs)
        if (samples or procs) and self.run_id is not None:
            append_samples(self.run_dir, samples, procs)  # the run folder first: the store is a projection
            self.recent.extend(samples)
            self.unsaved[0].extend(samples)
            self.unsaved[1].extend(procs)
        if (self.unsaved[0] or self.unsaved[1]) and self.run_id is not None:
            try:  # idempotent by time, so a batch that failed is simply offered again
                if self.node is not None:  # several machines: each node's readings under its own number
                    ingest_node_samples(self.store, self.run_id, self.node.slot, *self.unsaved)
                else:
                    self.store.ingest_samples(self.run_id, *self.unsaved)
            except Exception:  # noqa: BLE001 (samples.jsonl has them; see RunStream.flush)
                return
            self.unsaved = ([], [])

    def close(self) -> None:
        """Stop the sampler and write what it read last."""
        if self.sampler is None:
            return
        self.sampler.stop()
        self._write()
