"""What one rank has set up before it trains: the run, its strategy, accelerator, tokenizer and data.

:class:`Setup` is built by :mod:`runner.rank.trainer` and handed to the engine (:mod:`runner.rank.engine`)
and to the loop (:mod:`runner.rank.loop`); they journal through it, and read the stop request from it.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runner.spec import events as ev

if TYPE_CHECKING:
    from runner.rank.measure import RankMemory
    from runner.spec.recipe import Recipe
    from runner.spec.strategies import Strategy


class StopFlag:
    """Set by SIGTERM/SIGINT; the ranks agree on it at each step so they all stop together."""

    def __init__(self) -> None:
        self.requested = False
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:  # a second signal: stop now
            os._exit(128 + signum)
        self.requested = True


@dataclass(frozen=True)
class DataShape:
    """How the training rows fill optimizer steps (also the data position a checkpoint records)."""

    rows: int
    rows_per_step: int
    steps_per_epoch: int
    total_steps: int
    """The schedule's steps (``train.max_steps``, or ``epochs``' worth): what the lr schedule spans."""
    stop_step: int
    """The step this run stops after: ``train.stop_after`` within the schedule, else ``total_steps``."""


@dataclass
class Setup:
    """One rank's run before training: recipe and strategy, accelerator, tokenizer, data, journal."""

    run_dir: Path
    rank: int
    recipe: Recipe
    strategy: Strategy
    """The recipe's strategy as run by its engine (:func:`runner.spec.strategies.resolve`)."""
    accelerator: Any
    on_cpu: bool
    journal: ev.JournalWriter | None
    stop: StopFlag
    memory: RankMemory
    tokenizer: Any = None
    dataset: Any = None
    """:class:`runner.data.prepare.DataSet`: training blocks, eval blocks, format."""
    total_params: int = 0
    trainable_params: int = 0

    def emit(self, event: ev.TrainerEvent) -> None:
        """Journal ``event`` (rank 0; the other ranks have no journal)."""
        if self.journal is not None:
            self.journal.write(event)
