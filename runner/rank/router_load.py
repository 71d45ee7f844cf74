"""A mixture of experts' router load: tokens per expert per layer, from the router's own top-k choice.

transformers' MoE routers (``MixtralTopKRouter``, ``Qwen2MoeTopKRouter``, ``OlmoeTopKRouter``: the class a
model records as ``router_logits`` in ``_can_record_outputs``) return ``(logits, scores, indices)``; a
forward hook on each counts the indices of every token it routes. Nothing is kept for backward and the loss
is untouched (``output_router_logits`` would add the auxiliary loss). The counts of a step travel in the
step's collective (:func:`runner.rank.loop._reduce`), summed over ranks; rank 0 journals their summary as
named metrics (docs/metrics.md).
"""

from __future__ import annotations

import re
from typing import Any

import torch

LOAD_MAX_OVER_MEAN = "moe/load_max_over_mean"
"""The busiest expert's tokens over the mean expert's, in the layer where that is highest (1: balanced)."""
LOAD_MIN_OVER_MEAN = "moe/load_min_over_mean"
"""The idlest expert's tokens over the mean expert's, in the layer where that is lowest (0: an expert idle)."""
ROUTED_TOKENS = "moe/routed_tokens"
"""Token-to-expert assignments of the step in one layer (tokens times top-k), summed over ranks."""

_LAYER = re.compile(r"\.layers\.(\d+)\.")


def router_class(model: Any) -> type | None:
    """The router module class a transformers MoE model records ``router_logits`` from, or None (no MoE)."""
    for module in model.modules():
        recorder = (getattr(module, "_can_record_outputs", None) or {}).get("router_logits")
        target = getattr(recorder, "target_class", None)
        if isinstance(target, type):
            return target
    return None


def routed_indices(output: Any, top_k: int) -> torch.Tensor:
    """The experts each token went to: a router's ``indices`` (its third output), else the top-k of its
    logits (the first, or the only, output)."""
    if isinstance(output, tuple) and len(output) >= 3:
        return torch.as_tensor(output[2])
    logits = output[0] if isinstance(output, tuple) else output
    return torch.topk(logits, top_k, dim=-1).indices


def tokens_per_expert(indices: torch.Tensor, experts: int) -> torch.Tensor:
    """How many of the routed assignments (one per token and chosen expert) each expert got (int64)."""
    return torch.bincount(indices.reshape(-1).to(torch.int64), minlength=experts)[:experts]


def load_summary(counts: torch.Tensor) -> dict[str, float]:
    """The named metrics of a ``layers x experts`` table of tokens per expert; layers that routed nothing
    (dense layers of a mixed model, another stage's) are left out. Empty when no layer routed."""
    rows = counts.to(torch.float64)
    rows = rows[rows.sum(dim=1) > 0]
    if rows.numel() == 0:
        return {}
    mean = rows.mean(dim=1)
    return {LOAD_MAX_OVER_MEAN: float((rows.max(dim=1).values / mean).max()),
            LOAD_MIN_OVER_MEAN: float((rows.min(dim=1).values / mean).min()),
            ROUTED_TOKENS: float(rows.sum(dim=1).max())}


def experts_of(config: Any) -> int:
    """Experts per MoE layer a transformers config declares (0: a dense model)."""
    return int(getattr(config, "num_local_experts", None) or getattr(config, "num_experts", None) or 0)


class RouterLoad:
    """Forward hooks on every router of ``model`` counting tokens per expert per layer (row: the layer's
    index in the model's ``layers``; column: the expert). ``layers`` and ``experts`` come from the config, so
    every rank's table has the same size whichever layers it holds (a pipeline stage's share, or none).
    ``take`` returns the counts since the last one."""

    def __init__(self, model: Any, layers: int, experts: int) -> None:
        self.routers: list[tuple[int, Any]] = []
        cls = router_class(model) if experts > 0 else None
        for name, module in model.named_modules() if cls is not None else ():
            found = _LAYER.search(f".{name}.")
            if isinstance(module, cls) and found:  # type: ignore[arg-type]
                self.routers.append((int(found.group(1)), module))
        self.active = experts > 0
        """The model is a mixture of experts (every rank agrees: it is the config's)."""
        self.counts = torch.zeros(layers, experts, dtype=torch.int64)
        self._handles = [m.register_forward_hook(self._hook(i)) for i, m in self.routers]

    def _hook(self, layer: int) -> Any:
        def count(module: Any, _args: Any, output: Any) -> None:
            with torch.no_grad():
                indices = routed_indices(output, int(getattr(module, "top_k", 1))).detach()
                if self.counts.device != indices.device:  # counted where the router runs: no sync per layer
                    self.counts = self.counts.to(indices.device)
                self.counts[layer] += tokens_per_expert(indices, self.counts.shape[1])
        return count

    def take(self) -> torch.Tensor:
        """The counts since the last ``take`` (or the start), flattened on the CPU, and a fresh start."""
        out = self.counts.flatten().to("cpu", copy=True)
        self.counts.zero_()
        return out

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
