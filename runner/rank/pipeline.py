"""The training loop of runs that accelerate does not prepare: pipelines and tensor parallelism.

``pp`` and ``mp`` over several processes cut the model's decoder layers into one stage per process and
train it with ``torch.distributed.pipelining`` (a manual split: the first stage holds the embedding, the
last the final norm, the head and the loss). ``pp`` cuts each batch into ``launch.microbatches``
micro-batches under GPipe or 1F1B; ``mp`` is the same pipeline with ONE micro-batch, so exactly one stage
works at a time: the seeds' naive model parallelism, whose idle devices show in per-rank utilisation.
``tp`` (:mod:`runner.rank.tensor_parallel`) splits every decoder layer's weight matrices over the processes.

The trainer hands over at the start of :meth:`runner.rank.trainer.Trainer.run` (:func:`run`); this loop uses
the trainer's set-up (accelerator for the process group and autocast, tokenizer, data, model with LoRA)
and writes the same typed journal events (start with what is in effect, steps with loss and tokens,
memory, end). It keeps the trainer's data order: optimizer step ``s``, micro-step ``m`` takes rows
``(s*GA + m)*B ...`` of the epoch's permutation, on every process (no process trains different rows), so
a run of micro-batch B trains the rows of a one-process run of micro-batch B and of a DDP run of N
processes with B/N each.

Losses: each micro-batch's mean loss is divided by micro-batches x gradient accumulation before
backward (the schedule's own ``scale_grads`` is off: it would divide already accumulated gradients
again), so the gradient is the one of the whole batch's mean loss and the loss reported is the mean
over the batch, as in a one-process run (exactly so on packed data, where micro-batches hold equal
token counts). Gradient clipping uses the global norm over every process's parameters.

Not here: checkpoints (``train.save_every`` and ``train.resume_from`` are refused by the recipe
validator, :mod:`runner.spec.layout`; a graceful stop ends the run without one) and data parallel around
the pipeline or the tensor-parallel group.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import nn

from runner.rank import memtrack
from runner.spec import events as ev
from runner.spec import layout, strategies

if TYPE_CHECKING:
    from runner.rank.trainer import Trainer


@dataclass
class Engine:
    """What one process trains, and how one micro-step of it runs."""

    module: Any
    """The module whose parameters this process holds (a pipeline stage, or the tensor-parallel model)."""
    kind: Literal["PIPELINE", "TENSOR_PARALLEL"]
    """The ``distributed_type`` the start event reports (not accelerate's: accelerate prepared nothing)."""
    micro_step: Callable[[Any, Any, float], float]
    """``(input_ids, labels, scale) -> loss`` of this process's share: forward and backward of one
    accumulation micro-step, its loss multiplied by ``scale``; 0 where this process sees no loss."""
    owns_loss: bool
    """Whether this process's ``micro_step`` loss is the one reported (one process per replica)."""
    grad_sq: Callable[[], float]
    """This process's part of the squared global gradient norm (summed over processes: the whole)."""
    trainable: Callable[[bool], dict[str, Any]]
    """``full_names -> tensors`` this process contributes to the saved adapter or model (CPU tensors;
    a collective under tensor parallelism: every process calls it)."""
    info: dict[str, Any] = field(default_factory=dict)
    """What the start event says about the layout (``parallel``)."""
    device_map: dict[str, str] | None = None
    phase: str = "backward"
    """The memtrack phase a micro-step is measured under (a pipeline interleaves forward and backward)."""
    full_model: Any = None
    """The whole (PEFT) model as loaded, for saving in its format on rank 0."""
    replicas: int = 1
    """Data parallel replicas (tensor parallel with ``tp_size < nproc``); each trains its own rows."""
    replica: int = 0
    """This process's replica (its rows of each micro-batch)."""
    sync_grads: Callable[[], None] | None = None
    """Average the gradients over the replicas, after the micro-steps and before the norm and the step."""


def run(trainer: Trainer) -> str:
    """Train a pipelined or tensor-parallel run; return its end status (as ``Trainer.run``)."""
    from accelerate.utils import set_seed
    from transformers import get_scheduler

    recipe = trainer.recipe
    train, launch = recipe.train, recipe.launch
    strategy = strategies.get(launch.strategy)
    trainer.accelerator = acc = trainer.make_accelerator()
    set_seed(train.seed)
    trainer.emit(ev.PhaseEvent(type="phase", phase="tokenizing", detail=str(recipe.data.source)))
    trainer.tokenizer = trainer.load_tokenizer()
    data = trainer.load_blocks()
    blocks, mask = data.input_ids, data.attention_mask
    world, rank = acc.num_processes, acc.process_index
    B, GA = train.batch_size, train.grad_accum
    # A pipeline's processes, and a tensor-parallel group's, train the same rows; tensor-parallel groups
    # (tp_size < nproc) are data parallel replicas, each with its own rows.
    from runner.spec.layout import replicas

    R = replicas(recipe)
    rows_per_step = B * GA * R
    steps_per_epoch = blocks.shape[0] // rows_per_step
    if steps_per_epoch == 0:
        raise ValueError(f"train.batch_size: {blocks.shape[0]} rows of data cannot fill one optimizer step of "
                         f"{rows_per_step} rows (batch_size {B} x grad_accum {GA})")
    total_steps = train.max_steps or max(1, math.floor(train.epochs * steps_per_epoch))
    trainer.rss_baseline = memtrack.current_rss()
    trainer.emit(ev.PhaseEvent(type="phase", phase="loading_model", detail=f"{recipe.model.name}, {recipe.method.type}"))
    model = trainer.load_model()
    from runner.spec.flops import dims_from_config

    dims = dims_from_config(model.config, int(blocks.shape[1]))
    device = acc.device
    trainer.emit(ev.PhaseEvent(type="phase", phase="preparing", detail=f"{launch.strategy} x {world}"))
    if strategy.tensor_parallel:
        from runner.rank.tensor_parallel import build as build_tp

        engine = build_tp(model, recipe, device, world, rank, R)
    else:
        engine = build_pipeline(model, recipe, device, world, rank)
    engine.full_model = model  # what the adapter or model is saved from (rank 0)
    params = [p for p in engine.module.parameters() if p.requires_grad]
    # The per-parameter loop: torch's foreach kernels refuse lists that mix DTensors and plain tensors.
    optimizer = torch.optim.AdamW(params, lr=train.lr, weight_decay=train.weight_decay,
                                  foreach=False if strategy.tensor_parallel else None)
    scheduler = get_scheduler(train.schedule, optimizer, train.warmup_steps, total_steps)
    from runner.rank.trainer import _gather_list, _local_numel

    trainer.emit(ev.StartEvent(
        type="start",
        world_size=world,
        distributed_type=engine.kind,
        strategy=launch.strategy,
        device=str(device),
        device_type=device.type,
        mixed_precision=acc.mixed_precision,
        threads=torch.get_num_threads(),
        model_dims=dims,
        fsdp_version=None,
        params=trainer.total_params,
        trainable_params=trainer.trainable_params,
        local_param_numel=_local_numel(engine.module),
        rows=int(blocks.shape[0]),
        context_length=int(blocks.shape[1]),
        total_steps=total_steps,
        steps_per_epoch=steps_per_epoch,
        tokens_per_step=rows_per_step * int(blocks.shape[1]),
        device_map=engine.device_map,
        pids=_gather_list([os.getpid()]),
        start_step=0,
        resumed_from=None,
        resume_seconds=None,
        parallel=engine.info,
    ))

    from runner.rank.trainer import _epoch_order

    order: Any = None
    epoch = -1
    first_step_start = last_step_end = time.perf_counter()
    memory: dict[str, Any] = {}
    meter = memtrack.meter_for(device.type == "cuda", engine.module, optimizer)
    final_loss = float("nan")
    status: Literal["completed", "stopped", "failed"] = "completed"
    skipped = 0
    tokens_done = 0
    last_memory_event = -math.inf
    step = -1
    engine.module.train()
    for step in range(total_steps):
        if step // steps_per_epoch != epoch:
            epoch = step // steps_per_epoch
            order = _epoch_order(blocks.shape[0], train.seed, epoch, recipe.data.shuffle)
        t0 = time.perf_counter()
        if step == 0:
            first_step_start = t0
        peaks: memtrack.Meter = meter if step < memtrack.MEASURED_STEPS else memtrack.NoMeter()
        base = (step % steps_per_epoch) * rows_per_step
        loss_sum = 0.0
        step_tokens = 0
        for micro in range(GA):
            first_row = base + (micro * engine.replicas + engine.replica) * B
            rows = order[first_row: first_row + B]
            batch = blocks[rows]
            targets = batch if data.labels is None else data.labels[rows]  # data.train_on = "completions"
            if mask is None:
                labels = targets
                step_tokens += int(batch.numel())
            else:
                step_tokens += int(mask[rows].sum())
                labels = targets.masked_fill(mask[rows] == 0, -100)
            with peaks.phase(engine.phase), acc.autocast():
                loss_sum += engine.micro_step(batch.to(device), labels.to(device), 1.0 / GA)
        if engine.sync_grads is not None:
            engine.sync_grads()
        # One collective per step, as in the trainer: the loss (from the process that owns it), the
        # stop request, the tokens, the squared gradient norm, and each process's memory figures.
        mem_slots = torch.zeros(3 * world, dtype=torch.float64)
        mem_slots[3 * rank: 3 * rank + 3] = torch.tensor(trainer.memory_now(), dtype=torch.float64)
        mine = [loss_sum if engine.owns_loss else 0.0, float(trainer.stop.requested),
                float(step_tokens) if engine.owns_loss else 0.0, engine.grad_sq()]
        stats = torch.cat([torch.tensor(mine, dtype=torch.float64), mem_slots]).to(device)
        stats = acc.reduce(stats, reduction="sum").cpu()
        mean_loss = float(stats[0]) / engine.replicas  # each replica's loss is the mean over its rows
        stop_requested = float(stats[1]) > 0
        step_tokens = int(stats[2])
        grad_norm: float | None = None
        bad: tuple[str, float] | None = None
        with peaks.phase("optimizer"):
            if not math.isfinite(mean_loss):
                bad = ("nan_loss", mean_loss)
            elif train.max_grad_norm > 0:
                grad_norm = math.sqrt(max(0.0, float(stats[3])))
                if not math.isfinite(grad_norm):
                    bad = ("nan_grad_norm", grad_norm)
                else:
                    _clip(params, train.max_grad_norm, grad_norm)
            if bad is None:
                optimizer.step()
        if bad is None:
            if not memory:
                memory = trainer.state_bytes(engine.module, optimizer)
        else:
            skipped += 1
        lr = scheduler.get_last_lr()[0]
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        tokens_done += step_tokens
        t1 = last_step_end = time.perf_counter()
        final_loss = mean_loss
        notable = step + 1 == total_steps or stop_requested or bad is not None
        if (step + 1) % train.log_every == 0 or notable:
            step_event = ev.StepEvent(type="step", step=step + 1, epoch=epoch, loss=mean_loss, lr=lr,
                                      grad_norm=grad_norm, tokens=tokens_done, step_time=t1 - t0,
                                      tokens_per_s=step_tokens / (t1 - t0))
            if bad is not None:
                step_event["skipped"] = True
            trainer.emit(step_event)
        if step == 0 or notable or t1 - last_memory_event >= 10.0:
            last_memory_event = t1
            trainer.emit(ev.MemoryEvent(type="memory", step=step + 1,
                                        ranks=trainer.memory_ranks(stats[4:].tolist())))
        if bad is not None and trainer.nan_fails(step, bad, skipped):
            status = "failed"
            break
        if stop_requested:
            status = "stopped"  # no checkpoint: runner/spec/layout.py says so where a recipe asks for one
            break
    steps_done = step + 1
    train_seconds = last_step_end - first_step_start
    saved = save(trainer, engine) if train.save and status == "completed" else None
    measured: dict[str, Any] = {}
    if steps_done > 0:
        measured = {**meter.result(), "measured_steps": min(steps_done, memtrack.MEASURED_STEPS)}
    ranks = trainer.rank_memory({**memory, **measured})
    trainer.emit(ev.EndEvent(
        type="end", status=status, steps=steps_done, train_seconds=train_seconds, tokens=tokens_done,
        tokens_per_s=tokens_done / train_seconds if train_seconds > 0 and tokens_done else None,
        final_loss=final_loss, saved=saved, ranks=ranks, skipped=skipped, checkpoint=None,
    ))
    acc.end_training()
    return status


def _clip(params: list[Any], max_norm: float, total: float) -> None:
    """Scale gradients as ``torch.nn.utils.clip_grad_norm_`` does, by the GLOBAL norm ``total``."""
    coef = min(1.0, max_norm / (total + 1e-6))
    if coef < 1.0:
        for p in params:
            if p.grad is not None:
                p.grad.mul_(coef)


def save(trainer: Trainer, engine: Engine) -> str:
    """Gather every process's part of the adapter (LoRA) or model (full) and save it on rank 0."""
    from runner.rank.trainer import _gather_list, _save_adapter, _verify_saved

    acc = trainer.accelerator
    lora = trainer.recipe.method.type != "full"
    parts = _gather_list([engine.trainable(lora)])
    out = trainer.run_dir / ev.OUTPUT_DIR
    if acc.is_main_process:
        merged: dict[str, Any] = {}
        for part in parts:
            merged.update(part)
        model = engine.full_model
        if lora:
            _save_adapter(model, merged, out)
        else:
            causal_lm(model).save_pretrained(str(out), state_dict=merged, safe_serialization=True)
        trainer.tokenizer.save_pretrained(str(out))
        _verify_saved(out)
    acc.wait_for_everyone()
    return str(out)


# ---------------------------------------------------------------------- the pipeline


def causal_lm(model: Any) -> Any:
    """The ``*ForCausalLM`` under a PEFT wrapper (or the model itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def stage_bounds(layers: int, stages: int) -> list[tuple[int, int]]:
    """Decoder layers ``[lo, hi)`` of each stage: as even as possible, earlier stages one more (the
    first also embeds, the last runs the head and the loss)."""
    per, extra = divmod(layers, stages)
    bounds: list[tuple[int, int]] = []
    lo = 0
    for s in range(stages):
        hi = lo + per + (1 if s < extra else 0)
        bounds.append((lo, hi))
        lo = hi
    return bounds


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


def build_pipeline(model: Any, recipe: Any, device: Any, world: int, rank: int) -> Engine:
    """This process's stage of the model and the schedule that trains it."""
    import torch.nn.functional as F
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    core = causal_lm(model)
    _check_splittable(core, world, recipe.method.type == "full")
    names = {id(p): n for n, p in model.named_parameters()}
    bounds = stage_bounds(len(core.model.layers), world)
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
        # A causal LM's loss as transformers computes it (shift by one, ignore -100), scaled so that the
        # micro-batches' sum is the batch mean (see the module doc).
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(),
                               ignore_index=-100)
        return loss * scale["value"] / m

    stage = PipelineStage(stage_module, rank, world, device)
    schedule_cls = ScheduleGPipe if recipe.launch.pp_schedule == "gpipe" or m < world else Schedule1F1B
    schedule = schedule_cls(stage, n_microbatches=m, loss_fn=loss_fn, scale_grads=False)

    def micro_step(input_ids: Any, labels: Any, step_scale: float) -> float:
        scale["value"] = step_scale
        losses: list[Any] = []
        if first and last:
            schedule.step(input_ids, target=labels, losses=losses)
        elif first:
            schedule.step(input_ids)
        elif last:
            schedule.step(target=labels, losses=losses)
        else:
            schedule.step()
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
    return Engine(module=stage_module, kind="PIPELINE", micro_step=micro_step, owns_loss=last, grad_sq=grad_sq,
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
