"""The memory terms of the GPU-only efficiency switches (``runner/spec/switches.py`` has their rules), and the
line each prints in ``ftui estimate``. Pure; docs/memory-model.md, "Efficiency switches", says the same.

* Context parallelism (``cp_size``): each process holds ``seq_len / cp_size`` tokens of every sequence, so
  every activation term is that of the shorter sequence (ring attention keeps flash/efficient attention's
  linear memory). accelerate's default ``cp_comm_strategy`` is ``allgather``
  (accelerate/utils/dataclasses.py): torch's ``_AllGatherRotater`` gathers one layer's keys and values
  over the whole sequence while that layer's attention runs, forward and backward: ``2 x b x s x kv_heads x
  head_dim`` elements beside the step's other temporaries.
* FP8 (torchao ``Float8Linear``): the matmuls run in float8 with dynamic scales, but
  ``matmul_with_hp_or_float8_args`` saves the high-precision input and weight for backward
  (torchao/float8/float8_linear.py: ``ctx.save_for_backward(input_hp, weight_hp_t)``), so the activations are
  bf16's; the saved weight is the parameter itself, so autocast keeps no bf16 weight copy of a converted layer
  (only the unconverted head's). The weights stay in their stored dtype (fp32 masters for full fine-tuning).
* Activation offload (``save_on_cpu``): every tensor the forward saves goes to pinned host memory; the device
  keeps the step's temporaries (and, under checkpointing, the layer the backward recomputes outside the hook).
* ZeRO-Infinity (``offload = "nvme"``): the optimizer state, fp32 master and weights that CPU offload would
  move live on the NVMe folder instead of host memory (DeepSpeed's swap buffers in pinned host memory
  aside).
"""

from __future__ import annotations

from runner.planner.inputs import DTYPE_BYTES, EstimateInput

GIB = 2**30


def size_text(n: float) -> str:
    """``1.25 GiB`` or ``12.0 MiB``."""
    return f"{n / GIB:.2f} GiB" if n >= GIB / 10 else f"{n / 2**20:.1f} MiB"


def tokens_per_device(inp: EstimateInput) -> int:
    """Tokens of each sequence on one device: ``seq_len / cp_size`` (the recipe makes it divide)."""
    return max(1, inp.seq_len // max(1, inp.cp_size))


def ring_buffer_bytes(inp: EstimateInput, e: int) -> float:
    """Context parallelism's all-gathered keys and values of one layer (module doc), 0 without it."""
    if inp.cp_size <= 1:
        return 0.0
    sh = inp.shape
    return 2.0 * inp.micro_batch * inp.seq_len * sh.kv_heads * sh.head_dim * e


def fp8_copy_share(inp: EstimateInput) -> float:
    """The share of autocast's weight copies left under FP8: the head's (torchao's filter leaves it in bf16;
    converted layers save the parameter itself). 1.0 without FP8."""
    if not inp.fp8:
        return 1.0
    sizes = {name.split("@")[0]: s.in_features * s.out_features * s.count for name, s in inp.shape.linears.items()}
    total = sum(sizes.values())
    return sizes.get("lm_head", 0) / total if total else 0.0


def switch_lines(inp: EstimateInput, offloaded: dict[str, int], nvme: dict[str, int]) -> list[str]:
    """One line per switch in effect: what it does to this estimate (estimated, as the table it follows)."""
    lines: list[str] = []
    if inp.cp_size > 1:
        lines.append(f"context parallel: {inp.cp_size} processes per sequence, activations of "
                     f"{tokens_per_device(inp)} of {inp.seq_len} tokens each, plus "
                     f"{size_text(ring_buffer_bytes(inp, DTYPE_BYTES[inp.precision]))} of all-gathered "
                     "keys and values during a layer's attention (estimated)")
    if inp.fp8:
        lines.append("fp8: decoder Linear layers compute in float8 (torchao); weights keep their stored dtype and "
                     "activations stay bf16 (torchao saves the high-precision inputs), autocast's weight copies "
                     "of those layers are gone (estimated)")
    if inp.activation_offload:
        lines.append(f"activation offload: {size_text(offloaded.get('activations', 0))} of saved activations "
                     "in pinned host memory instead of the device (estimated)")
    if inp.attention == "eager":
        lines.append("attention eager: each layer keeps its fp32 attention probabilities, micro-batch x heads x "
                     "sequence^2 (estimated)")
    if inp.compiled:
        lines.append("compiled layers: the partitioner recomputes the MLP activation and the norms' products in "
                     "backward instead of keeping them (estimated)")
    if nvme:
        lines.append(f"nvme offload: {size_text(sum(nvme.values()))} ("
                     + ", ".join(f"{k} {size_text(v)}" for k, v in nvme.items())
                     + ") on the NVMe folder instead of the device (estimated)")
    return lines

