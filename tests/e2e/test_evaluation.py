"""Evaluation in real runs (the shared matrix's chat runs): eval loss over the whole held-out set at the
intervals and at the end, stored as named metrics, the same under single and FSDP at the same seed and global
batch; samples of the prompts stored."""

from __future__ import annotations

import math

import pytest

from tests.support.matrix import Matrix


@pytest.mark.parametrize("key", ["eval-single", "eval-fsdp"])
def test_eval_loss_is_stored_at_every_interval_and_at_the_end(matrix: Matrix, key: str) -> None:
    named = matrix[key]["named_metrics"]
    assert [p["step"] for p in named["eval/loss"]] == [1, 2]  # every step, and the end (step 2)
    for point, ppl in zip(named["eval/loss"], named["eval/perplexity"], strict=True):
        assert ppl["value"] == pytest.approx(math.exp(point["value"]))
    assert named["eval/tokens"][0]["value"] > 0


def test_eval_loss_matches_across_strategies(matrix: Matrix) -> None:
    single, fsdp = matrix["eval-single"]["named_metrics"], matrix["eval-fsdp"]["named_metrics"]
    assert [p["value"] for p in fsdp["eval/loss"]] == pytest.approx([p["value"] for p in single["eval/loss"]],
                                                                    rel=1e-4)
    # The same held-out tokens, counted once over the ranks.
    assert fsdp["eval/tokens"] == [{**p, "time": q["time"]} for p, q in zip(single["eval/tokens"], fsdp["eval/tokens"],
                                                                           strict=True)]


def test_eval_samples_are_stored(matrix: Matrix) -> None:
    samples = matrix["eval-single"]["eval_samples"]  # the prompt given with --set
    assert [s["step"] for s in samples] == [1, 2]
    assert [x["prompt"] for x in samples[0]["samples"]] == ["What is 3 plus 1?"]
    assert isinstance(samples[0]["samples"][0]["completion"], str)
    sharded = matrix["eval-fsdp"]["eval_samples"]  # the recipe's own prompts, generated under FSDP
    assert [s["step"] for s in sharded] == [1, 2]
    assert [x["prompt"] for x in sharded[0]["samples"]] == ["What is the capital of Japan?", "What is 12 plus 30?"]
    assert all(isinstance(x["completion"], str) for x in sharded[0]["samples"])
