"""Activation bytes of one micro-batch: what autograd saves for backward, counted tensor by tensor, and the
temporaries around it. Pure functions, no I/O; docs/memory-model.md ("Activations") has every formula with
the measurement it was checked against.

The count starts from Korthikanti et al. 2022 and follows the architecture features read from the config
(``runner.planner.shapes.ModelShape``: norm kind, gated or plain MLP, fused linears, dropout, parallel
blocks). Beside the saved tensors it gives the temporaries of each moment of the step: the logits around the
loss (3 x 4V bytes per token at the start of backward), a layer's backward, autocast's weight copies (cached
to the end of the forward), LoRA dropout's copies and masks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from runner.planner.inputs import DTYPE_BYTES, EstimateInput, weight_bytes
from runner.planner.shapes import ModelShape, lora_targeted, lora_trainable_params

# Bytes an MLP activation saves per intermediate element, in units of the compute element size: one op
# saves its input; transformers' ``gelu_new``/``gelu_fast`` are Python formulas whose pow, tanh and two
# products each keep a tensor (activations.py: NewGELUActivation).
_ACT_SAVED = {"gelu_new": 4, "gelu_fast": 4}
_ACT_SAVES_OUTPUT = frozenset({"relu"})
"""Activations whose backward reads their output (threshold_backward), not their input."""
_ADAPTER_E = 4
"""Bytes of a LoRA adapter element: peft keeps adapters fp32 and casts each adapted module's input to them."""


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
        first_layer: What the first decoder layer keeps (in ``stored``; its input needs no gradient when
            the embedding is frozen and nothing is checkpointed).
        layer_stored: What each other decoder layer keeps (its input alone under checkpointing).
        post: What the stack's end keeps: the final norm, the head's input, the labels, the log-softmax,
            and the embedding's dropout and indices. ``stored`` is ``first_layer + (layers - 1) x
            layer_stored + post + rotary``.
        rotary: What every layer shares, once per forward: the rotary embedding's cos and sin and, under
            checkpointing, the boolean attention mask of a model that builds one.
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
    first_layer: int = 0
    layer_stored: int = 0
    post: int = 0
    rotary: int = 0

    @property
    def peak(self) -> int:
        """Stored plus recompute: the activation high-water mark."""
        return self.stored + self.recompute


class _PerToken(NamedTuple):
    """Bytes saved per token by a part of the model, and how many of them are LoRA dropout's."""

    saved: int
    dropout: int


