"""The training script that ``accelerate launch`` runs, one copy per rank.

    accelerate launch --config_file RUN/accelerate.yaml -m runner.rank.trainer --run-dir RUN

It reads ``RUN/recipe.toml``, sets up the accelerator, tokenizer and data, picks the engine of the recipe's
layout (:mod:`runner.rank.engine`) and trains it in the one training loop (:mod:`runner.rank.loop`); rank 0
appends the events to ``RUN/events.jsonl``. Each rank's stdout/stderr go to ``RUN/logs/rank{N}.log``; the
trainer never touches the database.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import sys
import traceback
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from runner.rank.context import Setup, StopFlag
from runner.rank.rank_log import redirect_output
from runner.rank.resume_map import recipe_for_node
from runner.spec import events as ev
from runner.spec import layout, strategies
from runner.spec.recipe import load_recipe

if TYPE_CHECKING:
    from runner.rank.engine import Engine


def main(argv: list[str] | None = None) -> None:
    """Run one rank of the run in ``--run-dir``; exit non-zero when it fails."""
    parser = argparse.ArgumentParser(prog="python -m runner.rank.trainer")
    parser.add_argument("--run-dir", required=True, type=Path)
    args = parser.parse_args(argv)
    run_dir: Path = args.run_dir.resolve()
    rank = int(os.environ.get("RANK", "0"))

    redirect_output(ev.rank_log(run_dir, rank))
    faulthandler.enable()  # a segfault in a native library leaves its Python stack in the rank log
    # transformers 5 deprecates names that peft still calls every step; the log should show our own.
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
    pid_file = ev.rank_pid_file(run_dir, rank)
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    pid_file.write_text(str(os.getpid()))

    journal = ev.JournalWriter(run_dir / ev.EVENTS_FILE) if rank == 0 else None
    code = 0
    try:
        status = Trainer(run_dir, rank, journal).run()
        code = 1 if status == "failed" else 0
    except BaseException as exc:  # noqa: BLE001 (report every failure, then exit non-zero)
        traceback.print_exc()
        if journal is not None:
            journal.write(ev.ErrorEvent(type="error", message=f"{type(exc).__name__}: {exc}".strip(), rank=rank))
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        if journal is not None:
            journal.close()
    # Two-rank gloo runs abort at interpreter exit ~5% of the time ("terminate called without an
    # active exception"); skipping interpreter teardown avoided it in 20/20 runs (docs/cpu-facts.md).
    os._exit(code)


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
        # Deferred: torch, accelerate and transformers load once the rank's output goes to its log.
        import torch
        from accelerate.utils import set_seed

        from runner.data.cache import local_tokenizer_digest
        from runner.data.prepare import load_data
        from runner.rank import loop
        from runner.rank.engines.accelerate import make_accelerator
        from runner.rank.measure import RankMemory
        from runner.rank.model_load import load_tokenizer

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
    # Deferred with the rest of the rank's torch stack (see Trainer.run).
    from runner.rank import pipeline, tensor_parallel
    from runner.rank.engines.accelerate import AccelerateEngine
    from runner.rank.engines.deepspeed import DeepSpeedEngine
    from runner.rank.engines.split import SplitEngine
    from runner.rank.engines.torch_zero import TorchZeroEngine

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


if __name__ == "__main__":
    main()
