"""Memory estimate and strategy recommendation for a fine-tuning run: pure functions, no I/O, no GPU (the shape comes from ``runner.planner.shapes``).

Model states (bytes per parameter, Adam):
    Trainable weights cost ``w`` (weights) + ``w`` (grads) + 8 (Adam m and v in fp32) + 4 (fp32 master copy,
    only when the weights are stored in 16 bit). Accelerate's mixed precision keeps fp32 weights and autocasts,
    so bf16 training of fp32 weights is 4 + 4 + 8 = 16 B/param with no master; 16-bit weights give the
    seed's split 2 + 2 + (8 + 4) = 16 B/param, ``K = 12`` in the ZeRO paper. DeepSpeed (``zero1/2/3``) always
    stores 16-bit weights with an fp32 master in its bf16/fp16 modes. Frozen LoRA base weights cost only their
    storage; adapters are fp32 (peft upcasts them) with 4 + 4 + 8 = 16 B/param. QLoRA stores the quantized
    linear layers (every ``nn.Linear`` but ``lm_head``) in 4 bits plus the NF4 quantization constants:
    one fp8 absmax per 64 weights and, with double quantization, one fp32 constant per 256 blocks,
    8/64 + 32/(64*256) = 0.127 bits/param. Embeddings, norms and ``lm_head`` stay 16 bit.

Sharding (Rajbhandari et al. 2020, "ZeRO", N devices): ``zero1`` divides optimizer states (and master) by N,
``zero2`` also the grads, ``zero3`` and ``fsdp`` also the weights; ``ddp`` and ``single`` replicate; ``mp``
(naive model parallel, layers split across devices) holds ``ceil(L/N)`` layers per device, plus the
embedding or the head, and reports the busiest device.

Activations (bytes saved for backward): Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models", give ``s*b*h*(34 + 5*a*s/h)`` bytes per layer for a 16-bit GPT layer with dropout and
an explicit ``s*s`` attention matrix. HF Llama with SDPA saves less and differently, so the count is redone
per tensor (``e``: compute element size, 4 for fp32, 2 for bf16/fp16; ``w``: weight element size, which is
the dtype of the residual stream; ``kv``: kv heads; ``d``: head dim; ``I``: intermediate size), per token:

* each RMSNorm: the input upcast to fp32 (``4h``) and ``rsqrt`` (4), plus the normalized value (``w*h``)
  when the norm weight is trainable;
* each linear whose weight or adapter is trainable saves its input (shared by q/k/v and by gate/up unless
  autocast or peft casts it, which makes one copy per module); the o_proj input is the SDPA output;
* SDPA (flash or memory-efficient, no ``s*s`` matrix): rotated q (``e*a*d``), k and v (``e*kv*d`` each, GQA
  not expanded), the output (``e*a*d``) and the fp32 logsumexp (``4*a``);
* SwiGLU MLP: the gate output, its SiLU and the up output (``3*e*I``), plus the down_proj input (``e*I``)
  when down_proj trains: no dropout anywhere;
* a LoRA adapter adds its ``lora_B`` input (``r`` elements); with 16-bit weights and no autocast peft casts
  the input to the fp32 adapter, a ``4h`` copy per adapted module;
* after the layers: the final norm, the lm_head input if it trains, and the logits' ``log_softmax`` in
  fp32 for the loss (``4*V`` per token, the largest term for small models) plus the int64 labels.

Full fine-tuning in fp32 is ``4*(8h + 2*kv*d + 4I) + 8 + 4a``
bytes per token per layer (Korthikanti's ``34h`` becomes about ``20h + 4*kv*d + 8I`` at 16 bit). With
gradient checkpointing (HF checkpoints each decoder layer) the forward keeps only the layer inputs
(``w*h`` per token per layer) plus the post-layer terms, and backward recomputes one layer at a time, so
the peak adds one layer's full activations. Calibrated on the builtin tiny Llama (CPU, fp32, micro-batch
4, seq 256) against ``torch.autograd.graph.saved_tensors_hooks``: within 1% for full fine-tuning and LoRA,
with and without checkpointing (see ``docs/memory-model.md``). Not counted: transient buffers of
backward (the logits gradient is another ``4*V`` per token at the start of backward) and the CUDA context
and allocator slack, which is what ``reserve_bytes`` is for."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:

    pass

from runner import strategies
from runner.planner.shapes import ModelShape, _targeted, lora_trainable_params

Method = Literal["full", "lora", "qlora"]
Precision = Literal["fp32", "bf16", "fp16"]
Strategy = str
"""A strategy's name in ``runner/strategies.py`` (the table says what each shards)."""
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


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes on the busiest device, by kind.

    Attributes:
        params: Weights.
        grads: Gradients.
        optimizer: Adam moments.
        master: fp32 master weights (16-bit weights only).
        activations: Peak saved activations (with checkpointing: stored layer inputs plus one recomputed
            layer) including the fp32 logits.
        buffers: The 16-bit weight copies autocast saves for backward (fp32 weights, 16-bit compute) or, for
            ZeRO-3/FSDP, the gathered weights of one layer.
        total: Sum of the parts: params, grads, optimizer, master, activations, buffers and reserve.
        reserve: ``reserve_bytes``: the CUDA context and allocator slack (0 on CPU).
        activations_stored: Not a part of ``total``: what one forward pass saves for backward, the figure
            ``saved_tensors_hooks`` measures (the stored activations, without the layer checkpointing
            recomputes, plus the autocast weight casts, which are saved tensors too).
        offloaded: Bytes moved to host memory, by kind (``optimizer``, ``master``, ``params``).
    """

    params: int
    grads: int
    optimizer: int
    master: int
    activations: int
    buffers: int
    total: int
    reserve: int = 0
    activations_stored: int = 0
    offloaded: dict[str, int] = field(default_factory=dict, hash=False)

    @property
    def model_states(self) -> int:
        """Weights, gradients, optimizer states and master weights."""
        return self.params + self.grads + self.optimizer + self.master


@dataclass(frozen=True)
class ActivationBytes:
    """Activation bytes of one micro-batch on one full model copy.

    Attributes:
        per_layer: What one decoder layer saves for backward without checkpointing.
        stored: What the forward pass keeps for backward (the saved-tensor total).
        recompute: Extra peak during backward: one layer recomputed under checkpointing, else 0.
        logits: The fp32 log-softmax of the loss (included in ``stored``).
        weight_copies: 16-bit weight casts autocast keeps for backward (not included in ``stored``).
    """

    per_layer: int
    stored: int
    recompute: int
    logits: int
    weight_copies: int

    @property
    def peak(self) -> int:
        """Stored plus recompute: the activation high-water mark."""
        return self.stored + self.recompute


def _weight_bytes(inp: EstimateInput) -> int:
    if inp.param_dtype is not None:
        return DTYPE_BYTES[inp.param_dtype]
    return 4 if inp.method == "full" else DTYPE_BYTES[inp.precision]


def activation_bytes(inp: EstimateInput) -> ActivationBytes:
    """Activations HF Llama with SDPA saves for backward, for one micro-batch (formula in the module doc).

    Args:
        inp: The run; uses shape, method, precision, param_dtype, micro_batch, seq_len,
            gradient_checkpointing, lora_r and lora_targets.

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
    # Dtype a LoRA adapter computes in: autocast's, else the fp32 adapter's (peft casts the input to it).
    adapter_e = e if autocast else 4
    h, qd, kvd, inter = sh.hidden, sh.heads * sh.head_dim, sh.kv_heads * sh.head_dim, sh.intermediate

    def group(members: Sequence[str], width: int, in_e: int, already_saved: bool) -> int:
        """Bytes per token the linears reading one shared input save."""
        shared = already_saved
        total = 0
        for m in members:
            for trains, op_e in ((full, e if autocast else in_e), (m in adapted, adapter_e)):
                if not trains:
                    continue
                if op_e == in_e:  # no cast: the shared input itself is saved, once
                    if not shared:
                        total += in_e * width
                        shared = True
                else:  # autocast or peft made a private copy for this module
                    total += op_e * width
            if m in adapted:
                total += adapter_e * inp.lora_r  # lora_B input
        return total

    def norm(input_grad: bool) -> int:
        return (4 * h + 4 + (w * h if full else 0)) if input_grad else 0

    def layer(input_grad: bool) -> int:
        b = norm(input_grad) + group(("q_proj", "k_proj", "v_proj"), h, w, False)
        b += e * (2 * qd + 2 * kvd) + 4 * sh.heads  # SDPA: q, k, v, output, logsumexp
        b += group(("o_proj",), qd, e, True)
        b += norm(True) + group(("gate_proj", "up_proj"), h, w, False)
        b += 3 * e * inter + group(("down_proj",), inter, e, False)
        return b

    # Frozen embeddings: the first layer's input needs no grad, so its input norm saves nothing.
    first_input_grad = full or inp.gradient_checkpointing
    layers = layer(first_input_grad) + (sh.layers - 1) * layer(True)
    logits = 4 * sh.vocab * tokens
    post = (norm(True) + group(("lm_head",), h, w, False) + 8) * tokens + logits  # + int64 labels
    rotary = 2 * inp.seq_len * sh.head_dim * w
    per_layer = layer(True) * tokens
    head = _lm_head_params(sh)
    if inp.gradient_checkpointing:
        stored = sh.layers * w * h * tokens + post + rotary
        # Backward recomputes one layer at a time: its activations and its autocast weight casts.
        recompute = per_layer + (2 * (sh.linear_params - head) // max(1, sh.layers) if autocast else 0)
        copies = 2 * head if autocast else 0
    else:
        stored = layers * tokens + post + rotary
        recompute = 0
        copies = 2 * sh.linear_params if autocast else 0
    return ActivationBytes(per_layer, stored, recompute, logits, copies)


def _lm_head_params(sh: ModelShape) -> int:
    lm = sh.linears.get("lm_head")
    return lm.in_features * lm.out_features if lm and not sh.tied_embeddings else 0


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


def estimate(inp: EstimateInput) -> MemoryBreakdown:
    """Per-device memory of a fine-tuning run (the busiest device for ``mp``).

    Args:
        inp: The run.

    Returns:
        Bytes by kind; ``total`` is what the device must hold.
    """
    sh = inp.shape
    n = max(1, inp.n_devices)
    e = DTYPE_BYTES[inp.precision]
    w = _weight_bytes(inp)
    table_row = strategies.get(inp.strategy)
    deepspeed = table_row.engine == "deepspeed"
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
    params = base + train * tw
    grads = float(train * tw)
    optimizer = float(train * ADAM_BYTES)
    master = float(train * MASTER_BYTES if tw < 4 else 0)

    acts = activation_bytes(replace(inp, param_dtype="bf16" if w == 2 else inp.param_dtype))
    activations = float(acts.peak)
    stored = float(acts.stored + acts.weight_copies)
    buffers = float(acts.weight_copies)

    shards = table_row.shards
    if table_row.layer_split:
        weight_share, layer_share = _mp_share(inp)
        model_share = weight_share if inp.method == "full" else layer_share  # adapters sit in the layers
        params = base * weight_share + train * tw * model_share
        grads, optimizer, master = grads * model_share, optimizer * model_share, master * model_share
        # Layer activations split with the layers; the logits are all on the last device.
        activations = (acts.peak - acts.logits) * layer_share + acts.logits
        stored = (acts.stored - acts.logits) * layer_share + acts.logits + acts.weight_copies * weight_share
        buffers = acts.weight_copies * weight_share
    if "optimizer" in shards:
        optimizer, master = optimizer / n, master / n
    if "grads" in shards:
        grads = grads / n
    if "params" in shards:
        params = params / n
        # The gathered weights of the layer being computed, in compute precision.
        buffers = float(sh.layer_params * e)

    offloaded: dict[str, int] = {}
    if inp.offload_optimizer:
        offloaded["optimizer"], offloaded["master"] = round(optimizer), round(master)
        optimizer = master = 0.0
    if inp.offload_params:
        offloaded["params"] = round(params)
        params = 0.0
    p, g, o, m, a, b = (round(x) for x in (params, grads, optimizer, master, activations, buffers))
    r = inp.reserve_bytes
    return MemoryBreakdown(p, g, o, m, a, b, total=p + g + o + m + a + b + r, reserve=r,
                           activations_stored=round(stored), offloaded=offloaded)


# The parts of ``MemoryBreakdown.total``, in the order ``ftui estimate`` shows them.
PARTS: tuple[str, ...] = ("params", "grads", "optimizer", "master", "activations", "buffers", "reserve")


def breakdown_json(b: MemoryBreakdown) -> dict[str, int]:
    """Per-device bytes as JSON (``ftui estimate --format json`` and the ``estimate`` a run's summary stores).

    The :data:`PARTS` add up to ``total``; ``activations_stored`` is a detail of ``activations`` (what one
    forward saves, to compare with the trainer's measurement), not a part.
    """
    out = {part: int(getattr(b, part)) for part in PARTS}
    return {**out, "total": b.total, "activations_stored": b.activations_stored}
