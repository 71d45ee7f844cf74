"""What checkpointing costs, and how fast a resumed run gets going, in one run.

    python bench/bench_checkpoint.py [--steps 200] [--every 50] [--repeat 2] [--strategy single]

1. throughput: ``ftui run recipes/quickstart.toml`` for ``--steps`` steps with ``train.save_every =
   --every`` against the same run without checkpoints. Tokens/s is the trainer's own end figure: real
   tokens over the training span (start of the first step to the end of the last), so the checkpoints
   written between steps are inside it (the one after the last step is not). Also the time the saves
   took (their ``checkpoint`` events) as a share of that span.
2. time to first step: from the orchestrator's ``launch`` event to the first ``step`` event, for the
   fresh runs above and for runs resumed (``train.resume_from``) from the checkpoint one save before
   the end (they train the remaining ``--every`` steps).

Runs alternate and the best of ``--repeat`` is kept for each, to damp noise from other work on the
machine. Everything is measured; nothing is estimated.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "recipes" / "quickstart.toml"
STRATEGY_FLAGS = {
    "single": ["--strategy", "single"],
    "ddp": ["--strategy", "ddp", "--nproc", "2", "--set", "train.batch_size=2"],
    "fsdp": ["--strategy", "fsdp", "--nproc", "2", "--set", "train.batch_size=2"],
}


def ftui(home: Path, *args: str) -> None:
    env = {**os.environ, "FTUI_HOME": str(home), "FTUI_DB": f"sqlite:///{home / 'ftui.db'}",
           "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "tui.cli", *args], env=env, cwd=ROOT, capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise SystemExit(f"ftui {' '.join(args)} exited {proc.returncode}\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")


def last_run(home: Path) -> dict[str, Any]:
    """The newest run's figures, read from its journal and the store."""
    db = sqlite3.connect(home / "ftui.db")
    run_id, run_dir = db.execute("select id, run_dir from runs order by id desc limit 1").fetchone()
    launch = db.execute("select time from events where run_id = ? and type = 'launch'", (run_id,)).fetchone()[0]
    events = [json.loads(line) for line in (Path(run_dir) / "events.jsonl").read_text().splitlines()]
    start = next(e for e in events if e["type"] == "start")
    first_step = next(e for e in events if e["type"] == "step")
    end = next(e for e in events if e["type"] == "end")
    saves = [e for e in events if e["type"] == "checkpoint"]
    saves_in_span = [e for e in saves if e["step"] < end["steps"]]  # the last one is after the span
    return {
        "run_dir": run_dir,
        "tokens_per_s": end["tokens_per_s"],
        "train_seconds": end["train_seconds"],
        "first_step_after_launch_s": first_step["time"] - launch,
        "first_step_time_s": first_step["step_time"],
        "resume_seconds": start.get("resume_seconds"),
        "saves": len(saves),
        "save_seconds_in_span": sum(e["seconds"] for e in saves_in_span),
        "save_seconds_each": [round(e["seconds"], 3) for e in saves],
        "checkpoint_bytes": saves[-1]["bytes"] if saves else 0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--strategy", choices=list(STRATEGY_FLAGS), default="single")
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="bench-ckpt-"))
    common = [*STRATEGY_FLAGS[args.strategy], "--sample-interval", "0", "--set", f"train.max_steps={args.steps}",
              "--set", "train.save=false"]
    results: dict[str, list[dict[str, Any]]] = {"none": [], "every": [], "resumed": []}
    for _ in range(args.repeat):
        ftui(home, "run", str(RECIPE), *common)
        results["none"].append(last_run(home))
        ftui(home, "run", str(RECIPE), *common, "--set", f"train.save_every={args.every}")
        every = last_run(home)
        results["every"].append(every)
        resume_step = args.steps - args.every
        checkpoint = Path(every["run_dir"]) / "checkpoints" / f"step-{resume_step:08d}"
        ftui(home, "run", str(Path(every["run_dir"]) / "recipe.toml"), "--sample-interval", "0",
             "--set", f"train.resume_from={json.dumps(str(checkpoint))}", "--set", "train.save_every=0")
        results["resumed"].append(last_run(home))

    none = max(results["none"], key=lambda r: r["tokens_per_s"])
    every = max(results["every"], key=lambda r: r["tokens_per_s"])
    fresh_ttfs = min(r["first_step_after_launch_s"] for r in results["none"] + results["every"])
    resumed_ttfs = min(r["first_step_after_launch_s"] for r in results["resumed"])
    summary = {
        "strategy": args.strategy,
        "steps": args.steps,
        "save_every": args.every,
        "tokens_per_s_without_checkpoints": round(none["tokens_per_s"], 1),
        "tokens_per_s_with_checkpoints": round(every["tokens_per_s"], 1),
        "ratio": round(every["tokens_per_s"] / none["tokens_per_s"], 4),
        "save_seconds_in_span": round(every["save_seconds_in_span"], 3),
        "save_share_of_span": round(every["save_seconds_in_span"] / every["train_seconds"], 4),
        "save_seconds_each": every["save_seconds_each"],
        "checkpoint_bytes": every["checkpoint_bytes"],
        "time_to_first_step_fresh_s": round(fresh_ttfs, 2),
        "time_to_first_step_resumed_s": round(resumed_ttfs, 2),
        "resumed_over_fresh": round(resumed_ttfs / fresh_ttfs, 3),
        "restore_seconds": min(r["resume_seconds"] for r in results["resumed"]),
        "all_runs": {k: [{kk: (round(vv, 3) if isinstance(vv, float) else vv) for kk, vv in r.items()
                          if kk != "run_dir"} for r in v] for k, v in results.items()},
    }
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
