"""Verdicts drawn from noise: a comparison says when the host was busy with other work, never calls a run
"faster" than one that trained a different global batch, and gives medians and spread over repeated runs
(a real ``ftui sweep --repeat 2``: the shared ``cold_repeat`` sweep)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from runner.analysis.compare import build_comparison
from runner.analysis.noise import NoiseFloor, host_other_util
from tests.support import run_info
from tests.support.matrix import ColdRepeat

ROOT = Path(__file__).resolve().parents[2]
REAL = json.loads((ROOT / "tests" / "golden" / "show_run.json").read_text())["summary"]


def _with_recipe(run: Any, batch: int) -> Any:
    return dataclasses.replace(run, recipe_text=run.recipe_text + f"[train]\nbatch_size = {batch}\ngrad_accum = 1\n")


def test_a_different_global_batch_is_never_called_faster() -> None:
    single = _with_recipe(run_info(1, "single", 1, 1000.0), 4)
    ddp = _with_recipe(run_info(2, "ddp", 2, 1900.0), 4)  # --nproc 2 with the same micro-batch: global batch 8
    cmp = build_comparison([single, ddp], {})
    assert [r.global_batch for r in cmp.rows] == [4, 8]
    sentences = cmp.speedup_sentences()
    assert len(sentences) == 1 and "faster" not in sentences[0], sentences
    assert "global batch 8 vs 4" in sentences[0]
    assert cmp.recommendation().startswith("No recommendation: ddp x2 (run 2) and single (run 1) train different")
    floor = NoiseFloor(0.1, "repeats of single (runs 7, 8) on h")
    same = build_comparison([single, _with_recipe(run_info(2, "ddp", 2, 1900.0), 2)], {}, floor=floor)
    assert same.speedup_sentences() == [
        "ddp x2 (run 2) 1.90x faster than single (run 1): beyond the run-to-run spread of 10% (repeats of single "
        "(runs 7, 8) on h)"]
    assert "Caution" not in same.recommendation()


def test_a_busy_host_is_said() -> None:
    # A real quickstart run on this shared machine: the host at 99.9% of its 2 cores, the rank at 53.7% of one.
    assert host_other_util(REAL["telemetry"]) == pytest.approx(99.93 - 53.74 / 2, abs=0.1)
    busy = run_info(1, "single", 1, 1000.0, telemetry=REAL["telemetry"])
    quiet_tel = json.loads(json.dumps(REAL["telemetry"]))
    quiet_tel["devices"]["host:-1"]["active"]["util_mean"] = 30.0
    quiet = run_info(2, "single", 1, 1100.0, telemetry=quiet_tel)
    cmp = build_comparison([busy, quiet], {})
    assert cmp.rows[0].host_other_util is not None and cmp.rows[0].host_other_util > 70
    assert cmp.rows[1].host_other_util is not None and cmp.rows[1].host_other_util < 5
    text = cmp.recommendation()
    assert "run 1 (single): the host was busy with other work (73% of its CPU beyond the run's own ranks" in text
    assert "run 2 (single): the host was busy" not in text


def test_repeats_give_medians_and_spread_and_say_when_the_lead_is_noise(tmp_path: Path) -> None:
    from runner.analysis.repeats import by_strategy
    from runner.service.sweep import plan

    items = plan(ROOT / "recipes" / "quickstart.toml", ["single", "ddp"], 2, [], [], repeat=3)
    assert [i.strategy for i in items] == ["single"] * 3 + ["ddp"] * 3
    assert items[2].note.endswith("repeat 3/3")
    runs = [run_info(i + 1, s, n, tps) for i, (s, n, tps) in enumerate(
        [("single", 1, 1000.0), ("single", 1, 1200.0), ("single", 1, 900.0),
         ("ddp", 2, 1100.0), ("ddp", 2, 950.0), ("ddp", 2, None)])]
    cmp = build_comparison(runs, {})
    rows = by_strategy(cmp)
    assert [(r.label, r.run_ids, r.completed) for r in rows] == [("single", [1, 2, 3], 3), ("ddp x2", [4, 5, 6], 3)]
    assert rows[0].tokens_per_s is not None and (rows[0].tokens_per_s.median, rows[0].tokens_per_s.low,
                                                 rows[0].tokens_per_s.high) == (1000.0, 900.0, 1200.0)
    assert rows[1].tokens_per_s is not None and rows[1].tokens_per_s.n == 2  # the run with no figure is left out
    assert cmp.decision().kind == "tie" and "overlap" in cmp.recommendation()
    apart = build_comparison([run_info(1, "single", 1, 1000.0), run_info(2, "single", 1, 1010.0),
                              run_info(3, "ddp", 2, 2000.0), run_info(4, "ddp", 2, 2100.0)], {})
    assert "do not overlap" in apart.recommendation() and apart.recommendation().startswith("Use ddp x2")


def test_repeat_must_be_positive() -> None:
    from runner.service.sweep import plan
    from runner.spec.recipe import RecipeError

    with pytest.raises(RecipeError, match="--repeat"):
        plan(ROOT / "recipes" / "quickstart.toml", ["single"], None, [], [], repeat=0)


def test_sweep_repeat_runs_each_strategy_n_times_and_prints_medians(cold_repeat: ColdRepeat) -> None:
    out = cold_repeat.proc.stdout
    assert "2 runs, one after another" in out and "repeat 2/2" in out
    assert "over the repeats: median (min-max)" in out and "2/2" in out
    assert "The runs tie: all 2 are single" in out
