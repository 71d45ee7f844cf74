"""The ZeRO stages on two engines, and what a rank can see of the sharding and precision in effect.

``zero1``/``zero2``/``zero3`` (rows of :mod:`runner.spec.strategies`) run on one of two engines
(``launch.engine``), always through ``accelerate launch``:

* ``deepspeed``: accelerate's DeepSpeed integration with a DeepSpeed config generated here and kept in the
  run folder (``deepspeed.json``, modelled on the seed's ZeRO-2 and ZeRO-3-offload configs). On a CPU-only
  machine it trains over gloo; what makes that real (docs/zero.md): the process group forced to gloo,
  no ``cpu=True`` (which skips DeepSpeed), explicit per-device batches and gradient clipping (accelerate
  fills ``"auto"`` clipping with 1.0), and the trainer's own torch AdamW handed to DeepSpeed (no cpu_adam
  JIT build; ``zero_force_ds_cpu_optimizer: false`` lets it run with offload).
* ``torch``: PyTorch alone. ZeRO-1 is DDP + ``ZeroRedundancyOptimizer``; ZeRO-2 is FSDP2
  ``fully_shard(reshard_after_forward=False)``; ZeRO-3 is ``fully_shard``; offload is FSDP's
  ``CPUOffloadPolicy`` (parameters, gradients and optimizer state together; ``pin_memory=False`` on CPU).

The trainer asks :func:`in_effect` what the prepared model and optimizer really are, and
:func:`mismatch` compares that with the table's :class:`runner.spec.strategies.Engine`: a run that silently
became something else fails with the reason. :func:`precision_in_effect` reads the dtypes of the live
tensors (DeepSpeed keeps an fp32 master copy; torch follows the recipe).

Pure parts (no torch import): :func:`recipe_problem`, :func:`engine_missing`, :func:`deepspeed_config`.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Any

from runner.spec import strategies

if TYPE_CHECKING:
    from runner.spec.recipe import Recipe

DEEPSPEED_FILE = "deepspeed.json"
"""The generated DeepSpeed config, in the run folder."""
ZERO3_PERSISTENCE_THRESHOLD = 100_000
"""ZeRO-3 keeps parameters of fewer elements than this gathered on every rank (DeepSpeed's default, written
into the config so that the planner and the run agree)."""


# ---------------------------------------------------------------------- recipe rules (pure)


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
                + (" (FSDP offloads parameters with their optimizer state)" if engine.name == "torch" else ""))
    if resolved.engine == "deepspeed" and recipe.train.on_nan == "skip":
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
    not yet for DeepSpeed, nor for ZeroRedundancyOptimizer, which accelerate does not prepare."""
    return strategy.engine not in ("deepspeed", "torch") or strategy.accelerate_type == "FSDP"


def engine_missing(engine: str) -> str | None:
    """Why ``engine`` cannot run on this machine (a one-line reason naming the fix), or None."""
    if engine == "deepspeed" and importlib.util.find_spec("deepspeed") is None:
        return ("launch.engine: deepspeed is not installed (pip install -e '.[deepspeed]', with DS_BUILD_OPS=0 "
                "on a machine without CUDA), or use launch.engine = 'torch'")
    return None


def deepspeed_config(recipe: Recipe, on_cpu: bool) -> dict[str, Any]:
    """The DeepSpeed config of a ZeRO run (written to ``RUN/deepspeed.json``).

    Every value is explicit: accelerate's ``"auto"`` fill-ins need a prepared dataloader (the trainer owns
    its data order) and set gradient clipping to 1.0 whatever the recipe says.
    """
    launch, train = recipe.launch, recipe.train
    row = strategies.resolve(launch.strategy, launch.engine).engine_row()
    assert row is not None and row.stage is not None
    # The seed's 2e8-element buckets on GPU; on CPU a tenth (an fp32 bucket of 2e8 is 800 MB of host memory,
    # more than the whole tiny model's training).
    bucket = 200_000_000 if not on_cpu else 20_000_000
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
    if row.stage == 3:
        zero["stage3_param_persistence_threshold"] = ZERO3_PERSISTENCE_THRESHOLD
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


