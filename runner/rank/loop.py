"""The training loop: one for every layout, driving an :class:`runner.rank.engine.Engine`.

Data order is owned here, not by a sampler: the blocks are permuted once per epoch with the recipe's seed,
and optimizer step ``s``, micro-step ``m`` of data parallel replica ``r`` (of ``R``) takes rows
``((s*GA + m)*R + r)*B ...`` of that order. So a run with R replicas of micro-batch B sees exactly the rows
a one-process run of micro-batch R*B sees, and their losses can be compared step by step. The processes of
one pipeline or tensor-parallel group are one replica: they train the same rows.

The same makes a run resumable: the data position is the step number alone (:mod:`runner.rank.checkpointing`).

Each step: the engine's forward and backward of every micro-step; one collective that carries the loss,
the stop request, the token count, the engine's share of the squared gradient norm and each rank's memory
figures; the NaN policy; the engine's clip and optimizer step; the lr schedule; the events; eval and
checkpoint cadence. The first :data:`runner.rank.memtrack.MEASURED_STEPS` steps measure peak memory per phase.
"""

from __future__ import annotations

import math
import os
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from runner.hardware.processes import started_wall
from runner.rank import compiling, evaluate, memtrack, peak_probe, step_split
from runner.rank.checkpointing import check_resume
from runner.rank.context import DataShape, Setup
from runner.rank.engine import Engine, MicroBatch
from runner.rank.measure import gather_list
from runner.rank.model_load import load_model
from runner.rank.router_load import RouterLoad, experts_of, load_summary
from runner.rank.throughput import Span, Steady, Window, throughput
from runner.spec import events as ev
from runner.spec import layout, zero
from runner.spec.flops import dims_from_config, run_dtype

MEMORY_EVERY_S = 10.0
"""Seconds between ``memory`` events (plus one at the run's first and last step)."""

Status = Literal["completed", "stopped", "failed"]


@dataclass
class _Progress:
    """What the loop carries from step to step."""

    start_step: int
    tokens_done: int
    tokens_at_start: int
    step: int = -1
    epoch: int = -1
    order: Any = None
    status: Status = "completed"
    skipped: int = 0
    final_loss: float = float("nan")
    last_checkpoint: str | None = None
    last_memory_event: float = -math.inf
    first_step_start: float = 0.0
    last_step_end: float = 0.0
    last_step_cpu: float = 0.0
    """``time.process_time()`` at the end of the last step: the steady CPU-seconds end there."""
    memory: dict[str, Any] = field(default_factory=dict)
    precision_pending: bool = True
    scale: float | None = None
    eval_spans: list[Span] = field(default_factory=list)
    steady: Steady = field(default_factory=Steady)
    """The steps the steady state is measured over (neither memory-metered nor compiling)."""
    live_model: Any = None
    """The model as loaded (its config and decoder layers: the ``kernels`` event reads them)."""
    compiled_layers: int = 0
    """Decoder layers given to torch.compile (``train.compile``), compiled by the first step."""
    probe: peak_probe.Probe | None = None
    """The CPU matmul probes through the steady steps (:mod:`runner.rank.peak_probe`)."""
    profiling: bool = False
    """This step is the one whose time is split (:mod:`runner.rank.step_split`)."""
    split: step_split.StepSplit | None = None
    router: RouterLoad | None = None
    """A mixture of experts' tokens per expert per layer (:mod:`runner.rank.router_load`); None: dense."""


@dataclass(frozen=True)
class _Reduced:
    """The step's collective, read back."""

    mean_loss: float
    stop_requested: bool
    tokens: int
    grad_sq: float
    memory_slots: list[float]
    router_counts: list[float] = field(default_factory=list)
    """Tokens per expert per layer of the step, summed over ranks (a mixture of experts only)."""


