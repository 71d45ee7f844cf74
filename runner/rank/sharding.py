"""What a rank can see of the sharding and precision in effect, read from its prepared model and optimizer.

The engines of :mod:`runner.rank.engines` ask :func:`in_effect` what the prepared objects really are
(:func:`runner.spec.zero.mismatch` compares it with the strategy asked for), :func:`state_bytes` what this
rank holds, and :func:`precision_in_effect` the dtypes of the live tensors (DeepSpeed keeps an fp32 master
copy; torch follows the recipe). torch and deepspeed are imported where a function needs them: the rank
imports them anyway, this module's readers need not.
"""

from __future__ import annotations

from typing import Any


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


def dtype_name(dtype: Any) -> str:
    """``torch.bfloat16`` -> ``bf16`` (the recipe's words); other dtypes by torch's name."""
    text = str(dtype).removeprefix("torch.")
    return {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(text, text)


class ComputeDtype:
    """The dtype the matmuls of one forward really ran in: the output dtype of every ``nn.Linear`` (LoRA's
    included) during that forward, counted by dtype (a forward hook; removed on exit). The modules in
    ``compiled`` (ids: those of compiled decoder layers) get no hook, which Dynamo would trace into their graph."""

    def __init__(self, model: Any, compiled: frozenset[int] = frozenset()) -> None:
        self.model = model
        self.compiled = compiled
        self.handles: list[Any] = []
        self.seen: dict[str, int] = {}

    def _hook(self, module: Any, args: Any, out: Any) -> None:
        if hasattr(out, "dtype"):
            name = dtype_name(out.dtype)
            self.seen[name] = self.seen.get(name, 0) + 1

    def __enter__(self) -> ComputeDtype:
        import torch

        for module in self.model.modules():
            if isinstance(module, torch.nn.Linear) and id(module) not in self.compiled:
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
