"""Memory estimate for a fine-tuning run: pure functions, no I/O, no GPU (the shape comes from
``runner.planner.shapes``, the activations from ``runner.planner.activations``). docs/memory-model.md has
every formula with its source and the grid it was checked on; in short:

The estimate is the PEAK of one training step on the busiest device: the largest of the forward (at the
loss), the backward (its start, the recomputed layer under checkpointing, its end) and the optimizer step,
each the sum of what is alive at that moment; the parts of ``MemoryBreakdown`` are the parts of that
moment and add up to ``total``. The independent measurement it is compared with is runner/rank/memtrack.py's.

Model states: weights (``w`` B/param), gradients in the trainable dtype, AdamW's two moments in the
trainable dtype (torch's AdamW uses ``zeros_like(param)``: bf16 weights keep bf16 moments and no master),
an fp32 master only under DeepSpeed's bf16/fp16 (ZeRO's ``K = 12``). LoRA adapters are fp32 (peft); QLoRA
stores NF4 with double quantization (0.127 bits/param of constants). Sharding follows ZeRO (Rajbhandari et
al. 2020); DDP's buckets are the gradients (``gradient_as_bucket_view``) and live all step; what FSDP2
gathers at each moment follows the units accelerate makes (``runner.planner.fsdp``).

:func:`estimate` reads top to bottom as its steps: the model states of one replica, the activations of one
micro-batch, the busiest device's share of both (layer split, tensor split, ZeRO/FSDP sharding, DDP's
buckets, host offload), the parts alive at each candidate moment, and the breakdown at the largest."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from runner.planner.activations import ActivationBytes, activation_bytes, kernels_note
from runner.planner.deepspeed import add_deepspeed_parts, zero3_persistent_bytes
from runner.planner.fsdp import Gathered, gathered_units
from runner.planner.inputs import DTYPE_BYTES, EstimateInput, weight_bytes
from runner.planner.pipeline import (
    Stage,
    kept_outputs,
    receive_buffers,
    stage_activations,
    stage_weights,
    stages,
)
from runner.planner.shapes import lora_targeted, lora_trainable_params
from runner.planner.switches import fp8_copy_share, ring_buffer_bytes, tokens_per_device
from runner.spec import layout, strategies

ADAM_BYTES = 8  # two fp32 moments per trainable parameter
MASTER_BYTES = 4  # fp32 master copy of 16-bit weights
NF4_BITS = 4.0
# bitsandbytes NF4 with double quantization: an 8-bit absmax per 64-weight block, and one fp32 constant per
# 256 such blocks (QLoRA paper, section 3): 8/64 + 32/(64*256) = 0.127 bits per parameter.
NF4_DOUBLE_QUANT_OVERHEAD_BITS = 8 / 64 + 32 / (64 * 256)
GIB = 2**30
DEFAULT_RESERVE = "1GiB"
"""Per GPU, for the CUDA context, NCCL and allocator slack (why 1 GiB: docs/memory-model.md)."""


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes on the busiest device at its peak moment, by kind: the parts add up to ``total``.

    The peak is the largest of three phases of a training step (``phases``): the forward, the backward, the
    optimizer step. Each part is what is alive at that moment, so e.g. ``activations`` is 0 when the
    optimizer step is the peak, and ``grads`` holds only the gradients already produced when the peak is
    in the backward.

    Attributes:
        params: Weights.
        grads: Gradients alive at the peak.
        optimizer: Adam moments (in the trainable parameters' dtype: torch's AdamW keeps ``exp_avg`` and
            ``exp_avg_sq`` like the parameter; DeepSpeed keeps them in fp32).
        master: fp32 master weights (only DeepSpeed's bf16/fp16 modes keep one).
        activations: Saved activations alive at the peak (the fp32 log-softmax of the loss included).
        total: Sum of the parts (``params`` ... ``reserve``): what the device must hold.
        grad_buckets: DDP's flat gradient buckets beside the gradients (0 when gradients are bucket views,
            as ftui's trainer sets) or FSDP1's flat unsharded gradient of the layer being reduced.
        dropout: LoRA dropout: the dropped input copy and mask of each adapted module.
        recompute: Under checkpointing, the layer backward recomputes (its activations and weight casts).
        transient: Temporaries of the peak moment: the logits and their gradients around the loss, a
            layer's backward temporaries, or the optimizer's foreach temporaries.
        buffers: The 16-bit weight copies autocast saves for backward (fp32 weights, 16-bit compute) or,
            under FSDP/ZeRO-3, the gathered weights of the layers being computed.
        reserve: ``reserve_bytes``: the CUDA context and allocator slack (0 on CPU).
        ds_reduce_bucket: DeepSpeed's reduce bucket (``reduce_bucket_size`` elements, runner/planner/deepspeed.py)
            when it is alive at the peak.
        ds_gathered: DeepSpeed ZeRO-3's gathered parameters (every one above the persistence threshold) at
            the peak.
        ds_prefetch: DeepSpeed ZeRO-3's flat all-gather buffer of one prefetch bucket, alive beside the
            gathered copies until the head's fetch in the forward (runner/planner/deepspeed.py).
        activations_stored: Not a part: what one forward saves for backward (the ``saved_tensors_hooks``
            figure, autocast's weight casts included).
        grads_total: Not a part: every gradient (what the optimizer step holds).
        peak_phase: ``forward``, ``backward`` or ``optimizer``.
        phases: The total of each phase (without the reserve), to set beside the measured phase peaks.
        offloaded: Bytes moved to host memory, by kind (``optimizer``, ``master``, ``params``, ``activations``).
        nvme: Bytes moved to the NVMe folder by ZeRO-Infinity, by kind.
        approximate: Why this estimate is only approximate (None when the architecture is modelled).
    """

    params: int
    grads: int
    optimizer: int
    master: int
    activations: int
    buffers: int
    total: int
    reserve: int = 0
    grad_buckets: int = 0
    ds_reduce_bucket: int = 0
    ds_gathered: int = 0
    ds_prefetch: int = 0
    dropout: int = 0
    recompute: int = 0
    transient: int = 0
    activations_stored: int = 0
    grads_total: int = 0
    peak_phase: str = "optimizer"
    phases: dict[str, int] = field(default_factory=dict, hash=False)
    offloaded: dict[str, int] = field(default_factory=dict, hash=False)
    nvme: dict[str, int] = field(default_factory=dict, hash=False)
    approximate: str | None = None

    @property
    def model_states(self) -> int:
        """Weights, all gradients, optimizer states and master weights (persistent across the step)."""
        return self.params + max(self.grads, self.grads_total) + self.optimizer + self.master