def train(setup: Setup, engine: Engine) -> Status:
    """Load the model, prepare it with ``engine`` and train; return the end status."""
    recipe = setup.recipe
    blocks = setup.dataset.train.input_ids
    shape = _data_shape(setup, engine, int(blocks.shape[0]))
    resume = check_resume(setup, shape) if recipe.train.resume_from else None  # before the model: fail fast

    # The runtime's own resident memory before the model exists (RSS is reported separately from
    # the tensor peak, and this is the part of it training did not add).
    setup.memory.rss_baseline = memtrack.current_rss()
    setup.emit(ev.PhaseEvent(type="phase", phase="loading_model", detail=f"{recipe.model.name}, {recipe.method.type}"))
    loaded = load_model(setup)
    setup.total_params, setup.trainable_params = loaded.total_params, loaded.trainable_params
    dims = dims_from_config(loaded.model.config, int(blocks.shape[1]))  # for MFU, so compare reads no config
    # Before the engine wraps the model: DDP and FSDP2 take the compiled layers as they are.
    layers = compiling.compile_layers(loaded.model, recipe.train.compile_mode) if recipe.train.compile else 0
    setup.emit(ev.PhaseEvent(type="phase", phase="preparing", detail=engine.preparing_detail()))
    engine.prepare(loaded.model, shape)
    from transformers import get_scheduler  # deferred: transformers is slow to import

    scheduler = get_scheduler(recipe.train.schedule, engine.optimizer, recipe.train.warmup_steps, shape.total_steps)
    engine.register_scheduler(scheduler)

    progress = _Progress(start_step=0, tokens_done=0, tokens_at_start=0)  # real tokens: padding (data.pack = false) is not counted
    progress.router = _router_load(loaded.model.config, engine)
    resume_seconds = None
    if resume is not None:
        assert engine.checkpointer is not None, "the recipe validator refuses resume_from for this layout"
        setup.emit(ev.PhaseEvent(type="phase", phase="resuming", detail=str(recipe.train.resume_from)))
        t_load = time.perf_counter()
        engine.checkpointer.load(Path(str(recipe.train.resume_from)))
        resume_seconds = time.perf_counter() - t_load
        tokens = int(resume["tokens_done"])
        progress = _Progress(start_step=int(resume["step"]), tokens_done=tokens, tokens_at_start=tokens,
                             router=progress.router)
    progress.live_model, progress.compiled_layers = loaded.model, layers
    setup.emit(_start_event(setup, engine, shape, dims, progress.start_step, resume_seconds))
    return _run_steps(setup, engine, shape, scheduler, progress)


def _router_load(config: Any, engine: Engine) -> RouterLoad | None:
    """Router hooks on a mixture of experts (its layers and experts from the config, the same on every rank)."""
    experts = experts_of(config)
    return RouterLoad(engine.model, int(getattr(config, "num_hidden_layers", 0) or 0), experts) if experts else None


def _data_shape(setup: Setup, engine: Engine, rows: int) -> DataShape:
    recipe, train = setup.recipe, setup.recipe.train
    rows_per_step = layout.rows_per_step(recipe)  # the pre-flight's count too
    assert rows_per_step == train.batch_size * engine.replicas * train.grad_accum, (rows_per_step, engine.replicas)
    problem = layout.batch_problem(recipe, rows)
    if problem:
        raise ValueError(problem)
    steps_per_epoch = rows // rows_per_step
    total_steps = train.max_steps or max(1, math.floor(train.epochs * steps_per_epoch))
    stop_step = min(train.stop_after, total_steps) if train.stop_after else total_steps
    return DataShape(rows=rows, rows_per_step=rows_per_step, steps_per_epoch=steps_per_epoch,
                     total_steps=total_steps, stop_step=stop_step)


def _start_event(setup: Setup, engine: Engine, shape: DataShape, dims: Any, start_step: int,
                 resume_seconds: float | None) -> ev.StartEvent:
    acc, recipe = setup.accelerator, setup.recipe
    blocks = setup.dataset.train.input_ids
    world = acc.num_processes
    start = ev.StartEvent(
        type="start",
        world_size=world,
        distributed_type="",  # the engine's (below)
        strategy=recipe.launch.strategy,
        device=str(acc.device),
        device_type=acc.device.type,
        mixed_precision=acc.mixed_precision,
        threads=torch.get_num_threads(),  # intra-op threads: the divisor of CPU% and the MFU peak's
        model_dims=dims,
        fsdp_version=None,
        params=setup.total_params,
        trainable_params=setup.trainable_params,
        local_param_numel=0,
        rows=shape.rows,
        context_length=int(blocks.shape[1]),
        total_steps=shape.stop_step,  # what this run trains; the schedule spans shape.total_steps
        steps_per_epoch=shape.steps_per_epoch,
        tokens_per_step=shape.rows_per_step * int(blocks.shape[1]),
        device_map=None,
        pids=gather_list([os.getpid()]) if world > 1 else [os.getpid()],
        start_step=start_step,
        resumed_from=recipe.train.resume_from,
        resume_seconds=resume_seconds,
        process_started=started_wall(),  # the imports' start (runner.spec.first_step)
    )
    engine.describe(start)
    start["data"] = setup.dataset.info()
    return start


