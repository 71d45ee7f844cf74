"""Shared by the examples: the builtin tiny Llama and the pydoc corpus cut into blocks, made offline."""

from __future__ import annotations

from typing import Any


def tiny_model_and_blocks(context_length: int = 64, seed: int = 0) -> tuple[Any, Any, Any]:
    """(model, tokenizer, blocks): ftui's builtin 12.6M-parameter Llama (fresh weights, ``seed``), its
    byte-level BPE tokenizer and the pydoc corpus as a LongTensor of ``context_length`` token blocks."""
    import torch
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

    from runner.spec.builtin import corpus_text, ensure_tokenizer, tiny_llama_config
    from runner.spec.paths import cache_dir

    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(ensure_tokenizer(cache_dir())))
    ids = tokenizer(corpus_text())["input_ids"]
    n = len(ids) // context_length
    blocks = torch.tensor(ids[: n * context_length]).view(n, context_length)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(tiny_llama_config(len(tokenizer)))
    return model, tokenizer, blocks
