"""The engines' terms in the estimate, each from a written config: torch ZeRO-2's units kept gathered and the
forward's last all-gather output (runner/planner/fsdp.py), pipeline stages with their micro-batches in flight
(runner/planner/pipeline.py, runner/spec/layout.py), FSDP2's units as accelerate makes them with what each
moment of the backward holds of them, and the checkpointed backward's gradients and temporaries."""

from __future__ import annotations

from dataclasses import replace

import pytest
from transformers import GPT2Config, LlamaConfig

from runner.planner import EstimateInput, estimate, shape_from_config
from runner.planner.activations import activation_bytes
from runner.planner.fsdp import gathered_units, last_all_gather, units
from runner.planner.pipeline import kept_outputs, receive_buffers, stage_activations, stage_weights, stages
from runner.spec.layout import in_flight, runs_1f1b, stage_bounds

LLAMA = shape_from_config(LlamaConfig(hidden_size=128, intermediate_size=344, num_hidden_layers=9,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=4096))
GPT2 = shape_from_config(GPT2Config(n_embd=128, n_layer=4, n_head=4, vocab_size=4096, n_positions=256))


def _inp(**kw: object) -> EstimateInput:
    base = {"shape": LLAMA, "method": "lora", "precision": "fp32", "param_dtype": "fp32", "n_devices": 2,
            "micro_batch": 4, "seq_len": 64, "device": "cpu", "lora_targets": ("q_proj", "k_proj", "v_proj", "o_proj")}
    return EstimateInput(**{**base, **kw})  # type: ignore[arg-type]


# ---------------------------------------------------------------------- torch ZeRO-2 (FSDP2, no reshard after forward)

def test_zero2_torch_holds_every_unit_and_the_tails_all_gather_at_the_loss() -> None:
    zero2, zero3 = estimate(_inp(strategy="zero2", engine="torch")), estimate(_inp(strategy="zero3", engine="torch"))
    sh = LLAMA
    adapters = zero2.grads_total * 2  # the gradients are sharded over 2: the whole adapters, 4 bytes each
    layers = sh.layers * sh.layer_params * 4 + adapters
    # ZeRO-3 reshards each layer after its forward: at the loss only the root is gathered (its all-gather
    # output and the head together are the size of the root, counted as such).
    assert zero2.phases["forward"] - zero3.phases["forward"] == layers + sh.vocab * sh.hidden * 4
    # At the backward's start every unit is still gathered, the all-gather output freed.
    assert zero2.phases["backward"] >= zero3.phases["backward"] + layers - sh.layer_params * 4
    assert zero2.peak_phase in ("forward", "backward") and zero2.approximate is None


def test_the_last_all_gather_is_the_head_or_with_a_tied_head_the_last_layer() -> None:
    assert last_all_gather(_inp(), 0.0, 2) == LLAMA.vocab * LLAMA.hidden * 2
    tied = _inp(shape=GPT2)
    assert GPT2.tied_embeddings
    assert last_all_gather(tied, 4000.0, 4) == GPT2.layer_params * 4 + 1000.0


# ---------------------------------------------------------------------- pipeline stages

def test_stage_bounds_and_the_micro_batches_in_flight() -> None:
    assert stage_bounds(9, 2) == [(0, 5), (5, 9)]
    assert [in_flight("1f1b", s, 2, 3) for s in (0, 1)] == [2, 1]
    assert [in_flight("1f1b", s, 4, 8) for s in range(4)] == [4, 3, 2, 1]
    assert [in_flight("gpipe", s, 2, 3) for s in (0, 1)] == [3, 3]
    assert not runs_1f1b("1f1b", 1, 2)  # fewer micro-batches than stages: GPipe
    assert in_flight("1f1b", 0, 2, 1) == 1


@pytest.mark.parametrize("ckpt", [False, True])
@pytest.mark.parametrize("shape", [LLAMA, GPT2], ids=["llama", "gpt2"])
def test_the_stages_parts_add_up_to_the_whole_model(shape: object, ckpt: bool) -> None:
    inp = _inp(shape=shape, gradient_checkpointing=ckpt, strategy="pp", microbatches=2)
    acts = activation_bytes(inp)
    sh = inp.shape
    assert acts.stored == acts.first_layer + (sh.layers - 1) * acts.layer_stored + acts.post + acts.rotary
    split = stages(inp, 2)
    # Each stage computes its own rotary embedding; every other part is on exactly one stage.
    assert sum(stage_activations(acts, s) for s in split) == acts.stored + acts.rotary
    # A tied head is a second copy of the embedding on the last stage.
    extra = sh.vocab * sh.hidden if sh.tied_embeddings else 0
    assert sum(stage_weights(sh, s) for s in split) == sh.total_params + extra


