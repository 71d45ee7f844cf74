"""A mixture of experts: the builtin tiny Mixtral's shape and saved activations against the real model (every
expert's weights, only the routed experts' activations), and the router's load from hand-made router logits
and from a real forward (runner/rank/router_load.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from runner.planner import EstimateInput, activation_bytes, estimate, shape_from_config
from runner.rank.router_load import (
    LOAD_MAX_OVER_MEAN,
    LOAD_MIN_OVER_MEAN,
    ROUTED_TOKENS,
    RouterLoad,
    load_summary,
    routed_indices,
    tokens_per_expert,
)
from runner.spec import builtin
from tests.unit.test_families import BATCH, SEQ, VOCAB, saved_bytes


def _config(**changes: Any) -> Any:
    config = builtin.tiny_mixtral_config(VOCAB)
    for key, value in changes.items():
        setattr(config, key, value)
    return config


def _model(config: Any, dtype: torch.dtype = torch.float32) -> Any:
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=dtype).train()


def test_hand_made_router_logits_give_tokens_per_expert_and_the_load() -> None:
    # 4 tokens, 4 experts, top-2: tokens 0-2 prefer experts 0 and 1, token 3 experts 2 and 3.
    logits = torch.tensor([[5.0, 4.0, 0.0, -1.0], [3.0, 2.0, 1.0, 0.0], [9.0, 8.0, 1.0, 1.5], [0.0, 0.1, 7.0, 6.0]])
    indices = routed_indices(logits, 2)  # a router that returns its logits only: their top-k
    counts = tokens_per_expert(indices, 4)
    assert counts.tolist() == [3, 3, 1, 1]
    # A router's own (logits, scores, indices) output: its indices are the choice, whatever the logits say.
    chosen = torch.tensor([[3, 2], [3, 1], [3, 0], [3, 2]])
    assert tokens_per_expert(routed_indices((logits, torch.ones(4, 2), chosen), 2), 4).tolist() == [1, 1, 2, 4]
    table = torch.stack([counts, torch.tensor([2, 2, 2, 2]), torch.zeros(4, dtype=torch.int64)])  # a dense layer
    summary = load_summary(table)
    assert summary == {LOAD_MAX_OVER_MEAN: 1.5, LOAD_MIN_OVER_MEAN: 0.5, ROUTED_TOKENS: 8.0}  # mean: 8 / 4 = 2
    assert load_summary(torch.zeros(2, 4, dtype=torch.int64)) == {}


def test_the_hooks_count_what_transformers_reports_as_router_logits() -> None:
    """Every token is routed to top-k experts in each layer; the hooks' counts are the top-k of the router
    logits transformers exposes with ``output_router_logits`` (a forward of its own, the loss untouched)."""
    config = _config()
    model = _model(config)
    load = RouterLoad(model, config.num_hidden_layers, config.num_local_experts)
    assert [layer for layer, _ in load.routers] == [0, 1]
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    with torch.no_grad():
        out = model(input_ids=ids, labels=ids, output_router_logits=True)
    counts = load.take().view(config.num_hidden_layers, config.num_local_experts)
    want = torch.stack([tokens_per_expert(torch.topk(logits, config.num_experts_per_tok, dim=-1).indices, 4)
                        for logits in out.router_logits])
    assert torch.equal(counts, want)
    assert counts.sum(dim=1).tolist() == [BATCH * SEQ * config.num_experts_per_tok] * config.num_hidden_layers
    assert load.take().sum() == 0  # taken: a fresh start
    load.close()
    with torch.no_grad():
        model(input_ids=ids)
    assert load.take().sum() == 0  # closed: no hook left


def test_the_builtin_mixtral_is_counted_exactly() -> None:
    """Every expert's weights (the stacked 3D experts and the routers) count in params, grads and optimizer
    state; the estimate's shape is the real model's."""
    config = _config()
    real = _model(config)
    shape = shape_from_config(config)
    assert (shape.family, shape.mlp, shape.experts, shape.experts_per_token) == ("mixtral", "moe", 4, 2)
    assert shape.approximate is None
    assert shape.total_params == sum(p.numel() for p in real.parameters())
    experts = sum(p.numel() for n, p in real.named_parameters() if ".experts." in n)
    assert experts == 2 * 4 * 3 * 128 * 256  # layers x experts x (gate, up, down) x hidden x expert width
    full = estimate(EstimateInput(shape, method="full", micro_batch=BATCH, seq_len=SEQ, device="cpu"))
    assert full.params == full.grads == 4 * shape.total_params
    assert full.optimizer == 8 * shape.total_params  # Adam's two fp32 moments


def _saved_vs_estimate(config: Any, method: str = "full", precision: str = "fp32") -> tuple[int, int]:
    model = _model(config)
    if method == "lora":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    measured = saved_bytes(model, precision)
    inp = EstimateInput(shape_from_config(config), method=method, precision=precision,  # type: ignore[arg-type]
                        micro_batch=BATCH, seq_len=SEQ, device="cpu")
    acts = activation_bytes(inp)
    return acts.stored + acts.weight_copies, measured


@pytest.mark.parametrize(("method", "precision"), [("full", "fp32"), ("full", "bf16"), ("lora", "fp32")])
def test_the_builtin_mixtral_saves_what_the_planner_counts(method: str, precision: str) -> None:
    estimated, measured = _saved_vs_estimate(_config(), method, precision)
    assert estimated == pytest.approx(measured, rel=0.01)  # the experts' per-layer token counts: not modelled


def test_only_the_routed_experts_save_activations() -> None:
    """Twice the experts leave a token's saved activations but for the router's fp32 softmax (4 B per expert);
    a second routed expert adds one routed copy's (``x(3I + h) + 28`` and, full, ``x(h + I)``)."""
    base_est, base = _saved_vs_estimate(_config())
    more_est, more = _saved_vs_estimate(_config(num_local_experts=8))
    tokens, layers, h, i = BATCH * SEQ, 2, 128, 256
    assert more - base == pytest.approx(tokens * layers * 4 * 4, rel=0.05)
    assert more_est - base_est == tokens * layers * 4 * 4
    top1_est, top1 = _saved_vs_estimate(_config(num_experts_per_tok=1))
    slot = 4 * (3 * i + h) + 28 + 4 * (h + i) + 4 + 8  # + its index and weight in the router's top-k
    assert base_est - top1_est == tokens * layers * slot
    assert base - top1 == pytest.approx(tokens * layers * slot, rel=0.05)


