"""What ``ftui plan`` measured on this host before, for a recipe about to be estimated or composed.

A plan's decision is kept where its trials are: the store, under the plan's id (``plan-...``) in the sweep
column. Nothing else is written: :func:`past_decisions` ranks each stored plan's trials again (the rule
``ftui plan`` printed them with, :func:`runner.service.plan.standings`), so a decision read later is the one
its trials support, and a plan that was resumed and finished reads finished.

A decision applies to a recipe when they share its :class:`PlanKey`: the model's shape (not its name: two
checkpoints of one architecture train alike), the method, precision, context and rows per optimizer step, on
the same host and kind of device. The number of processes is not part of the match: each decision says how
many it raced, so ``ftui estimate`` of a one-process recipe still shows what a plan of 2 measured.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from datetime import datetime

from runner.planner.shapes import ModelShape, resolve_model_shape
from runner.service.plan import PLAN_PREFIX, standings
from runner.spec import strategies as table
from runner.spec.recipe import Recipe, RecipeError, parse_recipe
from store import RunInfo, Store


@dataclass(frozen=True)
class PlanKey:
    """What a plan's decision depends on, besides the processes it raced."""

    shape: tuple[object, ...]
    method: str
    precision: str
    context: int
    global_batch: int
    host: str
    device: str


def shape_signature(shape: ModelShape) -> tuple[object, ...]:
    """The sizes that decide how a model trains (the architecture), not where its weights come from."""
    return (shape.family, shape.total_params, shape.layers, shape.hidden, shape.heads, shape.kv_heads,
            shape.intermediate, shape.vocab, shape.tied_embeddings)


def recipe_key(recipe: Recipe, shape: ModelShape, host: str, device: str) -> PlanKey:
    """The key of ``recipe`` run on ``host`` (the store's host name) with devices of kind ``device``."""
    method = recipe.method.type + (f" r{recipe.method.lora.r}" if recipe.method.type != "full" else "")
    rows = table.global_batch(recipe.launch.strategy, recipe.train.batch_size, recipe.train.grad_accum,
                              recipe.launch.nproc)
    return PlanKey(shape_signature(shape), method, recipe.train.precision, recipe.data.context_length, rows,
                   host, device)


def this_host(recipe: Recipe, shape: ModelShape, on_cpu: bool) -> PlanKey:
    """The key of ``recipe`` run here (the host name the store gives runs started here)."""
    return recipe_key(recipe, shape, socket.gethostname(), "cpu" if on_cpu else "cuda")


@dataclass(frozen=True)
class PastDecision:
    """One stored plan's decision, read again from its trials."""

    plan_id: str
    when: datetime | None
    """When its newest trial started."""
    world: int
    """The most processes a candidate of the plan ran on."""
    kind: str
    """The verdict's kind: ``use`` (a winner), ``tie``, or ``unknown`` (no spread to judge by)."""
    leader: str | None
    """The fastest candidate's label (the winner when ``kind`` is ``use``)."""
    ratio: float | None
    """The leader's median steady-state tokens/s over ``versus``'s."""
    versus: str | None
    """``single`` when it was raced and completed, else the slowest completed candidate."""
    ties: tuple[str, ...]

    def json(self) -> dict[str, object]:
        return {"plan_id": self.plan_id, "when": self.when.isoformat() if self.when else None, "world": self.world,
                "kind": self.kind, "leader": self.leader, "ratio": self.ratio, "versus": self.versus,
                "ties": list(self.ties), "line": self.line()}

    def line(self) -> str:
        """``measured here: ddp x2, 1.92x single (plan plan-q-1a2b, 2026-11-26, 2 processes)``."""
        where = f"plan {self.plan_id}" + (f", {self.when:%Y-%m-%d}" if self.when else "") + f", {self.world} processes"
        if self.kind == "use" and self.leader:
            than = f", {self.ratio:.2f}x {self.versus}" if self.ratio and self.versus else ""
            return f"measured here: {self.leader}{than} ({where})"
        if self.ties:
            return f"measured here: {', '.join(self.ties)} tie ({where})"
        return f"measured here: no decision, one trial each without a measured spread ({where})"


def _decision(store: Store, pid: str, trials: list[RunInfo]) -> PastDecision | None:
    found = standings(store, pid)
    if found is None:
        return None
    ranking = found[1]
    done = [s for s in ranking.standings if s.tokens_per_s is not None]
    if not done:
        return None
    leader = done[0]
    versus = next((s for s in done if s.label == "single"), done[-1])
    ratio = None
    if versus is not leader and leader.tokens_per_s is not None and versus.tokens_per_s is not None:
        ratio = leader.tokens_per_s.median / versus.tokens_per_s.median
    started = [t.started_at for t in trials if t.started_at is not None]
    return PastDecision(pid, max(started) if started else None, max(t.nproc for t in trials),
                        ranking.decision.kind, leader.label, ratio, versus.label if ratio else None,
                        tuple(ranking.ties))


def run_key(trial: RunInfo, shapes: dict[str, ModelShape] | None = None) -> PlanKey | None:
    """The key of a stored trial (None when its recipe or its model's shape cannot be read here). ``shapes``:
    the shapes already read, by model name (a builtin MoE's shape takes a second of CPU to build: its
    tokenizer), filled as they are read."""
    shapes = {} if shapes is None else shapes
    try:
        recipe = parse_recipe(trial.recipe_text, source=f"run {trial.id}")
        name = recipe.model.name
        if name not in shapes:
            shapes[name] = resolve_model_shape(name, allow_network=False).shape
    except (RecipeError, ValueError, OSError):
        return None
    keep = table.global_batch(trial.strategy, recipe.train.batch_size, recipe.train.grad_accum, trial.nproc)
    key = recipe_key(recipe, shapes[name], trial.host or "", trial.device_type or "cpu")
    return PlanKey(key.shape, key.method, key.precision, key.context, keep, key.host, key.device)


def past_decisions(store: Store, key: PlanKey) -> list[PastDecision]:
    """The stored plans whose key is ``key``, newest first."""
    by_plan: dict[str, list[RunInfo]] = {}
    for run in store.list_runs(sweep_prefix=PLAN_PREFIX):
        by_plan.setdefault(str(run.sweep_id), []).append(run)
    out = []
    shapes: dict[str, ModelShape] = {}
    for pid, trials in by_plan.items():
        sample = next((t for t in trials if t.status == "completed"), None)
        if sample is None or run_key(sample, shapes) != key:
            continue
        if (decision := _decision(store, pid, trials)) is not None:
            out.append(decision)
    return sorted(out, key=lambda d: d.when or datetime.min, reverse=True)


def for_recipe(store: Store, recipe: Recipe, shape: ModelShape, on_cpu: bool) -> list[PastDecision]:
    """The stored plans of ``recipe`` as it would run here, newest first."""
    return past_decisions(store, this_host(recipe, shape, on_cpu))
