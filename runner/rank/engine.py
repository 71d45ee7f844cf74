"""The interface between the training loop and what trains: one engine per layout.

:mod:`runner.rank.loop` owns the data order, gradient accumulation, the step's collective, the NaN policy,
the events, and the eval, checkpoint and memory-meter cadence. An :class:`Engine` owns the model and
optimizer of one layout: how they are prepared, how one micro-batch runs forward and backward, how the
gradients are clipped and the optimizer stepped, what the rank holds, and how the result is saved.

The engines (:mod:`runner.rank.engines`): accelerate (one process, DDP, FSDP, one process over GPUs),
DeepSpeed, torch ZeRO-1 (ZeroRedundancyOptimizer), and the layouts accelerate does not prepare: pipeline
stages (``pp``, ``mp`` over processes) and tensor parallelism (``tp``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from runner.rank import memtrack
from runner.spec import events as ev

if TYPE_CHECKING:
    from runner.rank.checkpointing import Checkpointer
    from runner.rank.context import DataShape, Setup


@dataclass(frozen=True)
class MicroBatch:
    """One accumulation micro-step's rows (CPU tensors) and what its loss is weighted by."""

    input_ids: Any
    attention_mask: Any
    """None on packed data (every token is real)."""
    labels: Any
    """Targets, -100 where no token is learned (padding; prompts under ``data.train_on = "completions"``)."""
    index: int
    """The micro-step within the optimizer step (0 .. grad_accum - 1)."""
    accumulation: int
    """Micro-steps per optimizer step (``train.grad_accum``)."""
    learned: int
    """Tokens with a target in these rows (0 when the labels are the inputs)."""
    step_learned: int
    """Tokens with a target in the whole optimizer step, over every replica (0: the labels are the inputs)."""
    first: bool
    """The run's first micro-step (where activations and compute dtype are measured)."""

    @property
    def last(self) -> bool:
        """Whether this micro-step closes the accumulation."""
        return self.index == self.accumulation - 1


@dataclass(frozen=True)
class StepResult:
    """What the optimizer step did."""

    grad_norm: float | None
    """The global gradient norm (None where no clipping was asked for)."""
    stepped: bool
    """False when the norm was not finite and the update was refused."""


class Engine(ABC):
    """The model and optimizer of one layout, as the training loop drives them.

    Args:
        setup: The rank's set-up (recipe, strategy, accelerator, tokenizer, data).
        replicas: Data parallel replicas, each training its own rows of every micro-step.
        replica: This process's replica.
    """

    owns_loss: bool = True
    """Whether this process's loss and token count are the ones reported (one process per replica)."""
    evaluates: bool = True
    """Whether the loop runs ``eval`` on :attr:`model` (the split layouts have no whole model to run)."""
    checkpointer: Checkpointer | None = None
    """Resumable checkpoints, where the engine writes them."""

    def __init__(self, setup: Setup, replicas: int, replica: int) -> None:
        self.setup = setup
        self.replicas = replicas
        self.replica = replica
        self.model: Any = None
        """What the loop trains and evaluates (the prepared model, a pipeline stage)."""
        self.optimizer: Any = None
        self.input_device: Any = setup.accelerator.device
        """Where the inputs of :attr:`model` go (a model spread over GPUs: its first device)."""

    def preparing_detail(self) -> str:
        """The ``preparing`` phase event's detail."""
        return f"{self.setup.recipe.launch.strategy} x {self.setup.accelerator.num_processes}"

    @abstractmethod
    def prepare(self, model: Any, shape: DataShape) -> None:
        """Wrap or split the loaded ``model`` and build the optimizer (:attr:`model`, :attr:`optimizer`)."""

    @abstractmethod
    def describe(self, start: ev.StartEvent) -> None:
        """Fill the start event's fields that depend on the layout (distributed type, local parameters,
        device map, what is in effect)."""

    def register_scheduler(self, scheduler: Any) -> None:
        """Hand the lr scheduler to the checkpoints (where there are any; none by default)."""
        return None

    def meter(self) -> memtrack.LiveTensorPeaks | memtrack.CudaPeaks:
        """The memory meter of the first steps, seeded with what this rank trains."""
        return memtrack.meter_for(not self.setup.on_cpu, self.model, self.optimizer)

    @abstractmethod
    def zero_loss(self) -> Any:
        """What the micro-steps' losses are summed onto (the engine's own number type)."""

    @abstractmethod
    def forward_backward(self, batch: MicroBatch, peaks: memtrack.Meter) -> Any:
        """Forward and backward of one micro-step, measured in ``peaks``; the loss of this process's share,
        weighted so that the micro-steps' sum is the step's loss."""

    def reduce_grads(self) -> float:
        """After the micro-steps, before the step's collective: finish the gradients where the engine does
        it by hand; return this process's share of the squared global norm (0 where the engine clips itself)."""
        return 0.0

    @abstractmethod
    def clip_and_step(self, max_grad_norm: float, grad_sq: float) -> StepResult:
        """Clip the gradients to ``max_grad_norm`` (0: no clipping) and step the optimizer, unless the global
        norm is not finite. ``grad_sq``: the processes' :meth:`reduce_grads`, summed."""

    def zero_grad(self) -> None:
        """Drop the gradients after the step."""
        self.optimizer.zero_grad(set_to_none=True)

    def state_bytes(self) -> dict[str, Any]:
        """Bytes this rank holds of parameters, gradients, optimizer state and master (after the first step)."""
        return {}

    def precision(self) -> dict[str, Any] | None:
        """The precision in effect after the first step (:func:`runner.rank.sharding.precision_in_effect`);
        None where the engine does not report it."""
        return None

    def loss_scale(self) -> float | None:
        """The fp16 dynamic loss scale now, or None."""
        return None

    @abstractmethod
    def save(self) -> str:
        """Save the adapter or model to RUN/output; return the folder (every rank takes part)."""
