"""The model's shape (layers, widths, linear modules) that the memory formulas need, and where it comes from:
a transformers config (a local folder, the Hugging Face cache, or the hub), a builtin table of known models, or a
parameter count. This is the planner's only module that reads files."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, NamedTuple

from runner.planner.families import features, kv_heads, mlp_intermediate
from runner.planner.hub import hub_model_problem, in_cache
from runner.spec import builtin

if TYPE_CHECKING:
    from transformers import PretrainedConfig


@dataclass(frozen=True)
class LinearSpec:
    """One kind of linear layer in a model: its shape and how many the model has."""

    in_features: int
    out_features: int
    count: int


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder-only transformer that the estimate needs.

    Attributes:
        total_params: Every parameter, counted once (tied embeddings once).
        layers: Decoder layers.
        hidden: Hidden size ``h``.
        heads: Attention heads ``a``.
        kv_heads: Key/value heads (``heads`` without GQA).
        head_dim: Size of one head.
        intermediate: MLP intermediate size.
        vocab: Vocabulary size.
        tied_embeddings: Whether ``lm_head`` shares the input embedding.
        linears: Linear module short name (``q_proj``, ``lm_head``...) to its shape and count. A short name
            used with two shapes gets a second key ``name@INxOUT``.
    """

    total_params: int
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied_embeddings: bool
    linears: Mapping[str, LinearSpec] = field(hash=False)
    family: str = "llama"
    """``config.model_type`` (``llama`` for shapes built without a config)."""
    norm: str = "rms"
    """``rms`` (RMSNorm, computed in fp32) or ``layer`` (LayerNorm)."""
    mlp: str = "gated"
    """``gated`` (SwiGLU/GeGLU: act(gate) * up, then down) or ``plain`` (fc1, act, fc2)."""
    act: str = "silu"
    """The MLP activation as transformers names it (``silu``, ``gelu``, ``gelu_pytorch_tanh``, ``gelu_new``...)."""
    attn_in: tuple[str, ...] = ("q_proj", "k_proj", "v_proj")
    """The linears reading the attention's normalized input (one name when q, k, v are fused)."""
    attn_out: tuple[str, ...] = ("o_proj",)
    mlp_in: tuple[str, ...] = ("gate_proj", "up_proj")
    mlp_out: tuple[str, ...] = ("down_proj",)
    parallel_block: bool = False
    """Attention and MLP read one shared norm (Phi, GPT-J): one norm per layer."""
    attn_dropout: float = 0.0
    resid_dropout: float = 0.0
    embd_dropout: float = 0.0
    biases: bool = False
    norm_fp32_output: bool = False
    """Gemma's RMSNorm multiplies in fp32 (``1 + weight``), so a trained norm keeps a 4-byte normalized copy."""
    approximate: str | None = None
    """Why the activation formula is only approximate for this model (None: the family is modelled)."""
    position_embedding_params: int = 0
    """Learned position embeddings (GPT-2's ``wpe``): outside the layers, in FSDP's root unit."""
    parallel_residual: bool = False
    """Attention and MLP each read their own norm of the layer input (GPT-NeoX, Falcon-40B): two norms, one
    saved input."""
    attn_out_copy: bool = False
    """The output projection reads a copy of the attention output (runner/planner/families.py: Family)."""
    kv_layout: str = "gqa"
    """What the attention kernel is given for keys and values (runner/planner/families.py: Family)."""
    mask_always: bool = False
    """The model always passes the attention kernel a materialized causal mask (Falcon)."""
    sliding_window: int | None = None
    """Tokens a sliding-window layer attends to (Mistral, Qwen2, Phi-3, Mixtral); None: no window."""
    sliding_layers: int = 0
    """Layers with the sliding window."""
    rotary_fraction: float = 1.0
    """The part of each head rotary embeddings rotate (GPT-NeoX 0.25, Phi 0.5; 0 for learned positions)."""
    positions_per_token: bool = False
    """The learned position embedding is looked up per token (OPT): full fine-tuning saves its int64 indices."""
    act_dropout: float = 0.0
    """Dropout on the MLP's activation (OPT's ``activation_dropout``)."""
    eager_softmax_fp32: bool = True
    """Its eager attention takes the softmax in fp32 (runner/planner/families.py: Family)."""
    experts: int = 0
    """Experts per layer of a mixture of experts (Mixtral); 0: a dense MLP."""
    experts_per_token: int = 0
    """Experts each token is routed to."""
    shared_expert: int = 0
    """The intermediate size of a shared expert every token goes through beside the routed ones (Qwen2-MoE's
    gated ``shared_expert`` MLP, scaled by the sigmoid of ``shared_expert_gate``); 0: none."""
    norm_topk: bool = True
    """The router renormalizes the top-k routing weights (Mixtral; Qwen2-MoE and OLMoE with ``norm_topk_prob``)."""
    qk_norm: bool = False
    """An RMSNorm over the whole query projection and one over the key projection (OLMoE)."""
    largest_weight: int = 0
    """Elements of the largest parameter tensor (a Mixtral layer's stacked experts outgrow every linear)."""

    @property
    def linear_params(self) -> int:
        """Weights of every linear layer (biases not included), a tied ``lm_head`` not counted twice."""
        n = sum(s.in_features * s.out_features * s.count for s in self.linears.values())
        if self.tied_embeddings and "lm_head" in self.linears:
            lm = self.linears["lm_head"]
            n -= lm.in_features * lm.out_features * lm.count
        return n

    @property
    def embedding_params(self) -> int:
        """Input embedding plus an untied output head."""
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    @property
    def layer_params(self) -> int:
        """Parameters of one decoder layer (the rest spread evenly)."""
        rest = self.total_params - self.embedding_params - self.position_embedding_params - self.hidden
        return max(0, rest) // max(1, self.layers)


