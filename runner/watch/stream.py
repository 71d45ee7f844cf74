"""Journal to store: the trainer's ``events.jsonl`` streamed into the store in batches
(:class:`RunStream`, which also keeps what the watcher decides on: start, steps, end, errors), and
the watcher's own events written journal first (:class:`Recorder`).

No write here ends a run: a store that cannot be written (locked, its disk full) keeps what it missed
pending and takes it at the next write that works; a journal line the disk cannot take is kept and
written again. Each keeps its problem as one line (:func:`runner.hardware.disks.write_problem`) for the
end of the run to report."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runner.hardware.disks import is_no_space, write_problem
from runner.spec import events as ev
from runner.spec import strategies
from runner.spec.first_step import Moments, breakdown
from runner.spec.flops import run_flops_per_token
from runner.watch.journal import ORCHESTRATOR_FILE, OrchestratorJournal, read_jsonl
from runner.watch.prepare import Prepared
from store import Store, StoreError
from store.engine import database_path, describe_error

EventCallback = Callable[[dict[str, Any]], None]


def store_problem(store: Store, exc: BaseException) -> str:
    """One line for a store write that failed: ``--db URL: no space left on DEVICE (PATH)`` when its disk
    is full, else the store's own words."""
    if isinstance(exc, StoreError):
        return str(exc)[:500]
    path = database_path(store.url)
    if path is not None and is_no_space(exc):
        return f"--db {store.url}: {write_problem(path, exc)}"
    return describe_error(store.url, exc)[:500]


