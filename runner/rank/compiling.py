"""torch.compile of a model's decoder layers (``train.compile``), and the kernels a rank runs, read from the
live model and from Dynamo's own counters (the ``kernels`` event: :class:`runner.spec.events.KernelsEvent`).

Each decoder layer is compiled on its own (``module.compile(mode=...)``, before the engine wraps the model):
the layers are what FSDP2 shards and what the planner models, and a graph per layer keeps a graph break in
one layer from splitting the rest. The decoder layer is the class transformers names in the model's
``_no_split_modules`` (what accelerate's FSDP wraps too). Compilation is lazy: the first forward and
backward of each layer compile it (the ``compiling`` phase of the first step).
"""

from __future__ import annotations

import sys
from typing import Any

from runner.spec import events as ev


def decoder_layers(model: Any) -> list[Any]:
    """The decoder layers of ``model`` (under PEFT's wrappers): the modules of a class the base model's
    ``_no_split_modules`` names, or of a subclass of one (FSDP2 makes ``FSDPLlamaDecoderLayer`` of each)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = set(getattr(base, "_no_split_modules", None) or ())
    return [m for m in model.modules() if any(c.__name__ in names for c in type(m).__mro__)]


def compile_layers(model: Any, mode: str) -> int:
    """Compile each decoder layer of ``model`` with ``torch.compile(mode=mode)``; the number compiled.

    Every layer runs the same code, and Dynamo keeps one graph per layer (transformers' layers differ in
    ``layer_idx``), again for each grad mode (training, evaluation). Dynamo gives up on a code object after
    ``recompile_limit`` graphs (8) and runs the rest eagerly, so the limit is raised to fit every layer twice.

    Raises:
        ValueError: the model names no decoder layer class (one line naming the field).
    """
    import torch._dynamo  # deferred: torch

    layers = decoder_layers(model)
    if not layers:
        kind = type(model).__name__
        raise ValueError(f"train.compile: {kind} names no decoder layer class (_no_split_modules) to compile")
    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, 2 * len(layers) + 8)
    for layer in layers:
        layer.compile(mode=mode)
    return len(layers)


def compiled_modules(model: Any) -> frozenset[int]:
    """The ids of every module inside a compiled decoder layer of ``model`` (none when nothing is compiled)."""
    return frozenset(id(m) for layer in model.modules() if getattr(layer, "_compiled_call_impl", None) is not None
                     for m in layer.modules())


def graphs_compiled() -> int:
    """Graphs Dynamo has compiled in this process so far (0 when it was never loaded: nothing compiled)."""
    dynamo = sys.modules.get("torch._dynamo.utils")
    return int(dynamo.counters["stats"]["unique_graphs"]) if dynamo is not None else 0


def graph_breaks() -> int:
    """Graph breaks Dynamo met in this process so far (each splits a compiled layer in two)."""
    dynamo = sys.modules.get("torch._dynamo.utils")
    return int(sum(dynamo.counters["graph_break"].values())) if dynamo is not None else 0


def attention_in_effect(model: Any) -> str | None:
    """The attention implementation the live model dispatches to (``config._attn_implementation``, which
    transformers resolved from what was asked: ``sdpa`` for none)."""
    config = getattr(model, "config", None)
    value = getattr(config, "_attn_implementation", None)
    return str(value) if value is not None else None


def kernels_event(model: Any, step: int, mode: str | None, seconds: float | None) -> ev.KernelsEvent:
    """What the rank ran its first step with: the attention in effect, and (``mode``: train.compile on) how
    many layers are compiled, the graphs Dynamo made and the graph breaks it met, and the compile phase's
    seconds (the first step, compilation included)."""
    compiled = None
    if mode is not None:
        layers = sum(1 for m in decoder_layers(model) if getattr(m, "_compiled_call_impl", None) is not None)
        compiled = ev.CompileInEffect(mode=mode, layers=layers, graphs=graphs_compiled(), graph_breaks=graph_breaks(),
                                      seconds=seconds)
    return ev.KernelsEvent(type="kernels", step=step, attention=attention_in_effect(model), compile=compiled,
                           source="read from the live model (config._attn_implementation) and torch._dynamo's counters")
