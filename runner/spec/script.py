"""Script runs: your own training script (accelerate, Hugging Face Trainer, TRL) launched and watched by ftui.

A recipe with ``[launch] script = "train.py"`` (or ``ftui run --script train.py -- ARGS``) is launched with
the accelerate config ftui generates for its strategy (:func:`runner.spec.launch.accelerate_config`, as for its
own trainer); each rank runs :mod:`runner.rank.script_run`, which runs the script. The run folder, process
group, telemetry, hang detection, stop/kill and status are the same as a recipe run's. What the script
reports comes through :mod:`runner.track` (or :class:`runner.track_hf.FtuiCallback`); what it does not
report is "not reported", never a guess.

The model, data and method sections of such a recipe are optional and only describe the run (the
planner's estimate, the run table): :func:`described` tells which were written.
"""

from __future__ import annotations

import os
from pathlib import Path

from runner.spec.recipe import Recipe, RecipeError

DESCRIBING = ("model", "data", "method")
"""Sections a script run's recipe may give to describe the run; the script itself ignores them."""

METHOD = "script"
"""The ``runs.method`` of a script run whose recipe has no method section."""


def is_script(recipe: Recipe) -> bool:
    """Whether the recipe launches a script of its own (``launch.script``)."""
    return recipe.launch.script is not None


def described(recipe: Recipe) -> frozenset[str]:
    """The describing sections the recipe really wrote (all of them for a recipe run)."""
    if not is_script(recipe):
        return frozenset(DESCRIBING)
    return frozenset(s for s in DESCRIBING if s in recipe.model_fields_set)


def store_method(recipe: Recipe) -> str:
    """What ``runs.method`` records: the method, or ``script`` when a script run does not say."""
    return recipe.method.type if "method" in described(recipe) else METHOD


def store_model(recipe: Recipe) -> str:
    """What ``runs.model`` records: the model, or ``script:<file name>`` when a script run does not say."""
    if "model" in described(recipe):
        return recipe.model.name
    return f"script:{Path(str(recipe.launch.script)).name}"


def check_script(recipe: Recipe) -> None:
    """The script file exists and can be read.

    Raises:
        RecipeError: one line naming ``launch.script`` and the file.
    """
    script = recipe.launch.script
    if script is None:
        return
    path = Path(script).expanduser()
    if not path.exists():
        raise RecipeError(f"launch.script: {script}: no such file", field="launch.script",
                          problem=f"{script}: no such file")
    if not path.is_file():
        raise RecipeError(f"launch.script: {script}: not a file", field="launch.script",
                          problem=f"{script}: not a file")
    if not os.access(path, os.R_OK):
        raise RecipeError(f"launch.script: {script}: cannot be read", field="launch.script",
                          problem=f"{script}: cannot be read")
