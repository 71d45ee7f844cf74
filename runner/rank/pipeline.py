"""Pipeline stages (``pp``, and ``mp`` over several processes): the model's decoder layers cut into one
stage per process, trained with ``torch.distributed.pipelining``.

A manual split: the first stage holds the embedding, the last the final norm, the head and the loss. ``pp``
cuts each batch into ``launch.microbatches`` micro-batches under GPipe or 1F1B; ``mp`` is the same pipeline
with ONE micro-batch, so exactly one stage works at a time: the seeds' naive model parallelism, whose idle
devices show in per-rank utilisation. :func:`build_pipeline` returns this process's stage as a
:class:`runner.rank.engines.split.SplitModel`, which :class:`runner.rank.engines.split.SplitEngine` trains
in the one training loop (:mod:`runner.rank.loop`). Every process takes the same rows of each micro-step, so a
run of micro-batch B trains the rows of a one-process run of micro-batch B and of a DDP run of N processes
with B/N each.

The schedule's own ``scale_grads`` is off (it would divide already accumulated gradients again): each
micro-batch's loss is divided by the micro-batches here and by the gradient accumulation in the engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from runner.rank.engines.split import SplitModel, causal_lm
from runner.spec import layout

if TYPE_CHECKING:
    from runner.spec.recipe import Recipe


def _check_splittable(core: Any, stages: int, full: bool) -> None:
    inner: Any = getattr(core, "model", None)
    missing = [name for name, owner in (("model.embed_tokens", inner), ("model.layers", inner),
                                        ("model.norm", inner), ("model.rotary_emb", inner), ("lm_head", core))
               if owner is None or getattr(owner, name.rsplit(".", 1)[-1], None) is None]
    if missing:
        raise ValueError(f"launch.strategy: the pipeline splits Llama-style decoder models "
                         f"({type(core).__name__} has no {', '.join(missing)})")
    layers = len(inner.layers)
    if layers < stages:
        raise ValueError(f"launch.nproc: {stages} stages for a model of {layers} decoder layers")
    if full and getattr(core.config, "tie_word_embeddings", False):
        raise ValueError("method.type: full fine-tuning of a model with tied input and output embeddings "
                         "cannot be split into stages (the first and last stage would train two copies)")


def build_pipeline(model: Any, recipe: Recipe, device: Any, world: int, rank: int, replicas: int = 1) -> SplitModel:
    """This process's stage of the model and the schedule that trains it (``replicas``: always 1, no data
    parallel around a pipeline)."""
    import torch.nn.functional as F
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    core = causal_lm(model)
    _check_splittable(core, world, recipe.method.type == "full")
    names = {id(p): n for n, p in model.named_parameters()}
    bounds = layout.stage_bounds(len(core.model.layers), world)
    lo, hi = bounds[rank]
    first, last = rank == 0, rank == world - 1
    stage_module = _Stage(core, lo, hi, first, last)
    # Free what other stages hold: each process keeps only its own layers (and embedding or head).
    for i in range(len(core.model.layers)):
        if not lo <= i < hi:
            core.model.layers[i] = nn.Identity()
    if not first:
        core.model.embed_tokens = None
    if not last:
        core.lm_head = None
    stage_module.to(device)
    m = layout.microbatches(recipe)
    scale = {"value": 1.0}

    def loss_fn(logits: Any, labels: Any) -> Any:
        # A causal LM's loss as transformers computes it (transformers/loss/loss_utils.py ForCausalLMLoss):
        # the labels shifted by one and padded with -100, so the logits are used whole (no sliced copy of
        # them, nor a full-size gradient of the slice in backward); scaled so that the micro-batches' sum
        # is the batch mean (see the module doc).
        shifted = F.pad(labels, (0, 1), value=-100)[:, 1:]
        loss = F.cross_entropy(logits.float().flatten(0, 1), shifted.flatten(), ignore_index=-100)
        return loss * scale["value"] / m

    stage = PipelineStage(stage_module, rank, world, device)
    schedule_cls = Schedule1F1B if layout.runs_1f1b(recipe.launch.pp_schedule, m, world) else ScheduleGPipe
    schedule = schedule_cls(stage, n_microbatches=m, loss_fn=loss_fn, scale_grads=False)

    def micro_step(input_ids: Any, labels: Any, step_scale: float) -> float:
        scale["value"] = step_scale
        losses: list[Any] = []
        # return_outputs=False: the last stage keeps no micro-batch's logits past its loss (the losses are
        # what the loop reads); with outputs, the schedule would hold every micro-batch's logits until the
        # next step and concatenate them once more.
        if first and last:
            schedule.step(input_ids, target=labels, losses=losses, return_outputs=False)
        elif first:
            schedule.step(input_ids, return_outputs=False)
        elif last:
            schedule.step(target=labels, losses=losses, return_outputs=False)
        else:
            schedule.step(return_outputs=False)
        return float(sum(float(x) for x in losses))

    def grad_sq() -> float:
        return float(sum(float(p.grad.detach().float().pow(2).sum())
                         for p in stage_module.parameters() if p.grad is not None))

    def trainable(lora: bool) -> dict[str, Any]:
        return {names[id(p)]: p.detach().to("cpu", copy=True)
                for p in stage_module.parameters() if p.requires_grad or not lora}

    device_map = {f"model.layers.{i}": f"rank{r}" for r, (a, b) in enumerate(bounds) for i in range(a, b)}
    device_map = {"model.embed_tokens": "rank0", **device_map, "model.norm": f"rank{world - 1}",
                  "lm_head": f"rank{world - 1}"}
    schedule_name = "GPipe" if schedule_cls is ScheduleGPipe else "1F1B"
    info = {"kind": "pipeline", "stages": world, "microbatches": m, "schedule": schedule_name,
            "micro_batch_rows": recipe.train.batch_size // m, "stage_layers": [list(b) for b in bounds],
            "library": f"torch.distributed.pipelining (torch {torch.__version__})"}
    return SplitModel(module=stage_module, kind="PIPELINE", micro_step=micro_step, owns_loss=last, grad_sq=grad_sq,
                      trainable=trainable, info=info, device_map=device_map)


class _Stage(nn.Module):
    """Decoder layers ``[lo, hi)`` of a Llama-style model, with the embedding on the first stage and the
    final norm and head on the last (the head's output, the logits, goes to the loss)."""

    def __init__(self, core: Any, lo: int, hi: int, first: bool, last: bool) -> None:
        super().__init__()
        inner = core.model
        self.embed_tokens = inner.embed_tokens if first else None
        self.layers = nn.ModuleList([inner.layers[i] for i in range(lo, hi)])
        self.rotary_emb = inner.rotary_emb
        self.norm = inner.norm if last else None
        self.lm_head = core.lm_head if last else None

    def forward(self, x: Any) -> Any:
        hidden = self.embed_tokens(x) if self.embed_tokens is not None else x
        positions = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
        rope = self.rotary_emb(hidden, position_ids=positions)
        # No attention mask: causal attention (rows are packed, or padded on the right, where the padding
        # comes after every real token and carries label -100).
        for layer in self.layers:
            hidden = layer(hidden, attention_mask=None, position_embeddings=rope, position_ids=positions)
        if self.norm is not None and self.lm_head is not None:
            hidden = self.lm_head(self.norm(hidden))
        return hidden
