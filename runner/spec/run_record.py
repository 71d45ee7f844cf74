"""``RUN/run.json``: what the store knows of a run that no journal says, kept in the run folder too, so
that ``ftui db rebuild`` can record the run again exactly from its folder.

    {"uid", "name", "created_at" (ISO, UTC), "host", "recipe_source", "sweep_id",
     "resumed_from" (the uid of the run it continues, or null),
     "summary": {the summary pieces written beside the journals: uid, estimate, resumed_from,
                 sweep notes, the batch-size finder's result}}

Everything else of a run (its start, steps, metrics, telemetry, launch, end) is in its journals
(:mod:`runner.spec.events`, :mod:`runner.watch.journal`). The file is replaced whole on each change
(written beside it, then renamed), so a reader sees the old record or the new, never a torn one.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

RUN_RECORD_FILE = "run.json"


def read_record(run_dir: Path) -> dict[str, Any]:
    """The run's record (empty when the folder has none, or an unreadable one)."""
    try:
        data = json.loads((run_dir / RUN_RECORD_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def update_record(run_dir: Path, fields: dict[str, Any], summary: dict[str, Any] | None = None) -> None:
    """Merge ``fields`` into the record, and ``summary`` into its summary (keys given replace those keys)."""
    record = read_record(run_dir)
    record.update(fields)
    if summary:
        record["summary"] = {**record.get("summary", {}), **summary}
    path = run_dir / RUN_RECORD_FILE
    partial = path.with_name(f".{RUN_RECORD_FILE}.{os.getpid()}")
    try:
        partial.write_text(json.dumps(record, indent=2, default=str) + "\n", encoding="utf-8")
    except OSError:  # a full disk: no half-written file is left beside the record
        partial.unlink(missing_ok=True)
        raise
    os.replace(partial, path)


def from_epoch(seconds: float) -> datetime:
    """A journal's ``time`` (unix seconds) as the store keeps times: naive UTC."""
    return datetime.fromtimestamp(seconds, UTC).replace(tzinfo=None)
