"""DeepSpeed's buffers in the estimate, from the config ftui writes: the reduce bucket sized to the model,
when each stage holds it, and ZeRO-3's gathered parameters (runner/planner/deepspeed.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from runner.planner import estimate, inputs_from_recipe
from runner.planner.deepspeed import step_transient_bytes, zero3_prefetch_bytes
from runner.spec import builtin
from runner.spec.deepspeed_config import (
    CPU_BUCKET,
    DEEPSPEED_FILE,
    ZERO3_PERSISTENCE_THRESHOLD,
    ZERO3_PREFETCH_BUCKET,
)
from runner.spec.launch import build_launch
from runner.spec.recipe import Recipe, load_recipe
from runner.watch.estimate import trainable_count
from tests.support import QUICKSTART

RUN = Path("/tmp/ftui-test-run")


def _recipe(strategy: str, *sets: str) -> Recipe:
    return load_recipe(QUICKSTART, [f"launch.strategy='{strategy}'", "launch.nproc=2", "launch.engine='deepspeed'",
                                    "launch.device='cpu'", "data.context_length=64", *sets])


def _written(recipe: Recipe) -> dict:
    spec = build_launch(recipe, RUN, port=29555, cpu_threads=1, trainable=trainable_count(recipe))
    return json.loads(spec.files[DEEPSPEED_FILE])["zero_optimization"]


def _estimate(recipe: Recipe):  # type: ignore[no-untyped-def]
    return estimate(replace(inputs_from_recipe(recipe, allow_network=False), device="cpu"))


@pytest.mark.parametrize(("sets", "trainable"), [((), 122_880), (("method.type='full'",), 12_587_904)])
def test_the_written_buckets_are_the_trainable_count_where_the_model_is_smaller(sets: tuple[str, ...],
                                                                                trainable: int) -> None:
    zero = _written(_recipe("zero2", *sets))
    assert zero["reduce_bucket_size"] == zero["allgather_bucket_size"] == -(-trainable // 64) * 64 < CPU_BUCKET


def test_a_model_larger_than_the_bucket_keeps_the_configured_size() -> None:
    recipe = load_recipe(QUICKSTART, ["model.name='TinyLlama/TinyLlama-1.1B-Chat-v1.0'", "method.type='full'",
                                      "launch.strategy='zero2'", "launch.nproc=2", "launch.engine='deepspeed'",
                                      "launch.device='cpu'"])
    assert _written(recipe)["reduce_bucket_size"] == CPU_BUCKET


@pytest.mark.parametrize("strategy", ["zero1", "zero2"])
def test_zero12_hold_the_reduce_bucket_through_the_backward_only(strategy: str) -> None:
    recipe = _recipe(strategy, "method.type='full'")
    bucket = _written(recipe)["reduce_bucket_size"] * 4  # fp32 gradients
    b = _estimate(recipe)
    assert b.peak_phase == "backward" and b.ds_reduce_bucket == bucket


def test_zero2_allocates_its_bucket_at_the_heads_gradient() -> None:
    b = _estimate(_recipe("zero2", "method.type='full'"))
    # The first gradient is the head's: the loss's backward has freed the saved fp32 log-softmax and one of
    # its two logits-sized temporaries; the logits' gradient is alive beside the bucket.
    logits = 4 * 64 * 4096 * 4  # micro-batch 4 x context 64 x vocabulary 4096, fp32
    assert b.ds_reduce_bucket > 0
    assert b.activations == b.activations_stored - logits and b.transient == logits


def _large_parameters() -> list[int]:
    """An independent count: the tiny Llama's parameters at or above the persistence threshold, built on
    the meta device."""
    import torch
    from transformers import LlamaForCausalLM

    with torch.device("meta"):
        model = LlamaForCausalLM(builtin.tiny_llama_config(4096))
    return [p.numel() for p in model.parameters() if p.numel() >= ZERO3_PERSISTENCE_THRESHOLD]


@pytest.mark.parametrize("sets", [(), ("method.type='full'",)])
def test_zero3_forward_peaks_at_the_head_fetch_with_the_prefetch_buffer_beside_the_gathered_copies(
        sets: tuple[str, ...]) -> None:
    recipe = _recipe("zero3", *sets)
    b = _estimate(recipe)
    zero = _written(recipe)
    assert b.ds_reduce_bucket == zero["reduce_bucket_size"] * 4
    large = _large_parameters()
    assert sum(large) < zero["stage3_prefetch_bucket_size"]  # one prefetch takes every large parameter
    assert b.peak_phase == "forward" and b.ds_gathered == sum(large) * 4
    # The flat buffer: each rank's padded partition of each parameter, times the 2 ranks.
    assert b.ds_prefetch == sum(-(-p // 2) * 2 for p in large) * 4
    # The head is not run yet: no logits transients at that moment.
    assert b.transient == 0
    # The flat gradient partitions exist from the optimizer's creation on: half the trainable elements, fp32.
    assert b.grads == trainable_count(recipe) * 4 // 2
    assert b.approximate is None


def test_a_model_larger_than_the_prefetch_bucket_prefetches_one_bucket() -> None:
    inp = inputs_from_recipe(_recipe("zero3"), allow_network=False)
    big = replace(inp, shape=replace(inp.shape, vocab=2 * ZERO3_PREFETCH_BUCKET // inp.shape.hidden))
    assert zero3_prefetch_bytes(big, 2, 2) == ZERO3_PREFETCH_BUCKET * 2
    assert zero3_prefetch_bytes(inp, 2, 2) < ZERO3_PREFETCH_BUCKET * 2


def test_zero3_optimizer_step_holds_the_flat_fp32_gradient_and_adamw_temporaries() -> None:
    recipe = _recipe("zero3", "method.type='full'")
    b = _estimate(recipe)
    partition = trainable_count(recipe) / 2
    # On CPU: the flattened fp32 gradient of the master partition, then AdamW's per-parameter loop over that
    # one flat parameter (sqrt(exp_avg_sq) and the quotient); on CUDA foreach's sqrt alone.
    assert b.phases["optimizer"] == b.model_states + b.ds_reduce_bucket + 3 * 4 * partition
    cuda = replace(inputs_from_recipe(recipe, allow_network=False), device="cuda")
    assert step_transient_bytes(cuda, partition) == 2 * 4 * partition


def test_parameters_partitioned_by_zero_init_are_counted_whole() -> None:
    import torch

    from runner.rank.model_load import param_count

    layer = torch.nn.Linear(384, 1024)
    # What deepspeed.zero.Init leaves on a rank (partition_parameters.py): an empty tensor, the size in ds_numel.
    layer.weight.ds_numel = layer.weight.numel()  # type: ignore[attr-defined]
    layer.weight.data = torch.empty(0)
    assert param_count(layer.parameters()) == 384 * 1024 + 1024


@pytest.mark.parametrize("strategy", ["zero1", "zero2"])
def test_zero12_optimizer_step_frees_the_gradients_once_flattened(strategy: str) -> None:
    recipe = _recipe(strategy, "method.type='full'")
    b = _estimate(recipe)
    partition = trainable_count(recipe) / 2
    # The fp32 partition gradient and AdamW's two temporaries replace the gradients (stage_1_and_2.py step);
    # the reduce bucket was freed at the backward's end.
    assert b.phases["optimizer"] == b.params + b.optimizer + b.master + 3 * 4 * partition