@dataclass(frozen=True)
class _Saves:
    """What one run's layers save for backward, per token: the run and the element sizes its ops work in.

    Attributes:
        inp: The run.
        e: Bytes of a compute element (the precision's).
        w: Bytes of a stored weight element.
        adapted: Short names of the LoRA-adapted linears (empty for full fine-tuning).
        math_attention: Attention runs the math path (dropout in training rules out the fused kernels), which
            keeps the scores.
        att_e: Bytes of an attention element: fp32 for the math path under CPU autocast (measured,
            docs/memory-model.md), else the compute element.
        eager: ``model.attn_implementation = "eager"``: the attention is two matmuls around an fp32 softmax,
            each keeping what its backward reads (transformers' ``eager_attention_forward``).
        compiled: ``train.compile``: the decoder layers run through torch.compile, whose min-cut partitioner
            recomputes pointwise results in backward instead of saving them.
    """

    inp: EstimateInput
    e: int
    w: int
    adapted: frozenset[str]
    math_attention: bool
    att_e: int
    eager: bool = False
    compiled: bool = False

    @property
    def sh(self) -> ModelShape:
        """The model."""
        return self.inp.shape

    @property
    def full(self) -> bool:
        """Every weight trains."""
        return self.inp.method == "full"

    @property
    def autocast(self) -> bool:
        """Weights wider than the compute precision: autocast casts them for each matmul."""
        return self.w > self.e

    @property
    def adapter_e(self) -> int:
        """Dtype a LoRA adapter computes in: with 16-bit precision accelerate runs the forward under autocast
        (even over 16-bit weights), so the fp32 adapter computes in it; in fp32 over 16-bit weights (no
        autocast) peft casts the input to the fp32 adapter."""
        return self.e if self.e < 4 else 4

    def mask(self, elem: int) -> int:
        """Bytes per element of a dropout mask: a bool on GPU (native_dropout); on CPU dropout multiplies by a
        mask of the input's dtype (ATen's _dropout_impl), so it costs an element."""
        return 1 if self.inp.device == "cuda" else elem

    def group(self, members: Sequence[str], width: int, in_e: int, already_saved: bool,
              needs_grad: bool = True) -> _PerToken:
        """What the linears reading one shared input save; ``needs_grad``: that input needs a gradient."""
        sh, inp = self.sh, self.inp
        shared = already_saved
        total = dropout = 0
        copies: set[int] = set()  # compiled: one cast of the input per dtype (common subexpressions merged)
        for m in members:
            if m not in sh.linears and m.split("@")[0] not in {k.split("@")[0] for k in sh.linears}:
                continue
            lora = m.split("@")[0] in self.adapted
            for trains, op_e in ((self.full, self.e if self.autocast else in_e), (lora, self.adapter_e)):
                if not trains:
                    continue
                if lora and not self.full and inp.lora_dropout > 0 and op_e == self.adapter_e:
                    # peft: lora_A(dropout(x.to(fp32 adapter))): lora_A's input (the dropped copy, as the
                    # adapter computes) and, when x needs a gradient, dropout's mask of the fp32 copy.
                    extra = (op_e + (self.mask(_ADAPTER_E) if needs_grad else 0)) * width
                    dropout += extra
                    total += extra
                elif op_e == in_e and not (lora and self.e < 4):  # no cast: the shared input is saved, once
                    # (under autocast peft's cast to the fp32 adapter and autocast's cast back are private)
                    if not shared:
                        total += in_e * width
                        shared = True
                elif not (self.compiled and op_e in copies):  # autocast or peft made a private copy for this module
                    copies.add(op_e)
                    total += op_e * width
            if lora:
                total += self.adapter_e * inp.lora_r  # lora_B input
        return _PerToken(total, dropout)

    def norm(self, input_grad: bool, input_saved: bool = False, in_layer: bool = True, first: bool = True) -> int:
        """What a norm saves: nothing when neither its input nor its weight needs a gradient; ``input_saved``:
        another norm already saved the same input (two norms of one layer input); ``in_layer``: the norm is
        part of a decoder layer (compiled with ``train.compile``; the final norm is not); ``first``: its input
        is the layer's input (a compiled graph keeps an input as it is, an intermediate in at most the compute
        precision)."""
        sh, w = self.sh, self.w
        trains = self.full
        if not (input_grad or trains):
            return 0
        if sh.norm == "layer":  # native_layer_norm saves its input, mean and rstd, in the input's dtype
            return (0 if input_saved else w * sh.hidden) + 2 * w
        if self.compiled and in_layer:  # the input as it is and rsqrt: the upcast and the product are recomputed
            return (0 if input_saved else (w if first else min(w, self.e)) * sh.hidden) + 4
        normalized = (4 if sh.norm_fp32_output else w) * sh.hidden if trains else 0
        upcast = 0 if input_saved and w == 4 else 4 * sh.hidden
        return upcast + 4 + normalized  # RMSNorm: the fp32 upcast input and rsqrt

    def attention(self, masked: bool, input_grad: bool = True) -> int:
        """What the attention itself saves (its projections are in :meth:`group`); ``masked``: the kernel is
        given a materialized mask (a sliding window, or Falcon's); ``input_grad``: the layer's input needs a
        gradient (else only what the trained projections make does)."""
        sh, att_e, e = self.sh, self.att_e, self.e
        qd, s = sh.heads * sh.head_dim, self.inp.seq_len
        if self.eager:
            return self.eager_attention(input_grad)
        masked = masked and self.inp.attention == "sdpa"  # flash and flex take a window in the kernel, not a mask
        if self.math_attention:  # q and k, v (broadcast to every head), the softmax output
            saved = att_e * 3 * qd + sh.heads * s * att_e
            if sh.attn_dropout > 0:  # the dropout's mask and the dropped probabilities
                saved += sh.heads * s * (self.mask(att_e) + att_e)
            return saved
        # SDPA flash/efficient: q, k, v, output, logsumexp. With a mask transformers repeats the kv heads to
        # every head (no enable_gqa then) and SDPA converts the boolean mask to the query's dtype, per layer.
        kv = sh.heads if masked or sh.kv_layout == "expanded" else sh.kv_heads
        return e * (qd + 2 * kv * sh.head_dim) + e * qd + 4 * sh.heads + (s * e if masked else 0)

    def eager_attention(self, input_grad: bool) -> int:
        """What transformers' ``eager_attention_forward`` saves per token: ``matmul(q, k^T)`` keeps k (every
        head: ``repeat_kv`` copies the kv heads) where q needs a gradient and q where k does; the fp32 softmax
        keeps its output, and ``matmul(p, v)`` keeps v (every head) where p needs a gradient and p where v
        does, in the compute dtype: the softmax output itself, or its 16-bit copy under autocast when the
        softmax is fp32 (GPT-2 and Falcon take it in the scores' dtype). The mask is added (nothing kept).
        Each operand is saved in the compute precision (autocast's copy)."""
        sh, e = self.sh, self.e
        qd, s = sh.heads * sh.head_dim, self.inp.seq_len
        q_grad, k_grad, v_grad = (input_grad or self.trains(name) for name in self.qkv_names())
        p_grad = q_grad or k_grad
        probs, soft_e = sh.heads * s, 4 if sh.eager_softmax_fp32 else e
        saved = (e * qd if q_grad else 0) + (e * qd if k_grad else 0)  # k^T: kept for q's gradient, q for k's
        saved += soft_e * probs if p_grad else 0
        if v_grad and (soft_e != e or not p_grad):  # p for v's gradient: a copy unless the softmax output is it
            saved += e * probs
        if p_grad:
            saved += e * qd  # v, for p's gradient
        if sh.attn_dropout > 0 and p_grad:  # dropout's mask and the dropped probabilities
            saved += probs * (self.mask(e) + e)
        return saved

    def qk_norms(self, input_grad: bool) -> int:
        """What OLMoE's RMSNorms of the query and key projections save per token: each the fp32 input (the
        projection's output, or its upcast copy) and rsqrt where that projection's output needs a gradient, and
        the normalized input in the compute dtype for a trained weight."""
        sh = self.sh
        if not sh.qk_norm:
            return 0
        q, k, _ = self.qkv_names()
        total = 0
        for name, width in ((q, sh.heads * sh.head_dim), (k, sh.kv_heads * sh.head_dim)):
            if input_grad or self.trains(name):
                total += 4 * width + 4 + (self.e * width if self.full else 0)
        return total

    def trains(self, name: str) -> bool:
        """Whether the linear ``name`` trains (full fine-tuning, or an adapted module)."""
        return self.full or name.split("@")[0] in self.adapted

    def qkv_names(self) -> tuple[str, str, str]:
        """The linears that make q, k and v (one fused linear makes all three)."""
        names = self.sh.attn_in
        return (names[0], names[1], names[2]) if len(names) == 3 else (names[0], names[0], names[0])

    def moe(self) -> int:
        """What a mixture-of-experts MLP saves per token (the routed experts only). transformers' grouped_mm
        experts are not autocast: they compute in the weights' dtype."""
        sh, x, h, i, k = self.sh, self.w, self.sh.hidden, self.sh.intermediate, self.sh.experts_per_token
        # The router: its fp32 softmax, the int64 top-k indices and, renormalizing, their sum and the normalized
        # weights.
        router = 4 * sh.experts + 8 * k + ((4 + 4 * k) if sh.norm_topk else 0)  # the renormalizing sum, division
        if self.full and (self.autocast or not sh.mlp_in):  # the router's input, for its weight's gradient (the
            router += (self.e if self.autocast else self.w) * h  # shared expert's linears save it uncast)
        # Per routed copy of a token: the gate/up output, the activation, the expert's output (scaled by the
        # routing weight, which is kept too) and three int64 indices of the sort; for the experts' weight
        # gradients also the gathered input and the input of the down projection.
        slot = x * (3 * i + h) + 4 + 3 * 8 + (x * (h + i) if self.full else 0)
        return router + k * slot

    def shared_expert(self) -> _PerToken:
        """What Qwen2-MoE's shared expert saves per token beside the routed ones (its input linears are the
        layer's MLP input group): the gated MLP's gate output, activation and up output, the down projection's
        input, the sigmoid of its gate's one output and the expert's output that sigmoid scales."""
        sh, e, i = self.sh, self.e, self.sh.shared_expert
        if not i:
            return _PerToken(0, 0)
        out = self.group(sh.mlp_out, i, e, False)
        return _PerToken((2 if self.compiled else 3) * e * i + out.saved + e + e * sh.hidden, out.dropout)

    def mlp(self, input_grad: bool) -> _PerToken:
        """What the MLP saves between its input linears and its output linear, the output linear included;
        ``input_grad``: its activations need a gradient (else only an adapted output linear saves its input)."""
        sh, e, i = self.sh, self.e, self.sh.intermediate
        if sh.mlp == "moe":
            shared = self.shared_expert()
            return _PerToken(self.moe() + shared.saved, shared.dropout)
        if not input_grad:
            out = self.group(sh.mlp_out, i, e, False, needs_grad=False)
            return _PerToken(out.saved, out.dropout)
        act_mask = self.mask(e) * i if sh.act_dropout > 0 else 0
        if sh.mlp == "gated":  # gate output, its activation (recomputed when compiled), up output
            body, out_saved = (2 if self.compiled else 3) * e * i, False
        elif sh.act in _ACT_SAVES_OUTPUT:  # ReLU keeps its output: it is the output linear's input
            body, out_saved = e * i, sh.act_dropout == 0
        else:  # fc1 output (and a Python GELU's pieces)
            body, out_saved = _ACT_SAVED.get(sh.act, 1) * e * i, False
        out = self.group(sh.mlp_out, i, e, out_saved)
        return _PerToken(body + act_mask + out.saved, out.dropout)

    def layer(self, input_grad: bool, masked: bool = False) -> _PerToken:
        """What one decoder layer saves; ``input_grad``: its input needs a gradient; ``masked``: its attention
        is given a materialized mask."""
        sh, e, w = self.sh, self.e, self.w
        h, qd = sh.hidden, sh.heads * sh.head_dim
        norm_grad = input_grad or self.full  # the norms' outputs need a gradient
        copy = self.math_attention or self.eager or sh.attn_out_copy
        # With one shared norm (Phi, Falcon-7B) the MLP's input linears read the attention's input.
        attn_in = (*sh.attn_in, *sh.mlp_in) if sh.parallel_block else sh.attn_in
        groups = [self.group(attn_in, h, w, False, norm_grad), self.group(sh.attn_out, qd, e, not copy)]
        b = self.norm(input_grad) + groups[0].saved + self.qk_norms(input_grad) + self.attention(masked, input_grad) \
            + groups[1].saved
        if sh.parallel_residual:  # the MLP's own norm of the same layer input
            groups.append(self.group(sh.mlp_in, h, w, False, norm_grad))
            b += self.norm(input_grad, input_saved=True) + groups[-1].saved
        elif not sh.parallel_block:
            groups.append(self.group(sh.mlp_in, h, w, False))
            b += self.norm(True, first=False) + groups[-1].saved
        # A parallel MLP reads the layer input's norm: with neither that input nor an MLP input linear
        # needing a gradient (the first layer under LoRA) its activations need none either.
        mlp_in = {m.split("@")[0] for m in sh.mlp_in}
        parallel = sh.parallel_block or sh.parallel_residual
        mlp = self.mlp(not parallel or norm_grad or bool(mlp_in & self.adapted))
        resid_masks = 2 * self.mask(e) * h if sh.resid_dropout > 0 else 0  # the branch outputs' dropout
        return _PerToken(b + mlp.saved + resid_masks, sum(g.dropout for g in groups) + mlp.dropout)


