"""The embedded default: a small Llama (and a small Mixtral), a tokenizer and a corpus, all made here with no
download.

The corpus is the text of the Python standard library's ``pydoc_data.topics`` (~465 KB of English
technical prose that every CPython ships). The tokenizer is a byte-level BPE trained on that corpus
with ``tokenizers`` (~0.2 s) and cached on disk, keyed by a hash of the corpus and the vocabulary
size, so every rank of a run and every later run loads the identical tokenizer.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import LlamaConfig, MixtralConfig, PretrainedConfig, PreTrainedTokenizerFast

BUILTIN_PREFIX = "builtin:"
TINY_LLAMA = "builtin:tiny-llama"
PYDOC_CORPUS = "builtin:pydoc-topics"
TINY_LLAMA_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head")
"""The linear layers of the builtin Llama by name: what ``method.lora.target_modules`` may name for it."""
TINY_MIXTRAL = "builtin:tiny-mixtral"
TINY_MIXTRAL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "lm_head")
"""The linear layers of the builtin Mixtral: its experts are stacked 3D parameters and its router a parameter of its
own (transformers' ``MixtralExperts``, ``MixtralTopKRouter``), so LoRA adapts the attention and the head."""
TINY_QWEN2_MOE = "builtin:tiny-qwen2-moe"
TINY_QWEN2_MOE_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
                         "shared_expert_gate", "lm_head")
"""The linear layers of the builtin Qwen2-MoE: the attention's, the shared expert's MLP and its gate, the head (its
routed experts are stacked 3D parameters, as Mixtral's)."""
MODELS: dict[str, tuple[str, ...]] = {TINY_LLAMA: TINY_LLAMA_LINEAR, TINY_MIXTRAL: TINY_MIXTRAL_LINEAR,
                                      TINY_QWEN2_MOE: TINY_QWEN2_MOE_LINEAR}
"""The builtin models by name, with the linear layers ``method.lora.target_modules`` may name."""
TOKENIZER_VOCAB = 4096

# hidden 384, 6 layers, 6 heads (head dim 64), 2 kv heads: 12.6M parameters with a 4096 vocabulary.
TINY_LLAMA_SHAPE: dict[str, Any] = {
    "hidden_size": 384,
    "intermediate_size": 1024,
    "num_hidden_layers": 6,
    "num_attention_heads": 6,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
}

# The smallest mixture of experts that has what routing needs: 2 layers of 4 experts, 2 routed per token
# (hidden 128, 4 heads of 32, 2 kv heads, each expert's MLP 256 wide): 1.9M parameters with the builtin
# tokenizer, 1.05M of them the embeddings and head. No sliding window, no jitter: the router's choice is the top-k alone.
TINY_MIXTRAL_SHAPE: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "sliding_window": None,
    "router_jitter_noise": 0.0,
    "tie_word_embeddings": False,
}

# Qwen2-MoE's layer at the same size: 4 routed experts (top-2) and a shared expert of the same width beside them
# on every layer (decoder_sparse_step 1), q/k/v biases: 2.1M parameters with the builtin tokenizer.
TINY_QWEN2_MOE_SHAPE: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "moe_intermediate_size": 256,
    "shared_expert_intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "decoder_sparse_step": 1,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
}


def corpus_text() -> str:
    """The builtin corpus: every pydoc topic, in sorted key order, separated by blank lines."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[key] for key in sorted(topics))


def corpus_documents() -> list[str]:
    """The builtin corpus as one document per pydoc topic (sorted by key)."""
    from pydoc_data.topics import topics

    return [topics[key] for key in sorted(topics)]


def _tokenizer_key(vocab_size: int) -> str:
    digest = hashlib.sha256(corpus_text().encode()).hexdigest()[:16]
    return f"bpe-{vocab_size}-{digest}"


def tokenizer_dir(cache_dir: Path, vocab_size: int = TOKENIZER_VOCAB) -> Path:
    """Where the builtin tokenizer lives in ``cache_dir`` (it may not exist yet)."""
    return cache_dir / "tokenizers" / _tokenizer_key(vocab_size)


def ensure_tokenizer(cache_dir: Path, vocab_size: int = TOKENIZER_VOCAB) -> Path:
    """Train the builtin tokenizer once and cache it; return its folder.

    Safe when several processes race: each trains into a private temporary folder and renames it
    into place; a loser of the race throws its copy away. Training is deterministic, so every copy
    is the same.
    """
    target = tokenizer_dir(cache_dir, vocab_size)
    if (target / "tokenizer.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tok-", dir=target.parent))
    try:
        _train_tokenizer(vocab_size).save_pretrained(str(tmp))
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / "tokenizer.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _train_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<|pad|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus_documents(), trainer=trainer)
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok,
        eos_token="<|endoftext|>",
        bos_token="<|endoftext|>",
        pad_token="<|pad|>",
        model_max_length=1_000_000,
    )


def known_model_problem(name: str) -> str | None:
    """Why ``name`` (a ``builtin:`` model name) is not a builtin model, or None when it is."""
    if name in MODELS:
        return None
    return f"unknown builtin model {name!r} (have {', '.join(MODELS)})"


def model_config(name: str, vocab_size: int = TOKENIZER_VOCAB) -> PretrainedConfig:
    """The transformers config of the builtin model ``name`` (no download: built from the config class)."""
    if name == TINY_MIXTRAL:
        return tiny_mixtral_config(vocab_size)
    if name == TINY_QWEN2_MOE:
        from transformers import Qwen2MoeConfig

        config: Qwen2MoeConfig = Qwen2MoeConfig(vocab_size=vocab_size, bos_token_id=0, eos_token_id=0, pad_token_id=1,
                                                **TINY_QWEN2_MOE_SHAPE)
        return config
    if name == TINY_LLAMA:
        return tiny_llama_config(vocab_size)
    raise ValueError(f"model.name: {known_model_problem(name)}")


def tiny_mixtral_config(vocab_size: int = TOKENIZER_VOCAB) -> MixtralConfig:
    """The config of ``builtin:tiny-mixtral``."""
    from transformers import MixtralConfig

    return MixtralConfig(vocab_size=vocab_size, bos_token_id=0, eos_token_id=0, pad_token_id=1, **TINY_MIXTRAL_SHAPE)


def tiny_llama_config(vocab_size: int = TOKENIZER_VOCAB) -> LlamaConfig:
    """The config of ``builtin:tiny-llama`` (12.6M parameters at the default vocabulary)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=1,
        **TINY_LLAMA_SHAPE,
    )