# ---------------------------------------------------------------------- in the trainer (torch imported lazily)


def is_deepspeed(model: Any) -> bool:
    """Whether ``model`` is a DeepSpeed engine (what accelerate's prepare returns under DeepSpeed)."""
    return type(model).__name__ == "DeepSpeedEngine"


def zero_optimizer(params: list[Any], lr: float, weight_decay: float) -> Any:
    """ZeRO-1 with PyTorch alone: AdamW whose state each rank keeps for its own share of the parameters."""
    import torch
    from torch.distributed.optim import ZeroRedundancyOptimizer

    return ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW, lr=lr, weight_decay=weight_decay)


def inner_optimizer(optimizer: Any) -> Any:
    """The optimizer that holds this rank's state: through accelerate's wrapper, ZeroRedundancyOptimizer's
    local optimizer, or DeepSpeed's ZeRO optimizer's base optimizer."""
    opt = getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer
    if type(opt).__name__ == "ZeroRedundancyOptimizer":
        return opt.optim
    while hasattr(opt, "optimizer") and type(opt).__module__.startswith("deepspeed"):
        opt = opt.optimizer  # DeepSpeed's ZeRO optimizer -> the client's torch AdamW over flat partitions
    return opt


def master_tensors(model: Any) -> list[Any]:
    """DeepSpeed's fp32 master partitions of this rank that are not the weights themselves (ZeRO-3 in fp32
    updates the partitions in place and keeps none)."""
    if not is_deepspeed(model):
        return []
    opt = model.optimizer
    groups = getattr(opt, "single_partition_of_fp32_groups", None)
    if groups is None:
        groups = getattr(opt, "fp32_partitioned_groups_flat", None) or []
        own = {t.untyped_storage().data_ptr() for t in getattr(opt, "fp16_partitioned_groups_flat", []) or []}
        return [t for t in groups if t.numel() and t.untyped_storage().data_ptr() not in own]
    return [t for t in groups if t.numel()]


def local_param(p: Any) -> Any:
    """A parameter's local part: a DTensor's local shard, DeepSpeed ZeRO-3's partition (``ds_tensor``)."""
    if hasattr(p, "ds_tensor"):
        return p.ds_tensor
    return p.to_local() if hasattr(p, "to_local") else p


def deepspeed_grad_bytes(model: Any) -> int | None:
    """Bytes of the gradients DeepSpeed holds for this rank's partition at the end of the backward (it keeps
    them outside ``.grad``, in ``averaged_gradients``, and frees them in its step); None if not DeepSpeed."""
    if not is_deepspeed(model):
        return None
    held = getattr(model.optimizer, "averaged_gradients", None) or {}
    tensors = [t for group in (held.values() if isinstance(held, dict) else held) for t in group or []
               if hasattr(t, "numel")]
    # With optimizer offload the gradients go straight into the fp32 master partitions' .grad on the host.
    tensors += [t.grad for t in master_tensors(model) if getattr(t, "grad", None) is not None]
    seen: set[tuple[int, int]] = set()
    total = 0
    for t in tensors:
        key = (t.data_ptr(), t.numel())
        if key not in seen:
            seen.add(key)
            total += int(t.numel() * t.element_size())
    return total