def _saves(inp: EstimateInput) -> _Saves:
    """The element sizes and adapted modules of ``inp``'s forward."""
    e = DTYPE_BYTES[inp.precision]
    adapted = frozenset(k.split("@")[0] for k in lora_targeted(inp.shape, inp.lora_targets)) \
        if inp.method != "full" else frozenset()
    sh = inp.shape
    # SDPA's math path: attention dropout in training rules out the fused kernels, and so do keys and values
    # with fewer heads than the query that the model passes as they are (broadcast).
    # flash_attention_2 and flex_attention take both in their kernels (dropout's state, fewer kv heads).
    math_attention = inp.attention == "sdpa" and (sh.attn_dropout > 0 or (sh.kv_layout == "broadcast"
                                                                          and sh.kv_heads < sh.heads))
    att_e = 4 if (math_attention and e < 4 and inp.device == "cpu") else e
    return _Saves(inp, e, weight_bytes(inp), adapted, math_attention, att_e, eager=inp.attention == "eager",
                  compiled=inp.compiled)


def _masked_layers(inp: EstimateInput) -> int:
    """Layers whose attention kernel is given a materialized mask: every layer of a model that always builds
    one (Falcon); the sliding-window layers once the sequence reaches the window (transformers skips the
    mask below it: masking_utils._ignore_causal_mask_sdpa)."""
    sh = inp.shape
    if sh.mask_always:
        return sh.layers
    if sh.sliding_window is not None and inp.seq_len >= sh.sliding_window:
        return min(sh.layers, sh.sliding_layers)
    return 0


