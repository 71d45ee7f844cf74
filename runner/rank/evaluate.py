"""Evaluation on the held-out set, and the samples of ``eval.prompts``.

The eval loss is the mean cross-entropy over every learned token of the whole eval set: each rank takes
rows ``r, r+W, r+2W, ...`` and sums its tokens' losses and counts them (float64), and one all-reduce adds
the sums. So the figure does not depend on how rows were split over ranks or batched (unlike a mean of
per-batch means), and single, DDP and FSDP runs of the same model get the same eval loss. Every rank runs
the same number of forward passes (a rank out of rows feeds a row whose labels are all ignored), which
FSDP's collectives inside forward need.

Samples are greedy: every rank runs the same forward passes over the same prompt (FSDP again) and rank 0
keeps the text.
"""

from __future__ import annotations

import math
from typing import Any

from runner.data import chat
from runner.data.blocks import Blocks


def eval_loss(model: Any, blocks: Blocks, acc: Any, batch_size: int, input_device: Any) -> dict[str, float]:
    """``eval/loss``, ``eval/perplexity`` and ``eval/tokens`` over the whole eval set (see the module
    docstring); the same on every rank."""
    import torch
    import torch.nn.functional as F

    world, rank = acc.num_processes, acc.process_index
    n = int(blocks.input_ids.shape[0])
    mine = list(range(rank, n, world))
    batches = math.ceil(math.ceil(n / world) / batch_size)
    labels_all = blocks.labels if blocks.labels is not None else blocks.input_ids
    total = torch.zeros(2, dtype=torch.float64)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for b in range(batches):
                rows = mine[b * batch_size : (b + 1) * batch_size]
                real = len(rows)
                rows = rows + [0] * (batch_size - real) if real < batch_size else rows
                index = torch.tensor(rows, dtype=torch.long)
                ids = blocks.input_ids[index]
                labels = labels_all[index].clone()
                mask = blocks.attention_mask[index] if blocks.attention_mask is not None else None
                if mask is not None:
                    labels = labels.masked_fill(mask == 0, chat.IGNORE)
                if real < batch_size:
                    labels[real:] = chat.IGNORE  # filler rows: forward only, nothing counted
                inputs: dict[str, Any] = {"input_ids": ids.to(input_device)}
                if mask is not None:
                    inputs["attention_mask"] = mask.to(input_device)
                with acc.autocast():
                    logits = model(**inputs).logits
                shift_logits = logits[:, :-1, :].float()
                shift_labels = labels[:, 1:].to(shift_logits.device)
                loss = F.cross_entropy(shift_logits.reshape(-1, shift_logits.shape[-1]), shift_labels.reshape(-1),
                                       ignore_index=chat.IGNORE, reduction="sum")
                total[0] += float(loss)
                total[1] += float((shift_labels != chat.IGNORE).sum())
                del logits, shift_logits
    finally:
        if was_training:
            model.train()
    if world > 1:
        total = acc.reduce(total.to(acc.device), reduction="sum").cpu()
    loss_sum, tokens = float(total[0]), float(total[1])
    mean = loss_sum / tokens if tokens else float("nan")
    return {"eval/loss": mean, "eval/perplexity": math.exp(mean) if mean < 700 else float("inf"),
            "eval/tokens": tokens}


def samples(model: Any, tokenizer: Any, prompts: list[str], fmt: chat.Format, max_new_tokens: int,
            acc: Any, input_device: Any, context_length: int) -> list[dict[str, str]]:
    """Greedy completions of ``prompts`` (at most ``max_new_tokens`` tokens, stopping at end-of-text),
    computed by every rank alike; ``[{"prompt", "completion"}]``."""
    import torch

    out: list[dict[str, str]] = []
    eos = tokenizer.eos_token_id
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for prompt in prompts:
                ids = chat.prompt_ids(tokenizer, prompt, fmt)[-(context_length - 1):] or [eos or 0]
                new: list[int] = []
                for _ in range(max_new_tokens):
                    if len(ids) + len(new) >= context_length:
                        break
                    tensor = torch.tensor([ids + new], dtype=torch.long, device=input_device)
                    with acc.autocast():
                        logits = model(input_ids=tensor).logits
                    token = int(logits[0, -1].argmax())
                    if acc.num_processes > 1:  # rank 0's choice for all: ranks must run the same forwards
                        import torch.distributed as dist

                        chosen = torch.tensor([token], dtype=torch.long, device=acc.device)
                        dist.broadcast(chosen, 0)
                        token = int(chosen.item())
                    if token == eos:
                        break
                    new.append(token)
                out.append({"prompt": prompt, "completion": str(tokenizer.decode(new, skip_special_tokens=True))})
    finally:
        if was_training:
            model.train()
    return out

