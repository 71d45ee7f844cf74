"""The training script that ``accelerate launch`` runs, one copy per rank.

    accelerate launch --config_file RUN/accelerate.yaml -m runner.rank.trainer --run-dir RUN

It sends the rank's output to its log, then runs :class:`runner.rank.run.Trainer`, which reads
``RUN/recipe.toml``, picks the engine of the recipe's layout and trains it in the one loop; rank 0
appends the events to ``RUN/events.jsonl``. Each rank's stdout/stderr go to ``RUN/logs/rank{N}.log``; the
trainer never touches the database.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import warnings
from pathlib import Path

from runner.rank.rank_log import dump_stacks_on_signal, redirect_output, run_reporting
from runner.spec import events as ev


def main(argv: list[str] | None = None) -> None:
    """Run one rank of the run in ``--run-dir``; exit non-zero when it fails."""
    parser = argparse.ArgumentParser(prog="python -m runner.rank.trainer")
    parser.add_argument("--run-dir", required=True, type=Path)
    args = parser.parse_args(argv)
    run_dir: Path = args.run_dir.resolve()
    rank = int(os.environ.get("RANK", "0"))

    redirect_output(ev.rank_log(run_dir, rank))
    faulthandler.enable()  # a segfault in a native library leaves its Python stack in the rank log
    dump_stacks_on_signal(run_dir, rank)  # before the pid file: a rank the watcher finds can answer for its stacks
    # transformers 5 deprecates names that peft still calls every step; the log should show our own.
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
    pid_file = ev.rank_pid_file(run_dir, rank)
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    pid_file.write_text(str(os.getpid()))

    def train(journal: ev.JournalWriter | None) -> str:
        # deferred: torch (with accelerate and transformers, loaded once the rank's output goes to its log)
        from runner.rank.run import Trainer

        return Trainer(run_dir, rank, journal).run()

    code = run_reporting(train, run_dir, rank)
    # Two-rank gloo runs abort at interpreter exit ~5% of the time ("terminate called without an
    # active exception"); skipping interpreter teardown avoided it in 20/20 runs (docs/cpu-facts.md).
    os._exit(code)

if __name__ == "__main__":
    main()
