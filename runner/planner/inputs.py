"""What the memory estimate reads: the run as data (:class:`EstimateInput`) and the bytes of its dtypes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from runner.planner.shapes import ModelShape

Method = Literal["full", "lora", "qlora"]
Precision = Literal["fp32", "bf16", "fp16"]
Strategy = str
"""A strategy's name in ``runner/spec/strategies.py`` (the table says what each shards)."""
DTYPE_BYTES: Mapping[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2}


@dataclass(frozen=True)
class EstimateInput:
    """Everything the estimate depends on.

    Attributes:
        shape: The model.
        method: ``full`` fine-tuning, ``lora`` or ``qlora``.
        precision: Compute precision: ``fp32``, or mixed ``bf16``/``fp16``.
        param_dtype: Dtype the weights are stored in. ``None`` picks the usual: fp32 for full fine-tuning
            (accelerate keeps fp32 weights and autocasts), the compute precision for LoRA/QLoRA bases.
        strategy: A row of ``runner/spec/strategies.py``: ``single``, ``mp``, ``ddp``, ``fsdp``, ``hsdp``, ``zero1``...
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
        attention: ``model.attn_implementation`` as it runs: ``sdpa`` (transformers' choice when the recipe
            names none), ``eager`` (keeps the attention probabilities), ``flash_attention_2`` or
            ``flex_attention`` (keep a log-sum-exp per row, like SDPA's fused kernels).
        compiled: ``train.compile``: each decoder layer runs through torch.compile, whose partitioner
            recomputes cheap pointwise results in backward instead of saving them.
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
    shard: int | None = None
    """``hsdp``: processes each group shards the model states over (``launch.shard``, as
    :func:`runner.spec.layout.hsdp_mesh` completes it); None: that function's default for ``n_devices``."""
    cp_size: int = 1
    """Context parallelism: processes each sequence is split over (``launch.cp_size``)."""
    fp8: bool = False
    """torchao float8 training of the decoder's Linear layers (``train.precision = "fp8"``; ``precision`` is
    then the bf16 of everything else)."""
    activation_offload: bool = False
    """Saved activations in pinned host memory (``train.activation_offload``)."""
    nvme_offload: bool = False
    """What offload moves goes to an NVMe folder (``launch.offload = "nvme"``), not host memory."""
    attention: str = "sdpa"
    compiled: bool = False



def weight_bytes(inp: EstimateInput) -> int:
    """Bytes per stored weight: ``param_dtype``'s, else fp32 for full fine-tuning and the compute
    precision's for a LoRA/QLoRA base."""
    if inp.param_dtype is not None:
        return DTYPE_BYTES[inp.param_dtype]
    return 4 if inp.method == "full" else DTYPE_BYTES[inp.precision]
