"""The builtin tiny Mixtral (2 layers of 4 experts, top-2) trained by ``ftui run`` under DDP and FSDP on CPU:
the loss falls, the planner's estimate is within 5% of the measured peak (every expert's weights, the routed
experts' activations), and the router's load is journaled and shown by ``ftui show`` and ``ftui compare``."""

from __future__ import annotations

from typing import Any

from runner.rank.router_load import LOAD_MAX_OVER_MEAN, LOAD_MIN_OVER_MEAN, ROUTED_TOKENS
from runner.spec.summary import RunSummary
from tests.support import ROOT, Ftui
from tui.render.report import estimate_vs_measured

RECIPE = ROOT / "recipes" / "tiny-moe.toml"
STEPS, CONTEXT, ROWS = 3, 32, 4


def _train(ftui: Ftui, strategy: str) -> dict[str, Any]:
    name = f"moe-{strategy}"
    ftui.run("run", str(RECIPE), "--name", name, "--set", f"launch.strategy={strategy}", "--set", "launch.nproc=2",
             "--set", f"train.max_steps={STEPS}", "--set", f"data.context_length={CONTEXT}",
             "--set", f"train.batch_size={ROWS}", check=True, timeout=900)
    run_id = next(r["id"] for r in ftui.runs() if r["name"] == name)
    return ftui.show(run_id)


def _check(run: dict[str, Any], ftui: Ftui) -> None:
    assert run["status"] == "completed"
    losses = [m["loss"] for m in run["metrics"]]
    assert len(losses) == STEPS and losses[-1] < losses[0], losses
    rows = {kind: (est, meas, err) for kind, est, meas, err in estimate_vs_measured(RunSummary.from_json(run["summary"]))}
    for kind in ("peak", "forward peak", "backward peak", "optimizer-step peak"):
        assert rows[kind][2] is not None and abs(rows[kind][2]) <= 5, (run["strategy"], kind, rows)
    named = run["named_metrics"]
    assert [p["step"] for p in named[LOAD_MAX_OVER_MEAN]] == list(range(1, STEPS + 1))
    # Every token of both ranks' rows goes to 2 experts in each layer; the busiest expert has at least the mean
    # and at most all of a layer's assignments (4 experts: 4 times the mean); the idlest at most the mean.
    assert {p["value"] for p in named[ROUTED_TOKENS]} == {2 * ROWS * CONTEXT * 2}
    assert all(1 <= p["value"] <= 4 for p in named[LOAD_MAX_OVER_MEAN])
    assert all(0 <= p["value"] <= 1 for p in named[LOAD_MIN_OVER_MEAN])
    shown = " ".join(ftui.call("show", str(run["id"]), check=True).stdout.split())
    assert "named metrics (last value)" in shown and LOAD_MAX_OVER_MEAN in shown


def test_a_mixture_of_experts_trains_under_ddp_and_fsdp_and_reports_its_router_load(ftui: Ftui) -> None:
    ddp, fsdp = _train(ftui, "ddp"), _train(ftui, "fsdp")
    for run in (ddp, fsdp):
        _check(run, ftui)
    # The same rows from the same init: at step 1 both layouts route the same tokens to the same experts (the
    # counts are summed over ranks before the summary); later steps' weights differ in float summation order.
    for name in (LOAD_MAX_OVER_MEAN, LOAD_MIN_OVER_MEAN):
        assert fsdp["named_metrics"][name][0]["value"] == ddp["named_metrics"][name][0]["value"]
    table = ftui.call("compare", str(ddp["id"]), str(fsdp["id"]), "--format", "md", check=True).stdout
    assert f"{LOAD_MAX_OVER_MEAN} (last)" in table