def _largest_trainable(inp: EstimateInput) -> int:
    """Elements of the largest trainable tensor: an embedding or linear weight, or a LoRA matrix."""
    sh = inp.shape
    if inp.method == "full":
        return max([sh.vocab * sh.hidden, sh.largest_weight, *(s.in_features * s.out_features for s in sh.linears.values())])
    return max([0, *(inp.lora_r * max(s.in_features, s.out_features)
                     for s in lora_targeted(sh, inp.lora_targets).values())])


@dataclass(frozen=True)
class _Run:
    """The run as the formulas see it.

    Attributes:
        n: Devices.
        e: Bytes of a compute element.
        w: Bytes of a stored weight (DeepSpeed's bf16/fp16 modes hold 16-bit weights).
        row: The strategy's row of ``runner/spec/strategies.py``, as run by the recipe's engine.
        deepspeed: DeepSpeed implements it.
        stage: The ZeRO stage, if any.
    """

    n: int
    e: int
    w: int
    row: strategies.Strategy
    deepspeed: bool
    stage: int | None


def _resolve(inp: EstimateInput) -> _Run:
    """Devices, element sizes and the strategy row with its engine."""
    e = DTYPE_BYTES[inp.precision]
    row = strategies.get(inp.strategy)
    # An engine the row does not take (a zero2/torch recipe estimated under ddp) means the row's own.
    table_row = row.with_engine(inp.engine if inp.engine in row.engine_names() else "auto")
    deepspeed = table_row.accelerate_type == "DEEPSPEED"
    engine_row = table_row.engine_row()
    stage = engine_row.stage if engine_row is not None else None
    # DeepSpeed's bf16/fp16 modes hold 16-bit weights and an fp32 master.
    w = 2 if deepspeed and e == 2 else weight_bytes(inp)
    return _Run(max(1, inp.n_devices), e, w, table_row, deepspeed, stage)


