"""What sharded weights cost while they are computed with, under FSDP and the torch ZeRO stages (FSDP2
underneath: ``runner/spec/zero.py``); DeepSpeed ZeRO-3's own gathering is ``runner/planner/deepspeed.py``.

How accelerate wraps a model in FSDP2 (``accelerate/utils/fsdp_utils.py fsdp2_prepare_model``), the
:class:`Units`: one unit per decoder layer; the input embedding its own unit when the head is not tied to
it; the tail (``lm_head``, the final norm when accelerate finds it, and with a tied head the embedding: the
same tensor) a unit with ``reshard_after_forward=False``; the root the rest (GPT-2's position embeddings,
the final norm peft hides), which torch keeps gathered from its forward to its backward too. Each unit's
parameters are gathered whole in the compute dtype (mixed precision gathers in ``param_dtype``) into
storages beside their shards (``_fsdp_param.py init_unsharded_param``). The tail and the root are gathered
from their forward to their post-backward; a tied tail's post-backward hook sits on the token ids (no
gradient), so it runs only in the root's final callback: a tied tail stays gathered through the whole
backward, and its unsharded gradient (full fine-tuning) with it.

In the forward FSDP2 keeps the all-gather output of the last unit it gathered alive until the root's
forward ends, to overlap that copy-out with the next all-gather (``_fsdp_param_group.py wait_for_unshard``,
"defer free"; ``_fsdp_state.py _post_forward`` frees it): at the loss, the tail's all-gather output (the
head) beside the gathered head, or the last layer's when the tail was gathered first (a tied head).
In the backward each unit, once gathered, all-gathers the unit before it in the forward's order
(``_backward_prefetch``): its all-gather output waits beside the unit being computed until that unit's
backward starts, so inside the layer stack two layers are gathered. After a layer's backward its gradient
is copied into a reduce-scatter input that lives until the next layer's reduce-scatter
(``comm_ctx.reduce_scatter_state``), and the reduced shards are the layer's sharded gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

from runner.planner.inputs import EstimateInput


@dataclass(frozen=True)
class Units:
    """Bytes of each FSDP2 unit gathered whole (in the gather dtype).

    Attributes:
        tail: The head and the final norm; with a tied head the embedding too (the same tensor).
        embedding: The input embedding's own unit (0 when the head is tied to it: it is in the tail).
        leftover: The root's own parameters, what the other units leave (position embeddings, a norm).
        layer: One decoder layer with its share of the adapters.
        tied: The head is tied to the embedding.
    """

    tail: float
    embedding: float
    leftover: float
    layer: float
    tied: bool


def units(inp: EstimateInput, adapters: float, gather_e: int) -> Units:
    """The units of :mod:`this module's doc <runner.planner.fsdp>`, in bytes of ``gather_e``-byte elements;
    ``adapters``: the LoRA adapters' gathered bytes (they sit in the decoder layers)."""
    sh = inp.shape
    head = float(sh.vocab * sh.hidden)
    embedding = 0.0 if sh.tied_embeddings else head
    layer = float(sh.layer_params)
    leftover = max(0.0, sh.total_params - sh.layers * layer - head - embedding)
    return Units(tail=head * gather_e, embedding=embedding * gather_e, leftover=leftover * gather_e,
                 layer=layer * gather_e + adapters / max(1, sh.layers), tied=sh.tied_embeddings)


