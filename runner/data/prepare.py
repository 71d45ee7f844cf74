"""The data step: rows of any source -> train and eval token blocks, cached.

Rows come from the builtin corpus, a local file or a Hugging Face dataset (:mod:`runner.data.rows`);
chat and prompt/completion rows are tokenized with labels (:mod:`runner.data.chat`), text rows with the
labels equal to the ids; both are cut into blocks (:mod:`runner.data.blocks`). The held-out eval set is
``data.eval_source`` (or ``data.eval_split`` of the source), else a seeded ``data.eval_fraction`` of the
rows.

The blocks are cached by a key over everything that decides them (:mod:`runner.data.cache`). ``ftui
run``'s pre-flight fills the cache wherever the tokenizer is local (every row checked, the blocks
counted: a bad row, or data too short for one optimizer step, is one line and exit 2 before anything is
recorded).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runner.data import chat
from runner.data.blocks import Blocks, to_blocks
from runner.data.cache import (
    Cached,
    cache_key,
    cache_path,
    local_tokenizer_digest,
    read_cache,
    read_train_rows,
    write_cache,
)
from runner.data.rows import DataError, check_row, read_rows, row_text
from runner.spec import builtin
from runner.spec.paths import cache_dir

if TYPE_CHECKING:
    from runner.spec.recipe import DataSection, Recipe


@dataclass(frozen=True)
class DataSet:
    """What the trainer trains and evaluates on, and how it was obtained."""

    train: Blocks
    eval: Blocks | None
    format: chat.Format
    key: str
    cached: bool
    """Read from the cache (no tokenizing)."""
    seconds: float
    """Wall time of the data step (reading, tokenizing or loading the cache)."""
    tokens: int
    """Tokens of the train rows as tokenized (before packing cut or dropped any)."""

    def info(self) -> dict[str, Any]:
        """The data step's facts for the start event."""
        return {"format": self.format, "cache_key": self.key, "cached": self.cached, "seconds": self.seconds,
                "tokens": self.tokens, "eval_rows": 0 if self.eval is None else int(self.eval.input_ids.shape[0])}


def split_rows(data: DataSection, seed: int) -> tuple[list[Any], list[Any] | None, str, str]:
    """The train rows, the eval rows (None without an eval set), and the names of their sources.

    Raises:
        DataError: an empty source or an empty eval set (one line naming it).
    """
    train, held, name, eval_name = split_numbered(data, seed)
    return [row for _, row in train], None if held is None else [row for _, row in held], name, eval_name


Numbered = list[tuple[int, Any]]
"""Rows with their 0-based index in their source (errors name the source's row, whatever was held out)."""


def split_numbered(data: DataSection, seed: int) -> tuple[Numbered, Numbered | None, str, str]:
    """:func:`split_rows` with each row's index in its source."""
    listed, name = read_rows(data.source, data, data.split)
    rows: Numbered = list(enumerate(listed))
    if data.rows:
        rows = rows[: data.rows]
    if not rows:
        raise DataError(f"data.source: {name}: no rows")
    eval_rows: Numbered | None = None
    eval_name = name
    if data.eval_source is not None or data.eval_split is not None:
        source = data.eval_source or data.source
        listed_eval, eval_name = read_rows(source, data, data.eval_split or data.split, "data.eval_source")
        eval_rows = list(enumerate(listed_eval))
        if not eval_rows:
            what = "data.eval_split" if data.eval_source is None else "data.eval_source"
            raise DataError(f"{what}: {eval_name}: the eval split has no rows")
    elif data.eval_fraction > 0:
        count = int(round(len(rows) * data.eval_fraction))
        if count == 0:
            raise DataError(f"data.eval_fraction: {data.eval_fraction} of {len(rows)} rows of {name} is an empty "
                            "eval split (raise it, or use data.eval_source)")
        if count >= len(rows):
            raise DataError(f"data.eval_fraction: {data.eval_fraction} of {len(rows)} rows of {name} leaves no "
                            "row to train on")
        held = set(random.Random(seed).sample(range(len(rows)), count))
        eval_rows = [row for i, row in enumerate(rows) if i in held]
        rows = [row for i, row in enumerate(rows) if i not in held]
    return rows, eval_rows, name, eval_name


def encode_rows(rows: list[Any], fmt: chat.Format, data: DataSection, tokenizer: Any, name: str,
                field: str = "data.source", numbers: list[int] | None = None) -> chat.Encoded:
    """Token ids and labels of rows (text rows: labels are the ids).

    Args:
        numbers: each row's 0-based index in its source, for errors (default: its position here).

    Raises:
        DataError: a bad row, named by file and row.
    """
    def where(index: int) -> str:
        return f"{field}: {name} row {(numbers[index] if numbers else index) + 1}"

    if fmt == "text":
        if data.train_on == "completions":
            raise DataError(f"data.train_on: {name} holds text rows: completions needs chat (messages) or "
                            "prompt/completion rows")
        texts = [row_text(row, data, Path(name), numbers[i] if numbers else i) for i, row in enumerate(rows)]
        ids = [list(x) for x in tokenizer(texts, add_special_tokens=False)["input_ids"]]
        return chat.Encoded(ids, ids)
    for index, row in enumerate(rows):
        check_row(row, fmt, data, where(index))  # every row, before any tokenizing
    try:
        return chat.encode(rows, fmt, data, tokenizer, where)
    except chat.RowError as exc:
        raise DataError(str(exc)) from None


