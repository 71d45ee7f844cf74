"""The kernels a run trains with: the attention implementation transformers dispatches to
(``model.attn_implementation``) and torch.compile of each decoder layer (``train.compile``,
``train.compile_mode``).

What a recipe may ask is decided here as data (:func:`recipe_problem`: the recipe validator calls it), and
what this host can run (:func:`host_problem`: the pre-flight calls it, before anything is recorded). Both
answer one line naming the field. Nothing here imports torch: the packages are looked up, not imported.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Literal, get_args

from runner.spec import strategies

if TYPE_CHECKING:
    from runner.spec.recipe import Recipe

Attention = Literal["eager", "sdpa", "flex_attention", "flash_attention_2"]
"""``model.attn_implementation``: transformers' ``attn_implementation`` of the model."""
CompileMode = Literal["default", "reduce-overhead", "max-autotune"]
"""``train.compile_mode``: ``torch.compile``'s ``mode``."""
ATTENTION: tuple[str, ...] = get_args(Attention)
COMPILE_MODES: tuple[str, ...] = get_args(CompileMode)

DEFAULT_ATTENTION = "sdpa"
"""What transformers runs when the recipe names none (``PreTrainedModel.get_correct_attn_implementation``:
SDPA where the model class supports it, else eager)."""

CPU_COMPILER = "g++"
"""The C++ compiler inductor builds its CPU kernels with (``torch._inductor.config.cpp.cxx``'s default)."""


def recipe_problem(recipe: Recipe) -> str | None:
    """What the recipe asks of the kernels that no host can run (one line naming the field), or None."""
    train, launch = recipe.train, recipe.launch
    if train.compile_mode != "default" and not train.compile:
        return f"train.compile_mode: {train.compile_mode!r} takes effect only with train.compile = true"
    if recipe.model.attn_implementation == "flash_attention_2" and train.precision == "fp32":
        return ("model.attn_implementation: flash_attention_2 computes in fp16 or bf16 only; set train.precision "
                "to bf16 or fp16")
    if not train.compile:
        return None
    strategy = strategies.get(launch.strategy)
    try:
        refused = strategy.with_engine(launch.engine).compile_refused
    except KeyError:  # an engine the row does not take: the ZeRO rules name it
        return None
    if refused:
        return f"train.compile: not under {strategy.name} on the {strategy.with_engine(launch.engine).engine} engine: {refused}"
    if strategy.takes_fsdp_version and launch.fsdp_version == 1:
        return "train.compile: not under FSDP1 (compiled layers run under FSDP2); use launch.fsdp_version = 2"
    if train.gradient_checkpointing:
        return ("train.compile: not with train.gradient_checkpointing (transformers checkpoints each layer through "
                "torch.utils.checkpoint, of which Dynamo compiles next to nothing: docs/recipes.md); turn one off")
    return None


def host_problem(recipe: Recipe, on_cpu: bool) -> str | None:
    """What this host lacks to run the recipe's kernels (one line naming the field and what is missing), or
    None. ``on_cpu``: the ranks train on the CPU (:func:`runner.watch.host.runs_on_cpu`)."""
    attention = recipe.model.attn_implementation
    if attention == "flash_attention_2":
        if on_cpu:
            return "model.attn_implementation: flash_attention_2 needs a CUDA GPU; this run trains on the CPU"
        if importlib.util.find_spec("flash_attn") is None:
            return ("model.attn_implementation: flash_attention_2 needs the flash_attn package, which is not "
                    "installed here (pip install flash-attn)")
    if attention == "flex_attention":
        if on_cpu:
            return ("model.attn_implementation: flex_attention has no backward on CPU in torch (its "
                    "_validate_device refuses inputs that need a gradient); use it on a CUDA GPU")
        if not _torch_has("nn/attention/flex_attention.py"):
            return "model.attn_implementation: flex_attention needs torch >= 2.5 (torch.nn.attention.flex_attention)"
    needs_compiler = recipe.train.compile or attention == "flex_attention"
    if needs_compiler and on_cpu and shutil.which(CPU_COMPILER) is None:
        return (f"train.compile: inductor builds CPU kernels with {CPU_COMPILER}, which is not on PATH here "
                "(apt-get install g++)")
    if needs_compiler and not on_cpu and importlib.util.find_spec("triton") is None:
        field = "train.compile" if recipe.train.compile else "model.attn_implementation"
        return f"{field}: inductor builds GPU kernels with triton, which is not installed here"
    return None


def _torch_has(relative: str) -> bool:
    """Whether the installed torch ships ``relative`` (a file under its package), found without importing it."""
    spec = importlib.util.find_spec("torch")
    locations = spec.submodule_search_locations if spec is not None else None
    return any((Path(folder) / relative).is_file() for folder in locations or ())
