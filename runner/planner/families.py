"""The architecture features the activation formula needs, read from a transformers config: which linears read
which input, the norm, the MLP, how attention and MLP sit in a layer, what the attention kernel is given (key
and value heads, a mask), a mixture of experts' routing. Pure functions of the config; docs/memory-model.md
("Architectures") lists what each feature changes, with the measurement behind it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runner.planner.shapes import LinearSpec


@dataclass(frozen=True)
class Family:
    """How one ``model_type``'s decoder layer is built (transformers' modeling file for it).

    Attributes:
        names: The linears reading each input: attention in, attention out, MLP in, MLP out.
        norm: ``rms`` (RMSNorm, computed in fp32) or ``layer`` (LayerNorm).
        mlp: ``gated`` (act(gate) * up, then down), ``plain`` (fc1, act, fc2) or ``moe`` (routed gated experts).
        parallel: ``""`` (attention, then the MLP on the updated residual), ``shared_norm`` (attention and MLP
            read one norm of the layer input: Phi, Falcon-7B) or ``two_norms`` (each reads its own norm of the
            layer input: GPT-NeoX, Falcon-40B).
        norm_fp32_output: The RMSNorm multiplies in fp32 (Gemma's ``1 + weight``).
        attn_out_copy: The attention output reaches the output projection as a copy: the query is laid out
            head-major (GPT-NeoX's, Phi's and Phi-3's rotary concatenates the rotated and the passed parts), so
            the kernel's output is too and ``transpose(1, 2).contiguous()`` copies it.
        kv_layout: What the attention kernel is given for keys and values when there are fewer than query
            heads: ``gqa`` (transformers' SDPA integration: the kv heads with ``enable_gqa``, or repeated to
            every head when a mask is passed), ``expanded`` (the model expands them to every head itself:
            Falcon-40B) or ``broadcast`` (fewer heads, which only SDPA's math path takes: Falcon-7B).
        mask_always: The model always materializes its causal mask (Falcon), so the kernel gets a mask.
        rotary: The model rotates (part of) each head: its cos and sin are saved once.
        eager_softmax_fp32: Its eager attention takes the softmax in fp32 (``eager_attention_forward``'s
            ``dtype=torch.float32``); GPT-2's and Falcon's take it in the scores' dtype.
        qk_norm: An RMSNorm over the whole query projection and one over the key projection (OLMoE's
            ``q_norm``, ``k_norm``).
    """

    names: tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], tuple[str, ...]]
    norm: str = "rms"
    mlp: str = "gated"
    parallel: str = ""
    norm_fp32_output: bool = False
    attn_out_copy: bool = False
    kv_layout: str = "gqa"
    mask_always: bool = False
    rotary: bool = True
    eager_softmax_fp32: bool = True
    qk_norm: bool = False


_LLAMA_NAMES = (("q_proj", "k_proj", "v_proj"), ("o_proj",), ("gate_proj", "up_proj"), ("down_proj",))
_FALCON_NAMES = (("query_key_value",), ("dense",), ("dense_h_to_4h",), ("dense_4h_to_h",))

# Families whose decoder layer the activation formula models (docs/memory-model.md, "Architectures").
FAMILIES: dict[str, Family] = {
    "llama": Family(_LLAMA_NAMES),
    "mistral": Family(_LLAMA_NAMES),
    "qwen2": Family(_LLAMA_NAMES),
    "gemma": Family(_LLAMA_NAMES, norm_fp32_output=True),
    "phi3": Family((("qkv_proj",), ("o_proj",), ("gate_up_proj",), ("down_proj",)), attn_out_copy=True),
    "phi": Family((("q_proj", "k_proj", "v_proj"), ("dense",), ("fc1",), ("fc2",)), norm="layer", mlp="plain",
                  parallel="shared_norm", attn_out_copy=True),
    # GPT-2's two c_proj (attention h x h, MLP 4h x h) are told apart by shape in features().
    "gpt2": Family((("c_attn",), ("c_proj",), ("c_fc",), ("c_proj",)), norm="layer", mlp="plain", rotary=False,
                   eager_softmax_fp32=False),
    "gpt_neox": Family(_FALCON_NAMES, norm="layer", mlp="plain", parallel="two_norms", attn_out_copy=True),
    "opt": Family((("q_proj", "k_proj", "v_proj"), ("out_proj",), ("fc1",), ("fc2",)), norm="layer", mlp="plain",
                  rotary=False),
    "falcon": Family(_FALCON_NAMES, norm="layer", mlp="plain", mask_always=True, eager_softmax_fp32=False),
    "mixtral": Family((("q_proj", "k_proj", "v_proj"), ("o_proj",), (), ()), mlp="moe"),
    # Qwen2-MoE: the routed experts beside a shared expert (a gated MLP: these MLP linears) and its gate.
    "qwen2_moe": Family((("q_proj", "k_proj", "v_proj"), ("o_proj",), ("gate_proj", "up_proj", "shared_expert_gate"),
                         ("down_proj",)), mlp="moe"),
    # OLMoE: an RMSNorm on the whole query and key projections (q_norm, k_norm) before the rotary embedding.
    "olmoe": Family((("q_proj", "k_proj", "v_proj"), ("o_proj",), (), ()), mlp="moe", qk_norm=True),
}


def _cfg(config: Any, *names: str, default: Any = None) -> Any:
    """The first of ``names`` the config has a value for."""
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    return default


def _rotary_fraction(config: Any) -> float:
    """The part of each head that is rotated (GPT-NeoX 0.25, Phi 0.5, the others 1)."""
    rope = getattr(config, "rope_parameters", None) or {}
    frac = rope.get("partial_rotary_factor") if isinstance(rope, Mapping) else None
    return float(frac if frac is not None else _cfg(config, "partial_rotary_factor", "rotary_pct", default=1.0))


def _sliding_layers(config: Any, layers: int) -> tuple[int | None, int]:
    """The sliding window and how many layers use it: the layers ``layer_types`` marks (Qwen2), else every
    layer of a model with a window (Mistral, Phi-3, Mixtral)."""
    window = getattr(config, "sliding_window", None)
    if not window:
        return None, 0
    types = getattr(config, "layer_types", None)
    if isinstance(types, (list, tuple)):
        return int(window), sum(1 for t in types if t == "sliding_attention")
    return int(window), layers


def _falcon(config: Any, fam: Family) -> tuple[Family, str | None]:
    """Falcon's layer as its config arranges it, and why it is not modelled (ALiBi), if so."""
    new = bool(getattr(config, "new_decoder_architecture", False))
    if new:
        two = (getattr(config, "num_ln_in_parallel_attn", None) or 2) == 2
        fam = Family(fam.names, "layer", "plain", "two_norms" if two else "shared_norm", kv_layout="expanded",
                     mask_always=True, eager_softmax_fp32=False)
    elif bool(getattr(config, "parallel_attn", True)):
        fam = Family(fam.names, "layer", "plain", "shared_norm", kv_layout="broadcast", mask_always=True,
                     eager_softmax_fp32=False)
    else:
        fam = Family(fam.names, "layer", "plain", kv_layout="broadcast", mask_always=True, eager_softmax_fp32=False)
    if getattr(config, "alibi", False):
        return fam, "Falcon with ALiBi is not modelled (its bias makes a float mask per head)"
    return fam, None


def _family(config: Any, family: str) -> tuple[Family | None, str | None]:
    """The family as this config arranges it, and why it is not modelled (None: it is)."""
    fam = FAMILIES.get(family)
    if fam is None:
        return None, (f"architecture {family!r} is not modelled: its activations are estimated with the Llama layer "
                      "(modelled: " + ", ".join(sorted(FAMILIES)) + ")")
    if family == "falcon":
        return _falcon(config, fam)
    if family == "gpt_neox" and not getattr(config, "use_parallel_residual", True):
        fam = Family(fam.names, "layer", "plain", attn_out_copy=True)
    if family == "qwen2_moe" and (getattr(config, "mlp_only_layers", None)
                                  or getattr(config, "decoder_sparse_step", 1) != 1):
        return fam, ("Qwen2-MoE with dense layers (mlp_only_layers, decoder_sparse_step above 1) is not modelled: "
                     "every layer is estimated as a mixture of experts")
    if family == "opt":
        proj = getattr(config, "word_embed_proj_dim", None)
        if not getattr(config, "do_layer_norm_before", True) or (proj and proj != config.hidden_size):
            return fam, "OPT with its norm after the layer or a projected embedding (OPT-350M) is not modelled"
    return fam, None


def _dropout(config: Any, family: str) -> dict[str, float]:
    """The dropout probabilities that keep masks in training."""
    resid = _cfg(config, "resid_pdrop", "hidden_dropout", default=0.0)
    if family == "opt":
        resid = _cfg(config, "dropout", default=0.0)
    act = _cfg(config, "activation_dropout", default=0.0) if family == "opt" else 0.0
    return {
        "attn_dropout": float(_cfg(config, "attention_dropout", "attn_pdrop", default=0.0)),
        "resid_dropout": float(resid),
        "embd_dropout": float(_cfg(config, "embd_pdrop", "embedding_dropout", default=0.0)),
        "act_dropout": float(act),
    }


def _moe(config: Any) -> dict[str, Any]:
    """A mixture of experts' size: experts per layer, experts each token is routed to, the shared expert's width
    (Qwen2-MoE's ``shared_expert_intermediate_size``; 0: none) and whether the router renormalizes the top-k
    weights (Mixtral always; Qwen2-MoE and OLMoE when ``norm_topk_prob``)."""
    experts = int(_cfg(config, "num_local_experts", "num_experts", default=0))
    renorm = getattr(config, "model_type", "") == "mixtral" or bool(getattr(config, "norm_topk_prob", False))
    return {"experts": experts, "experts_per_token": int(_cfg(config, "num_experts_per_tok", default=0)),
            "shared_expert": int(_cfg(config, "shared_expert_intermediate_size", default=0)), "norm_topk": renorm}


def kv_heads(config: Any, heads: int) -> int:
    """Key/value heads of the projections: Falcon-7B's multi-query attention has one, whatever ``num_kv_heads``
    says; Falcon-40B's new decoder has ``num_kv_heads``."""
    if getattr(config, "model_type", "") == "falcon" and not getattr(config, "new_decoder_architecture", False):
        return 1 if getattr(config, "multi_query", True) else heads
    return int(_cfg(config, "num_key_value_heads", "num_kv_heads", default=heads))


def mlp_intermediate(config: Any, hidden: int) -> int:
    """The MLP's intermediate size (an expert's, in a mixture of experts: Qwen2-MoE's ``moe_intermediate_size``,
    its ``intermediate_size`` being that of dense layers)."""
    return int(_cfg(config, "moe_intermediate_size", "intermediate_size", "ffn_dim", "ffn_hidden_size", "n_inner", default=4 * hidden))


def features(config: Any, linears: Mapping[str, LinearSpec], biases: bool) -> dict[str, Any]:
    """The :class:`runner.planner.shapes.ModelShape` fields the activation formula needs, read from the config.

    Args:
        config: A transformers ``PretrainedConfig`` of a causal language model.
        linears: The model's linear modules by short name (to tell GPT-2's two ``c_proj`` apart).
        biases: Whether its linears have biases.
    """
    family = str(getattr(config, "model_type", "") or "unknown")
    act = str(_cfg(config, "hidden_act", "hidden_activation", "activation_function", "activation", default="silu"))
    layers = int(_cfg(config, "num_hidden_layers", "n_layer", default=1))
    window, sliding = _sliding_layers(config, layers)
    common: dict[str, Any] = {"family": family, "act": act, "biases": biases, "sliding_window": window,
                              "sliding_layers": sliding, **_dropout(config, family)}
    fam, why = _family(config, family)
    if fam is None:
        return {**common, "approximate": why}
    attn_in, attn_out, mlp_in, mlp_out = fam.names
    if family == "gpt2":  # the attention's c_proj is h x h, the MLP's 4h x h: shapes.py keys the second by shape
        square = [k for k, v in linears.items() if k.startswith("c_proj") and v.in_features == v.out_features]
        other = [k for k in linears if k.startswith("c_proj") and k not in square]
        attn_out, mlp_out = tuple(square), tuple(other)
    return {**common, "norm": fam.norm, "mlp": fam.mlp, "attn_in": attn_in, "attn_out": attn_out,
            "mlp_in": mlp_in, "mlp_out": mlp_out, "parallel_block": fam.parallel == "shared_norm",
            "parallel_residual": fam.parallel == "two_norms", "norm_fp32_output": fam.norm_fp32_output,
            "attn_out_copy": fam.attn_out_copy, "kv_layout": fam.kv_layout, "mask_always": fam.mask_always,
            "rotary_fraction": _rotary_fraction(config) if fam.rotary else 0.0,
            "positions_per_token": family == "opt", "approximate": why, "eager_softmax_fp32": fam.eager_softmax_fp32,
            "qk_norm": fam.qk_norm, **(_moe(config) if fam.mlp == "moe" else {})}
