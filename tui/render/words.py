"""User-facing words for accelerate's enums (one mapping, shared by the CLI and the app)."""

from __future__ import annotations

DISTRIBUTED_WORDS = {
    "NO": "one process",
    "MULTI_CPU": "DDP (CPU)",
    "MULTI_GPU": "DDP (GPU)",
    "MULTI_XPU": "DDP (XPU)",
    "MULTI_NPU": "DDP (NPU)",
    "MULTI_MLU": "DDP (MLU)",
    "FSDP": "FSDP",
    "DEEPSPEED": "DeepSpeed",
    "MEGATRON_LM": "Megatron-LM",
    "XLA": "XLA (TPU)",
    "PIPELINE": "pipeline",  # not accelerate's: runner/rank/pipeline.py (pp, mp over processes)
    "TENSOR_PARALLEL": "tensor parallel",  # runner/rank/tensor_parallel.py
}
"""accelerate's ``DistributedType`` as a person says it; an unknown value is shown as it is."""

DEVICE_WORDS = {"cpu": "CPU", "cuda": "GPU", "mps": "Apple GPU", "xpu": "Intel GPU"}


def distributed_words(value: str | None, device: str | None = None) -> str:
    """``"DDP (CPU)"`` for ``MULTI_CPU``; ``"-"`` when the run has not said yet (before its start event)."""
    if not value:
        return "-"
    words = DISTRIBUTED_WORDS.get(value.removeprefix("DistributedType."), value)
    if device and value in ("FSDP", "DEEPSPEED", "NO"):
        words += f" on {DEVICE_WORDS.get(device, device)}"
    return words


def strategy_words(strategy: str, nproc: int | None) -> str:
    """``ddp x2``: the strategy and its process count (alone for one process), as ``ftui runs`` and the
    dashboard show it."""
    return f"{strategy} x{nproc}" if nproc and nproc > 1 else strategy
