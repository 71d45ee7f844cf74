"""The recipe as the planner sees it: the estimate's input with the trainer's semantics (which dtype the
weights are stored in, the micro-batch, the sequence), shared by ``ftui estimate``, ``ftui run`` and Compose."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runner.spec.recipe import Recipe

from runner.planner.inputs import EstimateInput, Precision
from runner.planner.shapes import ModelShape, resolve_model_shape
from runner.spec import layout, strategies


def recipe_param_dtype(model_dtype: str, method: str, precision: str) -> Precision:
    """The dtype the trainer stores the weights in (``runner.rank.model_load.load_dtype`` without torch)."""
    if precision == "fp8":  # torchao's float8 layers keep their weights in the bf16 the rest computes in
        precision = "bf16"
    if model_dtype != "auto":
        return model_dtype  # type: ignore[return-value]
    if method in ("lora", "qlora") and precision != "fp32":
        return precision  # type: ignore[return-value]
    return "fp32"


def inputs_from_recipe(
    recipe: Recipe, n_devices: int | None = None, shape: ModelShape | None = None, allow_network: bool = True
) -> EstimateInput:
    """The estimate's input for a recipe, with the trainer's semantics (fp32 weights unless
    ``model.dtype`` or a 16-bit LoRA says otherwise; micro-batch = ``train.batch_size``; sequence =
    ``data.context_length``).

    Args:
        recipe: A validated recipe.
        n_devices: Devices to spread over (default: ``launch.nproc``, or the listed GPUs for ``mp``).
        shape: The model's shape, if already resolved (else :func:`resolve_model_shape`).
        allow_network: Whether the hub may be asked for an unknown model's config.

    Raises:
        ValueError: the model's shape cannot be had.
    """
    if shape is None:
        shape = resolve_model_shape(recipe.model.name, allow_network).shape
    launch, train, method = recipe.launch, recipe.train, recipe.method
    if n_devices is None:
        n_devices = len(launch.gpus) if strategies.get(launch.strategy).layer_split and launch.gpus else launch.nproc
    compute: Precision = "bf16" if train.precision == "fp8" else train.precision  # fp8: bf16 autocast around it
    return EstimateInput(
        shape=shape,
        method=method.type,
        precision=compute,
        param_dtype=recipe_param_dtype(recipe.model.dtype, method.type, compute),
        strategy=launch.strategy,
        n_devices=max(1, n_devices),
        micro_batch=train.batch_size,
        seq_len=recipe.data.context_length,
        gradient_checkpointing=train.gradient_checkpointing,
        lora_r=method.lora.r,
        lora_targets=tuple(method.lora.target_modules),
        lora_dropout=method.lora.dropout,
        fsdp_version=launch.fsdp_version,
        engine=launch.engine,
        offload_optimizer=launch.offload != "none",
        offload_params=launch.offload in ("optimizer+params", "nvme"),
        nvme_offload=launch.offload == "nvme",
        cp_size=launch.cp_size,
        fp8=train.precision == "fp8",
        activation_offload=train.activation_offload,
        microbatches=layout.microbatches(recipe),
        pp_schedule=launch.pp_schedule,
        tp_size=layout.tp_size(recipe),
        shard=sizes[1] if (sizes := layout.mesh(recipe)) is not None else None,
        attention=recipe.model.attn_implementation or "sdpa",  # None: transformers' default, SDPA
        compiled=recipe.train.compile,
        # "auto" is decided at launch (runner.watch.host.runs_on_cpu corrects it for a run's stored estimate).
        device="cpu" if launch.device == "cpu" else "cuda",
    )
