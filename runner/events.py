"""The run folder and its event journal: the contract between the trainer and the orchestrator.

A run folder holds everything needed to understand, re-ingest or resume a run without the database:

    recipe.toml          the resolved recipe the trainer reads
    accelerate.yaml      the generated accelerate config (absent when the recipe names its own)
    launch.json          argv, env and config path, as built
    events.jsonl         the journal: one JSON object per line, written by rank 0 only
    orchestrator.jsonl   the orchestrator's own events, journaled before the store (runner.journal)
    samples.jsonl        telemetry samples, appended per batch (runner.journal)
    watcher.lock         flock-ed by the process watching the run (runner.recover)
    launcher.log         stdout/stderr of ``accelerate launch`` itself
    logs/rank{N}.log     stdout/stderr of each rank
    ranks/{N}.pid        the pid of each rank, written as the rank starts
    output/              the saved adapter or model

    checkpoints/step-NNNNNNNN/   resumable checkpoints (``runner.checkpoint``), each with ``ftui.json``

Every event carries ``seq`` (0, 1, 2, ... within the run: its stable id), ``type`` and ``time``
(unix seconds). Types written by the trainer (rank 0):

- ``start``: world size, distributed type in effect, params, total steps, ... and ``start_step`` (0, or
  the checkpoint's step when resumed) with ``resumed_from`` (the checkpoint folder or null) and
  ``resume_seconds`` (wall time of restoring it, or null).
- ``step``: ``step`` (global, 1-based; a resumed run goes on at N+1), ``epoch``, ``loss``, ``lr``,
  ``grad_norm``, ``tokens`` (cumulative, from the checkpoint's count when resumed), ``step_time``,
  ``tokens_per_s``, and ``skipped: true`` on a step whose update was dropped (``train.on_nan = "skip"``).
- ``memory``: each rank's allocator figures, gathered in the step's collective, at step 1, then at
  most every ``MEMORY_EVERY_S`` seconds, and at the last step: ``step`` and ``ranks``, a list by rank
  of ``{"rank", "source", ...}``: source ``"torch.cuda"`` gives ``allocated_bytes``,
  ``reserved_bytes``, ``peak_allocated_bytes`` of the rank's device; source ``"rss"`` (CPU, where torch
  has no allocator statistics) gives the process's ``rss_bytes`` (now, /proc) and ``peak_rss_bytes``
  (getrusage).
- ``checkpoint``: ``step``, ``path``, ``seconds`` (wall time of the save, barriers included),
  ``bytes`` (files written), ``reason`` (``"every"`` or ``"stop"``), ``removed`` (older ones pruned).
- ``error``: ``message`` (one line); for a non-finite loss also ``reason`` (``"nan_loss"`` or
  ``"too_many_skipped"``), ``step`` and ``value`` (``"nan"``, ``"inf"``, ``"-inf"``).
- ``end``: ``status`` (completed / stopped / failed), ``steps``, ``train_seconds``, ``tokens``,
  ``tokens_per_s`` (of this run's own steps), ``final_loss``, ``saved``, ``ranks``, ``skipped``,
  ``checkpoint`` (the newest complete one, or null).

The orchestrator adds its own (``launch``, ``exit``, ``hang``) to the store only. JSON has no NaN or
infinity (and SQLite's json functions refuse them): the writer turns non-finite floats into null.

The orchestrator journals its own events (``launch``, ``attach``, ``rank_exit``, ``hang``, ``hang_stop``,
``stop_requested``, ``stop``, ``watcher_error``, ``exit``) in ``orchestrator.jsonl`` with their own ``seq``
(:mod:`runner.journal`).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

EVENTS_FILE = "events.jsonl"
RECIPE_FILE = "recipe.toml"
ACCELERATE_FILE = "accelerate.yaml"
LAUNCH_FILE = "launch.json"
LAUNCHER_LOG = "launcher.log"
OUTPUT_DIR = "output"


def rank_log(run_dir: Path, rank: int) -> Path:
    """The log file of one rank."""
    return run_dir / "logs" / f"rank{rank}.log"


def rank_pid_file(run_dir: Path, rank: int) -> Path:
    """The pid file one rank writes as it starts."""
    return run_dir / "ranks" / f"{rank}.pid"


def read_rank_pids(run_dir: Path) -> dict[int, int]:
    """The pids the ranks of a run wrote so far, by rank."""
    pids: dict[int, int] = {}
    folder = run_dir / "ranks"
    if not folder.is_dir():
        return pids
    for entry in folder.glob("*.pid"):
        try:
            pids[int(entry.stem)] = int(entry.read_text().strip())
        except (ValueError, OSError):
            continue  # being written right now; the next poll gets it
    return pids


def finite_json(value: Any) -> Any:
    """``value`` with every non-finite float (NaN, +-inf) replaced by None, in dicts, lists and tuples
    at any depth; everything else as is."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite_json(v) for v in value]
    return value


class JournalWriter:
    """Appends events to ``events.jsonl``: one ``write`` per record, flushed, so that lines from a
    crashing process are whole or absent, never torn."""

    def __init__(self, path: Path) -> None:
        self._file: IO[str] = open(path, "a", encoding="utf-8")  # noqa: SIM115 (closed in close())
        self._seq = 0

    def emit(self, type_: str, **payload: Any) -> dict[str, Any]:
        import time

        record = {"seq": self._seq, "type": type_, "time": time.time(), **payload}
        self._seq += 1
        try:
            line = json.dumps(record, separators=(",", ":"), allow_nan=False)
        except ValueError:  # a NaN or infinity somewhere: JSON (and SQLite's json1) has none
            record = finite_json(record)
            line = json.dumps(record, separators=(",", ":"), allow_nan=False)
        self._file.write(line + "\n")
        self._file.flush()
        return record

    def close(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()


@dataclass
class JournalReader:
    """Tails ``events.jsonl`` incrementally; only complete lines are returned."""

    path: Path
    _offset: int = 0
    _partial: bytes = field(default=b"", repr=False)

    def read_new(self) -> list[dict[str, Any]]:
        """Events appended since the last call (possibly none)."""
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self._offset)
                chunk = fh.read()
        except FileNotFoundError:
            return []
        if not chunk:
            return []
        self._offset += len(chunk)
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()
        events: list[dict[str, Any]] = []
        for line in lines:
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue  # a foreign line; the journal is ours alone, so this is noise
            if isinstance(event, dict) and "type" in event:
                events.append(event)
        return events
