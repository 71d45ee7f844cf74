"""The maths library's line against the ranks' own measure, on this host (CPU).

For each case: ``ftui estimate RECIPE --set ... --library --format json`` (the probe, or its cache) gives the
line's bytes; ``ftui run RECIPE --set ... --set train.max_steps=3`` gives each rank's ``heap_check`` over its
measured steps (glibc's heap growth minus the live tensors'). Prints one markdown row per case and the largest
difference; the goal is 2 MiB (docs/memory-model.md). ``FTUI_HOME`` is a fresh folder of its own unless given.

    python bench/bench_library.py [--cases quickstart-bf16,...] [--home DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

MIB = 2**20
CASES: dict[str, tuple[str, list[str]]] = {
    "quickstart-bf16": ("recipes/quickstart.toml", ["data.context_length=64", 'train.precision="bf16"']),
    "quickstart-fp32": ("recipes/quickstart.toml", ["data.context_length=64", 'train.precision="fp32"']),
    "quickstart-bf16-ddp2": ("recipes/quickstart.toml", ["data.context_length=64", 'train.precision="bf16"',
                                                         'launch.strategy="ddp"', "launch.nproc=2"]),
    "quickstart-fp32-ddp2": ("recipes/quickstart.toml", ["data.context_length=64", 'train.precision="fp32"',
                                                         'launch.strategy="ddp"', "launch.nproc=2"]),
    "tiny-moe-fp32": ("recipes/tiny-moe.toml", ['train.precision="fp32"']),
    "tiny-moe-bf16": ("recipes/tiny-moe.toml", ['train.precision="bf16"']),
}


def _sets(overrides: list[str]) -> list[str]:
    return [a for o in overrides for a in ("--set", o)]


def case(name: str, home: Path) -> tuple[int | None, list[int]]:
    """The line's bytes and each rank's bytes beyond tensors."""
    recipe, overrides = CASES[name]
    env = {**os.environ, "FTUI_HOME": str(home)}
    est = subprocess.run(["ftui", "estimate", recipe, *_sets(overrides), "--library", "--format", "json",
                          "--strategy", "single"], env=env, capture_output=True, text=True, check=True)
    term = json.loads(est.stdout)["library"]
    run_name = f"lib-{name}"
    subprocess.run(["ftui", "run", recipe, *_sets([*overrides, "train.max_steps=3", "train.save=false"]),
                    "--name", run_name], env=env, capture_output=True, text=True, check=True)
    folder = max((home / "runs").glob(f"*-{run_name}"), key=lambda p: p.stat().st_mtime)
    ranks: list[int] = []
    for line in (folder / "events.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event.get("type") == "end":
            ranks = [int(r["heap_check"]["beyond_tensors_bytes"]) for r in event.get("ranks", []) if "heap_check" in r]
    return term.get("bytes"), ranks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--home", type=Path)
    args = parser.parse_args(argv)
    home = args.home or Path(tempfile.mkdtemp(prefix="ftui-bench-library-"))
    print("| case | library line (probe) | ranks beyond tensors | largest difference |")
    print("|---|---:|---:|---:|")
    worst = 0.0
    for name in args.cases.split(","):
        line, ranks = case(name, home)
        diffs = [abs(line - r) / MIB for r in ranks] if line is not None else []
        worst = max([worst, *diffs])
        shown = ", ".join(f"{r / MIB:.2f}" for r in ranks) or "none"
        print(f"| {name} | {'not measured' if line is None else f'{line / MIB:.2f} MiB'} | {shown} MiB | "
              f"{max(diffs):.2f} MiB |" if diffs else f"| {name} | {line} | {shown} | - |", flush=True)
    print(f"\nlargest difference: {worst:.2f} MiB (goal: 2 MiB)")
    return 0 if worst <= 2 else 1


if __name__ == "__main__":
    sys.exit(main())
