"""The GPU-only efficiency switches: what a recipe may ask of them, and what each needs of the host.

* ``launch.cp_size``: context parallelism, each sequence split over ``cp_size`` processes. It runs through
  accelerate's ``ParallelismConfig(cp_size=...)``, which needs FSDP2 (accelerate/state.py refuses FSDP1 and
  no FSDP) and applies torch's ``context_parallel`` (ring attention) around each step.
* ``train.precision = "fp8"``: torchao's ``convert_to_float8_training`` swaps the decoder's ``nn.Linear``
  layers for ``Float8Linear``; the rest computes under bf16 autocast.
* ``train.activation_offload``: ``torch.autograd.graph.save_on_cpu(pin_memory=True)`` around the forward.
* ``launch.offload = "nvme"``: DeepSpeed ZeRO-3's ZeRO-Infinity, optimizer state and weights swapped to
  ``launch.nvme_path`` through DeepSpeed's ``async_io`` op.

:func:`recipe_problem` is the recipe's rules (pure); :func:`host_problems` reads what the host lacks
(CUDA, a GPU's compute capability, a package, a compiled op) from facts handed in, so that the pre-flight
(``runner.watch.preflight``) decides with this host's facts and the tests with theirs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from runner.spec import strategies

if TYPE_CHECKING:
    from runner.spec.recipe import Recipe

FP8_MIN_CAPABILITY = (8, 9)
"""Float8 matmuls (``torch._scaled_mm``) run on CUDA compute capability 8.9 (Ada) and 9.0 (Hopper) or above."""

CP_NOT_ON_CPU = ("torch's context_parallel ring attention implements only the CUDA SDPA kernels (flash, "
                 "memory-efficient, cuDNN), not the CPU one")
"""Why context parallelism cannot run on CPU (torch/distributed/tensor/experimental/_context_parallel/
_attention.py: its dispatch table names ``aten._scaled_dot_product_{flash,efficient,cudnn}_attention``; CPU's
SDPA is ``_scaled_dot_product_flash_attention_for_cpu``)."""

OFFLOAD_ON_CPU = "activations already live in host memory on CPU, so there is nothing to offload"


def recipe_problem(recipe: Recipe) -> str | None:
    """What is wrong with the recipe's efficiency switches (one line naming the field), or None."""
    for check in (_cp_problem, _fp8_problem, _offload_problem):
        problem = check(recipe)
        if problem:
            return problem
    return None


def _cp_problem(recipe: Recipe) -> str | None:
    launch, cp = recipe.launch, recipe.launch.cp_size
    if cp == 1:
        return None
    if launch.device == "cpu":
        return f"launch.cp_size: context parallelism needs CUDA GPUs: {CP_NOT_ON_CPU}; launch.device is 'cpu'"
    row = strategies.resolve(launch.strategy, launch.engine)
    fsdp2 = row.accelerate_type == "FSDP" and (not row.takes_fsdp_version or launch.fsdp_version == 2) \
        and not row.hybrid  # hsdp's mesh is dp_replicate x dp_shard; the cp mesh is dp_shard x cp
    if not fsdp2:
        return (f"launch.cp_size: context parallelism runs under FSDP2 (accelerate's ParallelismConfig), not "
                f"{row.name} on the {row.engine} engine; use strategy 'fsdp' with fsdp_version = 2")
    world = launch.nproc * (launch.nnodes or 1)
    if world % cp:
        return f"launch.cp_size: {cp} does not divide the {world} processes"
    if recipe.data.context_length % (2 * cp):
        return (f"launch.cp_size: data.context_length {recipe.data.context_length} must be a multiple of "
                f"2 x cp_size = {2 * cp} (torch's load-balanced split gives each process a head and a tail chunk)")
    if not recipe.data.pack:
        return ("launch.cp_size: context parallelism needs data.pack = true (ring attention is causal SDPA "
                "without a padding mask)")
    return None


def _fp8_problem(recipe: Recipe) -> str | None:
    if recipe.train.precision != "fp8":
        return None
    if recipe.launch.device == "cpu":
        return "train.precision: fp8 needs a CUDA GPU of compute capability 8.9 or above; launch.device is 'cpu'"
    if recipe.method.type == "qlora":
        return "train.precision: fp8 converts nn.Linear layers; qlora's are bitsandbytes 4-bit layers"
    row = strategies.resolve(recipe.launch.strategy, recipe.launch.engine)
    if row.accelerate_type == "DEEPSPEED" or row.layer_split or row.tensor_parallel:
        return (f"train.precision: fp8 runs on the accelerate engine (single, ddp, fsdp, the torch ZeRO "
                f"stages), not {row.name} on the {row.engine} engine")
    return None


def _offload_problem(recipe: Recipe) -> str | None:
    launch = recipe.launch
    if recipe.train.activation_offload and launch.device == "cpu":
        return f"train.activation_offload: {OFFLOAD_ON_CPU} (launch.device is 'cpu')"
    row = strategies.resolve(launch.strategy, launch.engine)
    if recipe.train.activation_offload and (row.layer_split or row.tensor_parallel):
        return (f"train.activation_offload: the {row.name} engine runs its own forward; activation offload "
                "runs on the accelerate and DeepSpeed engines")
    if launch.offload == "nvme" and not launch.nvme_path:
        return "launch.nvme_path: launch.offload = 'nvme' needs the NVMe folder DeepSpeed swaps into"
    if launch.nvme_path and launch.offload != "nvme":
        return f"launch.nvme_path: set, but launch.offload is {launch.offload!r} (nvme_path is for 'nvme')"
    return None


@dataclass(frozen=True)
class HostFacts:
    """What the switches need to know of the host where the ranks run.

    Attributes:
        cuda: Whether the ranks train on CUDA GPUs.
        capabilities: Compute capability of each GPU the run uses (NVML), where known.
        torchao: Whether torchao is importable.
        async_io: Why DeepSpeed's ``async_io`` op cannot run here (None: it can).
    """

    cuda: bool
    capabilities: Sequence[tuple[int, int] | None] = ()
    torchao: bool = False
    async_io: str | None = None


def host_problems(recipe: Recipe, host: HostFacts) -> list[str]:
    """Why the host cannot run the recipe's switches, one line each naming the field and what is missing."""
    problems: list[str] = []
    launch, train = recipe.launch, recipe.train
    if launch.cp_size > 1 and not host.cuda:
        problems.append(f"launch.cp_size: context parallelism needs CUDA GPUs and none is used here: {CP_NOT_ON_CPU}")
    if train.precision == "fp8":
        problems += _fp8_host_problem(host)
    if train.activation_offload and not host.cuda:
        problems.append(f"train.activation_offload: this run trains on the CPU: {OFFLOAD_ON_CPU}")
    if launch.offload == "nvme" and host.async_io:
        problems.append(f"launch.offload: 'nvme' needs DeepSpeed's async_io op: {host.async_io}")
    return problems


def _fp8_host_problem(host: HostFacts) -> list[str]:
    if not host.cuda:
        return ["train.precision: fp8 needs a CUDA GPU of compute capability 8.9 or above; none is used here"]
    low = [cap for cap in host.capabilities if cap is not None and cap < FP8_MIN_CAPABILITY]
    if low:
        got = ", ".join(f"{a}.{b}" for a, b in low)
        return [f"train.precision: fp8 needs GPUs of compute capability 8.9 or above (H100/H200, L40S); "
                f"this run's have {got}"]
    if not host.torchao:
        return ["train.precision: fp8 needs torchao (float8 training), which is not installed here "
                "(pip install torchao)"]
    return []
