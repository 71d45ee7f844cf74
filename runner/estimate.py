"""Memory estimate and strategy recommendation for a fine-tuning run: pure functions, no I/O, no GPU.

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
and allocator slack, which is what ``reserve_bytes`` is for.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from runner.recipe import Recipe

Method = Literal["full", "lora", "qlora"]
Precision = Literal["fp32", "bf16", "fp16"]
Strategy = Literal["single", "mp", "ddp", "fsdp", "zero1", "zero2", "zero3"]

STRATEGIES: tuple[Strategy, ...] = ("single", "mp", "ddp", "fsdp", "zero1", "zero2", "zero3")
LAUNCHABLE: tuple[Strategy, ...] = ("single", "mp", "ddp", "fsdp")  # what ``launch.strategy`` accepts today
DTYPE_BYTES: Mapping[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2}
ADAM_BYTES = 8  # two fp32 moments per trainable parameter
MASTER_BYTES = 4  # fp32 master copy of 16-bit weights
NF4_BITS = 4.0
# bitsandbytes NF4 with double quantization: an 8-bit absmax per 64-weight block, and one fp32 constant per
# 256 such blocks (QLoRA paper, section 3): 8/64 + 32/(64*256) = 0.127 bits per parameter.
NF4_DOUBLE_QUANT_OVERHEAD_BITS = 8 / 64 + 32 / (64 * 256)
GIB = 2**30


@dataclass(frozen=True)
class LinearSpec:
    """One kind of linear layer in a model: its shape and how many the model has."""

    in_features: int
    out_features: int
    count: int


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder-only transformer that the estimate needs.

    Attributes:
        total_params: Every parameter, counted once (tied embeddings once).
        layers: Decoder layers.
        hidden: Hidden size ``h``.
        heads: Attention heads ``a``.
        kv_heads: Key/value heads (``heads`` without GQA).
        head_dim: Size of one head.
        intermediate: MLP intermediate size.
        vocab: Vocabulary size.
        tied_embeddings: Whether ``lm_head`` shares the input embedding.
        linears: Linear module short name (``q_proj``, ``lm_head``...) to its shape and count. A short name
            used with two shapes gets a second key ``name@INxOUT``.
    """

    total_params: int
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied_embeddings: bool
    linears: Mapping[str, LinearSpec] = field(hash=False)

    @property
    def linear_params(self) -> int:
        """Weights of every linear layer (biases not included), a tied ``lm_head`` not counted twice."""
        n = sum(s.in_features * s.out_features * s.count for s in self.linears.values())
        if self.tied_embeddings and "lm_head" in self.linears:
            lm = self.linears["lm_head"]
            n -= lm.in_features * lm.out_features * lm.count
        return n

    @property
    def embedding_params(self) -> int:
        """Input embedding plus an untied output head."""
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    @property
    def layer_params(self) -> int:
        """Parameters of one decoder layer (the rest spread evenly)."""
        rest = self.total_params - self.embedding_params - self.hidden
        return max(0, rest) // max(1, self.layers)