def test_an_expert_parallel_size_is_refused_with_why() -> None:
    from runner.spec.recipe import parse_recipe

    recipe = parse_recipe('[model]\nname = "builtin:tiny-mixtral"\n[launch]\nep_size = 1\n', source="t")
    assert recipe.launch.ep_size == 1
    with pytest.raises(ValueError, match="launch.ep_size"):
        parse_recipe('[model]\nname = "builtin:tiny-mixtral"\n[launch]\nstrategy = "ddp"\nnproc = 2\nep_size = 2\n',
                     source="t")


def test_an_unknown_builtin_model_names_the_builtin_ones() -> None:
    from runner.spec.recipe import parse_recipe

    with pytest.raises(ValueError, match="builtin:tiny-llama, builtin:tiny-mixtral"):
        parse_recipe('[model]\nname = "builtin:tiny-moe"\n', source="t")


def test_the_builtin_qwen2_moe_is_counted_and_its_router_load_read() -> None:
    """Qwen2-MoE's routed experts beside a shared expert: every parameter counted; its activations (the shared
    expert's gated MLP and its sigmoid gate beside the routed copies) are what the planner counts; its router
    (``Qwen2MoeTopKRouter``) is found and counted like Mixtral's."""
    config = builtin.model_config(builtin.TINY_QWEN2_MOE, VOCAB)
    model = _model(config)
    shape = shape_from_config(config)
    assert shape.total_params == sum(p.numel() for p in model.parameters())
    assert (shape.approximate, shape.shared_expert, shape.norm_topk) == (None, 256, False)
    estimated, measured = _saved_vs_estimate(config)  # bf16 and LoRA: tests/unit/test_families.py's qwen2_moe
    assert estimated == pytest.approx(measured, rel=0.01)
    load = RouterLoad(model, config.num_hidden_layers, config.num_experts)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    with torch.no_grad():
        model(input_ids=ids)
    counts = load.take().view(config.num_hidden_layers, config.num_experts)
    assert counts.sum(dim=1).tolist() == [BATCH * SEQ * config.num_experts_per_tok] * config.num_hidden_layers


def test_the_shared_expert_and_the_query_key_norms_are_what_they_add() -> None:
    """Without its shared expert a Qwen2-MoE saves what a Mixtral of the same router saves; the shared expert
    adds, per token and layer, its gated MLP's three intermediates and the down projection's input (``4I_s``),
    its gate's sigmoid (one element) and the output that sigmoid scales (``h``); OLMoE's query and key norms add
    each projection's fp32 input and rsqrt, and the normalized input for the trained weight."""
    config = builtin.model_config(builtin.TINY_QWEN2_MOE, VOCAB)
    shape = shape_from_config(config)
    inp = EstimateInput(shape, micro_batch=BATCH, seq_len=SEQ, precision="fp32", device="cpu")
    bare = replace(inp, shape=replace(shape, shared_expert=0))
    tokens, h, i_s = BATCH * SEQ, 128, 256
    # fp32: the shared linears save the MoE block's input once (the router's F.linear reads the same tensor).
    assert activation_bytes(inp).stored - activation_bytes(bare).stored == tokens * 2 * 4 * (4 * i_s + 1 + h)
    olmoe = replace(shape, shared_expert=0, qk_norm=True)
    q, k = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    normed = activation_bytes(replace(bare, shape=olmoe)).stored - activation_bytes(bare).stored
    assert normed == tokens * 2 * ((4 * q + 4 + 4 * q) + (4 * k + 4 + 4 * k))
