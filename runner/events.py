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

Every event carries ``seq`` (0, 1, 2, ... within the run: its stable id), ``type`` and ``time``
(unix seconds). Types: ``start``, ``step``, ``end``, ``error``; the orchestrator journals its own
(``launch``, ``attach``, ``rank_exit``, ``hang``, ``hang_stop``, ``watcher_error``, ``exit``) in
``orchestrator.jsonl`` with their own ``seq``.
"""

from __future__ import annotations

import json
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
        self._file.write(json.dumps(record, separators=(",", ":")) + "\n")
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
