"""Two runs writing and four viewers polling every 0.2 s, all real processes on one store (both backends),
for a few seconds: no "database is locked", no lost row, no gap in what a viewer sees. The bench runs the
same for a minute."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SECONDS = 5
"""How long the writers and readers run: long enough for many flushes and polls of each."""


def test_two_writers_and_four_readers_lose_nothing(db_url: str) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_store_concurrency.py"), "--db", db_url,
                           "--seconds", str(SECONDS), "--json"], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout.strip(), proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["errors"] == [] and report["lost"] == [], report
    assert proc.returncode == 0, proc.stderr
    # 20 steps/s per writer, each with an event and a metric, plus 16 telemetry rows per 0.5 s flush.
    assert report["rows_written"] > 2 * SECONDS * (2 * 20 + 32) * 0.8, report
    assert report["reader_polls"] > 4 * SECONDS / 0.2 * 0.6, "readers kept polling throughout"
