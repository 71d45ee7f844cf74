"""The memory planner: per-device memory of a fine-tuning run under each strategy, and which to use.

Split on its seams:

* ``shapes``: the model's shape, read from its config (local folder, Hugging Face cache, builtin table)
  or derived from a parameter count: the planner's only I/O;
* ``inputs``: what the estimate reads (``EstimateInput``: the run as data) and the bytes of its dtypes;
* ``activations``: what one micro-batch saves for backward and the temporaries around it, by the
  architecture's features (pure functions);
* ``memory``: the estimate, pure functions (``estimate``: the peak of a training step per device, the parts
  alive at that moment adding up to the total: weights, gradients, buckets, optimizer, master, activations,
  dropout, recompute, transients, buffers, reserve); docs/memory-model.md keeps the formulas with their
  sources;
* ``recommend``: devices needed and the recommended strategy (the seed's decision flow);
* ``glue``: the recipe as the planner sees it, with the trainer's semantics (shared by ``ftui estimate``,
  ``ftui run``'s stored estimate and Compose).
"""

from runner.planner.activations import ActivationBytes, activation_bytes
from runner.planner.glue import inputs_from_recipe, recipe_param_dtype
from runner.planner.inputs import EstimateInput
from runner.planner.memory import (
    DEFAULT_RESERVE,
    GIB,
    PARTS,
    MemoryBreakdown,
    breakdown_json,
    checkpoint_bytes,
    estimate,
)
from runner.planner.recommend import Recommendation, estimate_report, gpus_needed, recommend
from runner.planner.shapes import (
    LinearSpec,
    ModelShape,
    ModelSource,
    llama_shape,
    lora_trainable_params,
    resolve_model_shape,
    shape_from_config,
    shape_from_params,
)
from runner.spec.units import parse_bytes

__all__ = [
    "DEFAULT_RESERVE",
    "GIB",
    "PARTS",
    "ActivationBytes",
    "EstimateInput",
    "LinearSpec",
    "MemoryBreakdown",
    "ModelShape",
    "ModelSource",
    "Recommendation",
    "activation_bytes",
    "breakdown_json",
    "checkpoint_bytes",
    "estimate",
    "estimate_report",
    "gpus_needed",
    "inputs_from_recipe",
    "llama_shape",
    "lora_trainable_params",
    "parse_bytes",
    "recipe_param_dtype",
    "recommend",
    "resolve_model_shape",
    "shape_from_config",
    "shape_from_params",
]
