"""DeepSpeed ZeRO's own buffers in the estimate, read from the config ftui writes
(:mod:`runner.spec.deepspeed_config`; DeepSpeed 0.19's ``runtime/zero/stage_1_and_2.py`` and ``stage3.py``).

- The reduce bucket (the ``ipg`` buffer): ``reduce_bucket_size`` elements, allocated whole. ZeRO-1/2
  allocate it at the first gradient of a backward and free it at the backward's end; ZeRO-1 with 16-bit
  weights stages it in fp32 (its gradient accumulation dtype), ZeRO-2 in the weights' dtype. ZeRO-3
  allocates it once, in the trainable parameters' dtype, when the optimizer is built: it lives all step.
- ZeRO-3 also allocates, with the optimizer, one flat buffer of the rank's gradient partitions in the
  gradient accumulation dtype (``grad_partitions_flat_buffer``, the weights' dtype unless the config names
  another): alive all step (the estimate's ``grads`` in every moment).
- The allgather bucket of ZeRO-1/2 allocates nothing: the updated partitions are gathered into the flat
  parameter buffer in place (``runtime/utils.py all_gather_dp_groups``).
- ZeRO-3 gathers each parameter above the persistence threshold when its module runs and, with the
  reuse distance larger than the model, keeps them gathered from its forward to its backward, up to
  ``stage3_max_live_parameters`` elements: the large parameters are gathered beside their partitions
  (the part the estimate names ``ds_gathered``).
- ZeRO-3's prefetch (``partitioned_param_coordinator.py``, from the second step on, once the module trace is
  complete) all-gathers the next ``stage3_prefetch_bucket_size`` elements of parameters into ONE flat buffer
  (``partition_parameters.py _all_gather_dtype``: each rank's padded partitions side by side); the first
  wait copies every parameter of it out (``torch.cat`` of its partitions), and the buffer lives until the
  last of those parameters is fetched, its handle popped from the in-flight registry. Under the bucket the
  whole model is one prefetch: at the head's fetch the flat buffer, every gathered copy and every activation
  but the logits are alive (the part named ``ds_prefetch``, the ``forward_prefetch`` moment).
"""

from __future__ import annotations

from runner.planner.inputs import EstimateInput
from runner.planner.shapes import lora_targeted, lora_trainable_params
from runner.spec.deepspeed_config import (
    ZERO3_MAX_LIVE_PARAMETERS,
    ZERO3_PERSISTENCE_THRESHOLD,
    ZERO3_PREFETCH_BUCKET,
    bucket_elements,
)


def trainable_elements(inp: EstimateInput) -> int:
    """The trainable parameter count of the run: every parameter for full fine-tuning, else the adapters."""
    if inp.method == "full":
        return inp.shape.total_params
    return lora_trainable_params(inp.shape, inp.lora_r, inp.lora_targets)


def reduce_bucket_bytes(inp: EstimateInput, stage: int, w: int) -> int:
    """Bytes of the reduce bucket of a run at ZeRO ``stage`` whose trainable elements are ``w`` bytes."""
    elements = bucket_elements(inp.device == "cpu", trainable_elements(inp))
    grad_bytes = 4 if stage == 1 else w
    return elements * grad_bytes


def zero3_large_params(inp: EstimateInput) -> list[int]:
    """Elements of each parameter ZeRO-3 partitions and gathers: every one at or above the persistence
    threshold (the linear weights, the head, the embedding unless the head is the same tensor, and learned
    position embeddings)."""
    sh = inp.shape
    large = [s.in_features * s.out_features for s in sh.linears.values() for _ in range(s.count)]
    if not (sh.tied_embeddings and "lm_head" in sh.linears):
        large.append(sh.vocab * sh.hidden)
    large.append(sh.position_embedding_params)
    return [p for p in large if p >= ZERO3_PERSISTENCE_THRESHOLD]


def zero3_gathered_bytes(inp: EstimateInput, w: int) -> int:
    """Bytes of every parameter above the persistence threshold gathered whole (``w`` bytes each), at most
    ``stage3_max_live_parameters`` elements of them."""
    return min(sum(zero3_large_params(inp)), ZERO3_MAX_LIVE_PARAMETERS) * w