def _run_steps(setup: Setup, engine: Engine, shape: DataShape, scheduler: Any, progress: _Progress) -> Status:
    recipe, train = setup.recipe, setup.recipe.train
    p = progress
    p.first_step_start = p.last_step_end = time.perf_counter()
    # One meter over the measured steps: what step 1 leaves alive (optimizer state, DDP's buckets) is
    # still counted in step 2.
    meter = engine.meter()
    p.probe = peak_probe.Probe(setup.on_cpu, run_dtype(recipe.train.precision))
    p.scale = engine.loss_scale()
    p.step = p.start_step - 1
    profiled = step_split.profiled_step(p.start_step, shape.stop_step, memtrack.MEASURED_STEPS)
    engine.model.train()
    for step in range(p.start_step, shape.stop_step):
        p.step = step
        if step // shape.steps_per_epoch != p.epoch:
            p.epoch = step // shape.steps_per_epoch
            p.order = epoch_order(shape.rows, train.seed, p.epoch, recipe.data.shuffle)
        if step == p.start_step and p.compiled_layers:
            setup.emit(ev.PhaseEvent(type="phase", phase="compiling", detail=f"torch.compile "
                                     f"{recipe.train.compile_mode}, {p.compiled_layers} decoder layers"))
        graphs = compiling.graphs_compiled()
        t0, cpu0 = time.perf_counter(), time.process_time()
        if step == p.start_step:
            p.first_step_start = t0
        metered = step - p.start_step < memtrack.MEASURED_STEPS
        p.profiling = step == profiled
        p.steady.begin(t0, p.tokens_done, metered, profiled=p.profiling, cpu=cpu0)
        # The first steps measure peak memory per phase (runner/rank/memtrack.py); later steps pay nothing.
        peaks: memtrack.Meter = meter if metered else memtrack.NoMeter()
        if p.router is not None:
            p.router.take()  # an evaluation's forwards since the last step are not training's routing
        with _profile(setup, p) as prof, step_split.mark(step_split.STEP_MARK, p.profiling):
            loss_sum, my_tokens = _micro_steps(setup, engine, shape, p, peaks)
            routed = p.router.take() if p.router is not None else None
            reduced = _reduce(setup, engine, loss_sum, my_tokens, engine.reduce_grads(), routed)
            grad_norm, bad = _optimizer_step(engine, train.max_grad_norm, reduced, peaks)
        if prof is not None:
            p.split = prof.result
        _after_step(setup, engine, p, bad)
        lr = scheduler.get_last_lr()[0]
        scheduler.step()  # the lr follows the step count, skipped steps included
        engine.zero_grad()
        p.tokens_done += reduced.tokens
        t1 = p.last_step_end = time.perf_counter()
        p.last_step_cpu = time.process_time()
        p.steady.end(compiled=compiling.graphs_compiled() > graphs)  # no compiling step in the steady state
        p.final_loss = reduced.mean_loss
        notable = step + 1 == shape.stop_step or reduced.stop_requested or bad is not None
        if (step + 1) % train.log_every == 0 or notable:
            step_event = ev.StepEvent(type="step", step=step + 1, epoch=p.epoch, loss=reduced.mean_loss, lr=lr,
                                      grad_norm=grad_norm, tokens=p.tokens_done, step_time=t1 - t0,
                                      tokens_per_s=reduced.tokens / (t1 - t0))
            if bad is not None:
                step_event["skipped"] = True
            setup.emit(step_event)
            _emit_router_load(setup, p, reduced, step + 1)
        if step == p.start_step:  # what the step ran with: attention, compiled layers and the compile's time
            mode = recipe.train.compile_mode if p.compiled_layers else None
            setup.emit(compiling.kernels_event(p.live_model, step + 1, mode, t1 - t0 if mode else None))
        if step == p.start_step or notable or t1 - p.last_memory_event >= MEMORY_EVERY_S:
            p.last_memory_event = t1
            setup.emit(ev.MemoryEvent(type="memory", step=step + 1, ranks=setup.memory.ranks(reduced.memory_slots)))
        if bad is not None and nan_fails(setup, step, bad, p.skipped):
            p.status = "failed"
            break
        _cadence(setup, engine, shape, p, reduced.stop_requested)
        # The peak under the run's load: before the first steady step, then between steady steps.
        if step - p.start_step >= memtrack.MEASURED_STEPS - 1 and p.probe.due(last=notable):
            p.probe.take()
        if reduced.stop_requested:
            p.status = "stopped"
            break
    return _finish(setup, engine, p, meter)


