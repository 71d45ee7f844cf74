"""Evaluation in real runs: eval loss over the whole held-out set at the intervals and at the end, stored as
named metrics, the same under single, DDP and FSDP at the same seed and global batch; samples stored."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from tests.support import Ftui

ROOT = Path(__file__).resolve().parents[2]


def _chat_file(path: Path) -> Path:
    rows = []
    for i in range(24):
        rows.append({"messages": [{"role": "user", "content": f"What is {i} plus 1?"},
                                  {"role": "assistant", "content": f"{i} plus 1 is {i + 1}."}]})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.slow
def test_eval_loss_matches_across_strategies_and_is_stored(ftui: Ftui, tmp_path: Path) -> None:
    source = _chat_file(tmp_path / "chat.jsonl")
    common = ["--set", f"data.source={json.dumps(str(source))}", "--set", "data.context_length=48",
              "--set", "data.eval_fraction=0.25", "--set", "train.max_steps=2", "--set", "train.eval_every=1",
              "--set", "eval.batch_size=2", "--set", "train.save=false"]
    plans = {"single": ["--set", "train.batch_size=2"],
             "ddp": ["--strategy", "ddp", "--nproc", "2", "--set", "train.batch_size=1"],
             "fsdp": ["--strategy", "fsdp", "--nproc", "2", "--set", "train.batch_size=1"]}
    shown: dict[str, dict[str, Any]] = {}
    for name, flags in plans.items():
        extra = ["--set", 'eval.prompts=["What is 3 plus 1?"]', "--set", "eval.max_new_tokens=3"] \
            if name != "ddp" else []
        proc = ftui.run("run", str(ROOT / "recipes" / "chat-lora.toml"), *common, *flags, *extra,
                        "--name", f"eval-{name}", timeout=900)
        assert proc.returncode == 0, f"{name}: {proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        run = next(r for r in ftui.runs() if r["name"] == f"eval-{name}")
        shown[name] = ftui.show(run["id"])
    for name, data in shown.items():
        named = data["named_metrics"]
        assert [p["step"] for p in named["eval/loss"]] == [1, 2], name  # every step, and the end (step 2)
        for point, ppl in zip(named["eval/loss"], named["eval/perplexity"], strict=True):
            assert ppl["value"] == pytest.approx(math.exp(point["value"]))
        assert named["eval/tokens"][0]["value"] > 0
    single = [p["value"] for p in shown["single"]["named_metrics"]["eval/loss"]]
    for name in ("ddp", "fsdp"):
        other = [p["value"] for p in shown[name]["named_metrics"]["eval/loss"]]
        assert other == pytest.approx(single, rel=1e-4), name
        assert shown[name]["named_metrics"]["eval/tokens"] == [
            {**p, "time": q["time"]} for p, q in zip(shown["single"]["named_metrics"]["eval/tokens"],
                                                     shown[name]["named_metrics"]["eval/tokens"], strict=True)]
    for name in ("single", "fsdp"):
        samples = shown[name]["eval_samples"]
        assert [s["step"] for s in samples] == [1, 2]
        assert [x["prompt"] for x in samples[0]["samples"]] == ["What is 3 plus 1?"]
        assert isinstance(samples[0]["samples"][0]["completion"], str)
    ddp_samples = shown["ddp"]["eval_samples"]  # the recipe's own prompts, generated under DDP
    assert [s["step"] for s in ddp_samples] == [1, 2]
    assert [x["prompt"] for x in ddp_samples[0]["samples"]] == ["What is the capital of Japan?", "What is 12 plus 30?"]
