"""Issue 16, item 2: verdicts drawn from noise. A comparison says when the host was busy with other work,
and never calls a run "faster" than one that trained a different global batch."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from runner.compare import build_comparison
from runner.noise import host_other_util
from tests.test_compare import _run

ROOT = Path(__file__).resolve().parent.parent
REAL = json.loads((ROOT / "tests" / "golden" / "show_run.json").read_text())["summary"]


def _with_recipe(run: Any, batch: int) -> Any:
    return dataclasses.replace(run, recipe_text=run.recipe_text + f"[train]\nbatch_size = {batch}\ngrad_accum = 1\n")


def test_a_different_global_batch_is_never_called_faster() -> None:
    single = _with_recipe(_run(1, "single", 1, 1000.0), 4)
    ddp = _with_recipe(_run(2, "ddp", 2, 1900.0), 4)  # --nproc 2 with the same micro-batch: global batch 8
    cmp = build_comparison([single, ddp], {})
    assert [r.global_batch for r in cmp.rows] == [4, 8]
    sentences = cmp.speedup_sentences()
    assert len(sentences) == 1 and "faster" not in sentences[0], sentences
    assert "global batch of 8" in sentences[0] and "(run 1) 4" in sentences[0]
    assert "Caution: the runs' global batches differ (single: 4, ddp x2: 8)" in cmp.recommendation()
    same = build_comparison([single, _with_recipe(_run(2, "ddp", 2, 1900.0), 2)], {})
    assert same.speedup_sentences() == ["ddp x2 (run 2) 1.90x faster than single (run 1)"]
    assert "Caution" not in same.recommendation()


def test_a_busy_host_is_said() -> None:
    # A real quickstart run on this shared machine: the host at 99.9% of its 2 cores, the rank at 53.7% of one.
    assert host_other_util(REAL) == __import__("pytest").approx(99.93 - 53.74 / 2, abs=0.1)
    busy = _run(1, "single", 1, 1000.0, telemetry=REAL["telemetry"])
    quiet_tel = json.loads(json.dumps(REAL["telemetry"]))
    quiet_tel["devices"]["host:-1"]["active"]["util_mean"] = 30.0
    quiet = _run(2, "single", 1, 1100.0, telemetry=quiet_tel)
    cmp = build_comparison([busy, quiet], {})
    assert cmp.rows[0].host_other_util is not None and cmp.rows[0].host_other_util > 70
    assert cmp.rows[1].host_other_util is not None and cmp.rows[1].host_other_util < 5
    text = cmp.recommendation()
    assert "run 1 (single): the host was busy with other work (73% of its CPU beyond the run's own ranks" in text
    assert "run 2 (single): the host was busy" not in text