def _module_short_name(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def shape_from_config(config: PretrainedConfig) -> ModelShape:
    """Build the shape of a transformers model from its config, exactly.

    The model is instantiated on the meta device (no memory, no weights) and its ``nn.Linear`` modules (and
    GPT-2 style ``Conv1D``) are walked, so counts are exact for any architecture ``AutoModelForCausalLM``
    knows.

    Args:
        config: A transformers ``PretrainedConfig`` of a causal language model.

    Returns:
        The model's shape.
    """
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
    total = sum(p.numel() for p in model.parameters())
    largest = max((p.numel() for p in model.parameters()), default=0)
    linears: dict[str, LinearSpec] = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            fin, fout = module.in_features, module.out_features
        elif type(module).__name__ == "Conv1D" and hasattr(module, "nf"):
            fin, fout = int(module.weight.shape[0]), int(module.weight.shape[1])
        else:
            continue
        key = _module_short_name(name)
        if key in linears and (linears[key].in_features, linears[key].out_features) != (fin, fout):
            key = f"{key}@{fin}x{fout}"
        old = linears.get(key)
        linears[key] = LinearSpec(fin, fout, (old.count if old else 0) + 1)

    hidden = int(_cfg(config, "hidden_size", "n_embd", "d_model"))
    heads = int(_cfg(config, "num_attention_heads", "n_head"))
    head_dim = int(getattr(config, "head_dim", None) or hidden // heads)
    vocab = int(config.vocab_size)
    embeddings = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Embedding))
    biases = any(getattr(m, "bias", None) is not None for m in model.modules()
                 if isinstance(m, torch.nn.Linear) or type(m).__name__ == "Conv1D")
    return ModelShape(
        total_params=total,
        layers=int(_cfg(config, "num_hidden_layers", "n_layer")),
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads(config, heads),
        head_dim=head_dim,
        intermediate=mlp_intermediate(config, hidden),
        vocab=int(config.vocab_size),
        tied_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        linears=linears,
        position_embedding_params=max(0, embeddings - vocab * hidden),
        largest_weight=largest,
        **features(config, linears, biases),
    )


