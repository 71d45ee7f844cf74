"""The data step: rows of any source -> train and eval token blocks, cached.

Rows come from the builtin corpus, a local file (:mod:`runner.data.source`) or a Hugging Face dataset
(:mod:`runner.data.hf_datasets`); chat and prompt/completion rows are tokenized with labels (:mod:`runner.data.chat`),
text rows as before. The held-out eval set is ``data.eval_source`` (or ``data.eval_split`` of the
source), else a seeded ``data.eval_fraction`` of the rows.

Tokenized data is cached under ``FTUI_HOME``'s cache folder (``cache/data/<key>.pt``), keyed by a hash
over the source's content, the eval set's, the tokenizer (its vocabulary and merges, chat template and
special tokens), the data section (context length, packing, mask rule, fields, row limit) and, for an
``eval_fraction``, the seed. So the second run of a recipe reads blocks instead of tokenizing, and of
the ranks of one run only the first tokenizes (``main_process_first``): the others read its file.
``ftui run``'s pre-flight fills the cache for chat and completion data (every row checked: a bad row is
one line and exit 2 before anything is recorded).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runner.data import chat
from runner.data.source import CHECK_ROWS, Blocks, DataError, _read_rows, _row_text
from runner.spec.builtin import BUILTIN_PREFIX, PYDOC_CORPUS, corpus_documents, corpus_text

if TYPE_CHECKING:
    import torch

    from runner.spec.recipe import DataSection, ModelSection, Recipe

CACHE_VERSION = "1"
"""Part of every cache key: bump it when the blocks built from the same inputs change."""


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


def is_file_source(source: str) -> bool:
    """A local data file (not the builtin corpus, not a Hugging Face dataset)."""
    from runner.data.hf_datasets import is_dataset_source

    return not source.startswith(BUILTIN_PREFIX) and not is_dataset_source(source)


def source_format(first: Any, data: DataSection) -> chat.Format:
    """The format of a source's rows, decided by its first row (``data.format = "auto"``)."""
    return chat.row_format(first, data)


def check_row(row: Any, fmt: chat.Format, data: DataSection, where: str) -> None:
    """Check one chat or prompt/completion row's structure; ``where`` names it in the error."""
    try:
        if fmt == "chat":
            chat.check_messages(row, data)
        elif fmt == "completion":
            chat.check_completion(row, data)
    except chat.RowError as exc:
        raise DataError(f"{where}: {exc}") from None


def read_rows(source: str, data: DataSection, split: str, field: str = "data.source") -> tuple[list[Any], str]:
    """Every row of ``source`` and the name errors give it (a file name, a dataset id).

    Raises:
        DataError: unreadable, missing, or a missing split/subset of a dataset; one line.
    """
    from runner.data.hf_datasets import HFDataError, is_dataset_source, load_rows

    if source == PYDOC_CORPUS:
        return [{"text": text} for text in corpus_documents()], source
    if is_dataset_source(source):
        try:
            return list(load_rows(source, split, data.subset, field)), source
        except HFDataError as exc:
            raise DataError(str(exc)) from None
    path = Path(source).expanduser()
    if not path.is_file():
        raise DataError(f"{field}: file not found: {source}")
    try:
        return list(_read_rows(path)), path.name
    except DataError as exc:
        raise DataError(f"{field}: {exc}") from None


def check_dataset(data: DataSection) -> None:
    """Pre-launch check of a Hugging Face dataset source: it loads (offline), the split exists, it has
    rows and its first rows fit the format."""
    rows, name = read_rows(data.source, data, data.split)
    if not rows:
        raise DataError(f"data.source: {name}: split {data.split!r} has no rows")
    fmt = source_format(rows[0], data)
    for index, row in enumerate(rows[:CHECK_ROWS]):
        if fmt == "text":
            _row_text(row, data, Path(name), index)
        else:
            check_row(row, fmt, data, f"data.source: {name} row {index + 1}")


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
        texts = [_row_text(row, data, Path(name), numbers[i] if numbers else i) for i, row in enumerate(rows)]
        ids = [list(x) for x in tokenizer(texts, add_special_tokens=False)["input_ids"]]
        return chat.Encoded(ids, ids)
    for index, row in enumerate(rows):
        check_row(row, fmt, data, where(index))  # every row, before any tokenizing
    try:
        return chat.encode(rows, fmt, data, tokenizer, where)
    except chat.RowError as exc:
        raise DataError(str(exc)) from None


