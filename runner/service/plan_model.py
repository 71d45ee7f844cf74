"""A plan's performance model (:mod:`runner.analysis.perf_model`) fitted on its raced trials: a prediction of
tokens/s for every candidate (raced or not), each raced one's error held out, and what the plan did not race:
each raced strategy at twice its processes (where the strategies table and this host take them) and at
twice its micro-batch (the accumulation kept, so the global batch doubles)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from runner.analysis import perf_model as pm
from runner.analysis.ranking import Ranking, Standing
from runner.service.plan import Candidate, Progress, Setup
from runner.spec import strategies as table
from runner.spec.recipe import Recipe
from runner.watch.host import nproc_over_host, runs_on_cpu
from store import RunInfo

ACT_BYTES = {"fp32": 4}
"""Bytes of an activation element by ``train.precision`` (16-bit otherwise: bf16, fp16, fp8's own casts)."""


def workload(runs: Sequence[RunInfo], base: Recipe) -> pm.Workload | None:
    """The model's bytes and shape from a trial's summary (the whole parameters and gradients the ranks
    counted, the model's dimensions); a trial whose strategy shards nothing first. None without one."""
    def unsharded(r: RunInfo) -> bool:
        return not table.get(r.strategy).shards if r.strategy in table.STRATEGIES else False

    for r in sorted(runs, key=lambda r: not unsharded(r)):
        s = r.summary
        rank = (s.ranks or [{}])[0]
        dims = s.model_dims or {}
        if rank.get("param_whole_bytes") and rank.get("grad_whole_bytes") is not None and dims.get("layers"):
            return pm.Workload(int(rank["param_whole_bytes"]), int(rank.get("grad_whole_bytes") or 0),
                               int(dims["layers"]), int(dims["heads"]) * int(dims["head_dim"]), int(dims["seq_len"]),
                               ACT_BYTES.get(base.train.precision, 2),
                               f"run {r.id}: the ranks' whole parameter and gradient bytes, the model's dimensions")
    return None


def layout(c: Candidate, base: Recipe, nproc: int | None = None, micro_batch: int | None = None) -> pm.Layout | None:
    """The candidate's layout (at another ``nproc`` or ``micro_batch`` where given); None without a batch
    split (not launchable)."""
    if c.split is None:
        return None
    return pm.layout_of(c.strategy, nproc or c.nproc, micro_batch or c.split.micro_batch, c.split.grad_accum,
                        c.engine, base.launch.microbatches, base.launch.tp_size)


@dataclass(frozen=True)
class WhatIf:
    """A configuration the plan did not race, predicted."""

    label: str
    change: str
    prediction: pm.Prediction


@dataclass
class PlanModel:
    fit: pm.Fit
    work: pm.Workload | None
    predicted: dict[str, pm.Prediction | None] = field(default_factory=dict)
    checked: dict[str, pm.Checked] = field(default_factory=dict)
    what_if: list[WhatIf] = field(default_factory=list)

    def source(self) -> str:
        """Where the model's figures come from, or why there is none."""
        return self.fit.device.source if self.fit.device else f"not fitted: {self.fit.why}"

    def candidate_json(self, label: str) -> dict[str, Any] | None:
        """A candidate's ``predicted``: tokens/s, the step's parts, the source; for a raced one, those of the fit
        without its trials, and their error."""
        pred = self.predicted.get(label)
        checked = self.checked.get(label)
        if pred is None and checked is None:
            return None
        if checked is None:
            return prediction_json(pred) if pred else {"tokens_per_s": None}
        # raced: the prediction of a fit without its trials, so that the error is never of a fitted figure
        out: dict[str, Any] = prediction_json(checked.held_out) if checked.held_out else {"tokens_per_s": None}
        out["held_out"] = True
        out["fitted_tokens_per_s"] = round(pred.tokens_per_s, 1) if pred else None
        out["error_pct"] = None if checked.error_pct is None else round(checked.error_pct, 1)
        out["error_source"] = ("runner.spec.summary.error_pct of the prediction by a fit without this candidate's "
                               "trials against its measured median tokens/s" + (f" ({checked.why})"
                                                                                if checked.why else ""))
        return out

    def json(self) -> dict[str, Any]:
        device = self.fit.device
        bandwidth = device.bandwidth if device else None
        return {
            "source": self.source(), "workload": self.work.source if self.work else None,
            "fitted_on": list(self.fit.fitted_on),
            "bandwidth_bytes_per_s": None if bandwidth is None or math.isinf(bandwidth) else round(bandwidth),
            "latency_s": device.latency_s if device else None,
            "compute_s_per_token": {str(n): r.compute_s_per_token for n, r in device.rates.items()} if device else {},
            "overhead_s_per_microbatch": {str(n): r.overhead_s for n, r in device.rates.items()} if device else {},
            "not_raced": [{"label": w.label, "change": w.change, **prediction_json(w.prediction)}
                          for w in self.what_if],
        }


def prediction_json(p: pm.Prediction) -> dict[str, Any]:
    return {"tokens_per_s": round(p.tokens_per_s, 1), "step_s": round(p.step_s, 4),
            "compute_s": round(p.compute_s, 4), "bubble_s": round(p.bubble_s, 4), "comm_s": round(p.comm_s, 4),
            "overhead_s": round(p.overhead_s, 4), "source": p.source}


def trials(setup: Setup, progress: Progress, ranking: Ranking) -> list[pm.TrialFigures]:
    """The completed candidates' measured figures (median tokens/s and step shares over their trials)."""
    by_run: dict[int, Standing] = {rid: s for s in ranking.standings for rid in s.run_ids}
    out = []
    for c in setup.candidates:
        ids = [r.id for r in progress.runs.get(c.key(), [])]
        s = next((by_run[i] for i in ids if i in by_run), None)
        lay = layout(c, setup.base)
        if s is None or s.tokens_per_s is None or lay is None or s.status != "completed":
            continue
        shares = dict(s.time_split.shares) if s.time_split else None
        out.append(pm.TrialFigures(c.label, lay, s.tokens_per_s.median, shares, tuple(s.run_ids)))
    return out


def _host_takes(base: Recipe, strategy: str, nproc: int) -> bool:
    """Whether the strategies table and this host take ``strategy`` at ``nproc`` processes."""
    on_cpu = runs_on_cpu(base)
    if table.get(strategy).nproc_problem(nproc, on_cpu) is not None:
        return False
    return nproc_over_host(base.model_copy(update={"launch": base.launch.model_copy(update={"nproc": nproc})})) is None


def _what_if(setup: Setup, device: pm.Device, work: pm.Workload, raced: Sequence[str],
             takes: Callable[[str, int], bool]) -> list[WhatIf]:
    """Each raced strategy (its first engine raced) at twice its processes, where the strategies table and
    this host take them, and at twice its micro-batch."""
    out: list[WhatIf] = []
    seen: set[str] = set()
    for c in setup.candidates:
        if c.label not in raced or c.split is None or c.strategy in seen:
            continue
        seen.add(c.strategy)
        for label, change, lay in (
                (f"{c.strategy} x{2 * c.nproc}", f"{2 * c.nproc} processes, micro-batch {c.split.micro_batch} kept",
                 layout(c, setup.base, nproc=2 * c.nproc) if takes(c.strategy, 2 * c.nproc) else None),
                (c.label, f"micro-batch {2 * c.split.micro_batch} and accumulation kept, so twice the global batch",
                 layout(c, setup.base, micro_batch=2 * c.split.micro_batch))):
            pred = pm.predict(device, work, lay) if lay is not None else None
            if pred is not None:
                out.append(WhatIf(label, change, pred))
    return out


def _unfitted_why(setup: Setup, ranking: Ranking | None, any_run: bool) -> str:
    """Why no trial fits the model: none ran, none stored the model's figures, or the plan's record with each
    candidate's batch split is gone (a plan rebuilt from its trials in the store)."""
    if not any_run or ranking is None:
        return "no completed trial"
    if any(c.split is None for c in setup.candidates):
        return "the plan's record (each candidate's micro-batch and accumulation) is not on this host"
    return "no trial stored the model's parameter bytes and dimensions"


def model_of(setup: Setup, progress: Progress, ranking: Ranking | None,
             takes: Callable[[str, int], bool] | None = None) -> PlanModel:
    """The plan's model fitted on its completed trials, its predictions and held-out errors (``takes``:
    whether a strategy runs at a process count here; default, the strategies table and this host)."""
    runs = [r for found in progress.runs.values() for r in found]
    work = workload(runs, setup.base)
    measured = trials(setup, progress, ranking) if ranking is not None else []
    if work is None or not measured:
        return PlanModel(pm.Fit(None, _unfitted_why(setup, ranking, bool(runs))), work)
    shares_host = runs_on_cpu(setup.base)
    fitted = pm.fit(measured, work, shares_host)
    model = PlanModel(fitted, work)
    if fitted.device is None:
        return model
    for c in setup.candidates:
        lay = layout(c, setup.base)
        model.predicted[c.label] = pm.predict(fitted.device, work, lay) if lay is not None else None
    model.checked = {k.label: k for k in pm.held_out(measured, work, shares_host)}
    model.what_if = _what_if(setup, fitted.device, work, [t.label for t in measured],
                             takes or (lambda s, n: _host_takes(setup.base, s, n)))
    return model