def _cfg(config: Any, *names: str) -> Any:
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    raise ValueError(f"config has none of {names}")


class _Ref(NamedTuple):
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int


# Published Llama-family shapes (head dim 64 for TinyLlama and Llama 3.2 1B, 128 otherwise).
LLAMA_REFERENCE_SHAPES: tuple[_Ref, ...] = (
    _Ref("TinyLlama-1.1B", 22, 2048, 32, 4, 5632, 32000),
    _Ref("Llama-3.2-3B", 28, 3072, 24, 8, 8192, 128256),
    _Ref("Llama-2-7B", 32, 4096, 32, 32, 11008, 32000),
    _Ref("Llama-3-8B", 32, 4096, 32, 8, 14336, 128256),
    _Ref("Llama-2-13B", 40, 5120, 40, 40, 13824, 32000),
    _Ref("CodeLlama-34B", 48, 8192, 64, 8, 22016, 32000),
    _Ref("Llama-2-70B", 80, 8192, 64, 8, 28672, 32000),
    _Ref("Llama-3.1-405B", 126, 16384, 128, 8, 53248, 128256),
)


def _llama_linears(
    layers: int, hidden: int, heads: int, kv: int, head_dim: int, inter: int, vocab: int
) -> dict[str, LinearSpec]:
    q, kvd = heads * head_dim, kv * head_dim
    return {
        "q_proj": LinearSpec(hidden, q, layers),
        "k_proj": LinearSpec(hidden, kvd, layers),
        "v_proj": LinearSpec(hidden, kvd, layers),
        "o_proj": LinearSpec(q, hidden, layers),
        "gate_proj": LinearSpec(hidden, inter, layers),
        "up_proj": LinearSpec(hidden, inter, layers),
        "down_proj": LinearSpec(inter, hidden, layers),
        "lm_head": LinearSpec(hidden, vocab, 1),
    }


def _llama_params(r: _Ref) -> int:
    head_dim = r.hidden // r.heads
    lin = _llama_linears(r.layers, r.hidden, r.heads, r.kv_heads, head_dim, r.intermediate, r.vocab)
    n = sum(s.in_features * s.out_features * s.count for s in lin.values())
    return n + r.vocab * r.hidden + (2 * r.layers + 1) * r.hidden


