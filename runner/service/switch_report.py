"""Every efficiency switch of a recipe, for ``ftui estimate`` and Compose: its state, what turning it does to
the estimate (:func:`runner.planner.switch_effects.switch_effects`) and whether it can run here (one line why
not: the recipe's rules, ``runner/spec/switches.py``, ``runner/spec/kernels.py``, ``runner/spec/layout.py``,
and this host's, :func:`runner.watch.preflight.host_problem`; the texts are theirs). And the switch the
recommendation may propose: the largest estimated memory cut beyond the estimate's error band, and a tokens/s
difference measured on this host beyond the runs' measured spread (:mod:`runner.analysis.verdict`)."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from runner.analysis import verdict
from runner.analysis.compare import load_comparison
from runner.analysis.run_figures import Kernels
from runner.planner.error_band import band_of, key_of
from runner.planner.inputs import EstimateInput
from runner.planner.recommend import fit_band
from runner.planner.shapes import ModelShape
from runner.planner.switch_effects import SwitchEffect, switch_effects
from runner.service.decisions import run_key, this_host
from runner.spec.recipe import Recipe
from runner.watch.host import runs_on_cpu
from runner.watch.preflight import host_problem
from store import Store

NVME_PLACEHOLDER = "/nvme"
"""The folder a ``launch.offload = "nvme"`` variant names (``launch.nvme_path`` is required with it); only its
presence is checked."""

RUNS_SEARCHED = 200
"""The newest completed runs searched for measurements of a switch on this host."""


@dataclass(frozen=True)
class SwitchRow:
    """One switch turned to one other state: what it does to the estimate, and why it cannot run here."""

    effect: SwitchEffect
    problem: str | None
    """Why not here (one line naming the field), None when it can run."""

    def line(self) -> str:
        """``model.attn_implementation sdpa -> eager: activations ... (+34%, estimated); runs here``."""
        where = "runs here" if self.problem is None else f"not here: {self.problem}"
        e = self.effect
        return f"{e.field} {e.state} -> {e.to}: {e.sentence()}; {where}"

    def json(self) -> dict[str, Any]:
        e = self.effect
        return {"field": e.field, "state": e.state, "to": e.to, "part": e.part or None, "before_bytes": e.before,
                "after_bytes": e.after, "change": e.change, "runs_here": self.problem is None,
                "problem": self.problem, "line": self.line()}


def _value(text: str) -> bool | int | str:
    if text in ("true", "false"):
        return text == "true"
    return int(text) if text.isdigit() else text


def variant(recipe: Recipe, field: str, to: str) -> Recipe:
    """``recipe`` with ``field`` at ``to`` (not validated: :func:`problem` validates it)."""
    section, name = field.split(".")
    update: dict[str, Any] = {name: _value(to)}
    if field == "launch.offload" and to == "nvme":
        update["nvme_path"] = NVME_PLACEHOLDER
    return recipe.model_copy(update={section: getattr(recipe, section).model_copy(update=update)})


def problem(recipe: Recipe, field: str, to: str) -> str | None:
    """Why ``recipe`` with ``field`` at ``to`` cannot run here: what the host lacks first, else what the
    recipe's rules refuse (one line naming the field); None when it can."""
    changed = variant(recipe, field, to)
    lacking = host_problem(changed)
    if lacking:
        return lacking
    try:
        Recipe.model_validate(changed.model_dump())
    except ValidationError as exc:
        return str(exc.errors()[0]["msg"]).removeprefix("Value error, ")
    return None


def switch_rows(recipe: Recipe, inp: EstimateInput) -> list[SwitchRow]:
    """Every switch of ``recipe`` (estimated as ``inp``) turned to each other state, and whether it runs here."""
    return [SwitchRow(e, problem(recipe, e.field, e.to)) for e in switch_effects(inp)]


def memory_proposal(rows: list[SwitchRow], inp: EstimateInput) -> str | None:
    """The switch that runs here and cuts its part of the estimate the most, when the cut is beyond the
    estimate's error band for this family and strategy (:func:`runner.planner.recommend.fit_band`): ``sdpa
    instead of eager cuts activations by 38% here (estimate)``."""
    key = key_of(inp)
    band, _ = fit_band(key, band_of(inp))
    cuts = [r for r in rows if r.problem is None and r.effect.change is not None and -r.effect.change > band]
    if not cuts:
        return None
    best = min(cuts, key=lambda r: r.effect.change or 0.0).effect
    return (f"{best.field} = {best.to} (instead of {best.state}) cuts {best.part} by "
            f"{-(best.change or 0.0) * 100:.0f}% here (estimate; beyond its error band of {band * 100:.0f}% for "
            f"{key})")


def _kernel_state(k: Kernels | None) -> tuple[str, bool] | None:
    return None if k is None else (k.attention or "sdpa", k.compile_mode is not None)


def speed_proposals(store: Store, recipe: Recipe, shape: ModelShape, rows: list[SwitchRow]) -> list[str]:
    """What completed runs of this recipe's training on this host (same model shape, method, precision,
    context, global batch, strategy and processes: :func:`runner.service.decisions.this_host`) measured of
    the attention and compile switches that run here: a line each for a kernel choice whose tokens/s differs
    from the recipe's own beyond the measured spread (:func:`runner.analysis.verdict.compare_pair`)."""
    key = this_host(recipe, shape, runs_on_cpu(recipe))
    launch = recipe.launch
    shapes: dict[str, ModelShape] = {recipe.model.name: shape}
    ids = [r.id for r in store.list_runs(status="completed", limit=RUNS_SEARCHED)
           if r.host == socket.gethostname() and r.strategy == launch.strategy and r.nproc == launch.nproc
           and run_key(r, shapes) == key]
    if len(ids) < 2:
        return []
    cmp = load_comparison(store, sorted(ids))
    found = verdict.groups(cmp.rows)
    own = (recipe.model.attn_implementation or "sdpa", recipe.train.compile)
    home = next((g for g in found if _kernel_state(g.rows[0].kernels) == own), None)
    if home is None:
        return []
    floor = verdict.repeat_floor(found) or cmp.floor
    runnable = {(r.effect.field, r.effect.to) for r in rows if r.problem is None}
    out = []
    for g in found:
        state = _kernel_state(g.rows[0].kernels)
        if g is home or state is None:
            continue
        if state[0] != own[0] and state[1] == own[1] and ("model.attn_implementation", state[0]) in runnable:
            what = f"model.attn_implementation = {state[0]}"
        elif state[1] != own[1] and state[0] == own[0] and ("train.compile", str(state[1]).lower()) in runnable:
            what = f"train.compile = {str(state[1]).lower()}"
        else:
            continue
        pair = verdict.compare_pair(g, home, floor)
        if pair.kind == "use":
            out.append(f"{what}: {(pair.ratio - 1) * 100:+.0f}% tokens/s measured on this host ({g.label} "
                       f"{g.runs()} against {home.label} {home.runs()}; {pair.why})")
    return out
