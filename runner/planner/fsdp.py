"""What sharded weights cost while they are computed with, under FSDP and the torch ZeRO stages (FSDP2
underneath: ``runner/spec/zero.py``); DeepSpeed ZeRO-3's own gathering is ``runner/planner/deepspeed.py``.

How accelerate wraps a model in FSDP2 (``accelerate/utils/fsdp_utils.py fsdp2_prepare_model``): one unit per
decoder layer, the input embedding its own unit, the tail (``lm_head``, with the final norm when accelerate
finds it) a unit that stays gathered from its forward to its backward, the root the rest. Each unit's
parameters are gathered whole in the compute dtype (mixed precision gathers in ``param_dtype``) into
storages beside their shards (``_fsdp_param.py init_unsharded_param``).

In the forward, FSDP2 keeps the all-gather output of the last unit it gathered alive until the root's
forward ends, to overlap that copy-out with the next all-gather (``_fsdp_param_group.py wait_for_unshard``,
"defer free"; ``_fsdp_state.py _post_forward`` frees it): at the loss, the tail's all-gather output (the
head) is alive beside the gathered head, or the last layer's when the head is tied to the embedding.
In the backward the all-gather output is freed at once.
"""

from __future__ import annotations

from dataclasses import dataclass

from runner.planner.inputs import EstimateInput


@dataclass(frozen=True)
class Gathered:
    """Bytes of gathered weights alive at the moments of a step, and a layer's unsharded gradient.

    Attributes:
        gathered: Inside the layer stack in the backward: the root unit and the layer being computed (each
            unit reshards after its backward, whether or not it stayed gathered after its forward).
        root: The units outside the layer stack gathered at the head's backward (embeddings, head, final norm).
        at_loss: Gathered at the loss in the forward: the root (every unit when the layers stay gathered),
            and the last unit's all-gather output.
        at_backward: Gathered when backward starts and through the last layer's recomputation (every unit
            when the layers stay gathered; else none beyond :attr:`root` and :attr:`gathered`).
        flat_grads: A layer's unsharded gradient before its reduce-scatter (FSDP1: the flat gradient).
    """

    gathered: float = 0.0
    root: float = 0.0
    at_loss: float = 0.0
    at_backward: float = 0.0
    flat_grads: float = 0.0


def last_all_gather(inp: EstimateInput, adapters: float, gather_e: int) -> float:
    """Bytes of the forward's last all-gather output, alive at the loss (see the module doc): the tail
    (``vocab x hidden``) for an untied head, else the last decoder layer with its share of the adapters."""
    sh = inp.shape
    if not sh.tied_embeddings:
        return float(sh.vocab * sh.hidden * gather_e)
    return sh.layer_params * gather_e + adapters / max(1, sh.layers)


def gathered_units(inp: EstimateInput, gather_e: int, train: int, tw: int, keeps_gathered: bool) -> Gathered:
    """The gathered weights and unsharded layer gradient of a run whose weights FSDP shards.

    Args:
        inp: The run.
        gather_e: Bytes of a gathered element (the compute dtype under mixed precision).
        train: Trainable parameters (the adapters for LoRA).
        tw: Bytes of a trainable element.
        keeps_gathered: FSDP2 ``reshard_after_forward=False`` (torch ZeRO-2): every unit stays gathered from
            its forward to its backward.
    """
    sh = inp.shape
    # LoRA's adapters sit in the decoder layers' units and are gathered with them.
    adapters = float(train * gather_e) if inp.method != "full" else 0.0
    # The root unit (embeddings, head, final norm: what the per-layer wrapping leaves) is gathered
    # while the loss is computed and again for the head's backward; inside the layer stack the layer
    # being computed is gathered beside it (measured: docs/memory-model.md).
    root = float(max(0, sh.total_params - sh.layers * sh.layer_params) * gather_e)
    gathered = root + 1.0 * sh.layer_params * gather_e
    at_loss, at_backward = root, 0.0
    if keeps_gathered:  # every unit stays gathered from its forward to its backward
        at_backward = root + float(sh.layers * sh.layer_params * gather_e) + adapters
        at_loss = at_backward + last_all_gather(inp, adapters, gather_e)
    flat_grads = 0.0
    if inp.method == "full" or train:
        layer_train = train / max(1, sh.layers) if inp.method != "full" else sh.layer_params
        flat_grads = float(layer_train * tw)
    return Gathered(gathered, root, at_loss, at_backward, flat_grads)