@dataclass(frozen=True)
class Gathered:
    """Bytes of gathered weights alive at the moments of a step, and the FSDP gradients beside them.

    Attributes:
        at_loss: Gathered at the loss in the forward: the tail, the root's own parameters and the last unit's
            all-gather output (every unit too when the layers stay gathered).
        at_gather: Gathered in the forward as the last unit's all-gather is copied out: that output and the
            unit's gathered weights beside the unit before's output, which ``wait_for_unshard`` still holds
            (``prev_all_gather_state``) until the copy-out returns.
        at_backward: Gathered when backward starts: the tail and the root's own parameters (every unit when
            the layers stay gathered).
        at_head: At the head's backward: :attr:`at_backward` and, with an untied head, the last layer's
            all-gather output the tail prefetched (a tied tail's forward came first: it prefetches nothing;
            layers kept gathered need no prefetch).
        in_stack: Inside the layer stack in the backward: the layer being computed and the next one's
            all-gather output (its prefetch), the root's own parameters, and a tied tail.
        at_end: At the embedding's backward: its unit (a tied tail) and the root's own parameters.
        flat_grads: A layer's unsharded gradient (in the gathered dtype) in its reduce-scatter input, alive
            until the next layer's reduce-scatter (FSDP1: the flat gradient).
        head_grad: The head's gradient from its backward to the end of the backward (unsharded, in the
            gathered dtype, when tied: the tail reduces it last).
    """

    at_loss: float = 0.0
    at_gather: float = 0.0
    at_backward: float = 0.0
    at_head: float = 0.0
    in_stack: float = 0.0
    at_end: float = 0.0
    flat_grads: float = 0.0
    head_grad: float = 0.0


def last_all_gather(inp: EstimateInput, adapters: float, gather_e: int) -> float:
    """Bytes of the forward's last all-gather output, alive at the loss (see the module doc): the tail
    (``vocab x hidden``) for an untied head, else the last decoder layer with its share of the adapters."""
    u = units(inp, adapters, gather_e)
    return u.layer if u.tied else u.tail


def layer_grads(inp: EstimateInput, train: int, tw: int) -> float:
    """Bytes of one decoder layer's trainable gradient, unsharded (LoRA: its share of the adapters)."""
    sh = inp.shape
    if inp.method == "full":
        return float(sh.layer_params * tw)
    return float(train * tw / max(1, sh.layers)) if train else 0.0


def gathered_units(inp: EstimateInput, gather_e: int, train: int, tw: int, keeps_gathered: bool,
                   shards: int) -> Gathered:
    """The gathered weights and FSDP gradients of a run whose weights FSDP shards.

    Args:
        inp: The run.
        gather_e: Bytes of a gathered element (the compute dtype under mixed precision).
        train: Trainable parameters (the adapters for LoRA).
        tw: Bytes of a trainable element.
        keeps_gathered: FSDP2 ``reshard_after_forward=False`` (torch ZeRO-2): every unit stays gathered from
            its forward to its backward.
        shards: Devices a weight is sharded over.
    """
    sh = inp.shape
    adapters = float(train * gather_e) if inp.method != "full" else 0.0
    u = units(inp, adapters, gather_e)
    kept = u.tail + u.leftover  # gathered from their forward to their backward
    at_backward = kept
    if keeps_gathered:  # every unit stays gathered from its forward to its backward
        at_backward = kept + u.embedding + sh.layers * u.layer
    last = last_all_gather(inp, adapters, gather_e)
    at_loss = at_backward + last
    tied_tail = u.tail if u.tied else 0.0
    before = u.leftover + tied_tail  # gathered before the last unit's all-gather
    if keeps_gathered:  # and every unit before it
        before += u.embedding + sh.layers * u.layer - (u.layer if u.tied else 0.0)
    at_gather = before + u.layer + 2 * last  # the previous layer's output, the last's and its weights
    # An untied tail prefetches the last layer at the head's backward (a no-op when the layers stayed gathered).
    at_head = at_backward + (0.0 if u.tied or keeps_gathered else u.layer)
    in_stack = tied_tail + u.leftover + 2 * u.layer
    if keeps_gathered:  # each unit reshards after its backward: the layers below are still gathered
        in_stack = max(in_stack, at_backward)
    at_end = (u.tail if u.tied else u.embedding) + u.leftover
    # An unsharded gradient is in the gathered weights' dtype; the reduced shards in the trainable dtype.
    flat = layer_grads(inp, train, gather_e)
    head = float(sh.vocab * sh.hidden) if inp.method == "full" else 0.0
    head_grad = head * gather_e if u.tied else head * tw / max(1, shards)
    return Gathered(at_loss=at_loss, at_gather=at_gather, at_backward=at_backward, at_head=at_head, in_stack=in_stack,
                    at_end=at_end, flat_grads=flat, head_grad=head_grad)