def quietly(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call ``fn``; an exception is swallowed (the end of a watch must run to its end)."""
    try:
        return fn(*args, **kwargs)
    except Exception:  # noqa: BLE001
        return None


class RunStream:
    """Streams one run's journal into the store in batches and tracks its state."""

    FLUSH_S = 0.5

    def __init__(self, store: Store, prepared: Prepared, on_event: EventCallback | None) -> None:
        assert prepared.run_id is not None
        self.store = store
        self.run_id = prepared.run_id
        self.prepared = prepared
        self.on_event = on_event
        self.reader = ev.JournalReader(prepared.run_dir / ev.EVENTS_FILE)
        self.pending: list[dict[str, Any]] = []
        self.last_flush = time.monotonic()
        self.start: ev.StartEvent | None = None
        self.end: ev.EndEvent | None = None
        self.error: str | None = None
        self.mismatch: str | None = None
        self.first_step_time: float | None = None
        self.last_step_time: float | None = None
        self.last_step: int | None = None
        self.last_event_time: float | None = None
        """Time of the trainer's latest event of any type: a sign of progress for the hang rule."""
        self.store_error: str | None = None
        """Why the store could not be written, while it cannot (None once a write works again)."""
        self.unsaved_updates: list[dict[str, Any]] = []
        """Run-row updates the store did not take yet, in order (written again before the next batch)."""
        self.loss_scale_drops = 0
        self.moments = Moments()
        """The moments before step 1 (:func:`runner.spec.first_step.breakdown`), as the journals give them."""

    def poll(self) -> None:
        """Read what the journal has new, note it, pass it on and write it when a batch is due."""
        fresh = self.reader.read_new()
        self.pending.extend(fresh)  # before any callback runs: a callback that raises loses nothing
        for raw in fresh:
            self._note(raw)
        if self.on_event is not None:
            for raw in fresh:
                self.on_event(raw)
        urgent = any(e["type"] not in ("step", "metrics") for e in self.pending)  # both batched
        if self.pending and (urgent or time.monotonic() - self.last_flush >= self.FLUSH_S):
            self.flush()

    def _note(self, raw: dict[str, Any]) -> None:
        event = ev.typed(raw)
        if event is None:
            return
        if isinstance(raw.get("time"), int | float):
            self.last_event_time = max(float(raw["time"]), self.last_event_time or 0.0)
        if event["type"] == "phase" and self.start is None:
            self._on_phase(str(event["phase"]), float(raw["time"]))
        elif event["type"] == "phase" and self.first_step_time is None:  # compiling: step 1 compiles the layers
            self.moments.stepping.append((str(event["phase"]), float(raw["time"])))
        elif event["type"] == "start":
            self.start = event
            started = event.get("process_started")
            self.moments.start = float(raw["time"])
            self.moments.process_started = float(started) if isinstance(started, int | float) else None
            self._on_start(event)
        elif event["type"] == "step":
            if self.first_step_time is None:
                self._on_first_step(float(raw["time"]))
            self.first_step_time = self.first_step_time or float(raw["time"]) - (event.get("step_time") or 0.0)
            self.last_step_time = float(raw["time"])
            self.last_step = event.get("step")
        elif event["type"] == "end":
            self.end = event
        elif event["type"] == "error":
            self.error = event.get("message")
        elif event["type"] in ("precision", "kernels"):  # what the trainer found in effect after its first step
            self._update_summary({event["type"]: {k: v for k, v in event.items() if k != "type"}})
        elif event["type"] == "loss_scale":
            self.loss_scale_drops += 1
            self._update_summary({"loss_scale_drops": self.loss_scale_drops})

    def flush(self) -> None:
        """Write the pending events. The events are in the journal already: a store that fails (locked,
        gone for a moment) must not end a 30-hour run, so they stay pending for the next flush (ingest
        skips by seq, so a batch must not be skipped over: the pending list keeps the order)."""
        self.last_flush = time.monotonic()
        try:
            while self.unsaved_updates:
                self.store.update_run(self.run_id, **self.unsaved_updates[0])
                self.unsaved_updates.pop(0)
            self.store.ingest(self.run_id, self.pending)
        except Exception as exc:  # noqa: BLE001
            self.store_error = store_problem(self.store, exc)
            return
        self.pending = []
        self.store_error = None

    def update_run(self, **values: Any) -> None:
        """Write to the run's row now, or (the store failing) with the next batch that goes through."""
        if self.unsaved_updates:  # keep the order: a later figure must not be overwritten by an older one
            self.unsaved_updates.append(values)
            return
        try:
            self.store.update_run(self.run_id, **values)
        except Exception as exc:  # noqa: BLE001 (the journal has the event whatever the store does now)
            self.store_error = store_problem(self.store, exc)
            self.unsaved_updates.append(values)

    def _update_summary(self, summary: dict[str, Any]) -> None:
        self.update_run(summary=summary)

    def _on_phase(self, phase: str, at: float) -> None:
        """A phase before ``start``: a moment of the time to first step (a phase entered again keeps its first)."""
        if all(name != phase for name, _ in self.moments.phases):
            self.moments.phases.append((phase, at))

    def _on_first_step(self, end: float) -> None:
        """Store the time to first step, broken down (:mod:`runner.spec.first_step`), from the journals alone:
        the watcher, a re-attached one and ``ftui db rebuild`` compute the same figures."""
        self.moments.launched = launcher_started(self.prepared.run_dir)
        self.moments.first_step_end = end
        self._update_summary({"time_to_first_step": breakdown(self.moments)})

    def _on_start(self, event: ev.StartEvent) -> None:
        launch = self.prepared.recipe.launch
        strategy = strategies.resolve(launch.strategy, launch.engine)
        in_effect = event.get("distributed_type")
        self.update_run(
            distributed_type=in_effect,
            device_type=event.get("device_type"),
            total_steps=event.get("total_steps"),
            summary={"params": event.get("params"), "trainable_params": event.get("trainable_params"),
                     "local_param_numel": event.get("local_param_numel"), "world_size": event.get("world_size"),
                     "tokens_per_step": event.get("tokens_per_step"), "mixed_precision": event.get("mixed_precision"),
                     "device_map": event.get("device_map"), "pids": event.get("pids"),
                     "threads": event.get("threads"), "model_dims": event.get("model_dims"),
                     # Stored so that compare computes MFU without reading a model config (no transformers).
                     "flops_per_token": run_flops_per_token(self.prepared.recipe.method.type, event.get("params"),
                                                            event.get("trainable_params"), event.get("model_dims")),
                     **({"engine": event["engine"]} if "engine" in event else {}),
                     **({"sharding": event["sharding"]} if "sharding" in event else {}),
                     **({"parallel": event["parallel"]} if "parallel" in event else {})},
        )
        if in_effect is not None and in_effect not in strategy.expect:  # None: a script did not say
            self.mismatch = (
                f"launch.strategy: asked for {strategy.name} ({' or '.join(sorted(strategy.expect))}) but "
                f"accelerate ran {in_effect}; the run was stopped"
            )


def launcher_started(run_dir: Path) -> float | None:
    """When the launcher's process started (unix seconds), as the watcher that spawned it journaled it
    (``launcher_started`` of the ``launch`` event in ``orchestrator.jsonl``); None for a run launched
    before it was journaled."""
    launches = [e for e in read_jsonl(run_dir / ORCHESTRATOR_FILE) if e.get("type") == "launch"]
    value = launches[-1].get("launcher_started") if launches else None
    return float(value) if isinstance(value, int | float) else None


class Recorder:
    """The watcher's events: to ``RUN/orchestrator.jsonl`` first, then to the store. Neither write
    raises: what one did not take is kept, in order, and offered again with the next event."""

    def __init__(self, store: Store, run_id: int, run_dir: Path, source: str = "orchestrator") -> None:
        self.store = store
        self.run_id = run_id
        self.source = source  # each node of a multi-node run numbers its own events
        self.journal = OrchestratorJournal(run_dir)
        self.unwritten: list[dict[str, Any]] = []
        """Events the run folder's disk did not take yet."""
        self.unstored: list[dict[str, Any]] = []
        """Events the store did not take yet (ingest skips by ``seq``: none may be skipped over)."""
        self.journal_error: str | None = None
        """Why the journal could not be written, while it cannot."""
        self.store_error: str | None = None

    def emit(self, type_: str, **payload: Any) -> dict[str, Any]:
        """Journal one event, then offer it to the store; the record."""
        record = self.journal.record(type_, **payload)
        self.unwritten.append(record)
        self.unstored.append(record)
        self._write()
        try:
            self.store.ingest(self.run_id, self.unstored, source=self.source)
        except Exception as exc:  # noqa: BLE001 (the journal has it; recover re-ingests it)
            self.store_error = store_problem(self.store, exc)
        else:
            self.unstored, self.store_error = [], None
        return record

    def _write(self) -> None:
        try:
            self.journal.write(self.unwritten)
        except OSError as exc:
            self.journal_error = write_problem(self.journal.path, exc)
        else:
            self.unwritten, self.journal_error = [], None

    def close(self) -> None:
        if self.unwritten:
            self._write()
        self.journal.close()
