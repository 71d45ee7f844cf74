"""Model FLOPs utilisation (MFU): the training FLOPs a run achieved over the hardware's peak.

FLOPs per token follow the PaLM paper (appendix B) as nanoGPT's ``estimate_mfu`` writes it:
``6 N + 12 L H Q T`` for N parameters, L layers, H heads of size Q and a context of T tokens. The
``6 N`` is 2 N for the forward matmuls, 2 N for the gradient with respect to the inputs and 2 N for
the gradient with respect to the weights. Frozen weights (the base model under LoRA) skip the last
one, so a LoRA run costs ``4 N_frozen + 6 N_trainable``. The attention term has no weights and is
paid in full either way: backward must still carry gradients through every layer to the adapters.

Peaks are dense (no 2:4 sparsity) vendor datasheet figures per GPU model and dtype; on CPU the
peak is measured on this host by a short fp32 matmul benchmark and cached per host and thread count.
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass
from typing import Any

# Dense peak TFLOP/s by GPU model and dtype (vendor datasheets; tensor cores with fp32 accumulate for
# 16-bit; "fp32" is the non-tensor-core rate torch uses by default, "tf32" needs allow_tf32).
# Keys are matched against the NVML device name in order, so the more specific come first.
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H100 PCIe": {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.2},
    "H100": {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9},  # SXM
    "H200": {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9},
    "A100": {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
    "L40S": {"bf16": 362.1, "fp16": 362.1, "tf32": 183.0, "fp32": 91.6},
    "L4": {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3},
    "A10G": {"bf16": 70.0, "fp16": 70.0, "tf32": 35.0, "fp32": 31.2},
    "A10": {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2},
    "RTX A6000": {"bf16": 154.8, "fp16": 154.8, "tf32": 77.4, "fp32": 38.7},
    "RTX 4090": {"bf16": 165.2, "fp16": 165.2, "tf32": 82.6, "fp32": 82.6},
    "RTX 3090": {"bf16": 71.0, "fp16": 71.0, "tf32": 35.6, "fp32": 35.6},
    "V100": {"fp16": 125.0, "fp32": 15.7},
    "T4": {"fp16": 65.0, "fp32": 8.1},
}

CPU_PEAK_SOURCE = "measured matmul peak (CPU)"


@dataclass(frozen=True)
class Peak:
    """Peak FLOP/s of one device, and where the figure comes from."""

    flops: float
    source: str


@dataclass(frozen=True)
class Mfu:
    """The MFU of a run.

    Attributes:
        flops_per_token: Training FLOPs per token (forward and backward).
        achieved_flops: ``flops_per_token * tokens_per_s``: FLOP/s over all devices.
        peak: Peak FLOP/s of one device.
        devices: Devices the run used.
        mfu: ``achieved_flops / (peak * devices)``, a fraction.
    """

    flops_per_token: float
    achieved_flops: float
    peak: Peak
    devices: int
    mfu: float


def flops_per_token(params: int, layers: int, heads: int, head_dim: int, seq_len: int,
                    trainable_params: int | None = None) -> float:
    """Training FLOPs per token: ``6N + 12 L H Q T``, or ``4 N_frozen + 6 N_trainable + 12 L H Q T``.

    Args:
        params: Every parameter of the model (N).
        layers: Decoder layers (L).
        heads: Attention heads (H).
        head_dim: Size of one head (Q).
        seq_len: Tokens per sequence (T).
        trainable_params: Parameters that get gradients; None means all (full fine-tuning).

    Returns:
        FLOPs per trained token.
    """
    trainable = params if trainable_params is None else min(trainable_params, params)
    frozen = params - trainable
    return float(4 * frozen + 6 * trainable + 12 * layers * heads * head_dim * seq_len)


def compute_mfu(fpt: float, tokens_per_s: float, peak: Peak, devices: int) -> Mfu:
    """MFU of a run that trained ``tokens_per_s`` tokens per second over ``devices`` devices."""
    achieved = fpt * tokens_per_s
    return Mfu(flops_per_token=fpt, achieved_flops=achieved, peak=peak, devices=devices,
               mfu=achieved / (peak.flops * max(1, devices)))


def gpu_peak(device_name: str, dtype: str) -> Peak | None:
    """The datasheet peak of a GPU by its NVML name (``NVIDIA H100 80GB HBM3``) and dtype."""
    name = device_name.upper().replace("NVIDIA", "").replace("GEFORCE", "")
    for model, table in PEAK_TFLOPS.items():
        if _matches(model.upper(), name):
            tflops = table.get(dtype) or (table.get("fp16") if dtype == "bf16" else None)
            if tflops is None:
                return None
            return Peak(tflops * 1e12, f"{model} {dtype} dense datasheet peak ({tflops:g} TFLOP/s)")
    return None


def _matches(model: str, name: str) -> bool:
    # "A10" must not match "A100"; "L4" must not match "L40S": whole-token match on the model.
    import re

    return re.search(rf"(?<![A-Z0-9]){re.escape(model)}(?![0-9A-Z])", name) is not None


def measure_cpu_peak(threads: int, seconds: float = 1.0, n: int = 1024) -> float:
    """FLOP/s of fp32 ``n x n`` matmuls on this host with ``threads`` torch threads, best of
    ~``seconds`` of repetitions (the best, because the host is shared and only slows us down)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(max(1, threads))
    try:
        a = torch.randn(n, n)
        b = torch.randn(n, n)
        torch.mm(a, b)  # warm-up
        best = 0.0
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            torch.mm(a, b)
            dt = time.perf_counter() - t0
            best = max(best, 2 * n**3 / dt)
        return best
    finally:
        torch.set_num_threads(before)


def cpu_peak(threads: int, cache: Any = None) -> Peak:
    """The measured CPU peak for ``threads`` threads, cached per host in ``cache`` (a folder; default
    :func:`runner.paths.cache_dir`)."""
    from pathlib import Path

    from runner.paths import cache_dir

    folder = Path(cache) if cache is not None else cache_dir()
    path = folder / "mfu-cpu-peak.json"
    key = f"{socket.gethostname()}|threads={threads}"
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        table = {}
    flops = table.get(key)
    if not isinstance(flops, (int, float)) or flops <= 0:
        flops = measure_cpu_peak(threads)
        table[key] = flops
        folder.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(table, indent=2) + "\n")
    return Peak(float(flops), f"{CPU_PEAK_SOURCE}, fp32 1024x1024, {threads} thread(s), "
                              f"{flops / 1e9:.1f} GFLOP/s, cached in {path}")