@dataclass(frozen=True)
class _States:
    """Model-state bytes on one device (floats until the breakdown rounds them).

    Attributes:
        base: The frozen base weights (0 for full fine-tuning), before any split.
        train: Trainable parameters (a count, never split).
        tw: Bytes of a trainable element.
        params: Weights.
        grads: Every gradient (what the optimizer step holds).
        optimizer: Adam's moments.
        master: fp32 master weights.
        opt_transient: The optimizer step's temporaries.
        head_grads: The head's weight gradient (full fine-tuning), alive from the head's backward on.
        persistent_grads: Gradients alive through the whole step (DDP's bucket views).
        buckets: DDP's buckets when they are a second copy of the gradients.
    """

    base: float
    train: int
    tw: int
    params: float
    grads: float
    optimizer: float
    master: float
    opt_transient: float
    head_grads: float
    persistent_grads: float = 0.0
    buckets: float = 0.0


def _model_states(inp: EstimateInput, run: _Run) -> _States:
    """Weights, gradients, optimizer states and master of one whole replica."""
    sh, w, e, deepspeed = inp.shape, run.w, run.e, run.deepspeed
    if inp.method == "full":
        train = sh.total_params
        base = 0.0
        tw = w
    else:
        train = lora_trainable_params(sh, inp.lora_r, inp.lora_targets)
        tw = 2 if deepspeed and e == 2 else 4  # peft keeps adapters fp32
        if inp.method == "lora":
            base = float(sh.total_params * w)
        else:
            quantized = sum(
                s.in_features * s.out_features * s.count
                for k, s in sh.linears.items()
                if k.split("@")[0] != "lm_head"
            )
            quantized = min(quantized, sh.total_params)
            bits = NF4_BITS + NF4_DOUBLE_QUANT_OVERHEAD_BITS
            base = quantized * bits / 8 + (sh.total_params - quantized) * min(w, 2)
    # torch's AdamW creates exp_avg and exp_avg_sq with zeros_like(param): the states follow the trainable
    # parameters' dtype, and there is no master copy. DeepSpeed keeps fp32 states and an fp32 master.
    state_e = ADAM_BYTES // 2 if deepspeed else tw
    # AdamW's step temporaries (torch/optim/adam.py): on GPU the foreach implementation (the default there)
    # allocates sqrt(exp_avg_sq) for every parameter at once; on CPU the default is the per-parameter loop,
    # which holds sqrt(exp_avg_sq) and its quotient for one parameter at a time (the largest one counts).
    if deepspeed:
        opt_transient = 0.0
    elif inp.device == "cuda":
        opt_transient = float(train * state_e)
    else:
        opt_transient = float(2 * state_e * _largest_trainable(inp))
    return _States(
        base=base, train=train, tw=tw, params=base + train * tw, grads=float(train * tw),
        optimizer=float(train * 2 * state_e),
        # DeepSpeed clones its fp32 master partition from the weights, in fp32 runs too (measured on every
        # stage: docs/zero.md).
        master=float(train * MASTER_BYTES if deepspeed else 0), opt_transient=opt_transient,
        # The head's weight gradient exists from the head's backward on (tied or not: a tied head's is the
        # embedding's gradient, created there).
        head_grads=float(sh.vocab * sh.hidden * tw) if inp.method == "full" else 0.0)


