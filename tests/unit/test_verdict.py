"""A comparison's verdict: a run is recommended only over runs that train the same thing, and only when its
lead is beyond the measured run-to-run spread; otherwise one line says the runs tie or cannot be compared,
and why. Pure: comparisons built from runs made by hand (no training)."""

from __future__ import annotations

import dataclasses
from typing import Any

from runner.analysis.compare import Comparison, build_comparison
from runner.analysis.noise import NoiseFloor, measured_floor
from runner.analysis.verdict import decide, recommendation
from tests.support import run_info


def run(id_: int, strategy: str, nproc: int, tps: float | None, batch: int = 2, precision: str = "fp32",
        **fields: Any) -> Any:
    """A quickstart-shaped run of ``strategy`` x ``nproc`` with micro-batch ``batch`` (global: x nproc for
    the data-parallel ones)."""
    r = run_info(id_, strategy, nproc, tps)
    text = r.recipe_text + f'[train]\nbatch_size = {batch}\ngrad_accum = 1\nprecision = "{precision}"\n'
    return dataclasses.replace(r, recipe_text=text, **fields)


def said(cmp: Comparison) -> str:
    return "\n".join([*cmp.speedup_sentences(), cmp.recommendation()])


def test_an_8x_ratio_between_different_global_batches_is_no_recommendation() -> None:
    """``ftui compare 1 2``: single at global batch 2 and ddp x2 at 4, 8.70x the tokens/s."""
    cmp = build_comparison([run(1, "single", 1, 100.0), run(2, "ddp", 2, 870.0)], {})
    verdict = cmp.decision()
    assert verdict.kind == "incomparable" and verdict.run_id is None and cmp.recommended_id is None
    text = said(cmp)
    assert "Use " not in text and "fastest" not in text and "faster" not in text, text
    assert "global batch 4 vs 2" in cmp.recommendation() and "8.70x" in cmp.speedup_sentences()[0]
    assert cmp.recommendation().startswith("No recommendation: ddp x2 (run 2) and single (run 1) train different")


def test_precision_model_and_data_count_as_different_trainings() -> None:
    bf16 = run(2, "single", 1, 300.0, precision="bf16")
    assert "precision bf16 vs fp32" in build_comparison([run(1, "single", 1, 100.0), bf16], {}).recommendation()
    other = dataclasses.replace(run(2, "single", 1, 300.0), model="gpt2")
    assert decide(build_comparison([run(1, "single", 1, 100.0), other], {}).rows).kind == "incomparable"


def test_repeats_whose_ranges_overlap_tie_and_apart_recommend() -> None:
    """A ``--repeat 3`` sweep: 1.01x against a 12-51% spread is a tie, never "Use"."""
    tps = [("single", 1, 1000.0), ("single", 1, 1200.0), ("single", 1, 900.0),
           ("ddp", 2, 1010.0), ("ddp", 2, 880.0), ("ddp", 2, 1330.0)]
    noisy = build_comparison([run(i + 1, s, n, t, batch=2 if n == 1 else 1) for i, (s, n, t) in enumerate(tps)], {})
    assert noisy.decision().kind == "tie"
    text = said(noisy)
    assert "Use " not in text and "faster" not in text, text
    assert "ranges" in noisy.recommendation() and "overlap" in noisy.recommendation()
    apart = [("single", 1, 1000.0), ("single", 1, 1010.0), ("ddp", 2, 2000.0), ("ddp", 2, 2100.0)]
    cmp = build_comparison([run(i + 1, s, n, t, batch=2 if n == 1 else 1) for i, (s, n, t) in enumerate(apart)], {})
    assert cmp.decision().kind == "use" and cmp.recommended_id == 4
    assert cmp.recommendation().startswith("Use ddp x2 (run 4): the fastest that completed")
    assert "do not overlap" in cmp.recommendation()
    assert cmp.speedup_sentences() == [
        "ddp x2 (runs 3, 4) 2.04x faster than single (runs 1, 2): ranges 2,000-2,100 and 1,000-1,010 tokens/s "
        "over 2 and 2 runs do not overlap"]


