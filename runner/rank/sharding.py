"""What a rank can see of the sharding and precision in effect, read from its prepared model and optimizer.

The engines of :mod:`runner.rank.engines` ask :func:`in_effect` what the prepared objects really are
(:func:`runner.spec.zero.mismatch` compares it with the strategy asked for), :func:`state_bytes` what this
rank holds and the whole model each of its parts is a share of (:func:`whole_model`; the verdict:
:mod:`runner.analysis.shard_verdict`), and :func:`precision_in_effect` the dtypes of the live tensors
(DeepSpeed keeps an fp32 master copy; torch follows the recipe). torch and deepspeed are imported where a function needs them: the rank
imports them anyway, this module's readers need not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple


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


class HeldGrads(NamedTuple):
    """Gradients a rank holds outside ``.grad``: their bytes and the bytes of one of their elements."""

    bytes: int
    itemsize: int | None
    """None when the rank holds none."""


def deepspeed_grad_bytes(model: Any) -> HeldGrads | None:
    """The gradients DeepSpeed holds for this rank's partition at the end of the backward (it keeps them
    outside ``.grad``, in ``averaged_gradients``, and frees them in its step); None if not DeepSpeed."""
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
    return HeldGrads(total, int(tensors[0].element_size()) if tensors else None)


def state_bytes(model: Any, optimizer: Any, held: HeldGrads | None = None,
                whole: Whole | None = None) -> dict[str, int]:
    """Exact bytes of this rank's parameters, gradients, optimizer state and fp32 master (local parts), and
    of the whole model's (``*_whole_bytes``, :func:`whole_bytes`) that each is a share of.

    Gradients are those alive on the parameters (``.grad``), read after the optimizer step, before
    ``zero_grad``; DeepSpeed's, which its step frees, are passed in as ``held`` (:func:`deepspeed_grad_bytes`).
    ``whole``: the whole model counted before this rank dropped what is not its own (a pipeline stage);
    None: counted from ``model`` now.
    """
    params = gathered = 0
    grads = held.bytes if held is not None else 0
    grad_itemsize = held.itemsize if held is not None else None
    for p in model.parameters():
        local = local_param(p)
        params += int(local.numel() * local.element_size())
        if local is not p and hasattr(p, "ds_tensor"):
            # ZeRO-3 keeps parameters under its persistence threshold gathered for good, beside the partition.
            gathered += int(p.data.numel() * p.data.element_size())
        if p.grad is not None:
            g = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
            grads += int(g.numel() * g.element_size())
            grad_itemsize = grad_itemsize or int(g.element_size())
    opt, opt_elements = optimizer_state(optimizer)
    masters = master_tensors(model)
    master = sum(int(t.numel() * t.element_size()) for t in masters)
    local_bytes = {"param_bytes": params + gathered, "grad_bytes": grads, "optimizer_bytes": opt,
                   "master_bytes": master, "param_gathered_bytes": gathered}
    itemsizes = Itemsizes(grad=grad_itemsize or _trainable_itemsize(model),
                          optimizer=opt / opt_elements if opt_elements else None,
                          master=int(masters[0].element_size()) if masters else None)
    return {**local_bytes, **whole_bytes(whole or whole_model(model), itemsizes)}


def optimizer_state(optimizer: Any) -> tuple[int, int]:
    """Bytes of this rank's optimizer state (local parts, each storage once) and the elements it covers
    (per parameter, its largest state tensor: AdamW's moments have the parameter's local shape)."""
    total = elements = 0
    seen: set[int] = set()
    for state in inner_optimizer(optimizer).state.values():
        largest = 0
        for value in state.values():
            if hasattr(value, "untyped_storage"):
                t = value.to_local() if hasattr(value, "to_local") else value
                largest = max(largest, int(t.numel()))
                ptr = t.untyped_storage().data_ptr()
                if ptr in seen and t.numel() > 1:
                    continue
                seen.add(ptr)
                total += int(t.numel() * t.element_size())
        elements += largest
    return total, elements


@dataclass(frozen=True)
class Whole:
    """The whole model as one rank counts it: every parameter at its global size, in this rank's dtype."""

    param_bytes: int
    trainable_numel: int
    """Elements of the trainable parameters (what gradients, optimizer state and master cover)."""


@dataclass(frozen=True)
class Itemsizes:
    """Bytes per element of what this rank measured: a gradient element, the optimizer state per trainable
    element (None where the rank holds no state), an fp32 master element (None: no master)."""

    grad: int | None
    optimizer: float | None
    master: int | None


def whole_numel(p: Any, fsdp1: dict[int, int]) -> int:
    """A parameter's global element count: DeepSpeed ZeRO-3's ``ds_numel``, FSDP1's from its flat parameter
    (``fsdp1``: :func:`fsdp1_whole_numels`), else ``numel()`` (a DTensor's is global, its local shard's is
    ``to_local().numel()``)."""
    if hasattr(p, "ds_numel"):
        return int(p.ds_numel)
    if id(p) in fsdp1:
        return fsdp1[id(p)]
    return int(p.numel())