@dataclass(frozen=True)
class _Activations:
    """Activation bytes on one device (floats until the breakdown rounds them).

    Attributes:
        whole: One micro-batch on one whole model copy.
        stored: What the forward keeps for backward on this device.
        copies: Autocast's weight casts kept for backward.
        fwd_copies: Autocast's weight casts alive at the end of the forward.
        recompute: The recomputed layer under checkpointing.
        logits_fwd: Temporaries at the loss in the forward.
        logits_bwd: Temporaries at the start of backward.
        logits: The saved log-softmax of the micro-batch whose backward runs (0 on a stage without the head).
        dropout: LoRA dropout's part of ``stored``.
        pipeline: A pipeline stage's receive buffers (alive all step).
        accumulated: What one micro-batch saves on a pipeline stage of several micro-batches per step: its
            last backward runs beside the gradients the earlier ones left (0: one micro-batch).
    """

    whole: ActivationBytes
    stored: float
    copies: float
    fwd_copies: float
    recompute: float
    logits_fwd: float
    logits_bwd: float
    logits: float
    dropout: float
    pipeline: float = 0.0
    accumulated: float = 0.0


def _activations(inp: EstimateInput, run: _Run, rows: int | None = None) -> _Activations:
    """The activations of one micro-batch (``rows`` rows: a pipeline's micro-batch; default the recipe's)
    on one whole model copy, in the dtypes the strategy computes in."""
    # FSDP's mixed precision gathers the weights in the compute dtype and casts the inputs: the forward
    # runs as over 16-bit weights (no autocast copies), whatever the stored dtype.
    fsdp_mixed = "params" in run.row.shards and not run.deepspeed and run.e < run.w
    # Context parallelism: each device holds its share of every sequence (runner/planner/switches.py).
    acts = activation_bytes(replace(inp, micro_batch=rows or inp.micro_batch, seq_len=tokens_per_device(inp),
                                    param_dtype="bf16" if run.w == 2 or fsdp_mixed else inp.param_dtype))
    kept = fp8_copy_share(inp)  # FP8's converted layers save the parameter itself, not a bf16 copy
    acts = replace(acts, weight_copies=round(acts.weight_copies * kept), forward_copies=round(acts.forward_copies * kept))
    return _Activations(acts, float(acts.stored), float(acts.weight_copies), float(acts.forward_copies),
                        float(acts.recompute), float(acts.logits_forward), float(acts.logits_backward),
                        float(acts.logits), float(acts.dropout))


def _split_layers(inp: EstimateInput, run: _Run, s: _States, stage: Stage) -> tuple[_States, _Activations]:
    """``mp``/``pp``: one stage's weights, model states and activations (:mod:`runner.planner.pipeline`)."""
    sh = inp.shape
    weight_share = stage_weights(sh, stage) / max(1, sh.total_params)
    layer_share = stage.layers / max(1, sh.layers)
    train_share = weight_share if inp.method == "full" else layer_share  # adapters sit in the layers
    # On CPU the optimizer's temporaries are the largest tensor's (every stage of two holds a vocab matrix).
    opt_transient = s.opt_transient * train_share if inp.device == "cuda" else s.opt_transient
    s = replace(s, params=s.base * weight_share + s.train * s.tw * train_share, grads=s.grads * train_share,
                optimizer=s.optimizer * train_share, master=s.master * train_share, opt_transient=opt_transient,
                head_grads=s.head_grads if stage.last else 0.0)
    a = _activations(inp, run, stage.rows)
    acts, k = a.whole, stage.in_flight
    head = 1.0 if stage.last else 0.0
    # A stage without the head starts its backward at its last layer's: that layer's temporaries.
    logits_bwd = a.logits_bwd if stage.last else float(acts.layer_backward)
    stored = stage_activations(acts, stage) * k + kept_outputs(inp, stage, run.e)
    return s, replace(a, stored=float(stored), copies=acts.weight_copies * weight_share,
                      fwd_copies=acts.forward_copies * weight_share, logits_fwd=a.logits_fwd * head,
                      logits_bwd=logits_bwd, logits=a.logits * head, dropout=a.dropout * layer_share * k,
                      pipeline=float(receive_buffers(inp, stage, run.e)),
                      accumulated=float(stored) / k if stage.microbatches > 1 else 0.0)


def _tensor_group(inp: EstimateInput, run: _Run) -> int:
    """``tp``: processes each weight matrix is split over (the other ``n / t`` groups are replicas); 1: none."""
    return min(run.n, inp.tp_size or run.n) if run.row.tensor_parallel else 1