def shape_from_params(
    n: float,
    layers: int | None = None,
    hidden: int | None = None,
    heads: int | None = None,
    kv_heads: int | None = None,
    intermediate: int | None = None,
    vocab: int | None = None,
    tied_embeddings: bool = False,
) -> ModelShape:
    """An approximate Llama-like shape for a raw parameter count (``--params 7.5e9``).

    ``total_params`` is ``n`` exactly; the other sizes are approximate. Missing values are filled by a
    heuristic: with neither ``layers`` nor ``hidden`` given, the published Llama shape whose size is nearest
    to ``n`` (on a log scale, from ``LLAMA_REFERENCE_SHAPES``) supplies every missing value; with one of
    them given the other follows from ``12 * layers * hidden**2 = n`` (hidden rounded to 128); heads default
    to ``hidden / 128``, kv heads to heads, intermediate to ``8/3 * hidden`` rounded up to 256, vocabulary
    to 32000. The linear modules are Llama's (q/k/v/o, gate/up/down, lm_head) for those sizes, so their sum
    can differ from ``n`` by a few percent.

    Args:
        n: Total parameters.
        layers: Decoder layers, if known.
        hidden: Hidden size, if known.
        heads: Attention heads, if known.
        kv_heads: Key/value heads, if known.
        intermediate: MLP intermediate size, if known.
        vocab: Vocabulary size, if known.
        tied_embeddings: Whether lm_head shares the input embedding.

    Returns:
        The approximate shape.
    """
    if not math.isfinite(n) or n <= 0:
        raise ValueError(f"parameter count must be a positive number (got {n:g})")
    for what, value in (("layers", layers), ("hidden size", hidden), ("heads", heads), ("kv heads", kv_heads),
                        ("intermediate size", intermediate), ("vocabulary size", vocab)):
        if value is not None and value <= 0:
            raise ValueError(f"{what} must be positive (got {value})")
    if layers is None and hidden is None:
        ref = min(LLAMA_REFERENCE_SHAPES, key=lambda r: abs(math.log(n / _llama_params(r))))
        layers, hidden = ref.layers, ref.hidden
        heads = heads or ref.heads
        kv_heads = kv_heads or ref.kv_heads
        intermediate = intermediate or ref.intermediate
        vocab = vocab or ref.vocab
    elif hidden is None:
        assert layers is not None
        hidden = max(128, round(math.sqrt(n / (12 * layers)) / 128) * 128)
    elif layers is None:
        layers = max(1, round(n / (12 * hidden * hidden)))
    heads = heads or max(1, hidden // 128)
    kv_heads = kv_heads or heads
    intermediate = intermediate or math.ceil(8 * hidden / 3 / 256) * 256
    vocab = vocab or 32000
    head_dim = hidden // heads
    return ModelShape(
        total_params=int(n),
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate=intermediate,
        vocab=vocab,
        tied_embeddings=tied_embeddings,
        linears=_llama_linears(layers, hidden, heads, kv_heads, head_dim, intermediate, vocab),
        approximate="the shape comes from a parameter count (a Llama layout is assumed); give the model's "
                    "config (--model or a recipe) for an exact shape",
    )


def lora_targeted(shape: ModelShape, targets: Sequence[str] | str) -> dict[str, LinearSpec]:
    """The linear modules of ``shape`` that a LoRA with these ``target_modules`` adapts, by name."""
    if isinstance(targets, str):
        if targets != "all-linear":
            targets = [targets]
        else:  # peft's "all-linear" adapts every linear layer but the output head
            return {k: v for k, v in shape.linears.items() if k.split("@")[0] != "lm_head"}
    wanted = set(targets)
    return {k: v for k, v in shape.linears.items() if k.split("@")[0] in wanted}


def lora_trainable_params(shape: ModelShape, r: int, target_modules: Sequence[str] | str) -> int:
    """Parameters peft's LoRA trains: ``r * (in + out)`` per adapted linear (A is r x in, B is out x r).

    Args:
        shape: The model.
        r: LoRA rank.
        target_modules: Linear short names as peft takes them (``["q_proj", "v_proj"]``), or ``"all-linear"``.

    Returns:
        The exact number of trainable adapter parameters (peft's default ``bias="none"``).
    """
    return sum(
        r * (s.in_features + s.out_features) * s.count for s in lora_targeted(shape, target_modules).values()
    )


# ---------------------------------------------------------------------- recipes


def llama_shape(
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    intermediate: int,
    vocab: int,
    tied_embeddings: bool = False,
    head_dim: int | None = None,
) -> ModelShape:
    """The exact shape of an HF Llama (no biases), computed without torch.

    Parameters: the linears, the input embedding, two RMSNorms per layer and the final norm (the tests
    compare it with ``shape_from_config`` on the meta device).
    """
    d = head_dim or hidden // heads
    linears = _llama_linears(layers, hidden, heads, kv_heads, d, intermediate, vocab)
    shape = ModelShape(0, layers, hidden, heads, kv_heads, d, intermediate, vocab, tied_embeddings, linears)
    total = shape.linear_params + vocab * hidden + (2 * layers + 1) * hidden
    largest = max(vocab * hidden, *(s.in_features * s.out_features for s in linears.values()))
    return replace(shape, total_params=total, largest_weight=largest)


class _Known(NamedTuple):
    match: str
    shape: _Ref


# Hub ids whose published config.json values are built in, so that ``ftui estimate`` works offline.
KNOWN_HUB_MODELS: tuple[_Known, ...] = (
    _Known("tinyllama-1.1b", LLAMA_REFERENCE_SHAPES[0]),
    _Known("codellama-34b", LLAMA_REFERENCE_SHAPES[5]),
)


class ModelSource(NamedTuple):
    """Where a recipe's model shape came from: ``shape`` and a short human note."""

    shape: ModelShape
    note: str


GIVE_A_CONFIG = ("give its config another way: a local folder holding its config.json (--model PATH, or a recipe "
                 "whose model.name is that folder), or its sizes (--params N --layers L --hidden H)")
"""How to estimate a model whose config cannot be had here."""


def resolve_model_shape(name: str, allow_network: bool = True) -> ModelSource:
    """The shape of ``model.name``: the builtin tiny Llama, a local folder, the local HF cache, a built-in
    table of known hub ids, or the hub (only when ``allow_network`` and reachable).

    Raises:
        ValueError: one line when the shape cannot be had.
    """
    if name == builtin.TINY_LLAMA:
        s = builtin.TINY_LLAMA_SHAPE
        shape = llama_shape(
            int(s["num_hidden_layers"]),
            int(s["hidden_size"]),
            int(s["num_attention_heads"]),
            int(s["num_key_value_heads"]),
            int(s["intermediate_size"]),
            builtin.TOKENIZER_VOCAB,
            bool(s["tie_word_embeddings"]),
        )
        return ModelSource(shape, f"{name} (builtin config)")
    if name.startswith(builtin.BUILTIN_PREFIX):
        return ModelSource(shape_from_config(builtin.model_config(name)), f"{name} (builtin config)")
    from pathlib import Path

    folder = Path(name).expanduser()
    if (folder / "config.json").is_file():
        try:
            shape = shape_from_config(_auto_config(str(folder), local_only=True))
        except Exception as exc:  # noqa: BLE001 (transformers raises OSError, ValueError, KeyError...: one line)
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ValueError(f"model.name: {folder / 'config.json'}: cannot read the model config ({first[:160]})") from None
        return ModelSource(shape, f"{name} (local config.json)")
    if in_cache(name):  # transformers is imported only for a config that is here
        try:
            cfg = _auto_config(name, local_only=True)
            return ModelSource(shape_from_config(cfg), f"{name} (config from the local Hugging Face cache)")
        except Exception:  # noqa: BLE001 (unreadable: try the table, then the hub)
            pass
    low = name.lower()
    for known in KNOWN_HUB_MODELS:
        if known.match in low:
            r = known.shape
            shape = llama_shape(r.layers, r.hidden, r.heads, r.kv_heads, r.intermediate, r.vocab)
            return ModelSource(shape, f"{name} (built-in table of {r.name}'s published config; hub not used)")
    if not allow_network:
        raise ValueError(f"model.name: {name}: config not in the local cache and not in the built-in table")
    problem = hub_model_problem(name)  # one request, no retries: offline, the answer comes at once
    if problem:
        raise ValueError(f"model.name: {name}: {problem}; {GIVE_A_CONFIG}")
    try:
        cfg = _auto_config(name, local_only=False)
    except Exception as exc:  # noqa: BLE001 (one line for the user)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(
            f"model.name: {name}: cannot read its config from the hub ({first[:160]}); "
            "use a local folder or --params/--layers/--hidden"
        ) from None
    return ModelSource(shape_from_config(cfg), f"{name} (config from the Hugging Face hub)")


def _auto_config(name: str, local_only: bool) -> PretrainedConfig:
    from transformers import AutoConfig

    cfg: PretrainedConfig = AutoConfig.from_pretrained(name, local_files_only=local_only)
    return cfg