def fsdp1_whole_numels(model: Any) -> dict[int, int]:
    """FSDP1: ``id(parameter) -> whole elements``. With ``use_orig_params`` each original parameter is a
    view of this rank's part of a flat shard (or empty), so its size is read from the flat parameter that
    holds it (``_params`` and ``_numels``, padding left out); a flat parameter seen as such: its unsharded
    size."""
    out: dict[int, int] = {}
    for module in model.modules():
        flat = getattr(module, "_flat_param", None)  # FSDP1's FullyShardedDataParallel
        if flat is None or not hasattr(flat, "_unpadded_unsharded_size"):
            continue
        out[id(flat)] = int(flat._unpadded_unsharded_size.numel())
        for p, n in zip(flat._params or [], flat._numels, strict=False):
            out[id(p)] = int(n)
    return out


def whole_model(model: Any) -> Whole:
    """The whole model this rank's parameters are a share of (every parameter counted once, at its global
    size, times the bytes of this rank's element of it)."""
    fsdp1 = fsdp1_whole_numels(model)
    params = trainable = 0
    for p in model.parameters():
        n = whole_numel(p, fsdp1)
        params += n * int(local_param(p).element_size())
        trainable += n if p.requires_grad else 0
    return Whole(params, trainable)


def whole_bytes(whole: Whole, itemsizes: Itemsizes) -> dict[str, int]:
    """The bytes of the whole model's parameters, gradients, optimizer state and master: what each of a
    rank's measured parts is a share of. Gradients and master: the trainable elements times the bytes of
    the rank's own element. Optimizer state: the bytes per element this rank's state holds times the
    trainable elements; exact for AdamW, which keeps the same state for every element (two moments in the
    state dtype) and one step counter per tensor, a few bytes against a tensor's kilobytes. A figure the
    rank cannot measure (no state on this rank) is left out."""
    out = {"param_whole_bytes": whole.param_bytes,
           "master_whole_bytes": whole.trainable_numel * itemsizes.master if itemsizes.master else 0}
    if itemsizes.grad is not None:
        out["grad_whole_bytes"] = whole.trainable_numel * itemsizes.grad
    if itemsizes.optimizer is not None:
        out["optimizer_whole_bytes"] = round(whole.trainable_numel * itemsizes.optimizer)
    return out


def _trainable_itemsize(model: Any) -> int | None:
    """Bytes of one element of the first trainable parameter (its gradient's dtype) where no gradient is
    held; None without trainable parameters."""
    p = next((p for p in model.parameters() if p.requires_grad), None)
    return int(local_param(p).element_size()) if p is not None else None


def _offload_device(config: Any) -> str:
    """The device of a DeepSpeed offload config (``cpu``, ``nvme``; its ``OffloadDeviceEnum`` as text)."""
    device = getattr(config, "device", None)
    return str(getattr(device, "value", device))


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
        if offload == "optimizer+params" and _offload_device(model.zero_offload_optimizer()) == "nvme" \
                and _offload_device(model.zero_offload_param()) == "nvme":
            offload = "nvme"  # ZeRO-Infinity: both swapped to the NVMe folder
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
        mesh = mesh_in_effect(model)
        if mesh is not None and mesh["replicate"] > 1:
            how += f" on a 2-D mesh: replicate {mesh['replicate']} x shard {mesh['shard']}"
        return {"engine": "torch", "stage": stage, "offload": "optimizer+params" if offloaded else "none",
                "how": how, "optimizer": type(inner_optimizer(optimizer)).__name__, "mesh": mesh}
    return {"engine": "accelerate", "stage": None, "offload": "none",
            "how": f"{accelerator.distributed_type.value} ({type(model).__name__})",
            "optimizer": type(inner_optimizer(optimizer)).__name__}


def mesh_in_effect(model: Any) -> dict[str, Any] | None:
    """The device mesh FSDP2 placed the weights on, read from the first DTensor parameter: its dimensions'
    names and sizes, and how many processes hold a replica (``Replicate()`` dimensions) and how many share
    one copy in shards (``Shard`` dimensions); None when no parameter is a DTensor."""
    for p in model.parameters():
        device_mesh, placements = getattr(p, "device_mesh", None), getattr(p, "placements", None)
        if device_mesh is None or placements is None:
            continue
        sizes = [int(s) for s in device_mesh.shape]
        replicate = shard = 1
        for size, placement in zip(sizes, placements, strict=True):
            if placement.is_replicate():
                replicate *= size
            elif placement.is_shard():
                shard *= size
        return {"replicate": replicate, "shard": shard, "dims": list(device_mesh.mesh_dim_names or ()),
                "sizes": sizes, "placements": [str(x) for x in placements],
                "source": "measured: the DTensor placements and device mesh of the rank's first sharded weight"}
    return None


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
