"""The training script that ``accelerate launch`` runs, one copy per rank.

    accelerate launch --config_file RUN/accelerate.yaml -m runner.rank.trainer --run-dir RUN

It reads ``RUN/recipe.toml``, trains, and (rank 0 only) appends events to ``RUN/events.jsonl``.
Each rank's stdout/stderr go to ``RUN/logs/rank{N}.log``; the trainer never touches the database.

Data order is owned here, not by a sampler: the blocks are permuted once per epoch with the
recipe's seed, and optimizer step ``s``, micro-step ``m`` of rank ``r`` takes rows
``((s*GA + m)*W + r)*B ...`` of that order. So a run with W ranks of micro-batch B sees exactly the
rows a one-process run of micro-batch W*B sees, and their losses can be compared step by step.

The same makes a run resumable: the data position is the step number alone. With
``train.save_every`` (and at a graceful stop) every rank takes part in accelerate's ``save_state``
into ``RUN/checkpoints/step-N`` (:mod:`runner.spec.checkpoint`); a run whose recipe sets
``train.resume_from`` to such a folder restores model or adapter, optimizer, scheduler and RNG states
after ``prepare`` and goes on at step N+1, with the step numbers, lr schedule and token count of the
run it continues.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import resource
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Literal

from runner.rank import memtrack
from runner.spec import events as ev
from runner.spec import strategies, zero

MEMORY_EVERY_S = 10.0
"""Seconds between ``memory`` events (plus one at the run's first and last step)."""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m runner.rank.trainer")
    parser.add_argument("--run-dir", required=True, type=Path)
    args = parser.parse_args(argv)
    run_dir: Path = args.run_dir.resolve()
    rank = int(os.environ.get("RANK", "0"))

    _redirect_output(ev.rank_log(run_dir, rank))
    import faulthandler

    faulthandler.enable()  # a segfault in a native library leaves its Python stack in the rank log
    import warnings

    # transformers 5 deprecates names that peft still calls every step; the log should show our own.
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
    pid_file = ev.rank_pid_file(run_dir, rank)
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    pid_file.write_text(str(os.getpid()))

    journal = ev.JournalWriter(run_dir / ev.EVENTS_FILE) if rank == 0 else None
    code = 0
    try:
        status = Trainer(run_dir, rank, journal).run()
        code = 1 if status == "failed" else 0
    except BaseException as exc:  # noqa: BLE001 (report every failure, then exit non-zero)
        traceback.print_exc()
        if journal is not None:
            journal.write(ev.ErrorEvent(type="error", message=f"{type(exc).__name__}: {exc}".strip(), rank=rank))
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        if journal is not None:
            journal.close()
    # Two-rank gloo runs abort at interpreter exit ~5% of the time ("terminate called without an
    # active exception"); skipping interpreter teardown avoided it in 20/20 runs (docs/cpu-facts.md).
    os._exit(code)


def _redirect_output(log: Path) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115


class _StopFlag:
    """Set by SIGTERM/SIGINT; the ranks agree on it at each step so they all stop together."""

    def __init__(self) -> None:
        self.requested = False
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:  # a second signal: stop now
            os._exit(128 + signum)
        self.requested = True


class Trainer:
    """One rank of a run. ``run()`` does everything; the pieces are methods so that a reader can
    follow the order: accelerator, tokenizer, data, model, optimizer, loop, save."""

    def __init__(self, run_dir: Path, rank: int, journal: ev.JournalWriter | None) -> None:
        from runner.spec.recipe import load_recipe

        self.run_dir = run_dir
        self.rank = rank
        self.journal = journal
        from runner.rank.resume_map import recipe_for_node

        self.recipe = recipe_for_node(load_recipe(run_dir / ev.RECIPE_FILE), run_dir)  # c10d resume: this node's folder
        self.stop = _StopFlag()

    def emit(self, event: ev.TrainerEvent) -> None:
        if self.journal is not None:
            self.journal.write(event)

    # ------------------------------------------------------------------ set-up

    def make_accelerator(self) -> Any:
        import torch
        from accelerate import Accelerator

        launch, train = self.recipe.launch, self.recipe.train
        self.strategy = row = strategies.resolve(launch.strategy, launch.engine)
        cpu = launch.device == "cpu" or (launch.device == "auto" and not torch.cuda.is_available())
        self.on_cpu = cpu
        if cpu and launch.strategy == "fsdp" and launch.fsdp_version == 1:
            os.environ["ACCELERATE_TORCH_DEVICE"] = "cpu"
        mixed = train.accelerate_mixed_precision
        from accelerate.utils import DistributedDataParallelKwargs

        # Gradients as views into DDP's buckets: without it each rank holds the gradients twice (the
        # parameters' .grad and the reducer's flat buckets), +w bytes per trainable parameter
        # (PyTorch DDP docs, ``gradient_as_bucket_view``; docs/memory-model.md). Only DDP reads it.
        handlers: list[Any] = [DistributedDataParallelKwargs(gradient_as_bucket_view=True)]
        if row.accelerate_type == "DEEPSPEED":
            # cpu=True would skip DeepSpeed altogether; on CPU its process group must be gloo (docs/zero.md).
            from accelerate.utils import InitProcessGroupKwargs

            handlers += [InitProcessGroupKwargs(backend="gloo")] if cpu else []
            if cpu:
                zero.skip_shm_comm_build()
            cpu = False
        accelerator = Accelerator(cpu=cpu, mixed_precision=mixed, kwargs_handlers=handlers)
        if cpu and row.accelerate_type == "FSDP":
            _force_fsdp_on_cpu(accelerator, launch.fsdp_version if row.name == "fsdp" else 2, mixed)
            zero.force_fsdp_offload_unpinned(getattr(accelerator.state, "fsdp_plugin", None))
        return accelerator

    def load_tokenizer(self) -> Any:
        from transformers import AutoTokenizer

        from runner.spec import builtin

        model = self.recipe.model
        from runner.data.chat import ensure_chat_template

        if model.name.startswith(builtin.BUILTIN_PREFIX):
            with self.accelerator.main_process_first():
                folder = builtin.ensure_tokenizer(_cache_dir())
            tok = AutoTokenizer.from_pretrained(str(folder))
            ensure_chat_template(tok, builtin=True)
            return tok
        tok = AutoTokenizer.from_pretrained(
            model.name, trust_remote_code=model.trust_remote_code, revision=model.revision
        )
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        ensure_chat_template(tok, builtin=False)
        return tok

    def load_model(self) -> Any:
        import torch

        from runner.spec import builtin

        recipe = self.recipe
        model_cfg, method = recipe.model, recipe.method
        dtype = _load_dtype(model_cfg.dtype, method.type, recipe.train.precision)
        mp = recipe.launch.strategy == "mp"
        if model_cfg.name == builtin.TINY_LLAMA:
            from transformers import LlamaForCausalLM

            torch.manual_seed(recipe.train.seed)  # the init is part of the recipe
            model: Any = LlamaForCausalLM(builtin.tiny_llama_config(len(self.tokenizer)))
            model = model.to(dtype)
            if mp and not self.on_cpu:
                model = _dispatch_over_gpus(model)
        elif model_cfg.name.startswith(builtin.BUILTIN_PREFIX):
            raise ValueError(f"model.name: unknown builtin model {model_cfg.name!r} (have {builtin.TINY_LLAMA})")
        else:
            from transformers import AutoModelForCausalLM

            kwargs: dict[str, Any] = {
                "dtype": dtype,
                "trust_remote_code": model_cfg.trust_remote_code,
                "revision": model_cfg.revision,
            }
            if method.type == "qlora":
                from transformers import BitsAndBytesConfig

                kwargs["quantization_config"] = BitsAndBytesConfig(  # type: ignore[no-untyped-call]
                    load_in_4bit=True,
                    bnb_4bit_quant_type="nf4",
                    bnb_4bit_use_double_quant=True,
                    bnb_4bit_compute_dtype=torch.bfloat16 if recipe.train.precision == "bf16" else torch.float16,
                )
                kwargs["device_map"] = {"": self.accelerator.local_process_index} if not mp else "auto"
            elif mp:
                kwargs["device_map"] = "auto"
            model = AutoModelForCausalLM.from_pretrained(model_cfg.name, **kwargs)
        self.total_params = sum(p.numel() for p in model.parameters())

        if recipe.train.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            model.config.use_cache = False
        if method.type in ("lora", "qlora"):
            from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

            if method.type == "qlora":
                model = prepare_model_for_kbit_training(  # type: ignore[no-untyped-call]
                    model, use_gradient_checkpointing=recipe.train.gradient_checkpointing
                )
            elif recipe.train.gradient_checkpointing:
                model.enable_input_require_grads()
            lora = method.lora
            model = get_peft_model(
                model,
                LoraConfig(
                    r=lora.r,
                    lora_alpha=lora.alpha,
                    lora_dropout=lora.dropout,
                    target_modules=list(lora.target_modules),
                    task_type="CAUSAL_LM",
                ),
            )
        self.trainable_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
        return model

    def load_blocks(self) -> Any:
        from runner.data.cache import local_tokenizer_digest
        from runner.data.prepare import load_data

        # The first rank tokenizes into the cache (or finds it there); the others then read its file.
        # The key is the pre-flight's: a local tokenizer's files, else the loaded tokenizer.
        with self.accelerator.main_process_first():
            self.dataset = load_data(self.recipe.data, self.tokenizer, self.recipe.train.seed,
                                     tokenizer_id=local_tokenizer_digest(self.recipe.model))
        return self.dataset.train

    # ------------------------------------------------------------------ run

    def run(self) -> str:
        """Train; return the end status (``completed``, ``stopped`` or ``failed``)."""
        import torch

        recipe = self.recipe
        train = recipe.train
        from runner.spec import strategies

        strategy = strategies.get(recipe.launch.strategy)
        if strategy.pipelined(recipe.launch.nproc) or strategy.tensor_parallel:
            from runner.rank import pipeline  # a loop of its own: accelerate prepares no pipeline or TP model

            return pipeline.run(self)
        self.accelerator = acc = self.make_accelerator()
        from accelerate.utils import set_seed

        set_seed(train.seed)
        self.emit(ev.PhaseEvent(type="phase", phase="tokenizing", detail=str(recipe.data.source)))
        self.tokenizer = self.load_tokenizer()
        data = self.load_blocks()
        blocks, mask, labels_all = data.input_ids, data.attention_mask, data.labels
        world = acc.num_processes
        B, GA = train.batch_size, train.grad_accum
        rows_per_step = B * world * GA
        steps_per_epoch = blocks.shape[0] // rows_per_step
        if steps_per_epoch == 0:
            raise ValueError(
                f"train.batch_size: {blocks.shape[0]} rows of data cannot fill one optimizer step of "
                f"{rows_per_step} rows (batch_size {B} x {world} processes x grad_accum {GA})"
            )
        total_steps = train.max_steps or max(1, math.floor(train.epochs * steps_per_epoch))
        self.data_shape = {"rows": int(blocks.shape[0]), "rows_per_step": rows_per_step,
                           "steps_per_epoch": steps_per_epoch, "total_steps": total_steps}
        resume = self.check_resume() if train.resume_from else None  # before the model: fail fast

        # The runtime's own resident memory before the model exists (RSS is reported separately from
        # the tensor peak, and this is the part of it training did not add).
        self.rss_baseline = memtrack.current_rss()
        self.emit(ev.PhaseEvent(type="phase", phase="loading_model", detail=f"{recipe.model.name}, {recipe.method.type}"))
        model = self.load_model()
        from runner.spec.flops import dims_from_config

        dims = dims_from_config(model.config, int(blocks.shape[1]))  # for MFU, so compare reads no config
        trainable = [p for p in model.parameters() if p.requires_grad]
        mp = recipe.launch.strategy == "mp"
        self.emit(ev.PhaseEvent(type="phase", phase="preparing",
                                detail=f"{recipe.launch.strategy} x {world} ({acc.distributed_type.value})"))
        engine = self.strategy.engine_row()
        if engine is not None and engine.name == "torch" and engine.stage == 1:
            # ZeroRedundancyOptimizer is not accelerate's to wrap (its state_dict needs a consolidation first):
            # the model alone is prepared (DDP), and the optimizer steps itself.
            optimizer = zero.zero_optimizer(trainable, train.lr, train.weight_decay)
            model = acc.prepare(model)
        else:
            optimizer = torch.optim.AdamW(trainable, lr=train.lr, weight_decay=train.weight_decay)
            model, optimizer = acc.prepare(model, optimizer)
        deepspeed = zero.is_deepspeed(model)
        # What really runs, read from the prepared objects; a ZeRO run that became something else stops here.
        sharding = zero.in_effect(model, optimizer, acc)
        wrong = zero.mismatch(self.strategy, recipe.launch.offload, sharding)
        if wrong:
            raise RuntimeError(wrong)
        from transformers import get_scheduler

        # Not prepared: accelerate's scheduler wrapper steps once per process, which would make the
        # lr curve depend on the world size. Registered, so that save_state/load_state carry it.
        scheduler = get_scheduler(train.schedule, optimizer, train.warmup_steps, total_steps)
        acc.register_for_checkpointing(scheduler)
        self.prepare_checkpointing(model)
        input_device = _input_device(model) if mp else acc.device

        start_step = tokens_done = 0  # real tokens: padding (data.pack = false) is not counted
        resume_seconds = None
        if resume is not None:
            self.emit(ev.PhaseEvent(type="phase", phase="resuming", detail=str(train.resume_from)))
            t_load = time.perf_counter()
            self.load_checkpoint(model, Path(str(train.resume_from)))
            resume_seconds = time.perf_counter() - t_load
            start_step, tokens_done = int(resume["step"]), int(resume["tokens_done"])

        self.emit(ev.StartEvent(
            type="start",
            world_size=world,
            distributed_type=acc.distributed_type.value,
            strategy=recipe.launch.strategy,
            device=str(acc.device),
            device_type=acc.device.type,
            mixed_precision=acc.mixed_precision,
            threads=torch.get_num_threads(),  # intra-op threads: the divisor of CPU% and the MFU peak's
            model_dims=dims,
            fsdp_version=recipe.launch.fsdp_version if acc.distributed_type.value == "FSDP" else None,
            params=self.total_params,
            trainable_params=self.trainable_params,
            local_param_numel=_local_numel(model),
            rows=int(blocks.shape[0]),
            context_length=int(blocks.shape[1]),
            total_steps=total_steps,
            steps_per_epoch=steps_per_epoch,
            tokens_per_step=rows_per_step * int(blocks.shape[1]),
            device_map=_device_map(model) if mp else None,
            pids=_gather_list([os.getpid()]) if world > 1 else [os.getpid()],
            start_step=start_step,
            resumed_from=train.resume_from,
            resume_seconds=resume_seconds,
            engine=self.strategy.engine,
            sharding=sharding,
            data=self.dataset.info(),
        ))
        self.eval_spans: list[tuple[float, float]] = []

        tokens_at_start = tokens_done
        order: Any = None
        epoch = -1
        first_step_start = last_step_end = time.perf_counter()
        memory: dict[str, Any] = {}
        memory_acts: dict[str, Any] = {}
        # One meter over the measured steps: what step 1 leaves alive (optimizer state, DDP's buckets) is
        # still counted in step 2.
        meter = memtrack.meter_for(not self.on_cpu, model, zero.inner_optimizer(optimizer))
        compute_dtype = zero.ComputeDtype(model)
        precision: dict[str, Any] = {}
        scale = zero.loss_scale(model, acc)
        final_loss = float("nan")
        status: Literal["completed", "stopped", "failed"] = "completed"
        skipped = 0
        last_checkpoint: str | None = None
        last_memory_event = -math.inf
        step = start_step - 1
        model.train()
        for step in range(start_step, total_steps):
            if step // steps_per_epoch != epoch:
                epoch = step // steps_per_epoch
                order = _epoch_order(blocks.shape[0], train.seed, epoch, recipe.data.shuffle)
            t0 = time.perf_counter()
            if step == start_step:
                first_step_start = t0
            loss_sum = torch.zeros((), device=acc.device)
            my_tokens = 0
            # The first steps measure peak memory per phase (runner/rank/memtrack.py); later steps pay nothing.
            peaks: memtrack.Meter = meter if step - start_step < memtrack.MEASURED_STEPS else memtrack.NoMeter()
            base = (step % steps_per_epoch) * rows_per_step
            # Masked labels (data.train_on = "completions"): rows learn different numbers of tokens, so the
            # loss is token-weighted over the whole optimizer step (every rank can count it: it holds all
            # rows), and one process, DDP and FSDP at the same global batch compute the same update.
            learned = _learned_tokens(labels_all, mask, order[base : base + rows_per_step]) if labels_all is not None else 0
            for micro in range(GA):
                start = base + (micro * world + acc.process_index) * B
                rows = order[start : start + B]
                batch = blocks[rows].to(input_device)
                # Labels differ from the ids where tokens are not learned (data.train_on = "completions").
                targets = batch if labels_all is None else labels_all[rows].to(input_device)
                if mask is None:
                    inputs = {"input_ids": batch, "labels": targets}
                    my_tokens += int(batch.numel())
                else:
                    my_tokens += int(mask[rows].sum())
                    batch_mask = mask[rows].to(input_device)
                    inputs = {"input_ids": batch, "attention_mask": batch_mask,
                              "labels": targets.masked_fill(batch_mask == 0, -100)}
                # The backward must run inside no_sync too: FSDP (1 and 2) reads the sync flag while
                # reducing gradients in backward, DDP at forward time.
                # DeepSpeed accumulates itself (told where the boundary is, below).
                ctx = acc.no_sync(model) if micro < GA - 1 and not deepspeed else contextlib.nullcontext()
                # One forward (the run's first step, micro-step 0) measures what autograd saves.
                first = step == start_step and micro == 0
                saved_meter = _SavedBytes(model, acc.device) if first else contextlib.nullcontext()
                with ctx:
                    with peaks.phase("forward"), acc.autocast(), saved_meter, (
                            compute_dtype if first else contextlib.nullcontext()):
                        # Only the loss is kept: holding the output would keep the logits alive through
                        # backward and into the next forward (docs/memory-model.md).
                        loss = model(**inputs).loss
                        loss = loss * (_learned_tokens(labels_all, mask, rows) * world / learned) if learned else loss / GA
                    if isinstance(saved_meter, _SavedBytes):
                        memory_acts = saved_meter.result()
                    with peaks.phase("backward"):
                        if deepspeed:
                            # The engine itself, not accelerate's wrapper (which would also step): the
                            # optimizer step stays after the step's collective, as for every strategy.
                            model.set_gradient_accumulation_boundary(micro == GA - 1)
                            model.backward(loss, scale_wrt_gas=False)  # the loss is already / GA
                        else:
                            acc.backward(loss)
                loss_sum += loss.detach().to(acc.device)
            # One collective per step carries the loss, the stop request, the token count and each
            # rank's memory figures (its own slots, zeros elsewhere), so every rank leaves the loop
            # after the same step and takes the same decision on a non-finite loss. It comes before
            # the optimizer step for that decision. float64: byte counts exceed float32's 24 bits.
            mem_slots = torch.zeros(3 * world, dtype=torch.float64)
            mem_slots[3 * acc.process_index : 3 * acc.process_index + 3] = torch.tensor(
                self.memory_now(), dtype=torch.float64)
            stats = torch.cat([
                torch.tensor([float(loss_sum), float(self.stop.requested), float(my_tokens)], dtype=torch.float64),
                mem_slots,
            ]).to(acc.device)
            if world > 1:
                stats = acc.reduce(stats, reduction="sum")
                stats[0] /= world
            stats = stats.cpu()
            mean_loss = float(stats[0])
            stop_requested = float(stats[1]) > 0
            step_tokens = int(stats[2])
            grad_norm = None
            bad: tuple[str, float] | None = None
            ds_grads = zero.deepspeed_grad_bytes(model) if deepspeed and not memory else None
            with peaks.phase("optimizer"):
                if not math.isfinite(mean_loss):
                    bad = ("nan_loss", mean_loss)
                elif deepspeed:
                    model.step()  # clips (gradient_clipping in its config), steps and zeroes the gradients
                    norm = model.get_global_grad_norm() if train.max_grad_norm > 0 else None
                    grad_norm = float(norm) if norm is not None else None
                elif train.max_grad_norm > 0:
                    grad_norm = float(acc.clip_grad_norm_(model.parameters(), train.max_grad_norm))
                    if not math.isfinite(grad_norm):  # global norm: the same on every rank
                        bad = ("nan_grad_norm", grad_norm)
                if bad is None and not deepspeed:
                    optimizer.step()
            if bad is None:
                if not memory:
                    memory = {**zero.state_bytes(model, optimizer, ds_grads), **memory_acts}
                if not precision:
                    precision = zero.precision_in_effect(model, optimizer, compute_dtype.result())
                    self.emit(ev.PrecisionEvent(type="precision", step=step + 1, **precision))  # type: ignore[typeddict-item]
            else:
                skipped += 1  # no update: a non-finite loss or gradient must not reach the weights
            if scale is not None:  # fp16: a drop of the dynamic loss scale means an overflow was skipped
                new_scale = zero.loss_scale(model, acc)
                if new_scale is not None and new_scale < scale:
                    self.emit(ev.LossScaleEvent(type="loss_scale", step=step + 1, old=scale, new=new_scale))
                scale = new_scale
            lr = scheduler.get_last_lr()[0]
            scheduler.step()  # the lr follows the step count, skipped steps included
            optimizer.zero_grad(set_to_none=True)
            tokens_done += step_tokens
            t1 = time.perf_counter()
            last_step_end = t1
            final_loss = mean_loss
            notable = step + 1 == total_steps or stop_requested or bad is not None
            if (step + 1) % train.log_every == 0 or notable:
                step_event = ev.StepEvent(
                    type="step",
                    step=step + 1,
                    epoch=epoch,
                    loss=mean_loss,
                    lr=lr,
                    grad_norm=grad_norm,
                    tokens=tokens_done,
                    step_time=t1 - t0,
                    tokens_per_s=step_tokens / (t1 - t0),
                )
                if bad is not None:
                    step_event["skipped"] = True
                self.emit(step_event)
            if step == start_step or notable or t1 - last_memory_event >= MEMORY_EVERY_S:
                last_memory_event = t1
                self.emit(ev.MemoryEvent(type="memory", step=step + 1, ranks=self.memory_ranks(stats[3:].tolist())))
            if bad is not None and self.nan_fails(step, bad, skipped):
                status = "failed"
                break
            if self.dataset.eval is not None and (
                    step + 1 == total_steps or (train.eval_every and (step + 1) % train.eval_every == 0)):
                self.evaluate(step + 1, model, input_device)
            every = train.save_every > 0 and (step + 1) % train.save_every == 0
            if (every or stop_requested) and zero.checkpoints_supported(self.strategy):
                last_checkpoint = self.save_checkpoint(step + 1, epoch, tokens_done,
                                                       reason="every" if every else "stop")
            if stop_requested:
                status = "stopped"
                break
        steps_done = step + 1
        # Evaluations between steps are not training time.
        train_seconds = last_step_end - first_step_start - sum(e - b for b, e in self.eval_spans if e <= last_step_end)

        saved = None
        if train.save and status == "completed":
            saved = self.save(model)
        measured: dict[str, Any] = {}
        if steps_done > start_step:
            measured = {**meter.result(), "measured_steps": min(steps_done - start_step, memtrack.MEASURED_STEPS)}
        ranks = self.rank_memory({**memory, **measured})
        run_tokens = tokens_done - tokens_at_start
        self.emit(ev.EndEvent(
            type="end",
            status=status,
            steps=steps_done,
            train_seconds=train_seconds,
            tokens=tokens_done,
            tokens_per_s=run_tokens / train_seconds if train_seconds > 0 and run_tokens else None,
            final_loss=final_loss,
            saved=saved,
            ranks=ranks,
            skipped=skipped,
            checkpoint=last_checkpoint,
        ))
        acc.end_training()
        return status

    def evaluate(self, step: int, model: Any, input_device: Any) -> None:
        """Eval loss over the whole eval set on every rank (:mod:`runner.rank.evaluate`), and the samples of
        ``eval.prompts``; rank 0 journals them as a ``metrics`` and an ``eval_samples`` event."""
        from runner.rank import evaluate

        begin = time.perf_counter()
        assert self.dataset.eval is not None
        spec = self.recipe.eval
        values = evaluate.eval_loss(model, self.dataset.eval, self.accelerator, spec.batch_size, input_device)
        self.emit(ev.metrics_event(step, values))
        if spec.prompts:
            texts = evaluate.samples(model, self.tokenizer, list(spec.prompts), self.dataset.format,
                                     spec.max_new_tokens, self.accelerator, input_device,
                                     self.recipe.data.context_length)
            self.emit(ev.EvalSamplesEvent(type="eval_samples", step=step, samples=texts))
        self.eval_spans.append((begin, time.perf_counter()))

    # ------------------------------------------------------------------ checkpoints

    def check_resume(self) -> dict[str, Any]:
        """The manifest of ``train.resume_from``, checked against this run (one-line errors)."""
        from runner.spec.checkpoint import CheckpointError, check_resume

        train = self.recipe.train
        assert train.resume_from is not None
        manifest = check_resume(train.resume_from, self.accelerator.num_processes, self.recipe.launch.strategy)
        data = manifest.get("data") or {}
        for key in ("rows", "rows_per_step", "steps_per_epoch"):
            if data.get(key) != self.data_shape[key]:
                raise CheckpointError(
                    f"train.resume_from: the checkpoint's data position does not fit this run ({key} "
                    f"{data.get(key)} there, {self.data_shape[key]} here): same data and batch needed"
                )
        if int(manifest["step"]) >= self.data_shape["total_steps"]:
            raise CheckpointError(
                f"train.resume_from: the checkpoint is at step {manifest['step']}, the run has "
                f"{self.data_shape['total_steps']} steps: nothing left to train (raise train.max_steps)"
            )
        return manifest

    def prepare_checkpointing(self, model: Any) -> None:
        """Choose what save_state writes. Under FSDP a sharded torch distributed checkpoint (every rank
        writes its own shard; the full-state-dict path segfaulted under FSDP1 on CPU, docs/cpu-facts.md).
        Elsewhere, for LoRA, only the trainable tensors: the frozen base is rebuilt from the recipe."""
        acc = self.accelerator
        self.adapter_keys: set[str] | None = None
        if acc.distributed_type.value == "FSDP":
            plugin = acc.state.fsdp_plugin
            plugin.state_dict_config = plugin.optim_state_dict_config = None
            plugin.set_state_dict_type("SHARDED_STATE_DICT")
            return
        if self.recipe.method.type == "full":
            return
        # Names without DDP's "module." prefix: accelerate hands save_state the module's own state dict.
        keys = {_plain_name(name) for name, p in model.named_parameters() if p.requires_grad}
        self.adapter_keys = keys

        def only_trainable(models: list[Any], weights: list[dict[str, Any]], output_dir: str) -> None:
            for i, sd in enumerate(weights):
                weights[i] = {k: v for k, v in sd.items() if _plain_name(k) in keys}

        acc.register_save_state_pre_hook(only_trainable)

    def save_checkpoint(self, step: int, epoch: int, tokens_done: int, reason: Literal["every", "stop"]) -> str:
        """Write a resumable checkpoint of this step (every rank takes part); return its folder.

        ``ftui.json`` says ``complete: false`` until every rank has written its part (a barrier)
        and rank 0 has checked that each rank's part is there; only then ``complete: true``."""
        from runner.spec import checkpoint as ck

        acc = self.accelerator
        t0 = time.perf_counter()
        folder = ck.checkpoint_dir(self.run_dir, step)
        manifest: dict[str, Any] = {
            "format": ck.FORMAT,
            "step": step,
            "epoch": epoch,
            "tokens_done": tokens_done,
            "data": {k: self.data_shape[k] for k in ("rows", "rows_per_step", "steps_per_epoch")}
            | {"step_in_epoch": step % self.data_shape["steps_per_epoch"], "seed": self.recipe.train.seed,
               "shuffle": self.recipe.data.shuffle},
            "recipe_digest": self.recipe.model_copy(
                update={"train": self.recipe.train.model_copy(update={"resume_from": None})}).digest(),
            "world_size": acc.num_processes,
            "strategy": self.recipe.launch.strategy,
            "distributed_type": acc.distributed_type.value,
            "method": self.recipe.method.type,
            "reason": reason,
            "complete": False,
        }
        # Several machines: each writes its own ranks' parts into its own run folder, and its first
        # rank checks them and writes that folder's manifest (one machine: the main process, as before).
        nnodes = int(os.environ.get("FTUI_NNODES", "1"))
        here = acc.is_local_main_process if nnodes > 1 else acc.is_main_process
        local = int(os.environ.get("LOCAL_WORLD_SIZE", acc.num_processes))
        node_ranks = range(int(os.environ.get("GROUP_RANK", "0")) * local, (int(os.environ.get("GROUP_RANK", "0")) + 1)
                           * local) if nnodes > 1 else None
        if nnodes > 1:  # model, optimizer and scheduler into every node's folder: each node resumes from its own
            acc.project_configuration.save_on_each_node = True
        if here:
            folder.mkdir(parents=True, exist_ok=True)
            ck.write_manifest(folder, manifest)
        acc.wait_for_everyone()
        acc.save_state(str(folder), safe_serialization=True)
        acc.wait_for_everyone()
        removed: list[str] = []
        size = 0
        if here:
            missing = ck.missing_rank_parts(folder, acc.num_processes, node_ranks, metadata=acc.is_main_process)
            if missing:
                raise RuntimeError(f"checkpoint {folder.name}: parts missing after the save: {', '.join(missing)}")
            files = ck.file_sizes(folder)
            size = sum(files.values())
            ck.write_manifest(folder, manifest | {"files": files, "bytes": size, "complete": True})
            removed = ck.prune(self.run_dir, self.recipe.train.keep_checkpoints, folder)
        acc.wait_for_everyone()
        self.emit(ev.CheckpointEvent(type="checkpoint", step=step, path=str(folder), seconds=time.perf_counter() - t0,
                                     bytes=size, reason=reason, removed=removed))
        return str(folder)

    def load_checkpoint(self, model: Any, folder: Path) -> None:
        """Restore model (or adapter), optimizer, scheduler and RNG states from ``folder``."""
        from runner.spec.checkpoint import CheckpointError

        kwargs: dict[str, Any] = {}
        if self.adapter_keys is not None:
            from safetensors import safe_open

            with safe_open(str(folder / "model.safetensors"), framework="pt") as fh:
                saved = set(fh.keys())
            if {_plain_name(k) for k in saved} != self.adapter_keys:
                raise CheckpointError(
                    f"train.resume_from: the checkpoint's {len(saved)} tensors are not this run's "
                    f"{len(self.adapter_keys)} trainable ones (another method, model or LoRA shape?)"
                )
            kwargs["strict"] = False  # the frozen base is not in the file; the checks here stand in
        self.accelerator.load_state(str(folder), **kwargs)
        if self.adapter_keys is not None:
            # strict=False would also pass over keys that match nothing: check every tensor arrived.
            from safetensors.torch import load_file

            saved_tensors = load_file(str(folder / "model.safetensors"))
            params = {_plain_name(n): p for n, p in model.named_parameters()}
            wrong = [k for k, v in saved_tensors.items() if not params[_plain_name(k)].detach().cpu().equal(v)]
            if wrong:
                raise CheckpointError(f"train.resume_from: {len(wrong)} tensors did not load, e.g. {wrong[0]}")


    # ------------------------------------------------------------------ measurement and saving

    def state_bytes(self, model: Any, optimizer: Any) -> dict[str, int]:
        """Exact bytes of this rank's parameters, gradients, optimizer state and fp32 master (local shards):
        :func:`runner.spec.zero.state_bytes`, which also reads DeepSpeed's partitions."""
        return zero.state_bytes(model, optimizer)

    def memory_now(self) -> tuple[float, float, float]:
        """This rank's three memory figures for the step collective: on CUDA the allocator's allocated,
        reserved and peak allocated bytes of its device(s); on CPU, where torch keeps no allocator
        statistics, the process RSS now and its peak (getrusage), third slot unused."""
        import torch

        if not self.on_cpu and torch.cuda.is_available():
            # mp spreads one rank over every visible GPU; the others use their own device only.
            mp = self.recipe.launch.strategy == "mp" and self.accelerator.num_processes == 1
            devices = list(range(torch.cuda.device_count())) if mp else [self.accelerator.device]
            return (float(sum(torch.cuda.memory_allocated(d) for d in devices)),
                    float(sum(torch.cuda.memory_reserved(d) for d in devices)),
                    float(sum(torch.cuda.max_memory_allocated(d) for d in devices)))
        rss = _rss_now()  # /proc counts pages, getrusage kilobytes: the peak is at least what is held now
        return float(rss), float(max(rss, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)), 0.0

    def nan_fails(self, step: int, bad: tuple[str, float], skipped: int) -> bool:
        """After a non-finite loss or gradient norm at ``step`` (0-based): whether the run fails, by
        ``train.on_nan`` and ``train.max_skipped_steps``; the error event says why (rank 0's loops both)."""
        train = self.recipe.train
        reason, value = bad
        what = "loss" if reason == "nan_loss" else "gradient norm"
        if train.on_nan == "stop":
            self.emit(ev.ErrorEvent(
                type="error", reason=reason, step=step + 1, value=repr(value), rank=0,
                message=f"non-finite {what} ({value!r}) at step {step + 1}; the run was stopped "
                        "without saving (train.on_nan = stop)"))
            return True
        if skipped > train.max_skipped_steps:
            self.emit(ev.ErrorEvent(
                type="error", reason="too_many_skipped", step=step + 1, value=repr(value), rank=0,
                message=f"{skipped} steps skipped for a non-finite loss or gradient norm, more "
                        f"than train.max_skipped_steps = {train.max_skipped_steps}"))
            return True
        return False

    def memory_ranks(self, slots: list[float]) -> list[dict[str, Any]]:
        """The ``ranks`` list of a ``memory`` event from the reduced slots (three per rank)."""
        cuda = not self.on_cpu
        ranks: list[dict[str, Any]] = []
        for r in range(len(slots) // 3):
            a, b, c = (int(v) for v in slots[3 * r : 3 * r + 3])
            if cuda:
                ranks.append({"rank": r, "source": "torch.cuda", "allocated_bytes": a, "reserved_bytes": b,
                              "peak_allocated_bytes": c})
            else:
                ranks.append({"rank": r, "source": "rss", "rss_bytes": a, "peak_rss_bytes": b})
        return ranks

    def rank_memory(self, memory: dict[str, Any]) -> list[dict[str, Any]]:
        import torch

        mine: dict[str, Any] = {
            "rank": self.accelerator.process_index,
            "pid": os.getpid(),
            **memory,
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "rss_baseline_bytes": getattr(self, "rss_baseline", None),
            "source": "psutil/getrusage" if self.on_cpu else "torch.cuda",
        }
        if not self.on_cpu and torch.cuda.is_available():
            # The measured phases reset the allocator's peak; the rest of the run kept counting after.
            mine["peak_allocated_bytes"] = max(torch.cuda.max_memory_allocated(), int(memory.get("peak_tensor_bytes") or 0))
            reserved = (memory.get("phase_reserved") or {}).values()
            mine["peak_reserved_bytes"] = max([torch.cuda.max_memory_reserved(), *reserved])
        if self.accelerator.num_processes == 1:
            return [mine]
        return _gather_list([mine])

    def save(self, model: Any) -> str | None:
        """Save the adapter (LoRA) or model (full) to RUN/output; verify that something was written."""
        acc = self.accelerator
        out = self.run_dir / ev.OUTPUT_DIR
        state_dict = _full_state_dict(model, acc, trainable_only=self.recipe.method.type != "full")
        if acc.is_main_process:
            unwrapped = acc.unwrap_model(model)
            if state_dict is not None and self.recipe.method.type != "full":
                _save_adapter(unwrapped, state_dict, out)
            else:
                unwrapped.save_pretrained(str(out), state_dict=state_dict, safe_serialization=True)
            self.tokenizer.save_pretrained(str(out))
            _verify_saved(out)
        acc.wait_for_everyone()
        return str(out)


# ---------------------------------------------------------------------- helpers


def _learned_tokens(labels: Any, mask: Any, rows: Any) -> int:
    """Tokens with a target among ``rows`` (labels shifted by one, as the model's loss shifts them)."""
    targets = labels[rows][:, 1:] != -100
    if mask is not None:
        targets &= mask[rows][:, 1:] != 0
    return int(targets.sum())


def _plain_name(name: str) -> str:
    """A parameter or state-dict key without DDP's ``module.`` prefix."""
    return name.removeprefix("module.")


def _rss_now() -> int:
    """Resident set size of this process now (Linux /proc; psutil elsewhere)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import psutil

        return int(psutil.Process().memory_info().rss)


def _gather_list(items: list[Any]) -> list[Any]:
    from accelerate.utils import gather_object

    return list(gather_object(items))


def _force_fsdp_on_cpu(accelerator: Any, version: int, mixed: str) -> None:
    """Make FSDP real on CPU. accelerate only switches to FSDP for GPU-like devices and silently runs
    plain multi-CPU DDP otherwise; setting the plugin and the distributed type on both state objects
    before ``prepare`` gives real sharding over gloo (docs/cpu-facts.md). The plugin reads the FSDP_*
    variables that ``accelerate launch`` exported from the generated config."""
    from accelerate import FullyShardedDataParallelPlugin
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    if accelerator.distributed_type not in (DistributedType.MULTI_CPU, DistributedType.NO):
        return
    if accelerator.num_processes < 2 and accelerator.distributed_type == DistributedType.NO:
        return  # one process: there is nothing to shard over; the start event says NO
    os.environ.setdefault("FSDP_VERSION", str(version))
    plugin = FullyShardedDataParallelPlugin(fsdp_version=version)
    if mixed != "no":
        plugin.set_mixed_precision(mixed)
    state = AcceleratorState()
    state.fsdp_plugin = plugin
    state.distributed_type = DistributedType.FSDP
    PartialState().distributed_type = DistributedType.FSDP


def _load_dtype(dtype: str, method: str, precision: str) -> Any:
    import torch

    table = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    if dtype != "auto":
        return table[dtype]
    # Full fine-tuning keeps fp32 master weights (accelerate autocasts the compute); LoRA's frozen
    # base can live in the compute dtype, which halves its memory.
    if method in ("lora", "qlora") and precision != "fp32":
        return table[precision]
    return torch.float32


def _dispatch_over_gpus(model: Any) -> Any:
    from accelerate import dispatch_model, infer_auto_device_map
    from accelerate.utils import get_balanced_memory

    no_split = list(getattr(model, "_no_split_modules", None) or [])
    max_memory = get_balanced_memory(model, no_split_module_classes=no_split)
    device_map = infer_auto_device_map(model, max_memory=max_memory, no_split_module_classes=no_split)
    return dispatch_model(model, device_map=device_map)


def _device_map(model: Any) -> dict[str, str] | None:
    base = model
    for attr in ("base_model", "model"):
        if hasattr(base, "hf_device_map"):
            break
        base = getattr(base, attr, base)
    dm = getattr(base, "hf_device_map", None)
    return {k: str(v) for k, v in dm.items()} if dm else None


def _input_device(model: Any) -> Any:
    import torch

    dm = _device_map(model)
    if dm:
        first = next(iter(dm.values()))
        return torch.device(f"cuda:{first}" if first.isdigit() else first)
    return next(model.parameters()).device


def _local_tensor(t: Any) -> Any:
    return t.to_local() if hasattr(t, "to_local") else t


def _local_bytes(t: Any) -> int:
    local = _local_tensor(t)
    return int(local.numel() * local.element_size())


def _local_numel(model: Any) -> int:
    return int(sum(_local_tensor(p).numel() for p in model.parameters()))


def _epoch_order(rows: int, seed: int, epoch: int, shuffle: bool) -> Any:
    import torch

    if not shuffle:
        return torch.arange(rows)
    gen = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(rows, generator=gen)


def _full_state_dict(model: Any, acc: Any, trainable_only: bool) -> Any:
    """A full (unsharded) state dict on rank 0 for FSDP, None otherwise (save_pretrained reads the
    model). Uses torch's distributed-checkpoint API: accelerate's FSDP1 full-state-dict path
    segfaulted on CPU (docs/cpu-facts.md)."""
    if acc.distributed_type.value == "DEEPSPEED" and model.zero_optimization_stage() == 3:
        # ZeRO-3's weights are partitions: DeepSpeed gathers them onto rank 0 (every rank takes part;
        # stage3_gather_16bit_weights_on_model_save in runner/spec/zero.py's config). The adapter's keys are
        # picked by _save_adapter.
        gathered = acc.get_state_dict(model)
        return {_clean_fqn(k): v for k, v in (gathered or {}).items()} if acc.is_main_process else None
    if acc.distributed_type.value != "FSDP":
        return None
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if getattr(getattr(acc.state, "fsdp_plugin", None), "fsdp_version", 2) == 1:
        # torch's state-dict hooks segfaulted under FSDP1 on CPU (cloning an unsharded parameter);
        # summoning the full parameters and copying them ourselves works on CPU and GPU alike.
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        wanted = {_clean_fqn(n) for n, p in model.named_parameters() if p.requires_grad or not trainable_only}
        with FSDP.summon_full_params(model, writeback=False):
            sd = {
                _clean_fqn(n): p.detach().to("cpu", copy=True)
                for n, p in model.named_parameters()
                if _clean_fqn(n) in wanted
            }
    else:
        # An adapter needs only the trainable tensors; gathering the frozen base too costs memory.
        options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=trainable_only)
        sd = get_model_state_dict(model, options=options)
    return {_clean_fqn(k): v for k, v in sd.items()}


def _save_adapter(peft_model: Any, state_dict: dict[str, Any], out: Path) -> None:
    """Write a gathered LoRA state dict in peft's adapter format. peft's own save_pretrained matches
    keys against the module tree, which under FSDP1 still holds the FSDP wrappers, and silently
    writes an empty adapter (docs/cpu-facts.md); the gathered keys are already clean."""
    from safetensors.torch import save_file

    adapter = next(iter(peft_model.peft_config))
    tensors = {k.replace(f".{adapter}.", "."): v.contiguous() for k, v in state_dict.items() if "lora_" in k}
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    peft_model.peft_config[adapter].save_pretrained(str(out))


def _clean_fqn(name: str) -> str:
    """A parameter name without FSDP1's and activation checkpointing's wrapper prefixes."""
    return name.replace("_fsdp_wrapped_module.", "").replace("_checkpoint_wrapped_module.", "")


def _verify_saved(out: Path) -> None:
    """PEFT writes an EMPTY adapter under FSDP without complaint (docs/cpu-facts.md): check the tensors."""
    from safetensors import safe_open

    files = list(out.glob("*.safetensors"))
    if not files:
        raise RuntimeError(f"save: no .safetensors file written in {out}")
    count = 0
    for file in files:
        with safe_open(str(file), framework="pt") as fh:
            count += len(list(fh.keys()))
    if count == 0:
        raise RuntimeError(f"save: {files[0].name} holds no tensors (an empty adapter)")


class _SavedBytes:
    """Bytes autograd saves for backward during one forward, parameters excluded.

    The method of ``tests/test_estimate.py``: a ``saved_tensors_hooks`` pack hook sums the unique
    storages (deduplicated by ``data_ptr``) of what is saved. Parameters are recognised by storage while
    their module runs (pre/post forward hooks), which also catches FSDP's all-gathered weights, whose
    memory is freed and can be reused by later activations. On CUDA the allocator's growth across the
    forward is reported too (``activation_alloc_bytes``), which includes what the hooks cannot see
    (e.g. tensors kept by non-reentrant checkpointing).
    """

    def __init__(self, model: Any, device: Any) -> None:
        self.model = model
        self.cuda = getattr(device, "type", "") == "cuda"
        self.live: dict[int, int] = {}
        self.seen: dict[int, int] = {}
        self.handles: list[Any] = []
        self.ctx: Any = None
        self.alloc0 = 0
        self.alloc1 = 0

    def _pre(self, module: Any, args: Any) -> None:
        for p in module.parameters(recurse=False):
            ptr = _local_tensor(p).untyped_storage().data_ptr()
            self.live[ptr] = self.live.get(ptr, 0) + 1

    def _post(self, module: Any, args: Any, out: Any) -> None:
        for p in module.parameters(recurse=False):
            ptr = _local_tensor(p).untyped_storage().data_ptr()
            if self.live.get(ptr, 0) > 1:
                self.live[ptr] -= 1
            else:
                self.live.pop(ptr, None)

    def _pack(self, t: Any) -> Any:
        import torch

        if isinstance(t, torch.nn.Parameter):
            return t
        storage = _local_tensor(t).untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in self.live and ptr not in self.seen:
            self.seen[ptr] = int(storage.nbytes())
        return t

    def __enter__(self) -> None:
        import torch

        for module in self.model.modules():
            self.handles.append(module.register_forward_pre_hook(self._pre))
            self.handles.append(module.register_forward_hook(self._post))
        if self.cuda:
            torch.cuda.synchronize()
            self.alloc0 = torch.cuda.memory_allocated()
        self.ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self.ctx.__enter__()

    def __exit__(self, *exc: object) -> None:
        import torch

        self.ctx.__exit__(*exc)
        for handle in self.handles:
            handle.remove()
        self.handles.clear()
        if self.cuda:
            torch.cuda.synchronize()
            self.alloc1 = torch.cuda.memory_allocated()

    def result(self) -> dict[str, Any]:
        out: dict[str, Any] = {"activation_bytes": sum(self.seen.values()),
                               "activation_source": "saved_tensors_hooks (one forward, step 1)"}
        if self.cuda:
            out["activation_alloc_bytes"] = self.alloc1 - self.alloc0
        return out


def _cache_dir() -> Path:
    from runner.spec.paths import cache_dir

    return cache_dir()


if __name__ == "__main__":
    main()
