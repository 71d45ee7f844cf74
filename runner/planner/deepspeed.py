"""DeepSpeed ZeRO's own buffers in the estimate, read from the config ftui writes
(:mod:`runner.spec.deepspeed_config`; DeepSpeed 0.19's ``runtime/zero/stage_1_and_2.py`` and ``stage3.py``).

- The reduce bucket (the ``ipg`` buffer): ``reduce_bucket_size`` elements, allocated whole. ZeRO-1/2
  allocate it at the first gradient of a backward and free it at the backward's end; ZeRO-1 with 16-bit
  weights stages it in fp32 (its gradient accumulation dtype), ZeRO-2 in the weights' dtype. ZeRO-3
  allocates it once, in the trainable parameters' dtype, when the optimizer is built: it lives all step.
- The allgather bucket of ZeRO-1/2 allocates nothing: the updated partitions are gathered into the flat
  parameter buffer in place (``runtime/utils.py all_gather_dp_groups``).
- ZeRO-3 gathers each parameter above the persistence threshold when its module runs and, with the
  reuse distance larger than the model, keeps them gathered from its forward to its backward, up to
  ``stage3_max_live_parameters`` elements: at the forward's peak the large parameters are gathered beside
  their partitions (the part the estimate names ``ds_gathered``).
"""

from __future__ import annotations

from runner.planner.inputs import EstimateInput
from runner.planner.shapes import lora_trainable_params
from runner.spec.deepspeed_config import (
    ZERO3_MAX_LIVE_PARAMETERS,
    ZERO3_PERSISTENCE_THRESHOLD,
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


def zero3_gathered_bytes(inp: EstimateInput, w: int) -> int:
    """Bytes of every parameter above the persistence threshold gathered whole (``w`` bytes each), at most
    ``stage3_max_live_parameters`` elements of them."""
    sh = inp.shape
    large = sum(s.in_features * s.out_features * s.count for s in sh.linears.values()
                if s.in_features * s.out_features >= ZERO3_PERSISTENCE_THRESHOLD)
    if sh.vocab * sh.hidden >= ZERO3_PERSISTENCE_THRESHOLD:
        large += sh.vocab * sh.hidden
    return min(large, ZERO3_MAX_LIVE_PARAMETERS) * w