def state_bytes(model: Any, optimizer: Any, grads_before_step: int | None = None) -> dict[str, int]:
    """Exact bytes of this rank's parameters, gradients, optimizer state and fp32 master (local parts).

    Gradients are those alive on the parameters (``.grad``), read after the optimizer step, before
    ``zero_grad``; DeepSpeed's, which its step frees, are passed in as ``grads_before_step``
    (:func:`deepspeed_grad_bytes`).
    """
    params = 0
    grads = grads_before_step or 0
    for p in model.parameters():
        local = local_param(p)
        params += int(local.numel() * local.element_size())
        if local is not p and hasattr(p, "ds_tensor"):
            # ZeRO-3 keeps parameters under its persistence threshold gathered for good, beside the partition.
            params += int(p.data.numel() * p.data.element_size())
        if p.grad is not None:
            g = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
            grads += int(g.numel() * g.element_size())
    opt = 0
    seen: set[int] = set()
    for state in inner_optimizer(optimizer).state.values():
        for value in state.values():
            if hasattr(value, "untyped_storage"):
                t = value.to_local() if hasattr(value, "to_local") else value
                ptr = t.untyped_storage().data_ptr()
                if ptr in seen and t.numel() > 1:
                    continue
                seen.add(ptr)
                opt += int(t.numel() * t.element_size())
    master = sum(int(t.numel() * t.element_size()) for t in master_tensors(model))
    return {"param_bytes": params, "grad_bytes": grads, "optimizer_bytes": opt, "master_bytes": master}


def in_effect(model: Any, optimizer: Any, accelerator: Any) -> dict[str, Any]:
    """What the prepared model and optimizer of this rank are: engine, ZeRO stage, offload, in the engine's
    own terms (read from the objects, never from the recipe)."""
    opt = getattr(optimizer, "optimizer", optimizer)
    if is_deepspeed(model):
        stage = int(model.zero_optimization_stage())
        offload = "none"
        if model.zero_offload_optimizer() if callable(getattr(model, "zero_offload_optimizer", None)) else False:
            offload = "optimizer"
        if stage == 3 and callable(getattr(model, "zero_offload_param", None)) and model.zero_offload_param():
            offload = "optimizer+params" if offload == "optimizer" else "params"
        return {"engine": "deepspeed", "stage": stage, "offload": offload, "how": f"DeepSpeed ZeRO stage {stage}",
                "optimizer": type(model.optimizer).__name__}
    if type(opt).__name__ == "ZeroRedundancyOptimizer":
        ddp = type(model).__name__ == "DistributedDataParallel"
        return {"engine": "torch", "stage": 1 if ddp else None, "offload": "none",
                "how": "DDP + ZeroRedundancyOptimizer" if ddp else f"{type(model).__name__} + ZeroRedundancyOptimizer",
                "optimizer": "ZeroRedundancyOptimizer"}
    fsdp2 = _fsdp2_groups(model)
    if fsdp2:
        # FSDP2 keeps the unsharded parameters after forward when reshard_after_forward=False: the
        # post-forward mesh is None for every parameter group (torch's FSDPParamGroup).
        reshard = any(g.post_forward_mesh_info is not None for g in fsdp2)
        offloaded = any(type(g.offload_policy).__name__ == "CPUOffloadPolicy" for g in fsdp2)
        stage = 3 if reshard else 2
        how = "FSDP2 fully_shard" + ("" if reshard else "(reshard_after_forward=False)")
        return {"engine": "torch", "stage": stage, "offload": "optimizer+params" if offloaded else "none",
                "how": how, "optimizer": type(inner_optimizer(optimizer)).__name__}
    return {"engine": "accelerate", "stage": None, "offload": "none",
            "how": f"{accelerator.distributed_type.value} ({type(model).__name__})",
            "optimizer": type(inner_optimizer(optimizer)).__name__}


def _fsdp2_groups(model: Any) -> list[Any]:
    """The FSDP2 parameter groups below the root. The root's own choice is torch's until its first forward
    (``reshard_after_forward=None``: it reads as True before the lazy init sets it to False), so it says
    nothing about the stage."""
    groups: list[Any] = []
    for module in model.modules():
        if module is model:
            continue
        get_state = getattr(module, "_get_fsdp_state", None)
        if get_state is None:
            continue
        group = getattr(get_state(), "_fsdp_param_group", None)
        if group is not None:
            groups.append(group)
    return groups


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