class _Stack(NamedTuple):
    """Per token: what the decoder layers save, how much of it is LoRA dropout's, what the first layer and
    the largest other one save."""

    saved: int
    dropout: int
    first: int
    largest: int


def _layer_stack(s: _Saves, first_input_grad: bool) -> _Stack:
    """What the decoder layers save per token. The first layer's input needs no gradient unless it trains or
    is checkpointed; a model whose sliding-window layers are not all of them (Qwen2) has them on top."""
    sh = s.sh
    masked = _masked_layers(s.inp)
    first = s.layer(first_input_grad, masked == sh.layers)
    rest_masked = masked - (1 if masked == sh.layers else 0)
    kinds = [(s.layer(True, True), rest_masked), (s.layer(True, False), sh.layers - 1 - rest_masked)]
    saved = first.saved + sum(k.saved * n for k, n in kinds)
    dropout = first.dropout + sum(k.dropout * n for k, n in kinds)
    return _Stack(saved, dropout, first.saved,
                  max(k.saved for k, n in kinds if n > 0) if sh.layers > 1 else first.saved)


def activation_bytes(inp: EstimateInput) -> ActivationBytes:
    """Activations a decoder-only transformer saves for backward, for one micro-batch (module doc and
    docs/memory-model.md, "Activations"), by the architecture features of ``inp.shape``.

    Args:
        inp: The run; uses shape, method, precision, param_dtype, micro_batch, seq_len,
            gradient_checkpointing, lora_r, lora_targets, lora_dropout and device.

    Returns:
        The activation bytes of one full model copy.
    """
    sh, s = inp.shape, _saves(inp)
    e, w, h = s.e, s.w, sh.hidden
    tokens = inp.micro_batch * inp.seq_len
    # Frozen embeddings: the first layer's input needs no grad, so its input norm saves nothing.
    first_input_grad = s.full or inp.gradient_checkpointing
    stack = _layer_stack(s, first_input_grad)
    layers, lora_dropout = stack.saved, stack.dropout * tokens
    embd = (s.mask(w) * h if sh.embd_dropout > 0 and first_input_grad else 0)
    if s.full:  # the embeddings' int64 indices (and OPT's per-token positions)
        embd += 8 * (2 if sh.positions_per_token else 1)
    logits = 4 * sh.vocab * tokens
    head = s.group(("lm_head",), h, w, False).saved
    # + the int64 labels per token, and nll_loss's fp32 total weight once
    post = (s.norm(True, in_layer=False) + head + 8 + embd) * tokens + logits + 4
    rotary = 2 * inp.seq_len * round(sh.head_dim * sh.rotary_fraction) * w  # cos and sin, once
    per_layer = stack.largest * tokens
    head_w = sh.vocab * sh.hidden if "lm_head" in sh.linears else 0  # the head's matmul casts it, tied or not
    layer_linear = (sh.linear_params - (0 if sh.tied_embeddings else head_w)) // max(1, sh.layers)
    # Around the loss: the logits in compute precision and, at 16 bit, HF's fp32 upcast, beside the
    # saved log-softmax; at the start of backward the log-softmax's output and input gradients (fp32).
    logits_forward = sh.vocab * tokens * (e + (4 if e != 4 else 0))
    logits_backward = 2 * 4 * sh.vocab * tokens
    # One layer's backward holds the gradients of its widest intermediates (the MLP's, in compute
    # precision) beside the incoming hidden gradient.
    layer_backward = tokens * e * (2 * sh.intermediate * max(1, sh.experts_per_token) + 2 * h)
    if s.math_attention or s.eager:  # or the gradients of the scores: through the dropout and the softmax
        score_e = (4 if sh.eager_softmax_fp32 else e) if s.eager else s.att_e  # eager's softmax dtype
        # They come after the MLP's backward (sequential blocks), which has freed what the MLP saved.
        mlp_saved = 0 if sh.parallel_block or sh.parallel_residual else s.mlp(True).saved
        layer_backward = max(layer_backward, tokens * (3 * score_e * sh.heads * inp.seq_len + 2 * e * h - mlp_saved))
    router = sh.experts * h * sh.layers  # a mixture of experts' routers (F.linear: autocast casts them)
    all_copies = 2 * (sh.linear_params + router + (head_w if sh.tied_embeddings else 0)) if s.autocast else 0
    # Under autocast the fp32 LoRA adapters are cast too (trainable leaves: cached to the forward's end).
    adapters = 2 * lora_trainable_params(sh, inp.lora_r, inp.lora_targets) if s.adapted and e < 4 else 0
    all_copies += adapters
    if inp.gradient_checkpointing:
        # Each layer's input, and the boolean attention mask once (an input of every checkpointed layer,
        # shared like the rotary embedding's cos and sin).
        rotary += inp.micro_batch * inp.seq_len * inp.seq_len if _masked_layers(inp) else 0
        first_layer = layer_stored = w * h * tokens
        stored = sh.layers * w * h * tokens + post + rotary
        recompute_copies = (2 * layer_linear if s.autocast else 0) + adapters // max(1, sh.layers)
        recompute = per_layer + recompute_copies  # one layer at a time: its activations and casts
        copies = 2 * head_w if s.autocast else 0
        dropout = 0
    else:
        # The other layers on average (a stage's share; Qwen2's sliding layers differ from its full ones).
        first_layer = stack.first * tokens
        layer_stored = (layers - stack.first) * tokens // max(1, sh.layers - 1)
        stored = layers * tokens + post + rotary
        recompute = recompute_copies = 0
        copies = all_copies
        dropout = lora_dropout
    return ActivationBytes(per_layer, stored, recompute, logits, copies, dropout, logits_forward, logits_backward,
                           layer_backward, recompute_copies, all_copies, first_layer, layer_stored, post, rotary)


COMPILED_EAGER = ("eager attention under torch.compile is estimated as eager's saves: what the partitioner keeps "
                  "around the softmax is not modelled (docs/memory-model.md)")
"""Why an estimate of eager attention in compiled layers is approximate (measured on the builtin Llama: a
probabilities-sized fp32 tensor more per layer in fp32, less in bf16)."""


def kernels_note(inp: EstimateInput) -> str | None:
    """Why the attention or compile terms of ``inp`` are approximate, or None where they are modelled."""
    return COMPILED_EAGER if inp.compiled and inp.attention == "eager" else None