def test_three_identical_runs_tie() -> None:
    cmp = build_comparison([run(1, "ddp", 2, 1000.0), run(2, "ddp", 2, 1370.0), run(3, "ddp", 2, 1100.0)], {})
    assert cmp.decision().kind == "tie" and cmp.speedup_sentences() == []
    assert cmp.recommendation().startswith("The runs tie: all 3 are ddp x2 training the same thing")
    assert "faster" not in said(cmp)


def test_one_run_each_needs_a_measured_floor() -> None:
    runs = [run(1, "single", 1, 1000.0), run(2, "ddp", 2, 1500.0, batch=1)]
    unknown = build_comparison(runs, {})
    assert unknown.decision().kind == "unknown" and "Use " not in said(unknown)
    assert unknown.recommendation().startswith("Cannot tell: ddp x2 had 1.50x the tokens/s of single")
    assert "ftui sweep --repeat 3" in unknown.recommendation()
    wide = build_comparison(runs, {}, floor=NoiseFloor(0.6, "repeats of single (runs 7, 8) on h"))
    assert wide.decision().kind == "tie" and "within the run-to-run spread of 60%" in wide.recommendation()
    narrow = build_comparison(runs, {}, floor=NoiseFloor(0.1, "repeats of single (runs 7, 8) on h"))
    assert narrow.decision().kind == "use" and narrow.recommended_id == 2
    assert "beyond the run-to-run spread of 10% (repeats of single (runs 7, 8) on h)" in narrow.recommendation()
    assert narrow.speedup_sentences()[0].startswith("ddp x2 (run 2) 1.50x faster than single (run 1): beyond")


def test_nothing_or_one_completed() -> None:
    assert decide(build_comparison([run(1, "single", 1, None, status="failed")], {}).rows).kind == "none"
    one = build_comparison([run(1, "single", 1, 100.0), run(2, "ddp", 2, None, status="failed")], {})
    assert one.decision().kind == "alone" and one.recommendation().endswith("; 1 did not complete.")


def test_the_floor_is_the_widest_spread_of_stored_repeats_on_the_host() -> None:
    stored = [dataclasses.replace(run_info(i, "single", 1, t), recipe_hash="abc", host=host)
              for i, t, host in [(1, 1000.0, "h"), (2, 1200.0, "h"), (3, 1100.0, "h"),  # 18% on h
                                 (4, 500.0, "other"), (5, 1000.0, "other"),              # not this host
                                 (9, 3000.0, "h")]]                                      # after the compared runs
    floor = measured_floor(stored, {"h"}, upto=8)
    assert floor is not None and abs(floor.relative - 200 / 1100) < 1e-9
    assert floor.source == "repeats of single (runs 1, 2, 3) on h"
    assert measured_floor(stored[:1], {"h"}, upto=8) is None


def test_a_busy_host_is_one_caution_however_many_runs_it_slowed() -> None:
    busy = [dataclasses.replace(r, host_other_util=o) for r, o in zip(
        build_comparison([run(1, "single", 1, 100.0), run(2, "single", 1, 110.0), run(3, "single", 1, 105.0)], {}).rows,
        (77.0, 86.0, 5.0), strict=True)]
    text = recommendation(busy)
    assert text.count("Caution") == 1, text
    assert "Caution: runs 1, 2: the host was busy with other work (77-86% of its CPU beyond the runs' own ranks" in text
    one = recommendation([busy[0], busy[2]])
    assert "Caution: run 1 (single): the host was busy with other work (77% of its CPU" in one


def test_completed_runs_without_a_steady_state_figure_are_not_called_unfinished() -> None:
    """Runs of one or two steps (every step memory-metered) completed but have no steady-state tokens/s:
    the verdict says that, not "no run completed"."""
    short = [run(1, "single", 1, None), run(2, "single", 1, None)]
    verdict = decide(build_comparison(short, {}).rows)
    assert verdict.kind == "none" and verdict.run_id is None
    assert "No completed run has a steady-state tokens/s" in verdict.text and "No run completed" not in verdict.text