def _profile(setup: Setup, p: _Progress) -> AbstractContextManager[step_split.StepProfile | None]:
    """torch's profiler over the step whose time is split; nothing on every other step."""
    return step_split.StepProfile(not setup.on_cpu) if p.profiling else nullcontext()


def _micro_steps(setup: Setup, engine: Engine, shape: DataShape, p: _Progress,
                 peaks: memtrack.Meter) -> tuple[Any, int]:
    """Forward and backward of the step's micro-batches; (summed loss, tokens of this process's rows)."""
    data, B, GA = setup.dataset.train, setup.recipe.train.batch_size, setup.recipe.train.grad_accum
    blocks, mask, labels_all = data.input_ids, data.attention_mask, data.labels
    base = (p.step % shape.steps_per_epoch) * shape.rows_per_step
    # Masked labels (data.train_on = "completions"): the step's learned tokens over every replica's rows
    # (every rank can count them: it holds all rows), which the accelerate engines weight the loss by.
    learned = _learned_tokens(labels_all, mask, p.order[base : base + shape.rows_per_step]) if labels_all is not None else 0
    loss_sum = engine.zero_loss()
    my_tokens = 0
    for micro in range(GA):
        with step_split.mark(step_split.DATA_MARK, p.profiling):
            start = base + (micro * engine.replicas + engine.replica) * B
            rows = p.order[start : start + B]
            batch = blocks[rows]
            # Labels differ from the ids where tokens are not learned (data.train_on = "completions").
            targets = batch if labels_all is None else labels_all[rows]
            if mask is None:
                batch_mask, labels = None, targets
                my_tokens += int(batch.numel())
            else:
                batch_mask = mask[rows]
                my_tokens += int(batch_mask.sum())
                labels = targets.masked_fill(batch_mask == 0, -100)
            micro_batch = MicroBatch(
                input_ids=batch, attention_mask=batch_mask, labels=labels, index=micro, accumulation=GA,
                learned=_learned_tokens(labels_all, mask, rows) if learned else 0, step_learned=learned,
                first=p.step == p.start_step and micro == 0)
        loss_sum += engine.forward_backward(micro_batch, peaks)
    return loss_sum, my_tokens


def _emit_router_load(setup: Setup, p: _Progress, reduced: _Reduced, step: int) -> None:
    """The step's router load as named metrics (``moe/*``), from every rank's tokens per expert per layer."""
    if p.router is None or not reduced.router_counts:
        return
    layers, experts = p.router.counts.shape
    values = load_summary(torch.tensor(reduced.router_counts, dtype=torch.float64).view(layers, experts))
    if values:
        setup.emit(ev.metrics_event(step, values))


