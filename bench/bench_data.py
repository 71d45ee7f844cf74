"""The data step and evaluation: tokenizing a 100k-row chat JSONL, cold vs cached, and what an evaluation costs.

    python bench/bench_data.py [--rows 100000] [--runs]

1. Data step (in process, the trainer's own function, runner.data.prepare.load_data): a chat JSONL of
   ``--rows`` conversations (recipes/data/make_chat.py's generator), completion-only labels, packed
   blocks of 256 and a 1% eval split: tokens/s of the cold step (read, render, tokenize, pack, write the
   cache) and the wall time cold vs cached.
2. ``--runs``: time to first step of a real ``ftui run`` (chat-lora recipe on that file, max_steps=1,
   no eval), cold (empty data cache: the pre-flight tokenizes) then cached (same recipe again), each
   ``--repeat`` times after a warm-up run: from the command's start to the start of training (the
   ``start`` event) and to step 1's event in the journal.
3. Evaluation cost: ``runner.rank.evaluate.eval_loss`` over an eval set of 16 blocks of 128 against the bare forward
   passes over the same batches (the builtin model, one process): the ratio says what an evaluation
   adds beyond its own forwards.

Prints one JSON object; BENCHMARKS.md records the figures with the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "recipes" / "data"))


def write_chat(path: Path, rows: int) -> None:
    from make_chat import conversations

    with open(path, "w", encoding="utf-8") as fh:
        for row in conversations(rows, seed=7):
            fh.write(json.dumps(row) + "\n")


def data_step(path: Path) -> dict[str, Any]:
    from runner.data import prepare
    from runner.spec.recipe import parse_recipe

    recipe = parse_recipe(f'[data]\nsource = "{path}"\nformat = "chat"\ntrain_on = "completions"\n'
                          'context_length = 256\neval_fraction = 0.01\n')
    tokenizer = prepare.load_tokenizer(recipe)
    cold = prepare.load_data(recipe.data, tokenizer, 0)
    cached = prepare.load_data(recipe.data, tokenizer, 0)
    assert not cold.cached and cached.cached
    return {"rows": sum(1 for _ in open(path)), "tokens": cold.tokens, "cold_s": round(cold.seconds, 2),
            "cached_s": round(cached.seconds, 3), "tokens_per_s_cold": round(cold.tokens / cold.seconds),
            "cached_speedup": round(cold.seconds / cached.seconds, 1),
            "blocks": int(cold.train.input_ids.shape[0])}


def first_step_s(path: Path, home: Path) -> dict[str, float]:
    """One real ``ftui run`` of chat-lora on ``path`` (max_steps 1): seconds from the command's start to
    the start of training (the ``start`` event, written just before step 1) and to step 1's event."""
    env = {**os.environ, "FTUI_HOME": str(home), "PYTHONPATH": str(ROOT)}
    env.pop("FTUI_DB", None)
    t0 = time.time()
    subprocess.run([sys.executable, "-m", "tui.cli", "run", str(ROOT / "recipes" / "chat-lora.toml"),
                    "--set", f'data.source="{path}"', "--set", "train.max_steps=1", "--set", "data.context_length=256", "--set", "data.eval_fraction=0.0",
                    "--set", "train.eval_every=0", "--set", "eval.prompts=[]", "--set", "train.save=false", "--sample-interval", "0"],
                   env=env, check=True, capture_output=True, cwd=ROOT)
    journal = max((home / "runs").iterdir(), key=lambda p: p.stat().st_mtime) / "events.jsonl"
    times = {}
    for line in journal.read_text().splitlines():
        event = json.loads(line)
        if event["type"] in ("start", "step") and event["type"] not in times:
            times[event["type"]] = float(event["time"]) - t0
    return {"to_training_s": times["start"], "to_first_step_s": times["step"]}


def first_steps(path: Path, home: Path, repeat: int) -> dict[str, Any]:
    """Time to first step cold (the data not in the cache: the pre-flight tokenizes) and cached (the same
    recipe again), ``repeat`` times each, after a warm-up run on a small file in the same home (it
    trains the builtin tokenizer and warms the page cache, which neither figure should include)."""
    small = home.parent / "warmup.jsonl"
    write_chat(small, 200)
    first_step_s(small, home)
    rounds: dict[str, list[dict[str, float]]] = {"cold": [], "cached": []}
    for _ in range(repeat):
        shutil.rmtree(home / "cache" / "data", ignore_errors=True)
        rounds["cold"].append(first_step_s(path, home))
        rounds["cached"].append(first_step_s(path, home))
    out: dict[str, Any] = {"rounds": rounds}
    for what in ("to_training_s", "to_first_step_s"):
        cold = statistics.median(r[what] for r in rounds["cold"])
        cached = statistics.median(r[what] for r in rounds["cached"])
        out[what] = {"cold": round(cold, 2), "cached": round(cached, 2), "speedup": round(cold / cached, 2)}
    return out


def eval_cost() -> dict[str, Any]:
    import torch
    from accelerate import Accelerator
    from transformers import LlamaForCausalLM

    from runner.data.blocks import Blocks
    from runner.rank import evaluate
    from runner.spec import builtin

    torch.manual_seed(0)
    model = LlamaForCausalLM(builtin.tiny_llama_config())
    acc = Accelerator(cpu=True)
    blocks = Blocks(torch.randint(0, 4096, (16, 128)), None, None)
    batch = 4
    evaluate.eval_loss(model, Blocks(blocks.input_ids[:4], None, None), acc, batch, "cpu")  # warm-up
    bare, full = [], []
    for _ in range(2):
        t0 = time.perf_counter()
        with torch.no_grad():
            model.eval()
            for i in range(0, 16, batch):
                model(input_ids=blocks.input_ids[i : i + batch]).logits.sum()
        bare.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        evaluate.eval_loss(model, blocks, acc, batch, "cpu")
        full.append(time.perf_counter() - t0)
    return {"eval_blocks": 16, "seq": 128, "batch": batch, "forwards_only_s": round(min(bare), 3),
            "eval_loss_s": round(min(full), 3), "ratio": round(min(full) / min(bare), 3)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--runs", action="store_true")
    parser.add_argument("--runs-only", action="store_true", help="only the time to first step (real runs)")
    parser.add_argument("--repeat", type=int, default=3, help="cold and cached runs each (median reported)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["FTUI_HOME"] = tmp
        path = Path(tmp) / "chat100k.jsonl"
        write_chat(path, args.rows)
        out: dict[str, Any] = {"load_average": os.getloadavg()[0]}
        if not args.runs_only:
            out["data_step"] = data_step(path)
        if args.runs or args.runs_only:
            out["first_step"] = first_steps(path, Path(tmp) / "runs-home", args.repeat)
        if not args.runs_only:
            out["eval"] = eval_cost()
        out["load_average_end"] = os.getloadavg()[0]
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
