"""What reporting a script run to ftui costs per training step (issue 14: at most 1% of a step).

    python bench/bench_script_track.py [--steps 30] [--rounds 2]

A ``transformers.Trainer`` trains ftui's builtin tiny Llama on CPU with ``logging_steps=1`` (a log every
step: the worst case) and ``FtuiCallback`` journaling into a temporary run folder (``FTUI_RUN_DIR`` set,
rank 0), in-process. Three figures:

1. hook time: wall time spent inside the callback's hooks (each wrapped with ``perf_counter``), per step,
   over the mean step time: what the callback itself costs, measured directly;
2. ``track.log`` alone: mean wall time of one call (journal line written and flushed);
3. A/B: mean step time with the callback (which also turns on the Trainer's token count) over without,
   alternating rounds: includes the token count, but on a shared machine its noise is larger than 1%.

Prints one JSON object; BENCHMARKS.md records it with the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))


def train(steps: int, with_callback: bool, run_dir: Path) -> tuple[list[float], float]:
    """Train ``steps`` steps; return (per-step wall times after the first, seconds inside the hooks)."""
    os.environ["FTUI_RUN_DIR"] = str(run_dir)
    from _tiny import tiny_model_and_blocks
    from transformers import DataCollatorForLanguageModeling, Trainer, TrainerCallback, TrainingArguments

    from runner import track
    from runner.track_hf import FtuiCallback

    track._reset()
    model, tokenizer, blocks = tiny_model_and_blocks(64)
    rows = [{"input_ids": b, "attention_mask": [1] * len(b)} for b in blocks.tolist()]
    spent = [0.0]

    class Timed(FtuiCallback):
        pass

    for hook in ("on_init_end", "on_train_begin", "on_log", "on_train_end"):
        original = getattr(FtuiCallback, hook)

        def timed(self: Any, *a: Any, _f: Any = original, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return _f(self, *a, **k)
            finally:
                spent[0] += time.perf_counter() - t0

        setattr(Timed, hook, timed)

    stamps: list[float] = []

    class Clock(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, *a: Any, **k: Any) -> None:
            stamps.append(time.perf_counter())

    callbacks: list[Any] = [Clock()] + ([Timed()] if with_callback else [])
    args = TrainingArguments(output_dir=tempfile.mkdtemp(prefix="ftui-bench-"), max_steps=steps,
                             per_device_train_batch_size=4, logging_steps=1, save_strategy="no", report_to=[],
                             use_cpu=True, seed=0, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, callbacks=callbacks, train_dataset=rows,
                      data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False))
    trainer.train()
    track.finish()
    return [b - a for a, b in zip(stamps, stamps[1:], strict=False)], spent[0]


def log_call_cost(run_dir: Path, calls: int = 5000) -> float:
    """Mean seconds of one ``track.log`` call with four figures (journal line written and flushed)."""
    os.environ["FTUI_RUN_DIR"] = str(run_dir)
    from runner import track

    track._reset()
    track.start(distributed="NO")
    t0 = time.perf_counter()
    for step in range(1, calls + 1):
        track.log({"loss": 1.0 / step, "lr": 1e-3, "grad_norm": 0.5, "tokens": 256 * step}, step=step)
    elapsed = (time.perf_counter() - t0) / calls
    track.finish()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with_steps: list[float] = []
    without_steps: list[float] = []
    hook_shares: list[float] = []
    for _ in range(args.rounds):
        for flag in (True, False):
            with tempfile.TemporaryDirectory() as tmp:
                steps, hooks = train(args.steps, flag, Path(tmp))
                events = (Path(tmp) / "events.jsonl").read_text().count("\n") if flag else 0
            (with_steps if flag else without_steps).extend(steps)
            if flag:
                assert events >= args.steps, f"the callback journaled {events} events for {args.steps} steps"
                hook_shares.append(hooks / args.steps / statistics.mean(steps))
    with tempfile.TemporaryDirectory() as tmp:
        per_log = log_call_cost(Path(tmp))
    step_with, step_without = statistics.mean(with_steps), statistics.mean(without_steps)
    result = {
        "steps": args.steps,
        "rounds": args.rounds,
        "mean_step_s_with_callback": round(step_with, 4),
        "mean_step_s_without": round(step_without, 4),
        "hook_time_share_of_step_pct": round(100 * max(hook_shares), 4),
        "track_log_call_us": round(per_log * 1e6, 1),
        "track_log_share_of_step_pct": round(100 * per_log / step_without, 4),
        "ab_step_ratio": round(step_with / step_without, 4),
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