def _reduce(setup: Setup, engine: Engine, loss_sum: Any, my_tokens: int, grad_sq: float,
            routed: Any = None) -> _Reduced:
    """One collective per step carries the loss, the stop request, the token count, the squared gradient norm,
    each rank's memory figures (its own slots, zeros elsewhere) and, for a mixture of experts, its tokens per
    expert per layer (``routed``), so every rank leaves the loop after the same step and takes the same
    decision on a non-finite loss. It comes before the optimizer step for that decision. float64: byte counts
    exceed float32's 24 bits."""
    acc = setup.accelerator
    world = acc.num_processes
    mem_slots = torch.zeros(3 * world, dtype=torch.float64)
    mem_slots[3 * acc.process_index : 3 * acc.process_index + 3] = torch.tensor(setup.memory.now(), dtype=torch.float64)
    owns = engine.owns_loss
    mine = [float(loss_sum) if owns else 0.0, float(setup.stop.requested), float(my_tokens) if owns else 0.0, grad_sq]
    router = routed.to(torch.float64) if routed is not None else torch.zeros(0, dtype=torch.float64)
    stats = torch.cat([torch.tensor(mine, dtype=torch.float64), mem_slots, router]).to(acc.device)
    if world > 1:
        stats = acc.reduce(stats, reduction="sum")
    stats = stats.cpu()
    # Each replica's loss is the mean over its rows.
    return _Reduced(mean_loss=float(stats[0]) / engine.replicas, stop_requested=float(stats[1]) > 0,
                    tokens=int(stats[2]), grad_sq=float(stats[3]), memory_slots=stats[4 : 4 + 3 * world].tolist(),
                    router_counts=stats[4 + 3 * world :].tolist())


def _optimizer_step(engine: Engine, max_grad_norm: float, reduced: _Reduced,
                    peaks: memtrack.Meter) -> tuple[float | None, tuple[str, float] | None]:
    """The engine's clip and step unless the loss is not finite; (gradient norm, why the update was refused)."""
    with peaks.phase("optimizer"):
        if not math.isfinite(reduced.mean_loss):
            return None, ("nan_loss", reduced.mean_loss)
        result = engine.clip_and_step(max_grad_norm, reduced.grad_sq)
    if not result.stepped:
        assert result.grad_norm is not None
        return result.grad_norm, ("nan_grad_norm", result.grad_norm)
    return result.grad_norm, None


def _after_step(setup: Setup, engine: Engine, p: _Progress, bad: tuple[str, float] | None) -> None:
    """What the first good step measures (state bytes, precision), the fp16 loss scale, the skip count."""
    if bad is None:
        if not p.memory:
            p.memory = engine.state_bytes()
        if p.precision_pending:
            p.precision_pending = False
            precision = engine.precision()
            if precision is not None:
                setup.emit(ev.PrecisionEvent(type="precision", step=p.step + 1, **precision))  # type: ignore[typeddict-item]
    else:
        p.skipped += 1  # no update: a non-finite loss or gradient must not reach the weights
    if p.scale is not None:  # fp16: a drop of the dynamic loss scale means an overflow was skipped
        new_scale = engine.loss_scale()
        if new_scale is not None and new_scale < p.scale:
            setup.emit(ev.LossScaleEvent(type="loss_scale", step=p.step + 1, old=p.scale, new=new_scale))
        p.scale = new_scale


def _cadence(setup: Setup, engine: Engine, shape: DataShape, p: _Progress, stop_requested: bool) -> None:
    """Eval and checkpoints after step ``p.step``, as the recipe asks."""
    train = setup.recipe.train
    done = p.step + 1
    if engine.evaluates and setup.dataset.eval is not None and (
            done == shape.stop_step or (train.eval_every and done % train.eval_every == 0)):
        begin, cpu = time.perf_counter(), time.process_time()
        setup.emit(ev.PhaseEvent(type="phase", phase="evaluating", detail=f"step {done}"))
        run_eval(setup, engine, done)
        p.eval_spans.append(Span(begin, time.perf_counter(), time.process_time() - cpu))
    every = train.save_every > 0 and done % train.save_every == 0
    if (every or stop_requested) and engine.checkpointer is not None and zero.checkpoints_supported(setup.strategy):
        setup.emit(ev.PhaseEvent(type="phase", phase="saving", detail=f"the checkpoint of step {done}"))
        p.last_checkpoint = engine.checkpointer.save(done, p.epoch, p.tokens_done, reason="every" if every else "stop")