def load_data(data: DataSection, tokenizer: Any, seed: int, *, use_cache: bool = True,
              tokenizer_id: str | None = None, loader: Callable[[], Any] | None = None,
              key: str | None = None) -> DataSet:
    """The train and eval blocks of a recipe's data, from the cache when it holds them.

    ``tokenizer`` may be None with a ``loader`` that returns it: with ``tokenizer_id``
    (:func:`local_tokenizer_digest`) a cached recipe never calls it. ``key``: the :func:`cache_key` when the
    caller has it (computing it hashes the whole source again).

    Raises:
        DataError: a bad source, row, eval split or size; one line naming the file and row.
    """
    t0 = time.perf_counter()
    if key is None:
        if tokenizer is None and tokenizer_id is None and loader is not None:
            tokenizer = loader()
        key = cache_key(data, tokenizer, seed, tokenizer_id)
    path = cache_path(key)
    cached = read_cache(path) if use_cache else None
    if cached is not None:
        return DataSet(cached.train, cached.eval, cached.format, key, True, time.perf_counter() - t0, cached.tokens)
    if tokenizer is None and loader is not None:
        tokenizer = loader()
    numbered, eval_numbered, name, eval_name = split_numbered(data, seed)
    rows = [row for _, row in numbered]
    fmt = chat.row_format(rows[0], data)
    encoded = encode_rows(rows, fmt, data, tokenizer, name, numbers=[i for i, _ in numbered])
    train = to_blocks(encoded, fmt, data, tokenizer, for_eval=False)
    evaluation = None
    if eval_numbered is not None:
        eval_field = "data.eval_source" if data.eval_source else "data.source"
        eval_encoded = encode_rows([row for _, row in eval_numbered], fmt, data, tokenizer, eval_name, eval_field,
                                   numbers=[i for i, _ in eval_numbered])
        evaluation = to_blocks(eval_encoded, fmt, data, tokenizer, for_eval=True)
    tokens = sum(len(ids) for ids in encoded.ids)
    if use_cache:
        write_cache(path, Cached(train, evaluation, fmt, tokens))
    return DataSet(train, evaluation, fmt, key, False, time.perf_counter() - t0, tokens)


def load_tokenizer(recipe: Recipe) -> Any:
    """The recipe's tokenizer as the trainer loads it (the builtin one trained once and cached), with a
    chat template (:func:`runner.data.chat.ensure_chat_template`)."""
    from transformers import AutoTokenizer

    model = recipe.model
    if model.name.startswith(builtin.BUILTIN_PREFIX):
        tok = AutoTokenizer.from_pretrained(str(builtin.ensure_tokenizer(cache_dir())))
    else:
        tok = AutoTokenizer.from_pretrained(model.name, trust_remote_code=model.trust_remote_code,
                                            revision=model.revision)
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
    chat.ensure_chat_template(tok, model.name.startswith(builtin.BUILTIN_PREFIX))
    return tok


def prefill(recipe: Recipe) -> int | None:
    """The pre-flight's data step: tokenize into the cache (the ranks then only read it), so that every
    bad row, and data too short for one optimizer step, is found before launch. Only where the tokenizer
    is local (the builtin one, or a model folder); otherwise the ranks do it.

    Returns:
        The train rows (blocks) the ranks will read; None when unknown here (the ranks tokenize, or a
        cache file written without its counts).

    Raises:
        DataError: one line naming the file and row.
    """
    name = recipe.model.name
    if not name.startswith(builtin.BUILTIN_PREFIX) and not Path(name).expanduser().is_dir():
        return None
    tokenizer_id = local_tokenizer_digest(recipe.model)
    tokenizer = None
    if tokenizer_id is None:  # the builtin tokenizer, not trained yet: loading it trains it
        tokenizer = _load_local_tokenizer(recipe)
        tokenizer_id = local_tokenizer_digest(recipe.model)
    key = cache_key(recipe.data, tokenizer, recipe.train.seed, tokenizer_id)
    path = cache_path(key)
    if path.is_file():
        # Cached: its rows were checked when it was written, and the ranks read it (a damaged file is
        # rebuilt there). Neither torch nor transformers is imported for a cached recipe.
        return read_train_rows(path)
    dataset = load_data(recipe.data, tokenizer, recipe.train.seed, tokenizer_id=tokenizer_id,
                        loader=lambda: _load_local_tokenizer(recipe), key=key)
    return dataset.train.shape[0]


def _load_local_tokenizer(recipe: Recipe) -> Any:
    """:func:`load_tokenizer` of the builtin model or a model folder, in the pre-flight.

    Raises:
        DataError: one line naming ``model.name``, whatever the folder's files make the loader raise.
    """
    try:
        return load_tokenizer(recipe)
    except Exception as exc:  # noqa: BLE001 (any file of a model folder can be wrong; it is one line either way)
        why = (str(exc).strip().splitlines() or [""])[0][:200]
        raise DataError(f"model.name: {recipe.model.name}: its tokenizer does not load ({type(exc).__name__}: "
                        f"{why})") from None
