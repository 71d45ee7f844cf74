"""One rank's run: set up the accelerator, tokenizer and data, pick the engine of the recipe's layout
(:mod:`runner.rank.engine`) and train it in the one training loop (:mod:`runner.rank.loop`).

Importing this module loads torch, accelerate and transformers: :mod:`runner.rank.trainer` imports it only
once the rank's output goes to its log.
"""

from __future__ import annotations

from pathlib import Path

import torch
from accelerate.utils import set_seed

from runner.data.cache import local_tokenizer_digest
from runner.data.prepare import load_data
from runner.rank import loop, pipeline, tensor_parallel
from runner.rank.context import Setup, StopFlag
from runner.rank.engine import Engine
from runner.rank.engines.accelerate import AccelerateEngine, make_accelerator
from runner.rank.engines.deepspeed import DeepSpeedEngine
from runner.rank.engines.split import SplitEngine
from runner.rank.engines.torch_zero import TorchZeroEngine
from runner.rank.measure import RankMemory
from runner.rank.model_load import load_tokenizer
from runner.rank.resume_map import recipe_for_node
from runner.spec import events as ev
from runner.spec import layout, strategies
from runner.spec.recipe import load_recipe


class Trainer:
    """One rank of a run: ``run()`` sets up accelerator, tokenizer and data, then trains the engine."""

    def __init__(self, run_dir: Path, rank: int, journal: ev.JournalWriter | None) -> None:
        self.run_dir = run_dir
        self.rank = rank
        self.journal = journal
        self.recipe = recipe_for_node(load_recipe(run_dir / ev.RECIPE_FILE), run_dir)  # c10d resume: this node's folder
        self.stop = StopFlag()

    def run(self) -> str:
        """Train; return the end status (``completed``, ``stopped`` or ``failed``)."""
        recipe = self.recipe
        launch = recipe.launch
        strategy = strategies.resolve(launch.strategy, launch.engine)
        on_cpu = launch.device == "cpu" or (launch.device == "auto" and not torch.cuda.is_available())
        accelerator = make_accelerator(recipe, strategy, on_cpu)
        memory = RankMemory(accelerator, on_cpu, all_devices=strategy.loads_over_devices and accelerator.num_processes == 1)
        setup = Setup(run_dir=self.run_dir, rank=self.rank, recipe=recipe, strategy=strategy, accelerator=accelerator,
                      on_cpu=on_cpu, journal=self.journal, stop=self.stop, memory=memory)
        set_seed(recipe.train.seed)
        setup.emit(ev.PhaseEvent(type="phase", phase="tokenizing", detail=str(recipe.data.source)))
        setup.tokenizer = load_tokenizer(setup)
        # The first rank tokenizes into the cache (or finds it there); the others then read its file.
        # The key is the pre-flight's: a local tokenizer's files, else the loaded tokenizer.
        with accelerator.main_process_first():
            setup.dataset = load_data(recipe.data, setup.tokenizer, recipe.train.seed,
                                      tokenizer_id=local_tokenizer_digest(recipe.model))
        return loop.train(setup, pick_engine(setup))


def pick_engine(setup: Setup) -> Engine:
    """The engine of the recipe's layout, as the strategy table describes it."""
    strategy, nproc = setup.strategy, setup.recipe.launch.nproc
    if strategy.tensor_parallel:
        return SplitEngine(setup, tensor_parallel.build, replicas=layout.replicas(setup.recipe))
    if strategy.pipelined(nproc):
        return SplitEngine(setup, pipeline.build_pipeline, replicas=1)
    if strategy.accelerate_type == "DEEPSPEED":
        return DeepSpeedEngine(setup)
    if strategy.zero_redundancy_optimizer:
        return TorchZeroEngine(setup)
    return AccelerateEngine(setup)
