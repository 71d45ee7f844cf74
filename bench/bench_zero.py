"""Throughput of each ZeRO stage on each engine against DDP, at the same global batch, in one run.

    python bench/bench_zero.py [--steps 20] [--warmup 3] [--nproc 2] [--method lora|full] [--repeat 1]

Every contender is ``ftui run recipes/quickstart.toml --strategy S --nproc N --engine E`` with the same
micro-batch per rank (so the same global batch), the same steps and ``train.save = false``, into a
throw-away ftui home. Tokens/s is the steady state: tokens of the steps after ``--warmup`` over the sum of
their step times (start-up excluded; it differs by design: DeepSpeed's engine set-up, FSDP's wrapping).
The best of ``--repeat`` rounds is kept per contender. Prints one JSON line per contender and a markdown
table (tokens/s, against DDP, torch against DeepSpeed per stage) with the host's load average.
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
CONTENDERS = [("ddp", "auto"), ("zero1", "deepspeed"), ("zero1", "torch"), ("zero2", "deepspeed"),
              ("zero2", "torch"), ("zero3", "deepspeed"), ("zero3", "torch")]


def run_one(home: str, strategy: str, engine: str, args: argparse.Namespace, name: str) -> dict[str, Any]:
    env = {**os.environ, "FTUI_HOME": home, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "tui.cli", "run", str(RECIPE), "--strategy", strategy, "--nproc", str(args.nproc),
           "--set", f"train.max_steps={args.steps}", "--set", "train.save=false", "--set", "train.log_every=1",
           "--set", f"method.type={json.dumps(args.method)}", "--set", f"train.batch_size={args.micro_batch}",
           "--name", name, "--sample-interval", "0"]
    if engine != "auto":
        cmd += ["--engine", engine]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        return {"strategy": strategy, "engine": engine, "error": proc.stdout[-500:] + proc.stderr[-500:]}
    runs = json.loads(subprocess.run([sys.executable, "-m", "tui.cli", "runs", "--format", "json"], env=env,
                                     cwd=ROOT, capture_output=True, text=True, check=True).stdout)
    run_id = next(r["id"] for r in runs if r["name"] == name)
    shown = json.loads(subprocess.run([sys.executable, "-m", "tui.cli", "show", str(run_id), "--format", "json"],
                                      env=env, cwd=ROOT, capture_output=True, text=True, check=True).stdout)
    steps = [m for m in shown["metrics"] if m["step"] > args.warmup]
    tokens = sum(m["tokens_per_s"] * m["step_time"] for m in steps)
    seconds = sum(m["step_time"] for m in steps)
    return {"strategy": strategy, "engine": engine, "tokens_per_s": tokens / seconds,
            "final_loss": shown["summary"].get("final_loss"), "sharding": shown["summary"].get("sharding", {}).get("how")}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--micro-batch", type=int, default=2)
    parser.add_argument("--method", choices=["lora", "full"], default="lora")
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    best: dict[tuple[str, str], dict[str, Any]] = {}
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory() as home:
        for round_ in range(args.repeat):
            for strategy, engine in CONTENDERS:
                result = run_one(home, strategy, engine, args, f"b{round_}-{strategy}-{engine}")
                print(json.dumps(result), flush=True)
                key = (strategy, engine)
                if "error" not in result and result["tokens_per_s"] > best.get(key, {}).get("tokens_per_s", 0):
                    best[key] = result
    load1 = os.getloadavg()
    ddp = best.get(("ddp", "auto"), {}).get("tokens_per_s")
    print(f"\nquickstart {args.method}, {args.nproc} ranks x {args.micro_batch} rows (global "
          f"{args.nproc * args.micro_batch}), {args.steps} steps, steady state after {args.warmup}; "
          f"load average {load0[0]:.1f} -> {load1[0]:.1f}\n")
    print("| strategy | engine | in effect | tokens/s | vs DDP | torch vs deepspeed |")
    print("|---|---|---|---:|---:|---:|")
    for strategy, engine in CONTENDERS:
        r = best.get((strategy, engine))
        if r is None:
            print(f"| {strategy} | {engine} | failed | - | - | - |")
            continue
        vs = f"{r['tokens_per_s'] / ddp:.2f}x" if ddp else "-"
        ds = best.get((strategy, "deepspeed"))
        cross = f"{r['tokens_per_s'] / ds['tokens_per_s']:.2f}x" if engine == "torch" and ds else ""
        print(f"| {strategy} | {engine} | {r['sharding']} | {r['tokens_per_s']:,.0f} | {vs} | {cross} |")


if __name__ == "__main__":
    main()