def to_blocks(encoded: chat.Encoded, fmt: chat.Format, data: DataSection, tokenizer: Any, *,
              for_eval: bool) -> Blocks:
    """Blocks of ``data.context_length`` tokens.

    Packed (``data.pack``): the rows are concatenated (text rows each followed by end-of-text) and cut;
    train drops the last partial block, eval pads it (the whole eval set is evaluated). Unpacked: each
    row padded (text rows truncated). Train blocks with no learned label are dropped: their loss is 0/0.
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


# ---------------------------------------------------------------------- the cache


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _source_digest(source: str) -> str:
    from runner.data.hf_datasets import fingerprint, is_dataset_source

    if source == PYDOC_CORPUS:
        return hashlib.sha256(corpus_text().encode()).hexdigest()
    if is_dataset_source(source):
        return fingerprint(source)
    path = Path(source).expanduser()
    return _file_digest(path) if path.is_file() else "missing"


def tokenizer_digest(tokenizer: Any) -> str:
    """A hash of what decides a tokenizer's output: its model (vocabulary, merges, normalizer), chat
    template and special tokens."""
    digest = hashlib.sha256()
    backend = getattr(tokenizer, "backend_tokenizer", None)
    digest.update(backend.to_str().encode() if backend is not None else repr(tokenizer.get_vocab()).encode())
    digest.update(str(getattr(tokenizer, "chat_template", None)).encode())
    digest.update(repr((tokenizer.eos_token_id, tokenizer.pad_token_id)).encode())
    return digest.hexdigest()


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                    "tokenizer.model", "vocab.json", "vocab.txt", "merges.txt", "chat_template.jinja",
                    "chat_template.json")
"""The files of a tokenizer folder that decide its output (``save_pretrained``'s and the hub's names)."""


def local_tokenizer_digest(model: ModelSection) -> str | None:
    """The tokenizer's digest from its files, without loading it: for the builtin tokenizer once it is
    trained, and for a model folder. None for a hub tokenizer (or a builtin one not trained yet): its
    digest comes from loading it (:func:`tokenizer_digest`).

    This is what lets a run whose data is cached start without importing transformers for the tokenizer
    (the pre-flight's check of a cached recipe): the files, the chat template :func:`load_tokenizer` adds,
    and the tokenizer libraries' versions decide the tokens, so they make the key.
    """
    from importlib import metadata

    from runner.spec import builtin
    from runner.spec.paths import cache_dir

    is_builtin = model.name.startswith(BUILTIN_PREFIX)
    folder = builtin.tokenizer_dir(cache_dir()) if is_builtin else Path(model.name).expanduser()
    if not folder.is_dir() or (is_builtin and not (folder / "tokenizer.json").is_file()):
        return None
    digest = hashlib.sha256()
    for name in _TOKENIZER_FILES:
        path = folder / name
        if path.is_file():
            digest.update(f"{name}:{_file_digest(path)}\n".encode())
    digest.update(f"builtin:{is_builtin}\n{chat.BUILTIN_CHAT_TEMPLATE}\n".encode())
    for library in ("tokenizers", "transformers"):
        try:
            digest.update(f"{library}=={metadata.version(library)}\n".encode())
        except metadata.PackageNotFoundError:
            digest.update(f"{library} missing\n".encode())
    return "files:" + digest.hexdigest()


def cache_key(data: DataSection, tokenizer: Any, seed: int, tokenizer_id: str | None = None) -> str:
    """The key of the tokenized data (see the module docstring), 32 hex digits.

    ``tokenizer_id``: the tokenizer's digest when known without it (:func:`local_tokenizer_digest`);
    else :func:`tokenizer_digest` of ``tokenizer``.
    """
    section = data.model_dump(mode="json", exclude={"shuffle"})
    parts = {
        "version": CACHE_VERSION,
        "data": section,
        "seed": seed if data.eval_fraction > 0 else None,
        "source": _source_digest(data.source),
        "eval_source": _source_digest(data.eval_source) if data.eval_source else None,
        "tokenizer": tokenizer_id or tokenizer_digest(tokenizer),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


def cache_path(key: str) -> Path:
    from runner.spec.paths import cache_dir

    return cache_dir() / "data" / f"{key}.pt"


def _pack(blocks: Blocks | None) -> dict[str, Any] | None:
    if blocks is None:
        return None
    return {"input_ids": blocks.input_ids, "attention_mask": blocks.attention_mask, "labels": blocks.labels}


def _unpack(saved: dict[str, Any] | None) -> Blocks | None:
    if saved is None:
        return None
    return Blocks(saved["input_ids"], saved["attention_mask"], saved["labels"])


def _write_cache(path: Path, payload: dict[str, Any]) -> None:
    import torch

    tmp = ""
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(prefix="tmp-", suffix=".pt", dir=path.parent)  # torch wants a plain name
        os.close(fd)
        torch.save(payload, tmp)
        os.replace(tmp, path)  # atomic: a reader sees the whole file or none
    except (OSError, RuntimeError):
        pass  # a cache that cannot be written only costs the next run its tokenizing
    finally:
        if tmp and os.path.exists(tmp):
            os.unlink(tmp)


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
    import torch

    t0 = time.perf_counter()
    if key is None:
        if tokenizer is None and tokenizer_id is None and loader is not None:
            tokenizer = loader()
        key = cache_key(data, tokenizer, seed, tokenizer_id)
    path = cache_path(key)
    if use_cache and path.is_file():
        try:
            # mmap: the blocks are paged in as batches read them, so a large cache costs nothing up front
            saved = torch.load(path, weights_only=True, mmap=True)
            train = _unpack(saved["train"])
            assert train is not None
            return DataSet(train, _unpack(saved["eval"]), saved["format"], key, True, time.perf_counter() - t0,
                           int(saved["tokens"]))
        except Exception:  # noqa: BLE001 (a damaged cache file is rebuilt, never trusted)
            pass
    if tokenizer is None and loader is not None:
        tokenizer = loader()
    numbered, eval_numbered, name, eval_name = split_numbered(data, seed)
    rows = [row for _, row in numbered]
    fmt = source_format(rows[0], data)
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
        _write_cache(path, {"train": _pack(train), "eval": _pack(evaluation), "format": fmt, "tokens": tokens})
    return DataSet(train, evaluation, fmt, key, False, time.perf_counter() - t0, tokens)


def load_tokenizer(recipe: Recipe) -> Any:
    """The recipe's tokenizer as the trainer loads it (the builtin one trained once and cached), with a
    chat template (:func:`runner.data.chat.ensure_chat_template`)."""
    from transformers import AutoTokenizer

    from runner.spec import builtin
    from runner.spec.paths import cache_dir

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


def needs_prefill(data: DataSection) -> bool:
    """Whether the pre-flight tokenizes the data (every row checked, the cache filled): chat and
    prompt/completion data and any eval set, where bad rows are common and sit anywhere in the file."""
    if data.source.startswith(BUILTIN_PREFIX) and data.eval_fraction == 0 and data.eval_source is None:
        return False
    if data.format in ("chat", "completion") or data.eval_fraction > 0 or data.eval_source or data.eval_split:
        return True
    from runner.data.source import _head_rows

    try:
        if is_file_source(data.source):
            rows = _head_rows(Path(data.source).expanduser(), 1)
        else:
            rows, _ = read_rows(data.source, data, data.split)
    except DataError:
        return True
    return bool(rows) and source_format(rows[0], data) != "text"


def prefill(recipe: Recipe) -> DataSet | None:
    """The pre-flight's data step: tokenize into the cache (the ranks then only read it), so that every
    bad row is found before launch. Only where :func:`needs_prefill` and the tokenizer is local (the
    builtin one, or a model folder); otherwise the ranks do it. None when nothing was tokenized (the
    data was cached already, or the ranks tokenize).

    Raises:
        DataError: one line naming the file and row.
    """
    if not needs_prefill(recipe.data):
        return None
    name = recipe.model.name
    if not name.startswith(BUILTIN_PREFIX) and not Path(name).expanduser().is_dir():
        return None
    tokenizer_id = local_tokenizer_digest(recipe.model)
    tokenizer = None
    if tokenizer_id is None:  # the builtin tokenizer, not trained yet: loading it trains it
        tokenizer = load_tokenizer(recipe)
        tokenizer_id = local_tokenizer_digest(recipe.model)
    key = cache_key(recipe.data, tokenizer, recipe.train.seed, tokenizer_id)
    if cache_path(key).is_file():
        # Cached: its rows were checked when it was written, and the ranks read it (a damaged file is
        # rebuilt there). Neither torch nor transformers is imported for a cached recipe.
        return None
    return load_data(recipe.data, tokenizer, recipe.train.seed, tokenizer_id=tokenizer_id,
                     loader=lambda: load_tokenizer(recipe), key=key)


def block_tensor(blocks: Blocks) -> torch.Tensor:
    """The label tensor of blocks (the ids where no token is masked)."""
    return blocks.labels if blocks.labels is not None else blocks.input_ids
