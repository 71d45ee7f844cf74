"""Token blocks: rows' ids and labels cut or padded to ``data.context_length`` for training and eval."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from runner.data import chat
from runner.data.rows import DataError, read_texts

if TYPE_CHECKING:
    import torch

    from runner.spec.recipe import DataSection


@dataclass(frozen=True)
class Blocks:
    """Token blocks ready for training: ``input_ids`` [rows, T]; ``attention_mask`` only when rows
    are padded (``data.pack = false``); ``labels`` only when some tokens are not learned
    (``data.train_on = "completions"``: -100 there), else the labels are the ids."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor | None
    labels: torch.Tensor | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.input_ids.shape[0]), int(self.input_ids.shape[1]))


def to_blocks(encoded: chat.Encoded, fmt: chat.Format, data: DataSection, tokenizer: Any, *,
              for_eval: bool) -> Blocks:
    """Blocks of ``data.context_length`` tokens.

    Packed (``data.pack``): the rows are concatenated (text rows each followed by end-of-text) and cut;
    train drops the last partial block, eval pads it (the whole eval set is evaluated). Unpacked: each
    row padded (text rows truncated). Train blocks with no learned label are dropped: their loss is 0/0.

    Raises:
        DataError: too few tokens for one block, or no block with a token to learn.
    """
    import torch

    T = data.context_length
    eos = tokenizer.eos_token_id
    masked = any(label == chat.IGNORE for labels in encoded.labels for label in labels)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos or 0)
    if data.pack:
        stream: list[int] = []
        labels: list[int] = []
        for ids, lab in zip(encoded.ids, encoded.labels, strict=True):
            stream.extend(ids)
            labels.extend(lab)
            if fmt == "text" and eos is not None:
                stream.append(eos)
                labels.append(eos)
        rows = len(stream) // T
        tail = len(stream) - rows * T
        if for_eval and tail:
            stream.extend([pad] * (T - tail))
            labels.extend([chat.IGNORE] * (T - tail))
            rows += 1
        if rows == 0:
            raise DataError(f"data.context_length: {len(stream)} tokens of data cannot fill one block of {T}")
        ids_tensor = torch.tensor(stream[: rows * T], dtype=torch.long).view(rows, T)
        label_tensor = torch.tensor(labels[: rows * T], dtype=torch.long).view(rows, T)
        mask: torch.Tensor | None = None
        if for_eval and tail:
            mask = torch.ones((rows, T), dtype=torch.long)
            mask[-1, tail:] = 0
        masked = masked or mask is not None
    else:
        n = len(encoded.ids)
        ids_tensor = torch.full((n, T), pad, dtype=torch.long)
        label_tensor = torch.full((n, T), chat.IGNORE, dtype=torch.long)
        mask = torch.zeros((n, T), dtype=torch.long)
        for i, (ids, lab) in enumerate(zip(encoded.ids, encoded.labels, strict=True)):
            ids, lab = ids[:T], lab[:T]
            ids_tensor[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            label_tensor[i, : len(lab)] = torch.tensor(lab, dtype=torch.long)
            mask[i, : len(ids)] = 1
    if not for_eval:
        # Position 0's label is never a target (the model predicts token t from tokens before it).
        keep = (label_tensor[:, 1:] != chat.IGNORE).any(dim=1)
        if not bool(keep.all()):
            ids_tensor, label_tensor = ids_tensor[keep], label_tensor[keep]
            mask = mask[keep] if mask is not None else None
        if ids_tensor.shape[0] == 0:
            raise DataError("data.train_on: no block of the data has a token to learn")
    return Blocks(ids_tensor, mask, label_tensor if masked else None)


def load_blocks(data: DataSection, tokenizer: Any) -> Blocks:
    """A text source tokenized into blocks of ``data.context_length`` tokens, uncached and without an
    eval split (the benchmarks' plain data step; the trainer's is :func:`runner.data.prepare.load_data`).

    Raises:
        DataError: a bad source or row, or too few tokens for one block.
    """
    import torch

    texts = read_texts(data)
    T = data.context_length
    encoded = tokenizer(texts, add_special_tokens=False)["input_ids"]
    eos = tokenizer.eos_token_id
    if data.pack:
        stream: list[int] = []
        for ids in encoded:
            stream.extend(ids)
            if eos is not None:
                stream.append(eos)
        rows = len(stream) // T
        if rows == 0:
            raise DataError(f"data.context_length: {len(stream)} tokens of data cannot fill one block of {T}")
        ids_tensor = torch.tensor(stream[: rows * T], dtype=torch.long).view(rows, T)
        return Blocks(ids_tensor, None)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos or 0)
    ids_tensor = torch.full((len(encoded), T), pad, dtype=torch.long)
    mask = torch.zeros((len(encoded), T), dtype=torch.long)
    for i, ids in enumerate(encoded):
        ids = ids[:T]
        ids_tensor[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        mask[i, : len(ids)] = 1
    return Blocks(ids_tensor, mask)
