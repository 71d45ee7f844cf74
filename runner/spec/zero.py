"""The ZeRO stages' rules: what a recipe may ask of the two engines, and whether a run is what it asked for.

``zero1``/``zero2``/``zero3`` (rows of :mod:`runner.spec.strategies`) run on one of two engines
(``launch.engine``), always through ``accelerate launch``:

* ``deepspeed``: accelerate's DeepSpeed integration with a DeepSpeed config built by
  :mod:`runner.spec.deepspeed_config` and kept in the run folder (``deepspeed.json``). On a CPU-only
  machine it trains over gloo (docs/zero.md).
* ``torch``: PyTorch alone. ZeRO-1 is DDP + ``ZeroRedundancyOptimizer``; ZeRO-2 is FSDP2
  ``fully_shard(reshard_after_forward=False)``; ZeRO-3 is ``fully_shard``; offload is FSDP's
  ``CPUOffloadPolicy`` (parameters, gradients and optimizer state together; ``pin_memory=False`` on CPU).

Each rank reads what its prepared model and optimizer really are (:func:`runner.rank.sharding.in_effect`);
:func:`mismatch` compares that with the table's :class:`runner.spec.strategies.Engine`, so a run that silently
became something else fails with the reason. Everything here is pure (no torch import).
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Any

from runner.spec import strategies

if TYPE_CHECKING:
    from runner.spec.recipe import Recipe


def recipe_problem(recipe: Recipe) -> str | None:
    """What is wrong with the recipe's engine and offload choice (one line naming the field), or None."""
    launch = recipe.launch
    row = strategies.get(launch.strategy)
    try:
        resolved = row.with_engine(launch.engine)
    except KeyError:
        return (f"launch.engine: strategy {row.name!r} runs on "
                f"{strategies.choices_text(('auto', *row.engine_names()))}, got {launch.engine!r}")
    engine = resolved.engine_row()
    offloads = engine.offloads if engine is not None else ("none",)
    if launch.offload not in offloads:
        if engine is None:
            return f"launch.offload: only the ZeRO stages offload (launch.strategy is {row.name!r})"
        return (f"launch.offload: {row.name} on the {engine.name} engine takes "
                f"{strategies.choices_text(offloads)}, got {launch.offload!r}"
                + (" (FSDP offloads parameters with their optimizer state)" if engine.offloads_grads else ""))
    if resolved.accelerate_type == "DEEPSPEED" and recipe.train.on_nan == "skip":
        return "train.on_nan: 'skip' is not supported on the deepspeed engine (its step owns the update); use 'stop'"
    if not checkpoints_supported(resolved):
        if recipe.train.save_every:
            return (f"train.save_every: checkpoints of {row.name} on the {resolved.engine} engine are not "
                    "supported yet; set 0")
        if recipe.train.resume_from:
            return f"train.resume_from: {row.name} on the {resolved.engine} engine cannot resume yet"
    return None


def checkpoints_supported(strategy: strategies.Strategy) -> bool:
    """Whether the trainer's checkpoints (accelerate ``save_state``) hold everything of this strategy's run:
    not yet for DeepSpeed, ZeroRedundancyOptimizer (which accelerate does not prepare), pipelines or tensor
    parallelism."""
    return strategy.checkpoints


ENGINE_PACKAGES: dict[str, tuple[str, str]] = {
    "deepspeed": ("deepspeed", "pip install -e '.[deepspeed]', with DS_BUILD_OPS=0 on a machine without CUDA"),
}
"""The package an engine imports beyond ftui's own dependencies, and how to install it."""


def engine_missing(engine: str) -> str | None:
    """Why ``engine`` cannot run on this machine (a one-line reason naming the fix), or None."""
    needed = ENGINE_PACKAGES.get(engine)
    if needed is not None and importlib.util.find_spec(needed[0]) is None:
        return f"launch.engine: {needed[0]} is not installed ({needed[1]}), or use launch.engine = 'torch'"
    return None


def mismatch(strategy: strategies.Strategy, offload: str, seen: dict[str, Any]) -> str | None:
    """Why the run is not the strategy asked for (one line), or None when engine, stage and offload match."""
    engine = strategy.engine_row()
    if engine is None:
        return None
    wanted = (engine.name, engine.stage, offload)
    got = (seen.get("engine"), seen.get("stage"), seen.get("offload"))
    if wanted == got:
        return None
    return (f"launch.strategy: asked for {strategy.name} on the {engine.name} engine ({engine.how}, offload "
            f"{offload}) but the rank runs {seen.get('how')} (engine {got[0]}, stage {got[1]}, offload {got[2]}); "
            "the run was stopped")