def test_the_busiest_stage_is_estimated_with_its_own_layers_and_micro_batches() -> None:
    inp = _inp(strategy="pp", micro_batch=3, microbatches=3, pp_schedule="1f1b")
    first, last = stages(inp, 2)
    assert (first.layers, first.in_flight, last.layers, last.in_flight, first.rows) == (5, 2, 4, 1, 1)
    acts = activation_bytes(replace(inp, micro_batch=1))
    # The last stage keeps one micro-batch's logits (its output) per micro-batch in flight, and receives the
    # hidden state (with its gradient) of every micro-batch.
    assert kept_outputs(inp, last, 4) == 1 * 64 * LLAMA.vocab * 4
    assert receive_buffers(inp, last, 4) == 3 * 2 * 64 * LLAMA.hidden * 4
    assert receive_buffers(inp, first, 4) == 3 * 64 * LLAMA.hidden * 4
    one_f_one_b, gpipe = estimate(inp), estimate(replace(inp, pp_schedule="gpipe"))
    # GPipe holds all 3 micro-batches on the last stage: 2 more of its activations and kept logits.
    more = 2 * (stage_activations(acts, last) + 64 * LLAMA.vocab * 4)
    assert gpipe.activations - one_f_one_b.activations in (more, more - 2 * stage_activations(acts, first)
                                                            + 2 * stage_activations(acts, last))
    assert gpipe.total > one_f_one_b.total


def test_a_full_stage_runs_its_last_micro_batch_backward_beside_the_earlier_gradients() -> None:
    # A longer sequence makes the last stage (the head's logits) the busiest.
    inp = _inp(strategy="pp", method="full", micro_batch=2, microbatches=2, pp_schedule="1f1b", seq_len=256)
    last = stages(inp, 2)[1]
    b = estimate(inp)
    acts = activation_bytes(replace(inp, micro_batch=1))
    weights = stage_weights(LLAMA, last) * 4
    # The last stage (1F1B: F1 B1 F2 B2): at B2 one micro-batch's activations, its logits, its kept logits
    # and every gradient B1 left, beside the weights and AdamW's two moments (fp32) and the receive buffers.
    one = stage_activations(acts, last) + kept_outputs(inp, last, 4)
    assert b.peak_phase == "backward"
    assert b.total == 3 * weights + weights + one + acts.logits_backward + receive_buffers(inp, last, 4)


