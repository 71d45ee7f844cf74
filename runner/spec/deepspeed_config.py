"""The DeepSpeed config of a ZeRO run on the ``deepspeed`` engine (pure: no torch, no deepspeed import).

Modelled on the seed's ZeRO-2 and ZeRO-3-offload configs. What makes it run on a CPU-only machine
(docs/zero.md): explicit per-device batches and gradient clipping (accelerate fills ``"auto"`` clipping with
1.0), and the trainer's own torch AdamW handed to DeepSpeed (no cpu_adam JIT build;
``zero_force_ds_cpu_optimizer: false`` lets it run with offload).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from runner.spec import strategies

if TYPE_CHECKING:
    from runner.spec.recipe import Recipe

DEEPSPEED_FILE = "deepspeed.json"
"""The generated DeepSpeed config, in the run folder."""
ZERO3_PERSISTENCE_THRESHOLD = 100_000
"""ZeRO-3 keeps parameters of fewer elements than this gathered on every rank (DeepSpeed's default, written
into the config so that the planner and the run agree)."""
ZERO3_MAX_LIVE_PARAMETERS = 1_000_000_000
"""ZeRO-3 keeps at most this many gathered parameter elements alive (DeepSpeed's default, written into the
config so that the planner and the run agree)."""
ZERO3_PREFETCH_BUCKET = 50_000_000
"""ZeRO-3 all-gathers up to this many elements of upcoming parameters at once into one flat buffer
(DeepSpeed's default ``stage3_prefetch_bucket_size``, written into the config so that the planner and the
run agree)."""
GPU_BUCKET = 200_000_000
"""The seed's bucket on GPU, in elements."""
CPU_BUCKET = 20_000_000
"""On CPU a tenth: an fp32 bucket of 2e8 is 800 MB of host memory, more than the whole tiny model's training."""
BUCKET_ALIGNMENT = 64
"""Bucket sizes are rounded up to this many elements (DeepSpeed asserts an even allgather bucket)."""


def bucket_elements(on_cpu: bool, trainable: int | None) -> int:
    """Elements of the reduce and allgather buckets ftui writes: the device's configured size, or the
    trainable parameter count (rounded up to :data:`BUCKET_ALIGNMENT`) where that is smaller.

    DeepSpeed allocates the reduce bucket (its ``ipg`` buffer) whole, in the gradients' dtype, whatever the
    model: a bucket larger than every gradient together is memory that nothing uses, and one bucket of all
    the gradients already reduces them in one collective. ``trainable`` None (not known): the configured size.
    """
    configured = CPU_BUCKET if on_cpu else GPU_BUCKET
    if not trainable or trainable <= 0:
        return configured
    return min(configured, -(-trainable // BUCKET_ALIGNMENT) * BUCKET_ALIGNMENT)


def deepspeed_config(recipe: Recipe, on_cpu: bool, trainable: int | None = None) -> dict[str, Any]:
    """The DeepSpeed config of a ZeRO run (written to ``RUN/deepspeed.json``).

    Every value is explicit: accelerate's ``"auto"`` fill-ins need a prepared dataloader (the trainer owns
    its data order) and set gradient clipping to 1.0 whatever the recipe says. ``trainable``: the model's
    trainable parameter count, which caps the buckets (:func:`bucket_elements`); None: not known.
    """
    launch, train = recipe.launch, recipe.train
    row = strategies.resolve(launch.strategy, launch.engine).engine_row()
    assert row is not None and row.stage is not None
    bucket = bucket_elements(on_cpu, trainable)
    zero: dict[str, Any] = {
        "stage": row.stage,
        # The seed's ZeRO-2 settings: bucketed, overlapped reduce-scatter into contiguous gradients.
        "allgather_partitions": True,
        "allgather_bucket_size": bucket,
        "reduce_scatter": True,
        "reduce_bucket_size": bucket,
        "overlap_comm": not on_cpu,  # overlapping needs a side stream; gloo on CPU has none
        "contiguous_gradients": True,
    }
    if launch.offload in ("optimizer", "optimizer+params"):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": not on_cpu}
    if launch.offload == "optimizer+params":
        zero["offload_param"] = {"device": "cpu", "pin_memory": not on_cpu}
    if launch.offload == "nvme":  # ZeRO-Infinity: optimizer state and weights swapped through async_io
        for key in ("offload_optimizer", "offload_param"):
            zero[key] = {"device": "nvme", "nvme_path": launch.nvme_path, "pin_memory": True}
    if row.stage == 3:
        zero["stage3_param_persistence_threshold"] = ZERO3_PERSISTENCE_THRESHOLD
        zero["stage3_max_live_parameters"] = ZERO3_MAX_LIVE_PARAMETERS
        zero["stage3_prefetch_bucket_size"] = ZERO3_PREFETCH_BUCKET
        zero["stage3_gather_16bit_weights_on_model_save"] = True  # the saved adapter/model: gathered on rank 0
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": train.batch_size,
        "gradient_accumulation_steps": train.grad_accum,
        "train_batch_size": train.batch_size * train.grad_accum * launch.nproc,
        "gradient_clipping": train.max_grad_norm,
        "zero_optimization": zero,
        "bf16": {"enabled": train.precision == "bf16"},
        # The seed's dynamic loss scaling: start at 2**16, halve on overflow, grow after 1000 good steps.
        "fp16": {"enabled": train.precision == "fp16", "loss_scale": 0, "initial_scale_power": 16,
                 "loss_scale_window": 1000, "hysteresis": 2, "min_loss_scale": 1},
        # The trainer hands DeepSpeed torch's AdamW (the same update as the other strategies, and no
        # cpu_adam JIT build); DeepSpeed refuses a client optimizer with offload unless told.
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    return config
