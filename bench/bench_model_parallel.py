"""Naive model parallel against a pipeline: per-device utilisation and tokens/s, and each layout against DDP.

    python bench/bench_model_parallel.py [--steps 20] [--batch 8] [--nproc 2]

Runs quickstart (fp32 LoRA, the builtin tiny Llama) at one global batch (``--batch`` rows per optimizer
step) as: one process; ``mp`` over N processes (one micro-batch: one stage works at a time); ``pp`` with
GPipe at 2 and ``--batch`` micro-batches and 1F1B at ``--batch``; ``tp`` over N; DDP over N (``--batch``/N
rows each). Utilisation is each rank's CPU % of its torch threads, sampled by psutil twice a second over
the active window (the mean over ranks, with the lowest and highest), exactly as ``ftui compare`` shows it;
tokens/s is the trainer's measured figure. The host's 1-minute load average is read before and after each
run: other work on a shared machine shows there. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "recipes" / "quickstart.toml"


def ftui(home: Path, *args: str) -> str:
    env = {**os.environ, "FTUI_HOME": str(home), "FTUI_DB": f"sqlite:///{home / 'ftui.db'}",
           "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "tui.cli", *args], env=env, capture_output=True, text=True,
                          check=False)
    if proc.returncode != 0:
        raise SystemExit(f"ftui {' '.join(args)}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
    return proc.stdout


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--nproc", type=int, default=2)
    args = parser.parse_args()
    n, b = args.nproc, args.batch
    layouts: dict[str, list[str]] = {
        "single": ["--strategy", "single"],
        f"mp x{n} (1 micro-batch)": ["--strategy", "mp", "--nproc", str(n)],
        f"pp x{n} GPipe, 2 micro-batches": ["--strategy", "pp", "--nproc", str(n), "--set",
                                            'launch.pp_schedule="gpipe"', "--set", "launch.microbatches=2"],
        f"pp x{n} GPipe, {b} micro-batches": ["--strategy", "pp", "--nproc", str(n), "--set",
                                              'launch.pp_schedule="gpipe"', "--set", f"launch.microbatches={b}"],
        f"pp x{n} 1F1B, {b} micro-batches": ["--strategy", "pp", "--nproc", str(n), "--set",
                                             f"launch.microbatches={b}"],
        f"tp x{n}": ["--strategy", "tp", "--nproc", str(n)],
        f"ddp x{n}": ["--strategy", "ddp", "--nproc", str(n)],
    }
    home = Path(tempfile.mkdtemp(prefix="ftui-bench-mp-"))
    rows: list[dict[str, Any]] = []
    for name, flags in layouts.items():
        before = os.getloadavg()[0]
        ftui(home, "run", str(RECIPE), *flags, "--set", f"train.max_steps={args.steps}",
             "--set", f"train.batch_size={b // n if name.startswith('ddp') else b}",
             "--name", name.split(" ")[0])
        after = os.getloadavg()[0]
        run_id = json.loads(ftui(home, "runs", "--format", "json"))[0]["id"]
        (row,) = json.loads(ftui(home, "compare", str(run_id), "--format", "json"))["runs"]
        rows.append({"layout": name, "load": f"{before:.1f} / {after:.1f}", **row})
        print(f"{name}: {row['cpu_util']:.0f}% util, {row['tokens_per_s']:.0f} tokens/s, load {before:.1f}/{after:.1f}",
              file=sys.stderr)
    ddp = rows[-1]["tokens_per_s"]
    mp_util = rows[1]["cpu_util"]
    print("| layout | mean rank util (min-max) | tokens/s | vs DDP | util vs mp | final loss | load 1-min before / after |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for r in rows:
        spread = f" ({r['util_min']:.0f}-{r['util_max']:.0f})" if r.get("util_min") is not None else ""
        print(f"| {r['layout']} | {r['cpu_util']:.0f}% of {r['cpu_threads']} thread(s){spread} | "
              f"{r['tokens_per_s']:,.0f} | {r['tokens_per_s'] / ddp:.2f}x | {r['cpu_util'] / mp_util:.2f}x | "
              f"{r['final_loss']:.4f} | {r['load']} |")


if __name__ == "__main__":
    main()
