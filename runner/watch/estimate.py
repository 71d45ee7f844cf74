"""The planner's memory estimate of one device of a run (``runner.planner``), as stored in the run's
summary at prepare time so that ``ftui show`` can set it against the measured bytes, and as the
pre-flight compares it with the free memory of the GPUs."""

from __future__ import annotations

from dataclasses import asdict, replace
from typing import Any

from runner.planner import breakdown_json, estimate, inputs_from_recipe, resolve_model_shape
from runner.planner.deepspeed import trainable_elements
from runner.planner.error_band import band_of, key_of
from runner.spec import strategies
from runner.spec.recipe import Recipe
from runner.spec.script import described
from runner.watch.host import runs_on_cpu
from runner.watch.library import cached_term


def estimate_summary(recipe: Recipe) -> dict[str, Any]:
    """The estimate of one device of this run. Never fails a run: a model whose shape cannot be had
    offline gets ``{"error": ...}``."""
    if "model" not in described(recipe):
        return {"error": "not reported: the script run's recipe has no model section"}
    try:
        source = resolve_model_shape(recipe.model.name, allow_network=False)
        inp = inputs_from_recipe(recipe, shape=source.shape)
        if runs_on_cpu(recipe):
            inp = replace(inp, device="cpu")
            if strategies.get(inp.strategy).layer_split and recipe.launch.nproc == 1:
                inp = replace(inp, n_devices=1)  # one device on CPU: mp is the single-process run
        breakdown = estimate(inp)
        band = band_of(inp)
        return {
            "per_device_bytes": breakdown_json(breakdown),
            "strategy": inp.strategy,
            "n_devices": inp.n_devices,
            "micro_batch": inp.micro_batch,
            "seq_len": inp.seq_len,
            "model": source.note,
            "precision": inp.precision,
            "param_dtype": inp.param_dtype or "auto",
            "device": inp.device,
            **({"approximate": breakdown.approximate} if breakdown.approximate else {}),
            "band_key": key_of(inp),
            "error_band": None if band is None else asdict(band),
            "library": dict(cached_term(recipe)),  # its own line, never in per_device_bytes
        }
    except Exception as exc:  # noqa: BLE001 (an estimate is informative only)
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}


def trainable_count(recipe: Recipe) -> int | None:
    """The run's trainable parameter count from the model's shape (what caps DeepSpeed's buckets in the
    config ftui writes); None when the shape cannot be had offline or the recipe names no model."""
    if "model" not in described(recipe):
        return None
    try:
        return trainable_elements(inputs_from_recipe(recipe, allow_network=False))
    except Exception:  # noqa: BLE001 (the configured bucket sizes stand)
        return None