def _finish(setup: Setup, engine: Engine, p: _Progress, meter: Any) -> Status:
    """Save, and journal the end event with every rank's memory."""
    train = setup.recipe.train
    steps_done = p.step + 1
    # Evaluations between steps are not training time; the metered steps are not the steady state.
    probes = p.probe.spans if p.probe is not None else []
    rate = throughput(Window(p.first_step_start, p.tokens_at_start), p.steady.window, p.steady.steps,
                      p.last_step_end, p.tokens_done, [*p.eval_spans, *probes], steady_until=p.steady.until,
                      end_cpu=p.last_step_cpu)
    # Only a completed run with steady steps has an MFU; every rank agrees on both (the step's collective).
    probed = (p.probe.record(setup, rate.steady_seconds, rate.steady_cpu_seconds)
              if p.probe is not None and p.status == "completed" and p.steady.steps else None)
    saved = None
    if train.save and p.status == "completed":
        setup.emit(ev.PhaseEvent(type="phase", phase="saving", detail="the trained model"))
        saved = engine.save()
    measured: dict[str, Any] = {}
    if steps_done > p.start_step:
        measured = {**meter.result(), "measured_steps": min(steps_done - p.start_step, memtrack.MEASURED_STEPS)}
    if p.split is not None:
        measured["step_split"] = p.split.json()
    ranks = setup.memory.summary({**p.memory, **measured})
    end = ev.EndEvent(
        type="end",
        status=p.status,
        steps=steps_done,
        train_seconds=rate.train_seconds,
        tokens=p.tokens_done,
        tokens_per_s=rate.tokens_per_s,
        window_tokens_per_s=rate.window_tokens_per_s,
        steady_steps=rate.steady_steps,
        steady_seconds=rate.steady_seconds,
        final_loss=p.final_loss,
        saved=saved,
        ranks=ranks,
        skipped=p.skipped,
        checkpoint=p.last_checkpoint,
    )
    if probed is not None:
        end["peak_probe"] = probed
        end["steady_cpu_seconds"] = peak_probe.ranks_cpu_seconds(probed)
    setup.emit(end)
    setup.accelerator.end_training()
    return p.status


def run_eval(setup: Setup, engine: Engine, step: int) -> None:
    """Eval loss over the whole eval set on every rank (:mod:`runner.rank.evaluate`), and the samples of
    ``eval.prompts``; rank 0 journals them as a ``metrics`` and an ``eval_samples`` event."""
    assert setup.dataset.eval is not None
    spec = setup.recipe.eval
    acc, model, device = setup.accelerator, engine.model, engine.input_device
    values = evaluate.eval_loss(model, setup.dataset.eval, acc, spec.batch_size, device)
    setup.emit(ev.metrics_event(step, values))
    if spec.prompts:
        texts = evaluate.samples(model, setup.tokenizer, list(spec.prompts), setup.dataset.format,
                                 spec.max_new_tokens, acc, device, setup.recipe.data.context_length)
        setup.emit(ev.EvalSamplesEvent(type="eval_samples", step=step, samples=texts))


def nan_fails(setup: Setup, step: int, bad: tuple[str, float], skipped: int) -> bool:
    """After a non-finite loss or gradient norm at ``step`` (0-based): whether the run fails, by
    ``train.on_nan`` and ``train.max_skipped_steps``; the error event says why."""
    train = setup.recipe.train
    reason, value = bad
    what = "loss" if reason == "nan_loss" else "gradient norm"
    if train.on_nan == "stop":
        setup.emit(ev.ErrorEvent(
            type="error", reason=reason, step=step + 1, value=repr(value), rank=0,
            message=f"non-finite {what} ({value!r}) at step {step + 1}; the run was stopped "
                    "without saving (train.on_nan = stop)"))
        return True
    if skipped > train.max_skipped_steps:
        setup.emit(ev.ErrorEvent(
            type="error", reason="too_many_skipped", step=step + 1, value=repr(value), rank=0,
            message=f"{skipped} steps skipped for a non-finite loss or gradient norm, more "
                    f"than train.max_skipped_steps = {train.max_skipped_steps}"))
        return True
    return False


def _learned_tokens(labels: Any, mask: Any, rows: Any) -> int:
    """Tokens with a target among ``rows`` (labels shifted by one, as the model's loss shifts them)."""
    targets = labels[rows][:, 1:] != -100
    if mask is not None:
        targets &= mask[rows][:, 1:] != 0
    return int(targets.sum())


def epoch_order(rows: int, seed: int, epoch: int, shuffle: bool) -> Any:
    """The epoch's permutation of the training rows (the identity without ``data.shuffle``)."""
    if not shuffle:
        return torch.arange(rows)
    gen = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(rows, generator=gen)
