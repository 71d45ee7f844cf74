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
from runner.planner.shapes import ModelShape, lora_targeted

# Bytes an MLP activation saves per intermediate element, in units of the compute element size: one op
# saves its input; transformers' ``gelu_new``/``gelu_fast`` are Python formulas whose pow, tanh and two
# products each keep a tensor (activations.py: NewGELUActivation).
_ACT_SAVED = {"gelu_new": 4, "gelu_fast": 4}


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
        rotary: The rotary embedding's cos and sin, computed once per forward.
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
    """

    inp: EstimateInput
    e: int
    w: int
    adapted: frozenset[str]
    math_attention: bool
    att_e: int

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

    def group(self, members: Sequence[str], width: int, in_e: int, already_saved: bool) -> _PerToken:
        """What the linears reading one shared input save."""
        sh, inp = self.sh, self.inp
        shared = already_saved
        total = dropout = 0
        for m in members:
            if m not in sh.linears and m.split("@")[0] not in {k.split("@")[0] for k in sh.linears}:
                continue
            lora = m.split("@")[0] in self.adapted
            for trains, op_e in ((self.full, self.e if self.autocast else in_e), (lora, self.adapter_e)):
                if not trains:
                    continue
                if lora and not self.full and inp.lora_dropout > 0 and op_e == self.adapter_e:
                    # peft: lora_A(dropout(x)): a private dropped copy and its mask per adapted module.
                    extra = (op_e + self.mask(op_e)) * width
                    dropout += extra
                    total += extra
                elif op_e == in_e:  # no cast: the shared input itself is saved, once
                    if not shared:
                        total += in_e * width
                        shared = True
                else:  # autocast or peft made a private copy for this module
                    total += op_e * width
            if lora:
                total += self.adapter_e * inp.lora_r  # lora_B input
        return _PerToken(total, dropout)

    def norm(self, input_grad: bool) -> int:
        """What a norm saves: nothing when neither its input nor its weight needs a gradient."""
        sh, e, w = self.sh, self.e, self.w
        trains = self.full
        if not (input_grad or trains):
            return 0
        if sh.norm == "layer":  # native_layer_norm saves its input and mean, rstd; autocast runs it in fp32
            return (4 if e < 4 else w) * sh.hidden + 8
        normalized = (4 if sh.norm_fp32_output else w) * sh.hidden if trains else 0
        return 4 * sh.hidden + 4 + normalized  # RMSNorm: the fp32 upcast input and rsqrt

    def attention(self) -> int:
        """What the attention itself saves (its projections are in :meth:`group`)."""
        sh, att_e = self.sh, self.att_e
        qd, kvd = sh.heads * sh.head_dim, sh.kv_heads * sh.head_dim
        qkv = att_e * (qd + 2 * kvd)
        if self.math_attention:  # q, k, v, softmax output, dropout mask, dropped probabilities (a*s each)
            scores = sh.heads * self.inp.seq_len
            return qkv + scores * (2 * att_e + self.mask(att_e))
        return qkv + self.e * qd + 4 * sh.heads  # SDPA flash/efficient: q, k, v, output, logsumexp

    def layer(self, input_grad: bool) -> _PerToken:
        """What one decoder layer saves; ``input_grad``: its input needs a gradient."""
        sh, e, w = self.sh, self.e, self.w
        h, qd = sh.hidden, sh.heads * sh.head_dim
        groups = [self.group(sh.attn_in, h, w, False), self.group(sh.attn_out, qd, e, not self.math_attention)]
        b = self.norm(input_grad) + groups[0].saved + self.attention() + groups[1].saved
        if not sh.parallel_block:
            groups.append(self.group(sh.mlp_in, h, w, False))
            b += self.norm(True) + groups[-1].saved
        if sh.mlp == "gated":
            b += 3 * e * sh.intermediate  # gate output, its activation, up output
        else:
            b += _ACT_SAVED.get(sh.act, 1) * e * sh.intermediate  # fc1 output (and a Python GELU's pieces)
        groups.append(self.group(sh.mlp_out, sh.intermediate, e, False))
        b += groups[-1].saved
        resid_masks = 2 * self.mask(w) * h if sh.resid_dropout > 0 else 0
        return _PerToken(b + resid_masks, sum(g.dropout for g in groups))


def _saves(inp: EstimateInput) -> _Saves:
    """The element sizes and adapted modules of ``inp``'s forward."""
    e = DTYPE_BYTES[inp.precision]
    adapted = frozenset(k.split("@")[0] for k in lora_targeted(inp.shape, inp.lora_targets)) \
        if inp.method != "full" else frozenset()
    math_attention = inp.shape.attn_dropout > 0
    att_e = 4 if (math_attention and e < 4 and inp.device == "cpu") else e
    return _Saves(inp, e, weight_bytes(inp), adapted, math_attention, att_e)


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
    first, other = s.layer(first_input_grad), s.layer(True)
    layers = first.saved + (sh.layers - 1) * other.saved
    lora_dropout = (first.dropout + other.dropout) * tokens
    embd = (s.mask(w) * h if sh.embd_dropout > 0 and first_input_grad else 0) + (8 if s.full else 0)  # + indices
    logits = 4 * sh.vocab * tokens
    head = s.group(("lm_head",), h, w, False).saved
    post = (s.norm(True) + head + 8 + embd) * tokens + logits  # + int64 labels
    rotary = 2 * inp.seq_len * sh.head_dim * w if sh.family not in ("gpt2",) else 0
    per_layer = other.saved * tokens
    head_w = sh.vocab * sh.hidden if "lm_head" in sh.linears else 0  # the head's matmul casts it, tied or not
    layer_linear = (sh.linear_params - (0 if sh.tied_embeddings else head_w)) // max(1, sh.layers)
    # Around the loss: the logits in compute precision and, at 16 bit, HF's fp32 upcast, beside the
    # saved log-softmax; at the start of backward the log-softmax's output and input gradients (fp32).
    logits_forward = sh.vocab * tokens * (e + (4 if e != 4 else 0))
    logits_backward = 2 * 4 * sh.vocab * tokens
    # One layer's backward holds the gradients of its widest intermediates (the MLP's, in compute
    # precision) beside the incoming hidden gradient.
    layer_backward = tokens * e * (2 * sh.intermediate + 2 * h)
    if s.math_attention:  # or the gradients of the scores: through the dropout and the softmax
        layer_backward = max(layer_backward, tokens * (3 * s.att_e * sh.heads * inp.seq_len + 2 * e * h))
    all_copies = 2 * (sh.linear_params + (head_w if sh.tied_embeddings else 0)) if s.autocast else 0
    if inp.gradient_checkpointing:
        first_layer = layer_stored = w * h * tokens
        stored = sh.layers * w * h * tokens + post + rotary
        recompute_copies = 2 * layer_linear if s.autocast else 0
        recompute = per_layer + recompute_copies  # one layer at a time: its activations and casts
        copies = 2 * head_w if s.autocast else 0
        dropout = 0
    else:
        first_layer, layer_stored = first.saved * tokens, per_layer
        stored = layers * tokens + post + rotary
        recompute = recompute_copies = 0
        copies = all_copies
        dropout = lora_dropout
    return ActivationBytes(per_layer, stored, recompute, logits, copies, dropout, logits_forward, logits_backward,
                           layer_backward, recompute_copies, all_copies, first_layer, layer_stored, post, rotary)