def zero3_prefetch_bytes(inp: EstimateInput, n: int, w: int) -> int:
    """Bytes of the flat buffer of one prefetch over ``n`` ranks: each large parameter's partition
    (``ceil(elements / n)``, DeepSpeed's padded ``ds_tensor``) times ``n``, ``w`` bytes each, for at most
    ``stage3_prefetch_bucket_size`` elements (the coordinator stops adding parameters once the bucket is
    reached; a model larger than the bucket is counted one full bucket, its overshoot past the bucket's end
    not counted)."""
    padded = sum(-(-p // n) * n for p in zero3_large_params(inp))
    return min(padded, ZERO3_PREFETCH_BUCKET, ZERO3_MAX_LIVE_PARAMETERS) * w


def zero3_persistent_bytes(inp: EstimateInput, w: int, tw: int) -> float:
    """Bytes DeepSpeed ZeRO-3 keeps gathered on every rank beside the partitions: each parameter under its
    persistence threshold (``stage3_param_persistence_threshold``: norms, small projections, LoRA
    matrices; ``w``: bytes of a weight, ``tw``: of a trainable adapter element)."""
    sh = inp.shape
    small = sum(s.in_features * s.out_features * s.count for s in sh.linears.values()
                if s.in_features * s.out_features < ZERO3_PERSISTENCE_THRESHOLD) * w
    norms = (2 * sh.layers + 1) * sh.hidden * (2 if sh.norm == "layer" else 1)
    small += norms * w if sh.hidden < ZERO3_PERSISTENCE_THRESHOLD else 0
    if inp.method != "full":
        small += sum(inp.lora_r * (s.in_features + s.out_features) * s.count
                     for s in lora_targeted(sh, inp.lora_targets).values()) * tw
    return float(small)


def step_transient_bytes(inp: EstimateInput, partition: float) -> float:
    """Bytes DeepSpeed's optimizer step allocates beside the model states, for a rank's ``partition`` of
    trainable elements (one group; ZeRO-3's ``sub_group_size`` is 1e9 by default): the fp32 gradient of its
    master partition, flattened from the gradients (``stage_1_and_2.py step``; ``stage3.py
    _prepare_fp32_grad_for_sub_group``), and torch AdamW's temporaries over that one flat fp32 parameter
    (``torch/optim/adamw.py``): on CUDA the foreach implementation's ``sqrt(exp_avg_sq)``, on CPU the
    per-parameter loop's ``sqrt(exp_avg_sq)`` and its quotient."""
    adam_temporaries = 1 if inp.device == "cuda" else 2
    return float((1 + adam_temporaries) * 4 * partition)


def add_deepspeed_parts(inp: EstimateInput, stage: int, params_sharded: bool, n: int, w: int, tw: int,
                        logits: float, moments: dict[str, dict[str, float]], partition: float) -> None:
    """DeepSpeed's reduce bucket, optimizer step and ZeRO-3's gathered parameters, added to the ``moments``
    of a step they are alive in (the module doc says when DeepSpeed allocates and frees each). ``n``: ranks
    sharing the partitions; ``w``/``tw``: bytes of a weight / of a trainable element; ``logits``: the saved
    log-softmax in the forward's activations (not yet computed when the head is fetched); ``partition``:
    the rank's trainable elements."""
    if not inp.offload_optimizer:  # offloaded, the step runs on the host
        moments["optimizer"]["transient"] = step_transient_bytes(inp, partition)
        if stage < 3:  # ZeRO-1/2 free the gradients once flattened (stage_1_and_2.py: free_grad_in_param_list)
            moments["optimizer"]["grads"] = 0.0
    bucket = float(reduce_bucket_bytes(inp, stage, tw))
    if stage < 3:
        # ZeRO-1/2 allocate the bucket at the first gradient (the head's weight), once the loss's backward has
        # freed the saved log-softmax and one of its two logits-sized temporaries (the logits' gradient stays);
        # it lives to the end of backward.
        loss = moments["backward"]
        moments["backward_bucket"] = {**loss, "activations": loss["activations"] - logits,
                                      "transient": loss["transient"] / 2}
    for name, parts in moments.items():
        # ZeRO-3 allocates its bucket with the optimizer.
        if stage == 3 or (name.startswith("backward") and name != "backward"):
            parts["ds_reduce_bucket"] = bucket
    if stage != 3 or not params_sharded:
        return
    gathered = float(zero3_gathered_bytes(inp, w))  # offloaded parameters are gathered onto the device too
    for name in ("forward", "backward", "backward_recompute"):
        if name in moments:
            moments[name]["ds_gathered"] = gathered
    fwd = moments["forward"]
    moments["forward_prefetch"] = {**fwd, "transient": 0.0, "activations": fwd["activations"] - logits,
                                   "ds_prefetch": float(zero3_prefetch_bytes(inp, n, w))}