def dtype_name(dtype: Any) -> str:
    """``torch.bfloat16`` -> ``bf16`` (the recipe's words); other dtypes by torch's name."""
    text = str(dtype).removeprefix("torch.")
    return {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(text, text)


class ComputeDtype:
    """The dtype the matmuls of one forward really ran in: the output dtype of every ``nn.Linear`` (LoRA's
    included) during that forward, counted by dtype (a forward hook; removed on exit)."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.handles: list[Any] = []
        self.seen: dict[str, int] = {}

    def _hook(self, module: Any, args: Any, out: Any) -> None:
        if hasattr(out, "dtype"):
            name = dtype_name(out.dtype)
            self.seen[name] = self.seen.get(name, 0) + 1

    def __enter__(self) -> ComputeDtype:
        import torch

        for module in self.model.modules():
            if isinstance(module, torch.nn.Linear):
                self.handles.append(module.register_forward_hook(self._hook))
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()

    def result(self) -> str | None:
        """The most frequent matmul output dtype (None when no Linear ran)."""
        return max(self.seen, key=lambda k: self.seen[k]) if self.seen else None


def precision_in_effect(model: Any, optimizer: Any, compute: str | None) -> dict[str, Any]:
    """The precision of this rank's live tensors: trainable and frozen weights, the optimizer state, the
    fp32 master copy (DeepSpeed; None where the optimizer updates the weights themselves) and the compute
    dtype measured by :class:`ComputeDtype`."""
    trainable: dict[str, int] = {}
    frozen: dict[str, int] = {}
    for p in model.parameters():
        local = local_param(p)
        bucket = trainable if p.requires_grad else frozen
        name = dtype_name(local.dtype)
        bucket[name] = bucket.get(name, 0) + int(local.numel())
    states: dict[str, int] = {}
    for state in inner_optimizer(optimizer).state.values():
        for value in state.values():
            if hasattr(value, "dtype") and getattr(value, "dim", lambda: 0)() > 0:
                name = dtype_name(value.dtype)
                states[name] = states.get(name, 0) + int(value.numel())
    masters = master_tensors(model)

    def main(counts: dict[str, int]) -> str | None:
        return max(counts, key=lambda k: counts[k]) if counts else None

    return {"params": main(trainable), "frozen_params": main(frozen), "compute": compute,
            "optimizer_state": main(states), "master": dtype_name(masters[0].dtype) if masters else None,
            "source": "measured: dtypes of the rank's live tensors; compute from the Linear outputs of the first forward"}


def loss_scale(model: Any, accelerator: Any) -> float | None:
    """The fp16 dynamic loss scale now (DeepSpeed's optimizer, or accelerate's GradScaler), else None."""
    if is_deepspeed(model):
        scale = getattr(model.optimizer, "cur_scale", None)
        if scale is None:
            scale = getattr(getattr(model.optimizer, "loss_scaler", None), "cur_scale", None)
        return float(scale) if scale is not None else None
    scaler = getattr(accelerator, "scaler", None)
    return float(scaler.get_scale()) if scaler is not None and scaler.is_enabled() else None


def force_fsdp_offload_unpinned(plugin: Any) -> None:
    """On a CPU-only machine FSDP's offload must not pin host memory (pinning needs CUDA): replace the
    plugin's ``CPUOffloadPolicy`` with ``pin_memory=False``."""
    from torch.distributed.fsdp import CPUOffloadPolicy

    if isinstance(getattr(plugin, "cpu_offload", None), CPUOffloadPolicy):
        plugin.cpu_offload = CPUOffloadPolicy(pin_memory=False)


def skip_shm_comm_build() -> None:
    """Keep DeepSpeed from JIT-compiling its shared-memory collective on a CPU-only machine.

    DeepSpeed's CPU backend builds ``deepspeed_shm_comm`` with g++ when it starts (minutes on a loaded 2-core
    machine, measured 3.5 min here) though training never uses it: it serves ``inference_all_reduce`` only;
    training collectives go through torch.distributed (gloo). DeepSpeed decides from its table of compatible
    ops, which it re-probes at import; marking the op incompatible makes it skip the build.
    """
    try:
        import deepspeed.ops as ops
    except ImportError:
        return
    table = getattr(ops, "__compatible_ops__", None)
    if isinstance(table, dict):
        table["deepspeed_shm_comm"] = False
