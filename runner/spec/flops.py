"""Training FLOPs per token: the formula MFU divides by the time, and the model dimensions it needs.

FLOPs per token follow the PaLM paper (appendix B) as nanoGPT's ``estimate_mfu`` writes it:
``6 N + 12 L H Q T`` for N parameters, L layers, H heads of size Q and a context of T tokens. The
``6 N`` is 2 N for the forward matmuls, 2 N for the gradient with respect to the inputs and 2 N for
the gradient with respect to the weights. Frozen weights (the base model under LoRA) skip the last
one, so a LoRA run costs ``4 N_frozen + 6 N_trainable``. The attention term has no weights and is
paid in full either way: backward must still carry gradients through every layer to the adapters.

The trainer records :func:`dims_from_config` at start and the orchestrator stores
:func:`run_flops_per_token` with the run, so the analysis never reads a model config.
"""

from __future__ import annotations

from typing import Any

DTYPES = ("fp32", "bf16", "fp16", "fp8")
"""The dtypes a matmul peak is known for; a run's precision maps to one of them (:func:`run_dtype`)."""


def run_dtype(precision: str | None) -> str:
    """The dtype a run's matmuls ran in: ``train.precision`` (``fp32``, ``bf16``, ``fp16``, ``fp8``: torchao's
    float8 Linear layers, the peak of a GPU that has one)."""
    return precision if precision in DTYPES else "fp32"


def flops_per_token(params: int, layers: int, heads: int, head_dim: int, seq_len: int,
                    trainable_params: int | None = None) -> float:
    """Training FLOPs per token: ``6N + 12 L H Q T``, or ``4 N_frozen + 6 N_trainable + 12 L H Q T``.

    Args:
        params: Every parameter of the model (N).
        layers: Decoder layers (L).
        heads: Attention heads (H).
        head_dim: Size of one head (Q).
        seq_len: Tokens per sequence (T).
        trainable_params: Parameters that get gradients; None means all (full fine-tuning).

    Returns:
        FLOPs per trained token.
    """
    trainable = params if trainable_params is None else min(trainable_params, params)
    frozen = params - trainable
    return float(4 * frozen + 6 * trainable + 12 * layers * heads * head_dim * seq_len)


def dims_from_config(cfg: Any, seq_len: int) -> dict[str, int] | None:
    """What :func:`flops_per_token` needs of a transformers config: layers, heads, head size, context
    length and the input-embedding parameters to leave out of N; None when the config lacks them.

    The trainer stores this in the run's summary (``model_dims``) so that compare never imports
    transformers to read a config.
    """
    heads = int(getattr(cfg, "num_attention_heads", 0) or 0)
    hidden = int(getattr(cfg, "hidden_size", 0) or 0)
    head_dim = int(getattr(cfg, "head_dim", 0) or 0) or (hidden // heads if heads else 0)
    layers = int(getattr(cfg, "num_hidden_layers", 0) or 0)
    if not (heads and head_dim and layers and seq_len):
        return None
    # The input embedding is a lookup, not a matmul: it costs no FLOPs (PaLM counts non-embedding N).
    # Tied, the same matrix is the output head (a matmul) and stays in N; untied, the output head stays
    # in N and the input embedding (vocab x hidden) leaves it.
    tied = bool(getattr(cfg, "tie_word_embeddings", False))
    embedding = 0 if tied else int(getattr(cfg, "vocab_size", 0) or 0) * hidden
    return {"layers": layers, "heads": heads, "head_dim": head_dim, "seq_len": int(seq_len),
            "embedding_params": embedding}


def run_flops_per_token(method: str, params: Any, trainable_params: Any,
                        dims: Any) -> float | None:
    """FLOPs per trained token of a run from what its start event reports (parameter counts and
    :func:`dims_from_config`'s ``model_dims``); None when any is missing. Stored with the run
    (``summary["flops_per_token"]``) so that compare computes MFU from stored figures alone.

    Args:
        method: ``full`` (every parameter trained) or an adapter method (``lora``...).
        params: Every parameter of the model.
        trainable_params: Parameters that get gradients (ignored for ``full``).
        dims: ``model_dims`` (layers, heads, head_dim, seq_len, embedding_params).
    """
    if not isinstance(params, int) or not params or not isinstance(dims, dict):
        return None
    if not all(isinstance(dims.get(k), int) for k in ("layers", "heads", "head_dim", "seq_len")):
        return None
    trainable = trainable_params if method != "full" and isinstance(trainable_params, int) else None
    matmul_params = params - int(dims.get("embedding_params", 0) or 0)
    return flops_per_token(matmul_params, dims["layers"], dims["heads"], dims["head_dim"], dims["seq_len"],
                           trainable)
