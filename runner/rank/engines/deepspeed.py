"""The DeepSpeed engine: ZeRO stages 1-3 on DeepSpeed, through accelerate's integration (docs/zero.md).

DeepSpeed's engine accumulates, clips and steps itself: it is told where the accumulation boundary is, its
``backward`` does not divide the loss again, and its ``step`` clips (``gradient_clipping`` in its config),
updates and zeroes the gradients. The step still comes after the step's collective, as for every engine.
"""

from __future__ import annotations

import contextlib
from typing import Any

from runner.rank import sharding
from runner.rank.engine import MicroBatch, StepResult
from runner.rank.engines.accelerate import AccelerateEngine


class DeepSpeedEngine(AccelerateEngine):
    """A model and optimizer that accelerate hands to DeepSpeed."""

    grads_before_step: sharding.HeldGrads | None = None
    """The gradients DeepSpeed holds at the end of the backward (its step frees them)."""
    measured: bool = False

    def no_sync(self, batch: MicroBatch) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()  # DeepSpeed accumulates itself (told where the boundary is)

    def backward(self, loss: Any, batch: MicroBatch) -> None:
        # The engine itself, not accelerate's wrapper (which would also step): the optimizer step stays
        # after the step's collective.
        self.model.set_gradient_accumulation_boundary(batch.last)
        self.model.backward(loss, scale_wrt_gas=False)  # the loss is already weighted

    def reduce_grads(self) -> float:
        if not self.measured:
            self.grads_before_step = sharding.deepspeed_grad_bytes(self.model)
        return 0.0

    def clip_and_step(self, max_grad_norm: float, grad_sq: float) -> StepResult:
        self.model.step()  # clips, steps and zeroes the gradients
        norm = self.model.get_global_grad_norm() if max_grad_norm > 0 else None
        return StepResult(grad_norm=float(norm) if norm is not None else None, stepped=True)

    def state_bytes(self) -> dict[str, Any]:
        self.measured = True
        return {**sharding.state_bytes(self.model, self.optimizer, self.grads_before_step), **self.activations}
