"""Memory estimate for a fine-tuning run: pure functions, no I/O, no GPU (the shape comes from
``runner.planner.shapes``). docs/memory-model.md has every formula with its source and the grid it was
checked on; in short:

The estimate is the PEAK of one training step on the busiest device: the largest of the forward (at the
loss), the backward (its start, the recomputed layer under checkpointing, its end) and the optimizer step,
each the sum of what is alive at that moment; the parts of ``MemoryBreakdown`` are the parts of that
moment and add up to ``total``. The independent measurement it is compared with is runner/rank/memtrack.py's.

Model states: weights (``w`` B/param), gradients in the trainable dtype, AdamW's two moments in the
trainable dtype (torch's AdamW uses ``zeros_like(param)``: bf16 weights keep bf16 moments and no master),
an fp32 master only under DeepSpeed's bf16/fp16 (ZeRO's ``K = 12``). LoRA adapters are fp32 (peft); QLoRA
stores NF4 with double quantization (0.127 bits/param of constants). Sharding follows ZeRO (Rajbhandari et
al. 2020); DDP's buckets are the gradients (``gradient_as_bucket_view``) and live all step; FSDP gathers its
root unit at the loss and one layer inside the stack.

Activations are counted tensor by tensor from what autograd saves (Korthikanti et al. 2022 as the starting
point), by architecture features read from the config (norm kind, gated/plain MLP, fused linears, dropout,
parallel blocks), plus the temporaries of each moment: the logits around the loss (3 x 4V bytes per token at
the start of backward), a layer's backward, AdamW's step temporaries; autocast's weight copies (cached to the
end of the forward); LoRA dropout's copies and masks."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:

    pass

from runner.planner.shapes import ModelShape, _targeted, lora_trainable_params
from runner.spec import strategies
from runner.spec.deepspeed_config import ZERO3_PERSISTENCE_THRESHOLD

Method = Literal["full", "lora", "qlora"]
Precision = Literal["fp32", "bf16", "fp16"]
Strategy = str
"""A strategy's name in ``runner/spec/strategies.py`` (the table says what each shards)."""
DTYPE_BYTES: Mapping[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2}
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
class EstimateInput:
    """Everything the estimate depends on.

    Attributes:
        shape: The model.
        method: ``full`` fine-tuning, ``lora`` or ``qlora``.
        precision: Compute precision: ``fp32``, or mixed ``bf16``/``fp16``.
        param_dtype: Dtype the weights are stored in. ``None`` picks the usual: fp32 for full fine-tuning
            (accelerate keeps fp32 weights and autocasts), the compute precision for LoRA/QLoRA bases.
        strategy: ``single``, ``mp``, ``ddp``, ``fsdp``, ``zero1``, ``zero2`` or ``zero3``.
        n_devices: GPUs the run spreads over.
        micro_batch: Sequences per device per step.
        seq_len: Tokens per sequence.
        gradient_checkpointing: HF per-layer activation checkpointing.
        offload_optimizer: Optimizer states and master weights live on the host.
        offload_params: Weights live on the host (ZeRO-3/FSDP offload).
        lora_r: LoRA rank.
        lora_targets: LoRA target module short names, or ``"all-linear"``.
        reserve_bytes: Flat allowance per device for the CUDA context and allocator slack (``ftui estimate``
            reserves 1 GiB per GPU by default, ``docs/memory-model.md``); 0 on CPU.
        lora_dropout: peft's ``lora_dropout`` (above 0 each adapted module keeps a dropped copy and a mask).
        device: ``cuda`` or ``cpu``: a dropout mask is a byte per element on GPU, an element on CPU.
        grad_bucket_view: DDP's gradients are views into its buckets (ftui's trainer sets it), else the
            buckets are a second copy of the gradients.
        fsdp_version: 1 or 2 (``launch.fsdp_version``): FSDP1 keeps a flat gradient per unit.
        microbatches: ``pp``: micro-batches per pipeline step (``launch.microbatches``).
        pp_schedule: ``pp``: ``gpipe`` (every micro-batch's activations alive at once) or ``1f1b`` (at
            most as many micro-batches in flight as there are stages).
    """

    shape: ModelShape
    method: Method = "full"
    precision: Precision = "bf16"
    param_dtype: Precision | None = None
    strategy: Strategy = "single"
    n_devices: int = 1
    micro_batch: int = 1
    seq_len: int = 2048
    gradient_checkpointing: bool = False
    offload_optimizer: bool = False
    offload_params: bool = False
    lora_r: int = 8
    lora_targets: tuple[str, ...] | str = ("q_proj", "v_proj")
    reserve_bytes: int = 0
    lora_dropout: float = 0.0
    device: Literal["cuda", "cpu"] = "cuda"
    grad_bucket_view: bool = True
    fsdp_version: int = 2
    engine: str = "auto"
    """``launch.engine``: what implements the strategy (the ZeRO stages: ``deepspeed`` or ``torch``)."""
    microbatches: int = 1
    pp_schedule: str = "gpipe"
    tp_size: int | None = None
    """``tp``: processes each weight matrix is split over (``launch.tp_size``); None: every device."""


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
        activations_stored: Not a part: what one forward saves for backward (the ``saved_tensors_hooks``
            figure, autocast's weight casts included).
        grads_total: Not a part: every gradient (what the optimizer step holds).
        peak_phase: ``forward``, ``backward`` or ``optimizer``.
        phases: The total of each phase (without the reserve), to set beside the measured phase peaks.
        offloaded: Bytes moved to host memory, by kind (``optimizer``, ``master``, ``params``).
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
    dropout: int = 0
    recompute: int = 0
    transient: int = 0
    activations_stored: int = 0
    grads_total: int = 0
    peak_phase: str = "optimizer"
    phases: dict[str, int] = field(default_factory=dict, hash=False)
    offloaded: dict[str, int] = field(default_factory=dict, hash=False)
    approximate: str | None = None

    @property
    def model_states(self) -> int:
        """Weights, all gradients, optimizer states and master weights (persistent across the step)."""
        return self.params + max(self.grads, self.grads_total) + self.optimizer + self.master


@dataclass(frozen=True)
class ActivationBytes:
    """Activation bytes of one micro-batch on one full model copy.

    Attributes:
        per_layer: What one decoder layer saves for backward without checkpointing.
        stored: What the forward pass keeps for backward (the saved-tensor total, LoRA dropout included).
        recompute: Extra peak during backward: one layer recomputed under checkpointing, else 0.
        logits: The fp32 log-softmax of the loss (included in ``stored``).
        weight_copies: 16-bit weight casts autocast keeps for backward (not included in ``stored``).
        dropout: LoRA dropout's input copies and masks (included in ``stored``).
        logits_forward: Temporaries at the loss in the forward: the logits in compute precision and,
            when that is 16 bit, their fp32 copy (``HF ForCausalLMLoss`` upcasts).
        logits_backward: Temporaries at the start of backward: the gradient of the log-softmax output and
            its input gradient, both fp32 (beside the saved log-softmax: 3 x 4V bytes per token in all).
        layer_backward: Temporaries of one layer's backward (the gradients of its largest intermediates).
        recompute_copies: Autocast weight casts of the recomputed layer (checkpointing), in ``recompute``.
        forward_copies: Autocast weight casts alive at the end of the forward: all of them, checkpointing
            or not (autocast caches the casts of trainable leaves until its context exits: torch.amp docs).
    """

    per_layer: int
    stored: int
    recompute: int
    logits: int
    weight_copies: int
    dropout: int = 0
    logits_forward: int = 0
    logits_backward: int = 0
    layer_backward: int = 0
    recompute_copies: int = 0
    forward_copies: int = 0

    @property
    def peak(self) -> int:
        """Stored plus recompute: the activation high-water mark."""
        return self.stored + self.recompute


def _weight_bytes(inp: EstimateInput) -> int:
    if inp.param_dtype is not None:
        return DTYPE_BYTES[inp.param_dtype]
    return 4 if inp.method == "full" else DTYPE_BYTES[inp.precision]


# Bytes an MLP activation saves per intermediate element, in units of the compute element size: one op
# saves its input; transformers' ``gelu_new``/``gelu_fast`` are Python formulas whose pow, tanh and two
# products each keep a tensor (activations.py: NewGELUActivation).
_ACT_SAVED = {"gelu_new": 4, "gelu_fast": 4}


def activation_bytes(inp: EstimateInput) -> ActivationBytes:
    """Activations a decoder-only transformer saves for backward, for one micro-batch (module doc and
    docs/memory-model.md, "Activations"), by the architecture features of ``inp.shape``.

    Args:
        inp: The run; uses shape, method, precision, param_dtype, micro_batch, seq_len,
            gradient_checkpointing, lora_r, lora_targets, lora_dropout and device.

    Returns:
        The activation bytes of one full model copy.
    """
    sh = inp.shape
    tokens = inp.micro_batch * inp.seq_len
    e = DTYPE_BYTES[inp.precision]
    w = _weight_bytes(inp)
    autocast = w > e
    full = inp.method == "full"
    adapted = {k.split("@")[0] for k in _targeted(sh, inp.lora_targets)} if not full else set()
    # Dtype a LoRA adapter computes in: with 16-bit precision accelerate runs the forward under autocast
    # (even over 16-bit weights), so the fp32 adapter computes in it; in fp32 over 16-bit weights (no
    # autocast) peft casts the input to the fp32 adapter.
    adapter_e = e if e < 4 else 4
    # A dropout mask: a bool per element on GPU (native_dropout); on CPU dropout multiplies by a mask of
    # the input's dtype (ATen's _dropout_impl), so it costs an element.
    def mask(elem: int) -> int:
        return 1 if inp.device == "cuda" else elem

    dropout_total = [0]
    h, qd, kvd, inter = sh.hidden, sh.heads * sh.head_dim, sh.kv_heads * sh.head_dim, sh.intermediate

    def group(members: Sequence[str], width: int, in_e: int, already_saved: bool) -> int:
        """Bytes per token the linears reading one shared input save."""
        shared = already_saved
        total = 0
        for m in members:
            if m not in sh.linears and m.split("@")[0] not in {k.split("@")[0] for k in sh.linears}:
                continue
            lora = m.split("@")[0] in adapted
            for trains, op_e in ((full, e if autocast else in_e), (lora, adapter_e)):
                if not trains:
                    continue
                if lora and not full and inp.lora_dropout > 0 and op_e == adapter_e:
                    # peft: lora_A(dropout(x)): a private dropped copy and its mask per adapted module.
                    extra = (op_e + mask(op_e)) * width
                    dropout_total[0] += extra
                    total += extra
                elif op_e == in_e:  # no cast: the shared input itself is saved, once
                    if not shared:
                        total += in_e * width
                        shared = True
                else:  # autocast or peft made a private copy for this module
                    total += op_e * width
            if lora:
                total += adapter_e * inp.lora_r  # lora_B input
        return total

    def norm(input_grad: bool) -> int:
        trains = full
        if not (input_grad or trains):
            return 0
        if sh.norm == "layer":  # native_layer_norm saves its input and mean, rstd; autocast runs it in fp32
            return (4 if e < 4 else w) * h + 8
        normalized = (4 if sh.norm_fp32_output else w) * h if trains else 0
        return 4 * h + 4 + normalized  # RMSNorm: the fp32 upcast input and rsqrt

    # Attention with dropout in training cannot use the fused kernels: the math path keeps the scores.
    math_attention = sh.attn_dropout > 0
    # Under CPU autocast (16-bit precision: the trainer always autocasts then) the math path runs in fp32
    # (measured, docs/memory-model.md).
    att_e = 4 if (math_attention and e < 4 and inp.device == "cpu") else e

    def attention() -> int:
        qkv = att_e * (qd + 2 * kvd)
        if math_attention:  # q, k, v, softmax output, dropout mask, dropped probabilities (a*s each)
            scores = sh.heads * inp.seq_len
            return qkv + scores * (2 * att_e + mask(att_e))
        return qkv + e * qd + 4 * sh.heads  # SDPA flash/efficient: q, k, v, output, logsumexp

    act_saved = _ACT_SAVED.get(sh.act, 1)
    resid_masks = 2 * mask(w) * h if sh.resid_dropout > 0 else 0

    def layer(input_grad: bool) -> int:
        b = norm(input_grad) + group(sh.attn_in, h, w, False) + attention()
        b += group(sh.attn_out, qd, e, not math_attention)
        if not sh.parallel_block:
            b += norm(True) + group(sh.mlp_in, h, w, False)
        if sh.mlp == "gated":
            b += 3 * e * inter  # gate output, its activation, up output
        else:
            b += act_saved * e * inter  # fc1 output (and a Python GELU's pieces)
        b += group(sh.mlp_out, inter, e, False)
        return b + resid_masks

    # Frozen embeddings: the first layer's input needs no grad, so its input norm saves nothing.
    first_input_grad = full or inp.gradient_checkpointing
    dropout_total[0] = 0
    layers = layer(first_input_grad) + (sh.layers - 1) * layer(True)
    lora_dropout = dropout_total[0] * tokens
    embd = (mask(w) * h if sh.embd_dropout > 0 and first_input_grad else 0) + (8 if full else 0)  # + indices
    logits = 4 * sh.vocab * tokens
    post = (norm(True) + group(("lm_head",), h, w, False) + 8 + embd) * tokens + logits  # + int64 labels
    rotary = 2 * inp.seq_len * sh.head_dim * w if sh.family not in ("gpt2",) else 0
    dropout_total[0] = 0
    per_layer = layer(True) * tokens
    head_w = sh.vocab * sh.hidden if "lm_head" in sh.linears else 0  # the head's matmul casts it, tied or not
    layer_linear = (sh.linear_params - (0 if sh.tied_embeddings else head_w)) // max(1, sh.layers)
    # Around the loss: the logits in compute precision and, at 16 bit, HF's fp32 upcast, beside the
    # saved log-softmax; at the start of backward the log-softmax's output and input gradients (fp32).
    logits_forward = sh.vocab * tokens * (e + (4 if e != 4 else 0))
    logits_backward = 2 * 4 * sh.vocab * tokens
    # One layer's backward holds the gradients of its widest intermediates (the MLP's, in compute
    # precision) beside the incoming hidden gradient.
    layer_backward = tokens * e * (2 * inter + 2 * h)
    if math_attention:  # or the gradients of the scores: through the dropout and the softmax
        layer_backward = max(layer_backward, tokens * (3 * att_e * sh.heads * inp.seq_len + 2 * e * h))
    if inp.gradient_checkpointing:
        stored = sh.layers * w * h * tokens + post + rotary
        recompute_copies = 2 * layer_linear if autocast else 0
        recompute = per_layer + recompute_copies  # one layer at a time: its activations and casts
        copies = 2 * head_w if autocast else 0
        dropout = 0
    else:
        stored = layers * tokens + post + rotary
        recompute = recompute_copies = 0
        copies = 2 * (sh.linear_params + (head_w if sh.tied_embeddings else 0)) if autocast else 0
        dropout = lora_dropout
    all_copies = 2 * (sh.linear_params + (head_w if sh.tied_embeddings else 0)) if autocast else 0
    return ActivationBytes(per_layer, stored, recompute, logits, copies, dropout, logits_forward, logits_backward,
                           layer_backward, recompute_copies, all_copies)


def _largest_trainable(inp: EstimateInput) -> int:
    """Elements of the largest trainable tensor: an embedding or linear weight, or a LoRA matrix."""
    sh = inp.shape
    if inp.method == "full":
        return max([sh.vocab * sh.hidden, *(s.in_features * s.out_features for s in sh.linears.values())])
    return max([0, *(inp.lora_r * max(s.in_features, s.out_features)
                     for s in _targeted(sh, inp.lora_targets).values())])


def _mp_share(inp: EstimateInput) -> tuple[float, float]:
    """Busiest device under naive model parallelism: its share of all weights, and of the layer stack.

    Layers are split evenly, ``ceil(L/N)`` per device; the first device also holds the embedding and the
    last the head, so the busiest holds ``ceil(L/N)/L`` of the layers plus one ``vocab x hidden`` matrix.
    """
    sh = inp.shape
    n = max(1, min(inp.n_devices, sh.layers))
    layer_share = math.ceil(sh.layers / n) / max(1, sh.layers)
    if n == 1:
        return 1.0, 1.0
    total = max(1, sh.total_params)
    emb = min(sh.embedding_params, total)
    return layer_share * (1 - emb / total) + sh.vocab * sh.hidden / total, layer_share


def _zero3_persistent(inp: EstimateInput, w: int, tw: int) -> float:
    """Bytes DeepSpeed ZeRO-3 keeps gathered on every rank beside the partitions: each parameter under its
    persistence threshold (``stage3_param_persistence_threshold``, 1e5 elements: norms, small projections,
    LoRA matrices)."""
    sh = inp.shape
    small = sum(s.in_features * s.out_features * s.count for s in sh.linears.values()
                if s.in_features * s.out_features < ZERO3_PERSISTENCE_THRESHOLD) * w
    norms = (2 * sh.layers + 1) * sh.hidden * (2 if sh.norm == "layer" else 1)
    small += norms * w if sh.hidden < ZERO3_PERSISTENCE_THRESHOLD else 0
    if inp.method != "full":
        small += sum(inp.lora_r * (s.in_features + s.out_features) * s.count
                     for s in _targeted(sh, inp.lora_targets).values()) * tw
    return float(small)


def estimate(inp: EstimateInput) -> MemoryBreakdown:
    """Per-device peak memory of a fine-tuning run (the busiest device for ``mp``).

    The peak is the largest of the forward, the backward and the optimizer step (formulas and sources:
    the module doc and docs/memory-model.md).

    Args:
        inp: The run.

    Returns:
        Bytes by kind at the peak; ``total`` is what the device must hold.
    """
    sh = inp.shape
    n = max(1, inp.n_devices)
    e = DTYPE_BYTES[inp.precision]
    w = _weight_bytes(inp)
    row = strategies.get(inp.strategy)
    # An engine the row does not take (a zero2/torch recipe estimated under ddp) means the row's own.
    table_row = row.with_engine(inp.engine if inp.engine in row.engine_names() else "auto")
    deepspeed = table_row.accelerate_type == "DEEPSPEED"
    engine_row = table_row.engine_row()
    stage = engine_row.stage if engine_row is not None else None
    if deepspeed and e == 2:  # DeepSpeed's bf16/fp16 modes hold 16-bit weights and an fp32 master
        w = 2

    # (count, bytes of weight, grad, optimizer, master) for each group of parameters.
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
    params = base + train * tw
    grads = float(train * tw)
    optimizer = float(train * 2 * state_e)
    # DeepSpeed clones its fp32 master partition from the weights, in fp32 runs too (measured on every stage:
    # docs/zero.md).
    master = float(train * MASTER_BYTES if deepspeed else 0)
    # AdamW's step temporaries (torch/optim/adam.py): on GPU the foreach implementation (the default there)
    # allocates sqrt(exp_avg_sq) for every parameter at once; on CPU the default is the per-parameter loop,
    # which holds sqrt(exp_avg_sq) and its quotient for one parameter at a time (the largest one counts).
    if deepspeed:
        opt_transient = 0.0
    elif inp.device == "cuda":
        opt_transient = float(train * state_e)
    else:
        opt_transient = float(2 * state_e * _largest_trainable(inp))

    # FSDP's mixed precision gathers the weights in the compute dtype and casts the inputs: the forward
    # runs as over 16-bit weights (no autocast copies), whatever the stored dtype.
    fsdp_mixed = "params" in table_row.shards and not deepspeed and e < w
    acts = activation_bytes(replace(inp, param_dtype="bf16" if w == 2 or fsdp_mixed else inp.param_dtype))
    stored = float(acts.stored)
    copies = float(acts.weight_copies)
    fwd_copies = float(acts.forward_copies)
    recompute = float(acts.recompute)
    logits_fwd, logits_bwd = float(acts.logits_forward), float(acts.logits_backward)
    # The head's weight gradient exists from the head's backward on (tied or not: a tied head's is the
    # embedding's gradient, created there).
    head_grads = float(sh.vocab * sh.hidden * tw) if inp.method == "full" else 0.0

    shards = table_row.shards
    if table_row.keeps_gathered:
        # FSDP2 with reshard_after_forward=False shards the weights at rest like ZeRO-3; it keeps them
        # unsharded from the forward to the backward (counted in buffers below).
        shards = shards | {"params"}
    if table_row.layer_split:
        weight_share, layer_share = _mp_share(inp)
        model_share = weight_share if inp.method == "full" else layer_share  # adapters sit in the layers
        params = base * weight_share + train * tw * model_share
        grads, optimizer, master = grads * model_share, optimizer * model_share, master * model_share
        opt_transient *= model_share
        # Layer activations split with the layers; the logits are all on the last device.
        stored = (acts.stored - acts.logits) * layer_share + acts.logits
        copies = acts.weight_copies * weight_share
        fwd_copies = acts.forward_copies * weight_share
        m = max(1, inp.microbatches)
        if table_row.pipeline_from is not None and n >= table_row.pipeline_from and m > 1:
            # A pipeline's micro-batch is micro_batch/m rows: the logits around the loss are one
            # micro-batch's; GPipe keeps every micro-batch's activations until the backwards, 1F1B at
            # most one per stage (torch.distributed.pipelining schedules).
            in_flight = m if inp.pp_schedule == "gpipe" else min(m, n)
            stored = (stored - acts.logits) * in_flight / m + acts.logits * in_flight / m
            logits_fwd, logits_bwd = logits_fwd / m, logits_bwd / m
    t = min(n, inp.tp_size or n)  # tp: the split is over a group of t; n / t groups are replicas
    if table_row.tensor_parallel and t > 1:
        # Megatron-style split of every decoder layer's projections: those weights (and, for full
        # fine-tuning, their gradients and optimizer state) are 1/n per device; the embedding, norms and
        # head stay whole. LoRA's A or B is split with its base, the other whole: about half the adapter.
        # Activations are counted whole (the residual stream is replicated): an upper bound.
        layer_frac = min(1.0, sh.layers * sh.layer_params / max(1, sh.total_params))
        share = layer_frac / t + (1 - layer_frac)
        train_share = share if inp.method == "full" else (1 + 1 / t) / 2
        params = base * share + train * tw * train_share
        grads, optimizer, master = grads * train_share, optimizer * train_share, master * train_share
        opt_transient *= train_share
        shards = frozenset()  # already divided: the FSDP-style rules below do not apply
    if "optimizer" in shards:
        optimizer, master, opt_transient = optimizer / n, master / n, opt_transient / n
    # ZeRO-1 keeps whole gradients (the paper's P_os, its figure 1 is a test). DeepSpeed 0.19 holds only its
    # partition at the step when each step is one micro-batch (docs/zero.md): the estimate is that much over.
    if "grads" in shards:
        grads = grads / n
        head_grads = head_grads / n
        if table_row.takes_fsdp_version and inp.fsdp_version == 1 and inp.method != "full":
            # FSDP1's gradient is flat per unit: it covers the frozen parameters of every unit that holds an
            # adapter (the decoder layers), not only the adapters.
            grads = float((sh.layers * sh.layer_params + train) * tw / n)
    gathered = root_gathered = 0.0
    flat_grads = 0.0
    if "params" in shards:
        params = params / n
        if deepspeed and stage == 3:
            params += _zero3_persistent(inp, w, tw)
        gather_e = e if e < w else w  # FSDP's mixed precision gathers in the compute dtype
        # The root unit (embeddings, head, final norm: what the per-layer wrapping leaves) is gathered
        # while the loss is computed and again for the head's backward; inside the layer stack the layer
        # being computed is gathered beside it (measured: docs/memory-model.md).
        root_gathered = float(max(0, sh.total_params - sh.layers * sh.layer_params) * gather_e)
        gathered = root_gathered + 1.0 * sh.layer_params * gather_e
        if table_row.keeps_gathered:  # every layer stays gathered from its forward to its backward
            gathered = root_gathered + float(sh.layers * sh.layer_params * gather_e)
        if inp.method == "full" or train:
            # A layer's unsharded gradient before its reduce-scatter (FSDP1: the flat gradient).
            layer_train = train / max(1, sh.layers) if inp.method != "full" else sh.layer_params
            flat_grads = float(layer_train * tw)
    # DDP allocates its gradient buckets when it wraps the model. ftui's trainer makes the gradients views
    # into them (gradient_as_bucket_view), so they are the gradients and live through the whole step;
    # without that, the buckets are a second copy.
    ddp = table_row.wraps_in_ddp  # ZeRO-1 with torch too: DDP's replica
    persistent_grads = grads if ddp else 0.0
    buckets = grads if ddp and not inp.grad_bucket_view else 0.0

    offloaded: dict[str, int] = {}
    if inp.offload_optimizer:
        offloaded["optimizer"], offloaded["master"] = round(optimizer), round(master)
        optimizer = master = opt_transient = 0.0
    if inp.offload_params:
        offloaded["params"] = round(params)
        params = 0.0
        if table_row.offloads_grads:  # FSDP's CPUOffloadPolicy keeps the sharded gradients on the host too
            offloaded["grads"] = round(grads)
            grads = persistent_grads = 0.0

    state = params + optimizer + master + persistent_grads + buckets
    buffers = copies + gathered
    # Candidate peak moments, each as the parts alive then.
    moments: dict[str, dict[str, float]] = {
        "forward": {"activations": stored, "transient": logits_fwd, "buffers": fwd_copies + root_gathered,
                    "grads": persistent_grads},
        "backward": {"activations": stored, "transient": logits_bwd, "buffers": copies, "grads": persistent_grads},
        # The end of backward: every gradient, the activations released; the embedding's input gradient
        # and its copy remain.
        "backward_end": {"transient": 2.0 * e * sh.hidden * inp.micro_batch * inp.seq_len, "buffers": gathered,
                         "grads": grads, "grad_buckets": flat_grads},
        "optimizer": {"grads": grads, "transient": opt_transient},
    }
    if root_gathered:  # the root gathered for the head's backward, beside one of the loss's gradients
        moments["backward_root"] = {"activations": stored, "transient": logits_bwd / 2,
                                    "buffers": copies + root_gathered, "grads": persistent_grads}
    if inp.gradient_checkpointing:
        moments["backward_recompute"] = {
            "activations": stored - acts.logits, "recompute": recompute, "transient": acts.layer_backward,
            "buffers": buffers, "grads": max(persistent_grads, head_grads), "grad_buckets": flat_grads}
    if acts.dropout and not inp.gradient_checkpointing:
        for name in ("forward", "backward"):
            moments[name]["activations"] -= acts.dropout
            moments[name]["dropout"] = float(acts.dropout)

    def size(parts: Mapping[str, float]) -> float:
        return state - persistent_grads + sum(parts.values())

    phases = {"forward": size(moments["forward"]),
              "backward": max(size(m) for k, m in moments.items() if k.startswith("backward")),
              "optimizer": size(moments["optimizer"])}
    peak_name = max(moments, key=lambda k: size(moments[k]))
    at_peak = moments[peak_name]
    part = {k: round(at_peak.get(k, 0.0)) for k in
            ("grads", "activations", "dropout", "recompute", "transient", "buffers", "grad_buckets")}
    part["grad_buckets"] += round(buckets)
    p, o, m = round(params), round(optimizer), round(master)
    r = inp.reserve_bytes
    total = p + o + m + sum(part.values()) + r
    return MemoryBreakdown(
        p, part["grads"], o, m, part["activations"], part["buffers"], total=total, reserve=r,
        grad_buckets=part["grad_buckets"], dropout=part["dropout"], recompute=part["recompute"],
        transient=part["transient"], activations_stored=round(acts.stored * (stored / max(1, acts.stored)) + copies),
        grads_total=round(grads), peak_phase=peak_name.split("_")[0],
        phases={k: round(v) for k, v in phases.items()}, offloaded=offloaded, approximate=sh.approximate)


# The parts of ``MemoryBreakdown.total``, in the order ``ftui estimate`` shows them.
PARTS: tuple[str, ...] = ("params", "grads", "grad_buckets", "optimizer", "master", "activations", "dropout",
                          "recompute", "transient", "buffers", "reserve")


def breakdown_json(b: MemoryBreakdown) -> dict[str, int]:
    """Per-device bytes as JSON (``ftui estimate --format json`` and the ``estimate`` a run's summary stores).

    The :data:`PARTS` add up to ``total``; ``activations_stored`` is a detail of ``activations`` (what one
    forward saves, to compare with the trainer's measurement), not a part.
    """
    out = {part: int(getattr(b, part)) for part in PARTS}
    return {**out, "total": b.total, "model_states": b.model_states,
            "offloaded": dict(b.offloaded), "host_bytes": sum(b.offloaded.values()),  # type: ignore[dict-item]
            "activations_stored": b.activations_stored, "grads_total": b.grads_total,
            "peak_phase": b.peak_phase, "phases": dict(b.phases),  # type: ignore[dict-item]
            **({"approximate": b.approximate} if b.approximate else {})}  # type: ignore[dict-item]