def test_tensor_parallel_activations_are_one_process_heads_and_mlp_slice() -> None:
    tp = estimate(_inp(strategy="tp"))
    local = replace(LLAMA, heads=LLAMA.heads // 2, kv_heads=LLAMA.kv_heads // 2,
                    intermediate=LLAMA.intermediate // 2)
    single = {"strategy": "single", "n_devices": 1}
    assert tp.activations_stored == estimate(_inp(**single, shape=local)).activations_stored
    assert tp.activations_stored < estimate(_inp(**single)).activations_stored


def test_naive_model_parallel_is_one_micro_batch_on_each_stage() -> None:
    split = stages(_inp(strategy="mp", microbatches=1, micro_batch=4), 2)
    assert [(s.rows, s.in_flight, s.microbatches) for s in split] == [(4, 1, 1), (4, 1, 1)]


# ---------------------------------------------------------------------- FSDP2's units and the backward

def test_fsdp2_units_tied_and_untied() -> None:
    # GPT-2 ties its head: the tail is the embedding (4096 x 128), the root keeps the positions (256 x 128)
    # and the final norm (the shape counts it as ``hidden``, its LayerNorm's bias spread over the layers);
    # Llama's embedding is its own unit, the root keeps the final RMSNorm.
    tied, untied = units(_inp(shape=GPT2), 800.0, 4), units(_inp(), 0.0, 2)
    assert (tied.tail, tied.embedding, tied.leftover) == (4096 * 128 * 4, 0, (256 * 128 + 128) * 4)
    assert tied.layer == GPT2.layer_params * 4 + 800.0 / 4
    assert (untied.tail, untied.embedding, untied.leftover) == (4096 * 128 * 2, 4096 * 128 * 2, 128 * 2)


def test_fsdp2_backward_holds_the_tail_the_prefetch_and_the_reduce_scatter_input() -> None:
    head, norm, positions = 4096 * 128, 128, 256 * 128
    layer = LLAMA.layer_params
    g = gathered_units(_inp(method="full"), 2, LLAMA.total_params, 4, False, 2)
    assert g.at_backward == (head + norm) * 2  # the tail (and the root's norm) at the backward's start
    assert g.at_loss == (head + norm + head) * 2  # and the tail's all-gather output
    assert g.at_head == (head + norm + layer) * 2  # the tail prefetches the last layer
    assert g.in_stack == (norm + 2 * layer) * 2  # a layer and the next one's prefetch
    assert g.at_end == (head + norm) * 2  # the embedding's unit
    assert g.flat_grads == layer * 2  # the reduce-scatter input, in the gathered dtype
    assert g.head_grad == head * 4 / 2  # reduced to its shard
    t = gathered_units(_inp(shape=GPT2, method="full"), 2, GPT2.total_params, 4, False, 2)
    tied_root = (head + positions + 128) * 2
    assert t.in_stack == tied_root + 2 * GPT2.layer_params * 2  # a tied tail stays gathered all backward
    assert t.at_head == t.at_backward == tied_root  # nothing prefetched: the tail came first in the forward
    assert t.at_loss == tied_root + GPT2.layer_params * 2  # the last layer's all-gather output
    assert t.head_grad == head * 2  # unsharded until the root's final callback


def test_fsdp2_last_all_gather_is_copied_out_beside_the_one_before() -> None:
    # Untied: the last layer's all-gather output, the tail's (the head) and the gathered head; tied: the tail
    # is gathered from the start, and the last layer's output and weights come beside the one before's.
    head, norm, layer = 4096 * 128, 128, LLAMA.layer_params
    g = gathered_units(_inp(), 4, 0, 4, False, 2)
    assert g.at_gather == (norm + layer + 2 * head) * 4
    t = gathered_units(_inp(shape=GPT2), 4, 0, 4, False, 2)
    assert t.at_gather == (head + 256 * 128 + 128 + 3 * GPT2.layer_params) * 4
    # torch ZeRO-2: every unit before the last is still gathered too.
    kept = gathered_units(_inp(), 4, 0, 4, True, 2)
    assert kept.at_gather == (norm + head + LLAMA.layers * layer + layer + 2 * head) * 4
    assert kept.at_head == kept.at_backward  # the layers stayed gathered: the tail prefetches nothing


def test_checkpointed_backward_holds_the_gradients_of_the_layers_above() -> None:
    # One device, full fine-tuning, a small vocabulary and long sequences (the recomputed layer is the peak):
    # the head's gradient and those of the 2 layers above the second-lowest (of 4) beside the recomputed
    # layer; without them the recompute moment is that much lower.
    sh = shape_from_config(GPT2Config(n_embd=128, n_layer=4, n_head=4, vocab_size=512, n_positions=512))
    run = _inp(shape=sh, method="full", strategy="single", n_devices=1, gradient_checkpointing=True,
               seq_len=512, micro_batch=2)
    b = estimate(run)
    acts = activation_bytes(run)
    stack_grads = 512 * 128 * 4 + 2 * sh.layer_params * 4
    params_and_state = sh.total_params * 4 * 3
    recompute = params_and_state + stack_grads + acts.stored - acts.logits + acts.recompute + acts.layer_backward
    assert b.peak_phase == "backward" and b.grads == stack_grads
    assert b.total == recompute


def test_score_gradients_come_after_the_mlp_has_freed_its_saves() -> None:
    # GPT-2 trains with attention dropout (the math path): its scores' gradients, 3 x 4 B x heads x seq per
    # token (CPU autocast keeps them fp32) with the hidden gradient, come once the MLP's backward has freed
    # what it saved: the fc output and gelu_new's four pieces (5 x I per token, I = 512).
    run = _inp(shape=GPT2, strategy="single", n_devices=1, seq_len=256, micro_batch=2)
    tokens = 2 * 256
    scores = tokens * (3 * 4 * 4 * 256 + 2 * 4 * 128)
    mlp = tokens * 4 * (2 * 512 + 2 * 128)
    assert activation_bytes(run).layer_backward == max(mlp, scores - tokens * 5 * 4 * 512)