def _tensor_local(inp: EstimateInput, run: _Run) -> EstimateInput:
    """``tp``: the run as one process's activations see it: the column-split projections give each process
    its heads (query and key/value) and its slice of the MLP's intermediate width, so the attention and MLP
    internals are 1/t; the layer inputs, the row-split outputs (after their all-reduce) and the logits are
    whole (the hidden width and vocabulary are unchanged)."""
    t = _tensor_group(inp, run)
    if t == 1:
        return inp
    sh = inp.shape
    return replace(inp, shape=replace(sh, heads=max(1, sh.heads // t), kv_heads=max(1, sh.kv_heads // t),
                                      intermediate=max(1, sh.intermediate // t)))


def _split_tensors(inp: EstimateInput, t: int, s: _States) -> _States:
    """``tp``: the device's share of the model states under a split over ``t`` processes.

    Megatron-style split of every decoder layer's projections: those weights (and, for full fine-tuning,
    their gradients and optimizer state) are 1/t per device; the embedding, norms and head stay whole.
    LoRA's A or B is split with its base, the other whole: about half the adapter. Activations: see
    :func:`_tensor_local`.
    """
    sh = inp.shape
    layer_frac = min(1.0, sh.layers * sh.layer_params / max(1, sh.total_params))
    share = layer_frac / t + (1 - layer_frac)
    train_share = share if inp.method == "full" else (1 + 1 / t) / 2
    return replace(s, params=s.base * share + s.train * s.tw * train_share, grads=s.grads * train_share,
                   optimizer=s.optimizer * train_share, master=s.master * train_share,
                   opt_transient=s.opt_transient * train_share)


def _sharded(inp: EstimateInput, run: _Run) -> frozenset[str]:
    """What ZeRO/FSDP divide over the devices: ``optimizer``, ``grads``, ``params``."""
    if _tensor_group(inp, run) > 1:
        return frozenset()  # already divided: the ZeRO/FSDP rules do not apply
    if run.row.keeps_gathered:
        # FSDP2 with reshard_after_forward=False shards the weights at rest like ZeRO-3; it keeps them
        # unsharded from the forward to the backward (counted in the gathered weights).
        return run.row.shards | {"params"}
    return run.row.shards


def _shard_group(inp: EstimateInput, run: _Run) -> int:
    """Devices ZeRO/FSDP divide the model states over: every one, or an ``hsdp`` run's shard group
    (``launch.shard``; its replicas hold the same shards, so more replicas divide nothing further)."""
    if not run.row.hybrid:
        return run.n
    return min(run.n, layout.hsdp_mesh(run.n, shard=inp.shard)[1])


def _shard_states(inp: EstimateInput, run: _Run, s: _States, shards: frozenset[str]) -> _States:
    """ZeRO/FSDP: each device's partition of what ``shards`` names (over :func:`_shard_group`)."""
    sh, n = inp.shape, _shard_group(inp, run)
    optimizer, master, opt_transient = s.optimizer, s.master, s.opt_transient
    if "optimizer" in shards:
        optimizer, master, opt_transient = optimizer / n, master / n, opt_transient / n
    # ZeRO-1 keeps whole gradients (the paper's P_os, its figure 1 is a test). DeepSpeed 0.19 holds only its
    # partition at the step when each step is one micro-batch (docs/zero.md): the estimate is that much over.
    grads, head_grads = s.grads, s.head_grads
    if "grads" in shards:
        grads = grads / n
        head_grads = head_grads / n
        if run.row.takes_fsdp_version and inp.fsdp_version == 1 and inp.method != "full":
            # FSDP1's gradient is flat per unit: it covers the frozen parameters of every unit that holds an
            # adapter (the decoder layers), not only the adapters.
            grads = float((sh.layers * sh.layer_params + s.train) * s.tw / n)
    params, persistent_grads = s.params, s.persistent_grads
    if "params" in shards:
        params = params / n
        if run.deepspeed and run.stage == 3:
            params += zero3_persistent_bytes(inp, run.w, s.tw)
            if not inp.offload_optimizer:  # offloaded: DeepSpeed keeps both on the host
                persistent_grads = grads  # its flat gradient partition, allocated with the optimizer
    return replace(s, params=params, grads=grads, optimizer=optimizer, master=master,
                   opt_transient=opt_transient, head_grads=head_grads, persistent_grads=persistent_grads)


def _gathered(inp: EstimateInput, run: _Run, s: _States, shards: frozenset[str]) -> Gathered:
    """The gathered weights and unsharded layer gradient of a run that shards its weights
    (:mod:`runner.planner.fsdp`; DeepSpeed ZeRO-3's own gathering: :mod:`runner.planner.deepspeed`)."""
    if "params" not in shards or (run.deepspeed and run.stage == 3):
        return Gathered()
    gather_e = run.e if run.e < run.w else run.w  # FSDP's mixed precision gathers in the compute dtype
    return gathered_units(inp, gather_e, s.train, s.tw, run.row.keeps_gathered, _shard_group(inp, run))


def _ddp_buckets(inp: EstimateInput, run: _Run, s: _States) -> _States:
    """DDP's gradient buckets, allocated when it wraps the model (ZeRO-1 with torch too: DDP's replica).

    ftui's trainer makes the gradients views into them (gradient_as_bucket_view), so they are the gradients
    and live through the whole step; without that, the buckets are a second copy.
    """
    ddp = run.row.wraps_in_ddp
    return replace(s, persistent_grads=s.grads if ddp else s.persistent_grads,
                   buckets=s.grads if ddp and not inp.grad_bucket_view else 0.0)


def _offload(inp: EstimateInput, run: _Run, s: _States) -> tuple[_States, dict[str, int]]:
    """What host offload moves off the device, and the bytes moved by kind."""
    offloaded: dict[str, int] = {}
    if inp.offload_optimizer:
        offloaded["optimizer"], offloaded["master"] = round(s.optimizer), round(s.master)
        s = replace(s, optimizer=0.0, master=0.0, opt_transient=0.0)
    if inp.offload_params:
        offloaded["params"] = round(s.params)
        s = replace(s, params=0.0)
        if run.row.offloads_grads:  # FSDP's CPUOffloadPolicy keeps the sharded gradients on the host too
            offloaded["grads"] = round(s.grads)
            s = replace(s, grads=0.0, persistent_grads=0.0)
    return s, offloaded


Moments = dict[str, dict[str, float]]
"""Candidate peak moments of a step, each as the parts alive then (beside the model states)."""


def _moments(inp: EstimateInput, run: _Run, s: _States, a: _Activations, g: Gathered) -> Moments:
    """The parts alive at each moment that can be the step's peak."""
    acts, persistent_grads = a.whole, s.persistent_grads
    moments: Moments = {
        "forward": {"activations": a.stored, "transient": a.logits_fwd, "buffers": a.fwd_copies + g.at_loss,
                    "grads": persistent_grads},
        "backward": {"activations": a.stored, "transient": a.logits_bwd, "buffers": a.copies + g.at_backward,
                     "grads": persistent_grads},
        # The end of backward: every gradient (FSDP: a tied head's still unsharded), the activations
        # released; the embedding's input gradient and its copy remain.
        "backward_end": {"transient": 2.0 * run.e * inp.shape.hidden * inp.micro_batch * tokens_per_device(inp),
                         "buffers": g.at_end, "grads": s.grads - s.head_grads + max(s.head_grads, g.head_grad),
                         "grad_buckets": g.flat_grads},
        "optimizer": {"grads": s.grads, "transient": s.opt_transient},
    }
    if g.at_gather:  # FSDP: the forward's last all-gather, every layer's activations saved, no logits yet
        moments["forward_gather"] = {"activations": a.stored - a.logits, "buffers": a.fwd_copies + g.at_gather,
                                     "grads": persistent_grads}
    if g.at_head:  # FSDP: the head's backward, beside one of the loss's gradients and the tail's prefetch
        moments["backward_head"] = {"activations": a.stored, "transient": a.logits_bwd / 2,
                                    "buffers": a.copies + g.at_head, "grads": persistent_grads}
    if inp.gradient_checkpointing:
        moments["backward_recompute"] = {
            "activations": a.stored - a.logits, "recompute": a.recompute, "transient": acts.layer_backward,
            "buffers": a.copies + g.in_stack, "grads": max(persistent_grads, _stack_grads(inp, s, g)),
            "grad_buckets": g.flat_grads}
    if a.accumulated:  # the last micro-batch's backward, every earlier one's gradients alive
        moments["backward_accumulated"] = {"activations": a.accumulated, "transient": a.logits_bwd,
                                           "buffers": a.copies, "grads": s.grads}
    if a.dropout and not inp.gradient_checkpointing:
        for name in ("forward", "backward"):
            moments[name]["activations"] -= a.dropout
            moments[name]["dropout"] = a.dropout
    if a.pipeline:
        for parts in moments.values():
            parts["buffers"] = parts.get("buffers", 0.0) + a.pipeline
    ring = ring_buffer_bytes(inp, run.e)  # context parallelism's gathered keys and values, inside attention
    for name in ("forward", "backward", "backward_head", "backward_recompute"):
        if ring and name in moments:
            moments[name]["transient"] += ring
    if run.deepspeed and run.stage is not None:
        add_deepspeed_parts(inp, run.stage, "params" in _sharded(inp, run), _shard_group(inp, run), run.w, s.tw,
                            a.logits, moments, s.train / _shard_group(inp, run))
    return moments


def _stack_grads(inp: EstimateInput, s: _States, g: Gathered) -> float:
    """The gradients alive in the checkpointed backward of the second-lowest decoder layer (where the
    recomputed layer peaks: the gradients grow layer by layer, and below it the lowest has no layer's
    prefetch beside it under FSDP): the head's (FSDP: a tied head's unsharded, :mod:`runner.planner.fsdp`)
    and those of the layers above it, as they are held (whole, or reduced to their shard)."""
    sh = inp.shape
    in_layers = 1.0 if inp.method != "full" else sh.layers * sh.layer_params / max(1, sh.total_params)
    above = s.grads * in_layers * max(0, sh.layers - 2) / max(1, sh.layers)
    return max(s.head_grads, g.head_grad) + above


def _breakdown(inp: EstimateInput, s: _States, a: _Activations, moments: Moments,
               offloaded: dict[str, int], nvme: dict[str, int]) -> MemoryBreakdown:
    """The parts at the largest moment, with the total of each phase."""
    state = s.params + s.optimizer + s.master + s.persistent_grads + s.buckets

    def size(parts: Mapping[str, float]) -> float:
        return state - s.persistent_grads + sum(parts.values())

    phases = {"forward": max(size(m) for k, m in moments.items() if k.startswith("forward")),
              "backward": max(size(m) for k, m in moments.items() if k.startswith("backward")),
              "optimizer": size(moments["optimizer"])}
    peak_name = max(moments, key=lambda k: size(moments[k]))
    at_peak = moments[peak_name]
    part = {k: round(at_peak.get(k, 0.0)) for k in
            ("grads", "activations", "dropout", "recompute", "transient", "buffers", "grad_buckets",
             "ds_reduce_bucket", "ds_gathered", "ds_prefetch")}
    part["grad_buckets"] += round(s.buckets)
    p, o, m = round(s.params), round(s.optimizer), round(s.master)
    r = inp.reserve_bytes
    total = p + o + m + sum(part.values()) + r
    acts = a.whole
    return MemoryBreakdown(
        p, part["grads"], o, m, part["activations"], part["buffers"], total=total, reserve=r,
        grad_buckets=part["grad_buckets"], dropout=part["dropout"], recompute=part["recompute"],
        transient=part["transient"], ds_reduce_bucket=part["ds_reduce_bucket"], ds_gathered=part["ds_gathered"],
        ds_prefetch=part["ds_prefetch"],
        activations_stored=round(acts.stored * (a.stored / max(1, acts.stored)) + a.copies),
        grads_total=round(s.grads), peak_phase=peak_name.split("_")[0],
        phases={k: round(v) for k, v in phases.items()}, offloaded=offloaded, nvme=nvme,
        approximate=inp.shape.approximate)


def estimate(inp: EstimateInput) -> MemoryBreakdown:
    """Per-device peak memory of a fine-tuning run (the busiest device for ``mp``).

    The peak is the largest of the forward, the backward and the optimizer step (formulas and sources:
    the module doc and docs/memory-model.md).

    Args:
        inp: The run.

    Returns:
        Bytes by kind at the peak; ``total`` is what the device must hold.
    """
    run = _resolve(inp)
    if run.row.layer_split:  # every stage's own estimate: the busiest is the largest
        return max((_estimate_part(inp, run, *_split_layers(inp, run, _model_states(inp, run), stage))
                    for stage in stages(inp, run.n)), key=lambda b: b.total)
    return _estimate_part(inp, run, _model_states(inp, run), _activations(_tensor_local(inp, run), run))


def _estimate_part(inp: EstimateInput, run: _Run, states: _States, acts: _Activations) -> MemoryBreakdown:
    """The estimate of one device from the model states and activations of its part of the model."""
    t = _tensor_group(inp, run)
    if t > 1:
        states = _split_tensors(inp, t, states)
    shards = _sharded(inp, run)
    states = _shard_states(inp, run, states, shards)
    gathered = _gathered(inp, run, states, shards)
    states, offloaded = _offload(inp, run, _ddp_buckets(inp, run, states))
    nvme, offloaded = (offloaded, {}) if inp.nvme_offload else ({}, offloaded)  # ZeRO-Infinity: on NVMe
    if inp.activation_offload:  # save_on_cpu: what the forward saves lives in pinned host memory
        offloaded["activations"] = round(acts.stored + acts.copies)
        acts = replace(acts, stored=0.0, copies=0.0, fwd_copies=0.0, dropout=0.0, logits=0.0)
    b = _breakdown(inp, states, acts, _moments(inp, run, states, acts, gathered), offloaded, nvme)
    if b.approximate is None:
        return replace(b, approximate=kernels_note(inp))
    return b


# The parts of ``MemoryBreakdown.total``, in the order ``ftui estimate`` shows them.
PARTS: tuple[str, ...] = ("params", "grads", "grad_buckets", "ds_reduce_bucket", "optimizer", "master", "activations",
                          "dropout", "recompute", "transient", "buffers", "ds_gathered", "ds_prefetch",
                          "reserve")


def breakdown_json(b: MemoryBreakdown) -> dict[str, int]:
    """Per-device bytes as JSON (``ftui estimate --format json`` and the ``estimate`` a run's summary stores).

    The :data:`PARTS` add up to ``total``; ``activations_stored`` is a detail of ``activations`` (what one
    forward saves, to compare with the trainer's measurement), not a part.
    """
    out = {part: int(getattr(b, part)) for part in PARTS}
    return {**out, "total": b.total, "model_states": b.model_states,
            "offloaded": dict(b.offloaded), "host_bytes": sum(b.offloaded.values()),  # type: ignore[dict-item]
            "nvme": dict(b.nvme), "nvme_bytes": sum(b.nvme.values()),  # type: ignore[dict-item]
            "activations_stored": b.activations_stored, "grads_total": b.grads_total,
            "peak_phase": b.peak_phase, "phases": dict(b.phases),  # type: ignore[dict-item]
            **({"approximate": b.approximate} if b.approximate else {})}  # type: ignore[dict-item]


def checkpoint_bytes(inp: EstimateInput) -> int:
    """Bytes one resumable checkpoint of the whole run takes on disk (every rank's part together): the
    trainable weights and AdamW's two moments (with DeepSpeed's fp32 master), plus the frozen base where the
    engine saves the whole model (FSDP's sharded state, DeepSpeed); a LoRA run elsewhere saves only its
    adapter (runner/rank/checkpointing.py). What the pre-flight wants free under the run folder."""
    run = _resolve(inp)
    s = _model_states(inp, run)
    whole_model = run.deepspeed or run.row.accelerate_type == "FSDP"
    saved = s.params if whole_model or inp.method == "full" else s.train * s.tw
    return round(saved + s.optimizer + s.master)
