"""The one pre-flight of every launch, for ``ftui run`` and the TUI's Launch alike.

:func:`runner.watch.orchestrator.preflight` refuses what cannot run (it calls
:func:`runner.watch.inputs.check_inputs`); this adds the warnings a person should see before a launch:
the recipe's inputs (:func:`runner.watch.inputs.input_warnings`) and busy or too-small GPUs.
"""

from __future__ import annotations

import os

from runner.spec import strategies
from runner.spec.recipe import Recipe


def launch_checks(recipe: Recipe, fake_gpus: int = 0) -> list[str]:
    """Check a recipe before launch.

    Args:
        recipe: the validated recipe.
        fake_gpus: scripted GPUs of the demo mode (0: the real NVML).

    Returns:
        Warnings, one line each (empty when nothing is worth saying).

    Raises:
        runner.watch.orchestrator.PreflightError: the run cannot start (a RecipeError naming the field).
        runner.watch.inputs.InputError: its data or folders are unusable.
    """
    from runner.watch import orchestrator
    from runner.watch.inputs import input_warnings

    warnings = orchestrator.preflight(recipe)
    return warnings + input_warnings(recipe) + gpu_warnings(recipe, fake_gpus)


def gpu_warnings(recipe: Recipe, fake_gpus: int = 0) -> list[str]:
    """Busy GPUs, and GPUs with less free memory than the plan needs per device (the estimate), among
    those the run will use; and the CUDA_VISIBLE_DEVICES mapping.

    Args:
        recipe: the validated recipe.
        fake_gpus: scripted GPUs of the demo mode (0: the real NVML).

    Returns:
        One line each; empty on a CPU run or a machine without GPUs.
    """
    from runner.hardware import check_gpus_free, visible_mapping
    from runner.watch.orchestrator import estimate_summary, probe_for

    probe = probe_for(fake_gpus)
    count = probe.nvml.device_count()
    if count == 0 or recipe.launch.device == "cpu":
        return []
    need = estimate_summary(recipe).get("per_device_bytes", {}).get("total")
    if need is not None:  # plus what ftui estimate reserves per GPU (CUDA context, NCCL, allocator slack)
        from runner.planner import DEFAULT_RESERVE, parse_bytes

        need += parse_bytes(DEFAULT_RESERVE)
    visible = (",".join(map(str, recipe.launch.gpus)) if recipe.launch.gpus is not None
               else os.environ.get("CUDA_VISIBLE_DEVICES"))
    layer_split = strategies.get(recipe.launch.strategy).layer_split
    mapping = visible_mapping(visible, count)[: None if layer_split else recipe.launch.nproc]
    notes = ["GPUs (CUDA index -> physical): " + ", ".join(f"cuda:{lo} -> GPU {phys}" for lo, phys in mapping)]
    return notes + list(check_gpus_free(probe, [phys for _, phys in mapping], need_bytes=need))
