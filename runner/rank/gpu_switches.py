"""The GPU-only efficiency switches inside a rank (their rules: ``runner/spec/switches.py``).

* Context parallelism: accelerate's ``ParallelismConfig(dp_shard_size, cp_size)`` builds the ``cp`` mesh and
  attaches torch's ``context_parallel`` hooks at ``prepare``; each micro-step's forward and backward run
  inside ``accelerator.maybe_context_parallel``, which splits the input ids, position ids and (pre-shifted)
  labels along the sequence (head-and-tail load balancing: runner/spec/switches.py).
* FP8: ``torchao.float8.convert_to_float8_training`` swaps the ``nn.Linear`` layers for ``Float8Linear`` before
  ``prepare`` (the head stays bf16: torchao's own recipe, and its vocabulary need not be a multiple of 16).
* Activation offload: ``torch.autograd.graph.save_on_cpu(pin_memory=True)`` around the forward.

:func:`in_effect` reads what is live: the ``cp`` mesh's size, the ``Float8Linear`` modules of the model and
the saved-tensor hooks the forward ran under.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from runner.spec.recipe import Recipe

FP8_DIVISOR = 16
"""``torch._scaled_mm`` needs both dimensions of a float8 matrix to be multiples of 16."""


def parallelism_config(recipe: Recipe, world: int) -> Any | None:
    """accelerate's ``ParallelismConfig`` for ``launch.cp_size`` over ``world`` processes (None without CP)."""
    cp = recipe.launch.cp_size
    if cp == 1:
        return None
    from accelerate.parallelism_config import ParallelismConfig  # deferred: accelerate

    return ParallelismConfig(dp_shard_size=world // cp, cp_size=cp)


def data_replica(accelerator: Any) -> tuple[int, int]:
    """``(replicas, replica)`` of the data: every process, or under CP the groups that share a sequence."""
    config = getattr(accelerator, "parallelism_config", None)
    if config is None or not config.cp_enabled:
        return accelerator.num_processes, accelerator.process_index
    mesh = accelerator.torch_device_mesh
    shards = mesh["dp_shard"] if "dp_shard" in (mesh.mesh_dim_names or ()) else None
    return (shards.size(), shards.get_local_rank()) if shards is not None else (1, 0)


def _fp8_filter(module: torch.nn.Module, fqn: str) -> bool:
    """Which Linear layers become Float8Linear: not the head, and both sizes multiples of 16."""
    if not isinstance(module, torch.nn.Linear) or fqn.split(".")[-1] == "lm_head":
        return False
    return module.in_features % FP8_DIVISOR == 0 and module.out_features % FP8_DIVISOR == 0


def convert_fp8(model: Any) -> Any:
    """``model`` with its Linear layers as torchao's ``Float8Linear`` (dynamic tensorwise scaling)."""
    from torchao.float8 import convert_to_float8_training  # deferred: torchao, GPU runs only

    return convert_to_float8_training(model, module_filter_fn=_fp8_filter)


def fp8_linears(model: Any) -> int:
    """``Float8Linear`` modules of the live model."""
    return sum(1 for m in model.modules() if type(m).__name__ == "Float8Linear")


def shift_labels(labels: torch.Tensor) -> torch.Tensor:
    """Labels already shifted one token left (the last one -100): a split sequence cannot shift its own."""
    return torch.nn.functional.pad(labels, (0, 1), value=-100)[..., 1:].contiguous()


@contextlib.contextmanager
def step_context(recipe: Recipe, accelerator: Any, inputs: dict[str, Any]) -> Iterator[None]:
    """One micro-step's forward and backward under context parallelism (``inputs`` are split in place)."""
    if recipe.launch.cp_size == 1:
        yield
        return
    ids = inputs["input_ids"]
    inputs["position_ids"] = torch.arange(ids.shape[1], device=ids.device).expand_as(ids).contiguous()
    inputs["shift_labels"] = inputs["labels"] = shift_labels(inputs["labels"])
    buffers = [inputs["input_ids"], inputs["position_ids"], inputs["shift_labels"]]
    with accelerator.maybe_context_parallel(buffers=buffers, buffer_seq_dims=[1, 1, 1],
                                            no_restore_buffers=set(buffers)):
        yield


def forward_context(recipe: Recipe) -> contextlib.AbstractContextManager[Any]:
    """The forward's saved-tensor hooks: pinned host memory under activation offload."""
    if recipe.train.activation_offload:
        return torch.autograd.graph.save_on_cpu(pin_memory=True)
    return contextlib.nullcontext()


def saved_to_host() -> bool:
    """Whether the saved-tensor hooks in force now are ``save_on_cpu``'s (read inside the forward)."""
    top = torch._C._autograd._top_saved_tensors_default_hooks(False)
    return top is not None and "save_on_cpu" in getattr(top[0], "__qualname__", "")


def in_effect(model: Any, accelerator: Any, offloaded: bool) -> dict[str, Any]:
    """The switches live on this rank: CP's mesh size, FP8 layers, whether the forward's saved tensors went to
    the host (``offloaded``, from :func:`saved_to_host` in the first forward)."""
    config = getattr(accelerator, "parallelism_config", None)
    cp = accelerator.torch_device_mesh["cp"].size() if config is not None and config.cp_enabled else 1
    return {"cp_size": int(cp), "fp8_linears": fp8_linears(model), "activation_offload": offloaded,
            "source": "measured: the accelerator's cp mesh, Float8Linear modules, the forward's saved-tensor hooks"}
