"""ZeRO-1 with PyTorch alone: DDP and ``ZeroRedundancyOptimizer`` (the torch engine's stages 2 and 3 are
FSDP2, which accelerate prepares: :class:`runner.rank.engines.accelerate.AccelerateEngine`)."""

from __future__ import annotations

from typing import Any

from runner.rank import sharding
from runner.rank.engines.accelerate import AccelerateEngine


class TorchZeroEngine(AccelerateEngine):
    """DDP for the model, ``ZeroRedundancyOptimizer`` for the optimizer state."""

    def build(self, model: Any, trainable: list[Any]) -> tuple[Any, Any]:
        # ZeroRedundancyOptimizer is not accelerate's to wrap (its state_dict needs a consolidation first):
        # the model alone is prepared (DDP), and the optimizer steps itself.
        train = self.setup.recipe.train
        optimizer = sharding.zero_optimizer(trainable, train.lr, train.weight_decay)
        return self.setup.accelerator.prepare(model), optimizer
