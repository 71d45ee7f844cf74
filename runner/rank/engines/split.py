"""The engine of models accelerate does not prepare: pipeline stages (``pp``, ``mp`` over processes,
:mod:`runner.rank.pipeline`) and tensor parallelism (``tp``, :mod:`runner.rank.tensor_parallel`).

A builder splits the loaded model into this process's :class:`SplitModel`; the engine trains it with torch's
AdamW. Losses: each micro-step's loss is multiplied by 1 / gradient accumulation before backward (a pipeline
also divides by its micro-batches), so the gradient is the one of the whole batch's mean loss and the loss
reported is the mean over the batch, as in a one-process run (exactly so on packed data, where micro-batches
hold equal token counts). Gradient clipping uses the global norm over every process's parameters, summed in
the step's collective.

Not here: checkpoints (``train.save_every`` and ``train.resume_from`` are refused by the recipe validator,
:mod:`runner.spec.layout`; a graceful stop ends the run without one), evaluation, and data parallel around a
pipeline.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

import torch

from runner.rank import memtrack, sharding
from runner.rank.checkpointing import save_gathered
from runner.rank.engine import Engine, MicroBatch, StepResult
from runner.rank.measure import gather_list, local_numel

if TYPE_CHECKING:
    from runner.rank.context import DataShape, Setup
    from runner.spec import events as ev
    from runner.spec.recipe import Recipe


@dataclass
class SplitModel:
    """What one process trains of a split model, and how one micro-step of it runs."""

    module: Any
    """The module whose parameters this process holds (a pipeline stage, or the tensor-parallel model)."""
    kind: Literal["PIPELINE", "TENSOR_PARALLEL"]
    """The ``distributed_type`` the start event reports (not accelerate's: accelerate prepared nothing)."""
    micro_step: Callable[[Any, Any, float], float]
    """``(input_ids, labels, scale) -> loss`` of this process's share: forward and backward of one
    accumulation micro-step, its loss multiplied by ``scale``; 0 where this process sees no loss."""
    owns_loss: bool
    """Whether this process's ``micro_step`` loss is the one reported (one process per replica)."""
    grad_sq: Callable[[], float]
    """This process's part of the squared global gradient norm (summed over processes: the whole)."""
    trainable: Callable[[bool], dict[str, Any]]
    """``full_names -> tensors`` this process contributes to the saved adapter or model (CPU tensors;
    a collective under tensor parallelism: every process calls it)."""
    info: dict[str, Any] = field(default_factory=dict)
    """What the start event says about the layout (``parallel``)."""
    device_map: dict[str, str] | None = None
    phase: str = "backward"
    """The memtrack phase a micro-step is measured under (a pipeline interleaves forward and backward)."""
    sync_grads: Callable[[], None] | None = None
    """Average the gradients over the replicas, after the micro-steps and before the norm and the step."""
    foreach: bool | None = None
    """AdamW's ``foreach`` (torch's foreach kernels refuse lists that mix DTensors and plain tensors)."""


class Builder(Protocol):
    """Splits the loaded model: ``(model, recipe, device, world, rank, replicas) -> SplitModel``."""

    def __call__(self, model: Any, recipe: Recipe, device: Any, world: int, rank: int,
                 replicas: int) -> SplitModel: ...


def causal_lm(model: Any) -> Any:
    """The ``*ForCausalLM`` under a PEFT wrapper (or the model itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


class SplitEngine(Engine):
    """Trains this process's :class:`SplitModel`; groups of ``world / replicas`` processes train the same rows.

    Args:
        setup: The rank's set-up.
        build: Splits the loaded model.
        replicas: Data parallel replicas (tensor-parallel groups; 1 for a pipeline).
    """

    evaluates = False

    def __init__(self, setup: Setup, build: Builder, replicas: int) -> None:
        acc = setup.accelerator
        super().__init__(setup, replicas=replicas, replica=acc.process_index // (acc.num_processes // replicas))
        self.build = build
        self.split: SplitModel | None = None
        self.full_model: Any = None
        self.params: list[Any] = []
        self.whole: sharding.Whole | None = None
        """The whole model, counted before the split (a pipeline stage drops the other stages' layers)."""

    def _split(self) -> SplitModel:
        assert self.split is not None, "prepare() first"
        return self.split

    def prepare(self, model: Any, shape: DataShape) -> None:
        acc, train = self.setup.accelerator, self.setup.recipe.train
        self.full_model = model  # what the adapter or model is saved from (rank 0)
        self.whole = sharding.whole_model(model)
        self.split = split = self.build(model, self.setup.recipe, acc.device, acc.num_processes,
                                        acc.process_index, self.replicas)
        self.owns_loss = split.owns_loss
        self.model = split.module
        self.params = [p for p in split.module.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=train.lr, weight_decay=train.weight_decay,
                                           foreach=split.foreach)

    def describe(self, start: ev.StartEvent) -> None:
        split = self._split()
        start["distributed_type"] = split.kind
        start["fsdp_version"] = None
        start["local_param_numel"] = local_numel(split.module)
        start["device_map"] = split.device_map
        start["parallel"] = split.info

    def meter(self) -> memtrack.LiveTensorPeaks | memtrack.CudaPeaks:
        return memtrack.meter_for(self.setup.accelerator.device.type == "cuda", self.model, self.optimizer)

    def zero_loss(self) -> Any:
        return 0.0

    def forward_backward(self, batch: MicroBatch, peaks: memtrack.Meter) -> Any:
        split, device = self._split(), self.setup.accelerator.device
        with peaks.phase(split.phase), self.setup.accelerator.autocast():
            return split.micro_step(batch.input_ids.to(device), batch.labels.to(device), 1.0 / batch.accumulation)

    def reduce_grads(self) -> float:
        split = self._split()
        if split.sync_grads is not None:
            split.sync_grads()
        return split.grad_sq()

    def clip_and_step(self, max_grad_norm: float, grad_sq: float) -> StepResult:
        grad_norm = None
        if max_grad_norm > 0:
            grad_norm = math.sqrt(max(0.0, grad_sq))
            if not math.isfinite(grad_norm):
                return StepResult(grad_norm=grad_norm, stepped=False)
            _clip(self.params, max_grad_norm, grad_norm)
        self.optimizer.step()
        return StepResult(grad_norm=grad_norm, stepped=True)

    def state_bytes(self) -> dict[str, Any]:
        return sharding.state_bytes(self.model, self.optimizer, whole=self.whole)

    def save(self) -> str:
        """Gather every process's part of the adapter (LoRA) or model (full) and save it on rank 0."""
        parts = gather_list([self._split().trainable(self.setup.recipe.method.type != "full")])
        return save_gathered(self.setup, parts, self.full_model, causal_lm(self.full_model))


def _clip(params: list[Any], max_norm: float, total: float) -> None:
    """Scale gradients as ``torch.nn.utils.clip_grad_norm_`` does, by the GLOBAL norm ``total``."""
    coef = min(1.0, max_norm / (total + 1e-6))
    if coef < 1.0:
        for p in params:
            if p.grad is not None:
                p.grad.mul_(coef)
