"""Tensor parallelism (``tp``): every decoder layer's weight matrices split over the processes.

torch's DTensor plans (``torch.distributed.tensor.parallel``), applied by hand to a Llama-style model as
Megatron-LM splits a transformer layer: ``q_proj``, ``k_proj``, ``v_proj``, ``gate_proj`` and ``up_proj``
column-wise (each process computes its own heads and its slice of the MLP's hidden units), ``o_proj`` and
``down_proj`` row-wise (partial outputs summed by one all-reduce per block). The embedding, the norms and
the head stay whole on every process; every process trains the same rows, so the loss is the same
everywhere. It runs over NCCL on GPUs and over gloo on CPU.

LoRA: peft wraps a targeted linear as ``base_layer`` plus ``lora_A`` then ``lora_B``. A column-wise base
keeps ``lora_A`` whole and splits ``lora_B`` column-wise too (its output is the same slice of features);
a row-wise base splits ``lora_A`` row-wise (it reads the same slice of the input, and its small output is
all-reduced) and keeps ``lora_B`` whole. The sum ``base(x) + B(A(x))`` then has the same layout on both
sides.

Data parallel around it: with ``launch.tp_size < nproc`` the processes form a 2-D mesh (``dp`` x ``tp``,
row-major: processes ``0..tp-1`` are the first group); each group trains its own rows, and after the
micro-steps every gradient (the local shard of a split one) is averaged over the ``dp`` dimension with one
all-reduce per tensor, as DDP would. Done by hand because accelerate's ``ParallelismConfig`` (the same
2-D mesh) refuses CPU processes (``MULTI_CPU``); the hand-made mesh runs over gloo and NCCL alike.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from runner.rank.engines.split import SplitModel, causal_lm

if TYPE_CHECKING:
    from runner.spec.recipe import Recipe

COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
ROW = ("o_proj", "down_proj")


def layer_plan(layer: Any) -> dict[str, str]:
    """``submodule path -> "colwise" | "rowwise"`` for one decoder layer (peft's wrappers included)."""
    plan: dict[str, str] = {}
    for block in ("self_attn", "mlp"):
        owner = getattr(layer, block, None)
        for name in (*COLUMN, *ROW):
            module = getattr(owner, name, None) if owner is not None else None
            if module is None:
                continue
            style = "colwise" if name in COLUMN else "rowwise"
            path = f"{block}.{name}"
            base = getattr(module, "base_layer", None)
            if base is None:
                plan[path] = style
                continue
            plan[f"{path}.base_layer"] = style
            for adapter in getattr(module, "lora_A", {}):
                # Column-wise: B's output features are split as the base's; row-wise: A reads the base's slice.
                plan[f"{path}.{'lora_B' if style == 'colwise' else 'lora_A'}.{adapter}"] = style
    return plan


def build(model: Any, recipe: Recipe, device: Any, world: int, rank: int, replicas: int = 1) -> SplitModel:
    """Apply the tensor-parallel plans over groups of ``world / replicas`` processes; the engine trains the
    whole model, each group (a data parallel replica) on its own rows."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    tp = world // replicas
    tp_rank, replica = rank % tp, rank // tp
    core = causal_lm(model)
    config = core.config
    heads = int(getattr(config, "num_attention_heads", 0) or 0)
    kv_heads = int(getattr(config, "num_key_value_heads", heads) or heads)
    inter = int(getattr(config, "intermediate_size", 0) or 0)
    for what, count in (("attention heads", heads), ("key/value heads", kv_heads), ("MLP units", inter)):
        if count % tp:
            raise ValueError(f"launch.tp_size: {tp} does not divide the model's {count} {what}")
    layers = getattr(getattr(core, "model", None), "layers", None)
    if layers is None:
        raise ValueError(f"launch.strategy: tp splits Llama-style decoder models ({type(core).__name__} "
                         "has no model.layers)")
    model.to(device)
    if replicas > 1:
        mesh2d = init_device_mesh(device.type, (replicas, tp), mesh_dim_names=("dp", "tp"))
        mesh, dp_group = mesh2d["tp"], mesh2d["dp"].get_group()
    else:
        mesh, dp_group = init_device_mesh(device.type, (world,), mesh_dim_names=("tp",)), None
    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    plan = layer_plan(layers[0])
    if not plan:
        raise ValueError("launch.strategy: tp found no q/k/v/o or gate/up/down projections to split")
    for layer in layers:
        parallelize_module(layer, mesh, {path: styles[style]() for path, style in layer_plan(layer).items()})
    names = {id(p): n for n, p in model.named_parameters()}
    params = list(model.parameters())

    def micro_step(input_ids: Any, labels: Any, scale: float) -> float:
        loss = model(input_ids=input_ids, labels=labels).loss * scale
        loss.backward()
        return float(loss.detach())

    def sync_grads() -> None:
        # DDP's average over the replicas, by hand: each process holds its shard of a split gradient (the
        # same shard as its peers in the other groups) or a whole one; to_local() shares its storage.
        for p in params:
            if p.grad is not None:
                local = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
                dist.all_reduce(local, group=dp_group)
                local.div_(replicas)

    def grad_sq() -> float:
        # After sync_grads every replica holds the same gradients: the first replica counts them. Within it,
        # split gradients count their local slice on every process; whole ones once (its process 0).
        if replica:
            return 0.0
        total = 0.0
        for p in params:
            g = p.grad
            if g is None:
                continue
            if isinstance(g, DTensor):
                whole = all(isinstance(pl, Replicate) for pl in g.placements)
                if whole and tp_rank:
                    continue
                total += float(g.to_local().detach().float().pow(2).sum())
            elif tp_rank == 0:
                total += float(g.detach().float().pow(2).sum())
        return total

    def trainable(lora: bool) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for p in params:  # full_tensor() is a collective: every process walks the same list
            if lora and not p.requires_grad:
                continue
            t = p.full_tensor() if isinstance(p, DTensor) else p
            if rank == 0:
                out[names[id(p)]] = t.detach().to("cpu", copy=True)
        return out

    split = sorted({path.split(".")[1] for path in plan})
    info = {"kind": "tensor_parallel", "tp_size": tp, "data_parallel": replicas, "split": split,
            "library": f"torch.distributed.tensor.parallel (torch {torch.__version__})"}
    return SplitModel(module=model, kind="TENSOR_PARALLEL", micro_step=micro_step, owns_loss=tp_rank == 0,
                      grad_sq=grad_sq, trainable=trainable, info=info, device_map=None, phase="backward",
                      sync_grads=sync_grads if replicas > 1 else None, foreach=False)
