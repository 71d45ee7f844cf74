"""A plan's performance model wired in (runner/service/plan_model.py, tui/render/plan.py), without training:
trials written by hand with the figures a plan stores (tokens/s, the ranks' profiled step, the model's bytes
and dimensions), the predictions derived from those figures and the module's formulas."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from runner.analysis import time_split
from runner.analysis.compare import build_comparison
from runner.analysis.ranking import rank
from runner.service import plan
from runner.service.plan_model import model_of
from runner.spec.recipe import load_recipe
from tests.support import run_info

QUICKSTART = Path(__file__).resolve().parents[2] / "recipes" / "quickstart.toml"
PARAM_BYTES, GRAD_BYTES = 50_000_000, 480_000
DIMS = {"layers": 6, "heads": 4, "head_dim": 64, "seq_len": 64, "embedding_params": 0}


def _trial(id_: int, strategy: str, nproc: int, tps: float, shares: dict[str, float]) -> Any:
    """A completed trial of quickstart at context 64 whose ranks each profiled a step of ``shares``."""
    ranks = [{"rank": r, "param_whole_bytes": PARAM_BYTES, "grad_whole_bytes": GRAD_BYTES,
              "step_split": {"wall_s": 1.0, **{f"{k}_s": v for k, v in shares.items()}, "source": "test"}}
             for r in range(nproc)]
    run = run_info(id_, strategy, nproc, tps, ranks=ranks, model_dims=DIMS)
    micro = 2 if nproc == 2 else 4
    return dataclasses.replace(run, recipe_text=run.recipe_text + f"[train]\nbatch_size = {micro}\n")


def _plan() -> tuple[plan.Setup, plan.Progress, Any]:
    base = load_recipe(QUICKSTART, ["data.context_length=64"])
    cands = plan.search_space(base, ["single", "ddp", "fsdp"], 2,
                              lambda more: load_recipe(QUICKSTART, ["data.context_length=64", *more]),
                              lambda r: None, plan.Memory(2**36, True, "test"), lambda n: None, True)
    by = {c.strategy: c for c in cands}
    cands = [dataclasses.replace(c, skip="over the --budget") if c.strategy == "fsdp" else c for c in cands]
    runs = [_trial(1, "single", 1, 1000.0, {"compute": 0.9, "comm": 0.0, "data": 0.0, "other": 0.1}),
            _trial(2, "ddp", 2, 1500.0, {"compute": 0.8, "comm": 0.15, "data": 0.0, "other": 0.05})]
    progress = plan.Progress(runs={by["single"].key(): [runs[0]], by["ddp"].key(): [runs[1]]})
    splits = {r.id: s for r in runs if (s := time_split.of_run(r.summary)) is not None}
    ranking = rank(build_comparison(runs, {}).rows, None, None, splits)
    return plan.Setup(base, "plan-m", cands, plan.Memory(2**36, True, "test"), 8, 1), progress, ranking


def test_the_plans_model_predicts_every_candidate_from_the_trials_figures() -> None:
    setup, progress, ranking = _plan()
    model = model_of(setup, progress, ranking, takes=lambda s, n: s != "single")  # single: one process only
    ddp_step = 4 * 64 / 1500.0  # rows a step x tokens a row / measured tokens/s
    # DDP is the only trial at 2 processes and its shares add up to 1: the fit gives it back exactly
    assert model.predicted["ddp x2"] is not None
    assert model.predicted["ddp x2"].tokens_per_s == pytest.approx(1500.0)
    # single held out: DDP's compute per token (the rank computed 2 rows), halved on a host the ranks share
    c1 = 0.8 * ddp_step / (2 * 64) / 2
    held = model.checked["single"]
    assert held.held_out is not None
    assert held.held_out.tokens_per_s == pytest.approx(4 * 64 / (4 * 64 * c1 + 0.05 * ddp_step))
    assert held.error_pct == pytest.approx((held.held_out.tokens_per_s - 1000.0) / 10.0)
    # FSDP, not raced: DDP's compute and overhead, with the weights gathered twice over the bandwidth DDP's
    # gradient all-reduce measured
    fsdp = model.predicted["fsdp x2"]
    per_byte = 0.15 * ddp_step / GRAD_BYTES
    assert fsdp is not None and fsdp.comm_s == pytest.approx((GRAD_BYTES + 2 * PARAM_BYTES / 2) * per_byte)
    assert fsdp.tokens_per_s < 1500.0
    # not raced: each raced strategy at twice its processes (where taken) and at twice its micro-batch
    assert [(w.label, w.change.split(",")[0]) for w in model.what_if] == [
        ("single", "micro-batch 8 and accumulation kept"),
        ("ddp x4", "4 processes"), ("ddp x2", "micro-batch 4 and accumulation kept")]
    ddp4 = model.what_if[1].prediction
    assert ddp4.compute_s == pytest.approx(model.predicted["ddp x2"].compute_s * 2)  # 4 ranks share the host


def test_the_report_shows_predictions_errors_and_what_was_not_raced() -> None:
    from rich.console import Console

    from tui.render.plan import plan_markdown, plan_report, plan_table

    setup, progress, ranking = _plan()
    report = plan_report(setup, progress, ranking)
    entries = {e["label"]: e for e in report["candidates"]}
    single = entries["single"]["predicted"]
    assert single["held_out"] and single["error_pct"] is not None and "error_pct" in single["error_source"]
    assert entries["fsdp x2"]["status"] == "not raced" and entries["fsdp x2"]["predicted"]["tokens_per_s"] > 0
    assert "held_out" not in entries["fsdp x2"]["predicted"]
    model = report["performance_model"]
    assert model["fitted_on"] == ["ddp x2", "single"] and model["bandwidth_bytes_per_s"] > 0
    console = Console(width=200, record=True)
    console.print(plan_table(report))
    text = console.export_text()
    assert "predicted" in text and "model err" in text and f"{single['error_pct']:+.0f}%" in text
    assert "performance model: fitted on ddp x2, single" in text
    assert any(line.startswith("- predicted, not raced: ddp x2, micro-batch 4") for line in
               plan_markdown(report).splitlines())
    # at 80 columns: two tables, every header and label whole, nothing past the edge
    narrow = Console(width=80, record=True)
    narrow.print(plan_table(report, narrow.width))
    lines = narrow.export_text().splitlines()
    assert max(map(len, lines)) <= 80 and "…" not in "".join(lines)
    for header in ("candidate", "tokens/s", "predicted", "model err", "est. mem", "meas. mem", "1st step", "runs"):
        assert header in "\n".join(lines), header
    assert sum("fsdp x2" in line for line in lines) >= 2  # a row in each table


def test_a_plan_rebuilt_without_its_record_says_why_it_has_no_model() -> None:
    """A plan rebuilt from its trials in the store has no batch split per candidate: no model, and the reason
    names the missing record rather than the trials."""
    setup, progress, ranking = _plan()
    unsplit = [dataclasses.replace(c, split=None) for c in setup.candidates]
    model = model_of(dataclasses.replace(setup, candidates=unsplit), progress, ranking)
    assert model.fit.device is None
    assert model.source() == "not fitted: the plan's record (each candidate's micro-batch and accumulation) is not on this host"
    assert model_of(setup, plan.Progress(runs={}), None).source() == "not fitted: no completed trial"