def _module_short_name(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def shape_from_config(config: PretrainedConfig) -> ModelShape:
    """Build the shape of a transformers model from its config, exactly.

    The model is instantiated on the meta device (no memory, no weights) and its ``nn.Linear`` modules (and
    GPT-2 style ``Conv1D``) are walked, so counts are exact for any architecture ``AutoModelForCausalLM``
    knows.

    Args:
        config: A transformers ``PretrainedConfig`` of a causal language model.

    Returns:
        The model's shape.
    """
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
    total = sum(p.numel() for p in model.parameters())
    linears: dict[str, LinearSpec] = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            fin, fout = module.in_features, module.out_features
        elif type(module).__name__ == "Conv1D" and hasattr(module, "nf"):
            fin, fout = int(module.weight.shape[0]), int(module.weight.shape[1])
        else:
            continue
        key = _module_short_name(name)
        if key in linears and (linears[key].in_features, linears[key].out_features) != (fin, fout):
            key = f"{key}@{fin}x{fout}"
        old = linears.get(key)
        linears[key] = LinearSpec(fin, fout, (old.count if old else 0) + 1)

    hidden = int(_cfg(config, "hidden_size", "n_embd", "d_model"))
    heads = int(_cfg(config, "num_attention_heads", "n_head"))
    head_dim = int(getattr(config, "head_dim", None) or hidden // heads)
    return ModelShape(
        total_params=total,
        layers=int(_cfg(config, "num_hidden_layers", "n_layer")),
        hidden=hidden,
        heads=heads,
        kv_heads=int(getattr(config, "num_key_value_heads", None) or heads),
        head_dim=head_dim,
        intermediate=int(
            getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None) or 4 * hidden
        ),
        vocab=int(config.vocab_size),
        tied_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        linears=linears,
    )


def _cfg(config: Any, *names: str) -> Any:
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    raise ValueError(f"config has none of {names}")


class _Ref(NamedTuple):
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int


# Published Llama-family shapes (head dim 64 for TinyLlama and Llama 3.2 1B, 128 otherwise).
LLAMA_REFERENCE_SHAPES: tuple[_Ref, ...] = (
    _Ref("TinyLlama-1.1B", 22, 2048, 32, 4, 5632, 32000),
    _Ref("Llama-3.2-3B", 28, 3072, 24, 8, 8192, 128256),
    _Ref("Llama-2-7B", 32, 4096, 32, 32, 11008, 32000),
    _Ref("Llama-3-8B", 32, 4096, 32, 8, 14336, 128256),
    _Ref("Llama-2-13B", 40, 5120, 40, 40, 13824, 32000),
    _Ref("CodeLlama-34B", 48, 8192, 64, 8, 22016, 32000),
    _Ref("Llama-2-70B", 80, 8192, 64, 8, 28672, 32000),
    _Ref("Llama-3.1-405B", 126, 16384, 128, 8, 53248, 128256),
)


def _llama_linears(
    layers: int, hidden: int, heads: int, kv: int, head_dim: int, inter: int, vocab: int
) -> dict[str, LinearSpec]:
    q, kvd = heads * head_dim, kv * head_dim
    return {
        "q_proj": LinearSpec(hidden, q, layers),
        "k_proj": LinearSpec(hidden, kvd, layers),
        "v_proj": LinearSpec(hidden, kvd, layers),
        "o_proj": LinearSpec(q, hidden, layers),
        "gate_proj": LinearSpec(hidden, inter, layers),
        "up_proj": LinearSpec(hidden, inter, layers),
        "down_proj": LinearSpec(inter, hidden, layers),
        "lm_head": LinearSpec(hidden, vocab, 1),
    }


def _llama_params(r: _Ref) -> int:
    head_dim = r.hidden // r.heads
    lin = _llama_linears(r.layers, r.hidden, r.heads, r.kv_heads, head_dim, r.intermediate, r.vocab)
    n = sum(s.in_features * s.out_features * s.count for s in lin.values())
    return n + r.vocab * r.hidden + (2 * r.layers + 1) * r.hidden


def shape_from_params(
    n: float,
    layers: int | None = None,
    hidden: int | None = None,
    heads: int | None = None,
    kv_heads: int | None = None,
    intermediate: int | None = None,
    vocab: int | None = None,
    tied_embeddings: bool = False,
) -> ModelShape:
    """An approximate Llama-like shape for a raw parameter count (``--params 7.5e9``).

    ``total_params`` is ``n`` exactly; the other sizes are approximate. Missing values are filled by a
    heuristic: with neither ``layers`` nor ``hidden`` given, the published Llama shape whose size is nearest
    to ``n`` (on a log scale, from ``LLAMA_REFERENCE_SHAPES``) supplies every missing value; with one of
    them given the other follows from ``12 * layers * hidden**2 = n`` (hidden rounded to 128); heads default
    to ``hidden / 128``, kv heads to heads, intermediate to ``8/3 * hidden`` rounded up to 256, vocabulary
    to 32000. The linear modules are Llama's (q/k/v/o, gate/up/down, lm_head) for those sizes, so their sum
    can differ from ``n`` by a few percent.

    Args:
        n: Total parameters.
        layers: Decoder layers, if known.
        hidden: Hidden size, if known.
        heads: Attention heads, if known.
        kv_heads: Key/value heads, if known.
        intermediate: MLP intermediate size, if known.
        vocab: Vocabulary size, if known.
        tied_embeddings: Whether lm_head shares the input embedding.

    Returns:
        The approximate shape.
    """
    if not math.isfinite(n) or n <= 0:
        raise ValueError(f"parameter count must be a positive number (got {n:g})")
    for what, value in (("layers", layers), ("hidden size", hidden), ("heads", heads), ("kv heads", kv_heads),
                        ("intermediate size", intermediate), ("vocabulary size", vocab)):
        if value is not None and value <= 0:
            raise ValueError(f"{what} must be positive (got {value})")
    if layers is None and hidden is None:
        ref = min(LLAMA_REFERENCE_SHAPES, key=lambda r: abs(math.log(n / _llama_params(r))))
        layers, hidden = ref.layers, ref.hidden
        heads = heads or ref.heads
        kv_heads = kv_heads or ref.kv_heads
        intermediate = intermediate or ref.intermediate
        vocab = vocab or ref.vocab
    elif hidden is None:
        assert layers is not None
        hidden = max(128, round(math.sqrt(n / (12 * layers)) / 128) * 128)
    elif layers is None:
        layers = max(1, round(n / (12 * hidden * hidden)))
    heads = heads or max(1, hidden // 128)
    kv_heads = kv_heads or heads
    intermediate = intermediate or math.ceil(8 * hidden / 3 / 256) * 256
    vocab = vocab or 32000
    head_dim = hidden // heads
    return ModelShape(
        total_params=int(n),
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate=intermediate,
        vocab=vocab,
        tied_embeddings=tied_embeddings,
        linears=_llama_linears(layers, hidden, heads, kv_heads, head_dim, intermediate, vocab),
    )


def _targeted(shape: ModelShape, targets: Sequence[str] | str) -> dict[str, LinearSpec]:
    if isinstance(targets, str):
        if targets != "all-linear":
            targets = [targets]
        else:  # peft's "all-linear" adapts every linear layer but the output head
            return {k: v for k, v in shape.linears.items() if k.split("@")[0] != "lm_head"}
    wanted = set(targets)
    return {k: v for k, v in shape.linears.items() if k.split("@")[0] in wanted}


def lora_trainable_params(shape: ModelShape, r: int, target_modules: Sequence[str] | str) -> int:
    """Parameters peft's LoRA trains: ``r * (in + out)`` per adapted linear (A is r x in, B is out x r).

    Args:
        shape: The model.
        r: LoRA rank.
        target_modules: Linear short names as peft takes them (``["q_proj", "v_proj"]``), or ``"all-linear"``.

    Returns:
        The exact number of trainable adapter parameters (peft's default ``bias="none"``).
    """
    return sum(
        r * (s.in_features + s.out_features) * s.count for s in _targeted(shape, target_modules).values()
    )


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
    deepspeed = inp.strategy in ("zero1", "zero2", "zero3")
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

    s = inp.strategy
    if s == "mp":
        weight_share, layer_share = _mp_share(inp)
        model_share = weight_share if inp.method == "full" else layer_share  # adapters sit in the layers
        params = base * weight_share + train * tw * model_share
        grads, optimizer, master = grads * model_share, optimizer * model_share, master * model_share
        # Layer activations split with the layers; the logits are all on the last device.
        activations = (acts.peak - acts.logits) * layer_share + acts.logits
        stored = (acts.stored - acts.logits) * layer_share + acts.logits + acts.weight_copies * weight_share
        buffers = acts.weight_copies * weight_share
    if s in ("zero1", "zero2", "zero3", "fsdp"):
        optimizer, master = optimizer / n, master / n
    if s in ("zero2", "zero3", "fsdp"):
        grads = grads / n
    if s in ("zero3", "fsdp"):
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


def _fits(inp: EstimateInput, gpu_mem_bytes: int) -> bool:
    return estimate(inp).total <= gpu_mem_bytes


def _at(inp: EstimateInput, strategy: Strategy, n_gpus: int) -> EstimateInput:
    return replace(inp, strategy=strategy, n_devices=1 if strategy == "single" else n_gpus)


def gpus_needed(inp: EstimateInput, gpu_mem_bytes: int, max_gpus: int = 1024) -> int | None:
    """The fewest devices on which ``inp.strategy`` fits, or ``None`` if none up to ``max_gpus`` does.

    Args:
        inp: The run (its ``n_devices`` is ignored).
        gpu_mem_bytes: Memory of one device.
        max_gpus: Largest device count tried.

    Returns:
        The minimum device count, or ``None``.
    """
    if inp.strategy in ("single", "ddp"):  # replicated: more devices never help
        return 1 if _fits(replace(inp, n_devices=1), gpu_mem_bytes) else None
    lo, hi = 1, max_gpus
    if not _fits(replace(inp, n_devices=hi), gpu_mem_bytes):
        return None
    while lo < hi:  # memory per device never grows with the device count
        mid = (lo + hi) // 2
        if _fits(replace(inp, n_devices=mid), gpu_mem_bytes):
            hi = mid
        else:
            lo = mid + 1
    return lo


@dataclass(frozen=True)
class Recommendation:
    """A strategy (and method) to run with, and why.

    Attributes:
        strategy: The recommended strategy, or ``None`` when nothing fits.
        reason: One sentence with the numbers.
        fits: For the requested method, whether each strategy fits on ``n_gpus`` devices.
        method: The fine-tuning method the recommendation is for (may be cheaper than asked).
    """

    strategy: Strategy | None
    reason: str
    fits: dict[str, bool] = field(hash=False)
    method: Method = "full"


def _gib(x: float) -> str:
    return f"{x / GIB:.1f} GiB"


def recommend(inputs: EstimateInput, gpu_mem_bytes: int, n_gpus: int) -> Recommendation:
    """Pick a strategy the seed's way: replicate when one device holds a copy, else shard as little as fits.

    If the model states plus one micro-batch fit on one device: ``ddp`` for speed (``single`` with one
    GPU). Else ``zero2`` when sharding optimizer states and grads suffices, else ``fsdp`` (weights sharded
    too, same memory as ``zero3``). ``mp`` always runs but leaves GPUs idle; it is recommended only when no
    data-parallel strategy fits and the layer split does. If a full fine-tune fits nowhere, LoRA is tried,
    then QLoRA.

    Args:
        inputs: The run (its strategy and device count are ignored).
        gpu_mem_bytes: Memory of one GPU.
        n_gpus: GPUs available.

    Returns:
        The recommendation.
    """
    fits: dict[str, bool] = {s: _fits(_at(inputs, s, n_gpus), gpu_mem_bytes) for s in STRATEGIES}
    methods: list[Method] = [inputs.method]
    if inputs.method == "full":
        methods += ["lora", "qlora"]
    elif inputs.method == "lora":
        methods.append("qlora")
    order: list[Strategy] = ["ddp" if n_gpus > 1 else "single"]
    if n_gpus > 1:
        order += ["zero2", "fsdp", "mp"]
    for method in methods:
        inp = replace(inputs, method=method)
        for s in order:
            est = estimate(_at(inp, s, n_gpus))
            if est.total > gpu_mem_bytes:
                continue
            what = {"full": "full fine-tuning", "lora": "LoRA", "qlora": "QLoRA"}[method]
            if method != inputs.method:
                what += f" (a {inputs.method} fine-tune fits nowhere)"
            where = f"each of {n_gpus} GPUs" if n_gpus > 1 else "the GPU"
            reason = (
                f"{inputs.precision} {what} with {s} needs {_gib(est.total)} per GPU "
                f"(model states {_gib(est.model_states)}, activations {_gib(est.activations)}), "
                f"within the {_gib(gpu_mem_bytes)} of {where}."
            )
            if s not in LAUNCHABLE:
                fsdp = estimate(_at(inp, "fsdp", n_gpus))
                reason += (
                    f" `ftui run` cannot launch {s} yet (launch.strategy takes {', '.join(LAUNCHABLE)})"
                    + (f"; fsdp fits too, at {_gib(fsdp.total)} per GPU." if fsdp.total <= gpu_mem_bytes else ".")
                )
            return Recommendation(s, reason, fits, method)
    best = min(estimate(_at(replace(inputs, method=methods[-1]), s, n_gpus)).total for s in order)
    reason = (
        f"Nothing fits: even {methods[-1]} needs {_gib(best)} per GPU against {_gib(gpu_mem_bytes)} on "
        f"{n_gpus} GPU(s); add GPUs, shorten sequences, or enable gradient checkpointing or offload."
    )
    return Recommendation(None, reason, fits, inputs.method)


def estimate_report(
    base_inputs: EstimateInput, gpu_mem_bytes: int, n_gpus: int, strategies: Sequence[Strategy] = STRATEGIES
) -> dict[str, Any]:
    """A JSON-ready report of every strategy and the recommendation.

    Args:
        base_inputs: The run (strategy and device count are set per entry).
        gpu_mem_bytes: Memory of one GPU.
        n_gpus: GPUs available (``single`` uses one).
        strategies: Strategies to report.

    Returns:
        ``{"strategies": {name: {"per_device_bytes": {...}, "fits": bool, "gpus_needed": int | None}},
        "recommendation": {"strategy": ..., "reason": ...}}``.
    """
    out: dict[str, Any] = {}
    for s in strategies:
        inp = _at(base_inputs, s, n_gpus)
        est = estimate(inp)
        out[s] = {
            "per_device_bytes": breakdown_json(est),
            "fits": est.total <= gpu_mem_bytes,
            "gpus_needed": gpus_needed(inp, gpu_mem_bytes),
        }
    rec = recommend(base_inputs, gpu_mem_bytes, n_gpus)
    return {"strategies": out, "recommendation": {"strategy": rec.strategy, "reason": rec.reason}}


# ---------------------------------------------------------------------- recipes


def llama_shape(
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    intermediate: int,
    vocab: int,
    tied_embeddings: bool = False,
    head_dim: int | None = None,
) -> ModelShape:
    """The exact shape of an HF Llama (no biases), computed without torch.

    Parameters: the linears, the input embedding, two RMSNorms per layer and the final norm (the tests
    compare it with ``shape_from_config`` on the meta device).
    """
    d = head_dim or hidden // heads
    linears = _llama_linears(layers, hidden, heads, kv_heads, d, intermediate, vocab)
    shape = ModelShape(0, layers, hidden, heads, kv_heads, d, intermediate, vocab, tied_embeddings, linears)
    total = shape.linear_params + vocab * hidden + (2 * layers + 1) * hidden
    return replace(shape, total_params=total)


class _Known(NamedTuple):
    match: str
    shape: _Ref


# Hub ids whose published config.json values are built in, so that ``ftui estimate`` works offline.
KNOWN_HUB_MODELS: tuple[_Known, ...] = (
    _Known("tinyllama-1.1b", LLAMA_REFERENCE_SHAPES[0]),
    _Known("codellama-34b", LLAMA_REFERENCE_SHAPES[5]),
)


class ModelSource(NamedTuple):
    """Where a recipe's model shape came from: ``shape`` and a short human note."""

    shape: ModelShape
    note: str


def resolve_model_shape(name: str, allow_network: bool = True) -> ModelSource:
    """The shape of ``model.name``: the builtin tiny Llama, a local folder, the local HF cache, a built-in
    table of known hub ids, or the hub (only when ``allow_network`` and reachable).

    Raises:
        ValueError: one line when the shape cannot be had.
    """
    from runner import builtin

    if name == builtin.TINY_LLAMA:
        s = builtin.TINY_LLAMA_SHAPE
        shape = llama_shape(
            int(s["num_hidden_layers"]),
            int(s["hidden_size"]),
            int(s["num_attention_heads"]),
            int(s["num_key_value_heads"]),
            int(s["intermediate_size"]),
            builtin.TOKENIZER_VOCAB,
            bool(s["tie_word_embeddings"]),
        )
        return ModelSource(shape, f"{name} (builtin config)")
    if name.startswith(builtin.BUILTIN_PREFIX):
        raise ValueError(f"model.name: unknown builtin model {name!r}")
    from pathlib import Path

    folder = Path(name).expanduser()
    if (folder / "config.json").is_file():
        try:
            shape = shape_from_config(_auto_config(str(folder), local_only=True))
        except Exception as exc:  # noqa: BLE001 (transformers raises OSError, ValueError, KeyError...: one line)
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ValueError(f"model.name: {folder / 'config.json'}: cannot read the model config ({first[:160]})") from None
        return ModelSource(shape, f"{name} (local config.json)")
    try:
        cfg = _auto_config(name, local_only=True)
        return ModelSource(shape_from_config(cfg), f"{name} (config from the local Hugging Face cache)")
    except Exception:  # noqa: BLE001 (not cached: try the table, then the hub)
        pass
    low = name.lower()
    for known in KNOWN_HUB_MODELS:
        if known.match in low:
            r = known.shape
            shape = llama_shape(r.layers, r.hidden, r.heads, r.kv_heads, r.intermediate, r.vocab)
            return ModelSource(shape, f"{name} (built-in table of {r.name}'s published config; hub not used)")
    if not allow_network:
        raise ValueError(f"model.name: {name}: config not in the local cache and not in the built-in table")
    try:
        cfg = _auto_config(name, local_only=False)
    except Exception as exc:  # noqa: BLE001 (one line for the user)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(
            f"model.name: {name}: cannot read its config from the hub ({first[:160]}); "
            "use a local folder or --params/--layers/--hidden"
        ) from None
    return ModelSource(shape_from_config(cfg), f"{name} (config from the Hugging Face hub)")


def _auto_config(name: str, local_only: bool) -> PretrainedConfig:
    from transformers import AutoConfig

    cfg: PretrainedConfig = AutoConfig.from_pretrained(name, local_files_only=local_only)
    return cfg


def recipe_param_dtype(model_dtype: str, method: str, precision: str) -> Precision:
    """The dtype the trainer stores the weights in (``runner.trainer._load_dtype`` without torch)."""
    if model_dtype != "auto":
        return model_dtype  # type: ignore[return-value]
    if method in ("lora", "qlora") and precision != "fp32":
        return precision  # type: ignore[return-value]
    return "fp32"


def inputs_from_recipe(
    recipe: Recipe, n_devices: int | None = None, shape: ModelShape | None = None, allow_network: bool = True
) -> EstimateInput:
    """The estimate's input for a recipe, with the trainer's semantics (fp32 weights unless
    ``model.dtype`` or a 16-bit LoRA says otherwise; micro-batch = ``train.batch_size``; sequence =
    ``data.context_length``).

    Args:
        recipe: A validated recipe.
        n_devices: Devices to spread over (default: ``launch.nproc``, or the listed GPUs for ``mp``).
        shape: The model's shape, if already resolved (else :func:`resolve_model_shape`).
        allow_network: Whether the hub may be asked for an unknown model's config.

    Raises:
        ValueError: the model's shape cannot be had.
    """
    if shape is None:
        shape = resolve_model_shape(recipe.model.name, allow_network).shape
    launch, train, method = recipe.launch, recipe.train, recipe.method
    if n_devices is None:
        n_devices = len(launch.gpus) if launch.strategy == "mp" and launch.gpus else launch.nproc
    return EstimateInput(
        shape=shape,
        method=method.type,
        precision=train.precision,
        param_dtype=recipe_param_dtype(recipe.model.dtype, method.type, train.precision),
        strategy=launch.strategy,
        n_devices=max(1, n_devices),
        micro_batch=train.batch_size,
        seq_len=recipe.data.context_length,
        gradient_checkpointing=train.gradient_checkpointing,
        lora_r=method.lora.r,
        lora_targets=tuple(method.lora.target_modules),
    )


# The parts of ``MemoryBreakdown.total``, in the order ``ftui estimate`` shows them.
PARTS: tuple[str, ...] = ("params", "grads", "optimizer", "master", "activations", "buffers", "reserve")


def breakdown_json(b: MemoryBreakdown) -> dict[str, int]:
    """Per-device bytes as JSON (``ftui estimate --format json`` and the ``estimate`` a run's summary stores).

    The :data:`PARTS` add up to ``total``; ``activations_stored`` is a detail of ``activations`` (what one
    forward saves, to compare with the trainer's measurement), not a part.
    """
    out = {part: int(getattr(b, part)) for part in PARTS}
    return {**out, "total": b.total, "activations_stored": b.activations_stored}


def parse_bytes(text: str, allow_zero: bool = False) -> int:
    """``48GiB``, ``80GB``, ``3.5GiB``, ``512MiB`` or a plain byte count.

    Raises:
        ValueError: one line, for anything else, and for sizes that are not finite or not positive (zero is
            accepted with ``allow_zero``).
    """
    units = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
             "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
    s = text.strip().lower().replace(" ", "")
    i = len(s)
    while i > 0 and not (s[i - 1].isdigit() or s[i - 1] == "."):
        i -= 1
    num, unit = s[:i], s[i:]
    expected = f"{text!r}: expected a size like 48GiB, 80GB, 512MiB or a byte count"
    if not num or unit not in units:
        raise ValueError(expected)
    try:
        value = float(num) * units[unit]
    except ValueError:
        raise ValueError(expected) from None
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{text!r}: must be a finite size {'of at least 0' if allow_zero else 'above 0'}")
    if value >= 2**63:
        raise ValueError(f"{text!r}: too large a size")
    return int(value)
