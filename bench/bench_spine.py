"""Throughput of the ftui spine against bare baselines, in one run.

    python bench/bench_spine.py [--steps 40] [--warmup 5] [--repeat 2]

1. trainer vs bare loop: the ftui trainer (launched by hand with ``accelerate launch``, exactly the
   argv of ``ftui run --dry-run``) against a minimal hand-written PyTorch loop on the same model
   (builtin tiny Llama + the same LoRA), same rows, same batch, same threads, one process.
2. orchestration: ``ftui run`` (orchestrator, journal tailing, SQLite writes) against bare
   ``accelerate launch`` of the same trainer.

Tokens/s is computed the same way for every contender: tokens of the steps after ``--warmup`` divided by
the sum of their step times (so start-up, which differs by design, is excluded). Runs alternate and
the best of ``--repeat`` is kept for each, to damp noise from other work on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "recipes" / "quickstart.toml"


def steady_tokens_per_s(step_events: list[dict], warmup: int) -> float:
    steady = [e for e in step_events if e["step"] > warmup]
    tokens = sum(e["tokens_per_s"] * e["step_time"] for e in steady)
    return tokens / sum(e["step_time"] for e in steady)


def bare_loop(steps: int, warmup: int, threads: int) -> float:
    """A minimal PyTorch loop: same model, LoRA, rows, batch and optimizer as the quickstart recipe."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoTokenizer, LlamaForCausalLM

    from runner.data.blocks import load_blocks
    from runner.spec import builtin
    from runner.spec.paths import cache_dir
    from runner.spec.recipe import load_recipe

    torch.set_num_threads(threads)
    recipe = load_recipe(RECIPE)
    tok = AutoTokenizer.from_pretrained(str(builtin.ensure_tokenizer(cache_dir())))
    blocks = load_blocks(recipe.data, tok).input_ids
    torch.manual_seed(recipe.train.seed)
    model = LlamaForCausalLM(builtin.tiny_llama_config(len(tok)))
    lora = recipe.method.lora
    model = get_peft_model(model, LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                             target_modules=list(lora.target_modules), task_type="CAUSAL_LM"))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=recipe.train.lr)
    order = torch.randperm(blocks.shape[0], generator=torch.Generator().manual_seed(0))
    B = recipe.train.batch_size
    events = []
    model.train()
    for step in range(steps):
        t0 = time.perf_counter()
        batch = blocks[order[step * B:(step + 1) * B]]
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.train.max_grad_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        float(loss)
        dt = time.perf_counter() - t0
        events.append({"step": step + 1, "step_time": dt, "tokens_per_s": B * blocks.shape[1] / dt})
    return steady_tokens_per_s(events, warmup)


def _env(home: Path) -> dict[str, str]:
    return {**os.environ, "FTUI_HOME": str(home), "FTUI_DB": f"sqlite:///{home / 'ftui.db'}"}


def bare_accelerate(home: Path, steps: int, warmup: int) -> float:
    env = _env(home)
    dry = subprocess.run([sys.executable, "-m", "tui.cli", "run", str(RECIPE), "--set", f"train.max_steps={steps}",
                          "--set", "train.save=false", "--dry-run", "--format", "json"],
                         env=env, cwd=ROOT, capture_output=True, text=True, check=True)
    launch = json.loads(dry.stdout)
    subprocess.run(launch["argv"], env={**env, **launch["env"]}, check=True, capture_output=True)
    journal = Path(launch["accelerate_config"]).parent / "events.jsonl"
    events = [json.loads(line) for line in journal.read_text().splitlines()]
    return steady_tokens_per_s([e for e in events if e["type"] == "step"], warmup)


def ftui_run(home: Path, steps: int, warmup: int) -> float:
    env = _env(home)
    name = f"bench-{time.time_ns()}"
    subprocess.run([sys.executable, "-m", "tui.cli", "run", str(RECIPE), "--set", f"train.max_steps={steps}",
                    "--set", "train.save=false", "--name", name], env=env, cwd=ROOT, check=True, capture_output=True)
    runs = json.loads(subprocess.run([sys.executable, "-m", "tui.cli", "runs", "--format", "json"], env=env, cwd=ROOT,
                                     capture_output=True, text=True, check=True).stdout)
    run_id = next(r["id"] for r in runs if r["name"] == name)
    shown = json.loads(subprocess.run([sys.executable, "-m", "tui.cli", "show", str(run_id), "--format", "json"],
                                      env=env, cwd=ROOT, capture_output=True, text=True, check=True).stdout)
    return steady_tokens_per_s(shown["metrics"], warmup)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    import psutil

    threads = psutil.cpu_count(logical=False) or 1
    results: dict[str, list[float]] = {"bare loop": [], "bare accelerate launch": [], "ftui run": []}
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        os.environ["FTUI_HOME"] = str(home)
        for i in range(args.repeat):
            results["bare loop"].append(bare_loop(args.steps, args.warmup, threads))
            results["bare accelerate launch"].append(bare_accelerate(home, args.steps, args.warmup))
            results["ftui run"].append(ftui_run(home, args.steps, args.warmup))
            print(f"round {i + 1}: " + ", ".join(f"{k} {v[-1]:,.0f}" for k, v in results.items()), flush=True)
    best = {k: max(v) for k, v in results.items()}
    print(f"\nquickstart (tiny Llama LoRA, batch 4 x 256, fp32, 1 process, {threads} threads), "
          f"{args.steps} steps, first {args.warmup} excluded, best of {args.repeat}:")
    for name, value in best.items():
        print(f"  {name:24s} {value:8,.0f} tokens/s")
    print(f"  trainer / bare loop          {best['bare accelerate launch'] / best['bare loop']:.3f}  (target >= 0.97)")
    print(f"  ftui run / bare accelerate   {best['ftui run'] / best['bare accelerate launch']:.3f}  (target >= 0.99)")


if __name__ == "__main__":
    main()
