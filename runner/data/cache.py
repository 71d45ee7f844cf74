"""The tokenized-data cache: its key and its files.

Tokenized data is cached under ``FTUI_HOME``'s cache folder (``cache/data/<key>.pt``, its block counts
beside it in ``<key>.json`` for the pre-flight), keyed by a hash over the source's content, the eval
set's, the tokenizer (its vocabulary and merges, chat template and special tokens), the data section
(context length, packing, mask rule, fields, row limit) and, for an ``eval_fraction``, the seed. So the
second run of a recipe reads blocks instead of tokenizing, and of the ranks of one run only the first
tokenizes (``main_process_first``): the others read its file.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runner.data import chat, hf_datasets
from runner.data.blocks import Blocks
from runner.data.rows import is_dataset_source
from runner.spec import builtin
from runner.spec.paths import cache_dir

if TYPE_CHECKING:
    from runner.spec.recipe import DataSection, ModelSection

CACHE_VERSION = "1"
"""Part of every cache key: bump it when the blocks built from the same inputs change."""

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "tokenizer.model", "vocab.json", "vocab.txt", "merges.txt", "chat_template.jinja",
                   "chat_template.json")
"""The files of a tokenizer folder that decide its output (``save_pretrained``'s and the hub's names)."""


@dataclass(frozen=True)
class Cached:
    """What one cache file holds: the train and eval blocks, their rows' format and the train tokens."""

    train: Blocks
    eval: Blocks | None
    format: chat.Format
    tokens: int
    """Tokens of the train rows as tokenized (before packing cut or dropped any)."""


# ---------------------------------------------------------------------- the key


def file_digest(path: Path) -> str:
    """The sha256 of a file's content, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def source_digest(source: str) -> str:
    """A hash of what a data source holds (a dataset's by :func:`runner.data.hf_datasets.fingerprint`)."""
    if source == builtin.PYDOC_CORPUS:
        return hashlib.sha256(builtin.corpus_text().encode()).hexdigest()
    if is_dataset_source(source):
        return hf_datasets.fingerprint(source)
    path = Path(source).expanduser()
    return file_digest(path) if path.is_file() else "missing"


def tokenizer_digest(tokenizer: Any) -> str:
    """A hash of what decides a tokenizer's output: its model (vocabulary, merges, normalizer), chat
    template and special tokens."""
    digest = hashlib.sha256()
    backend = getattr(tokenizer, "backend_tokenizer", None)
    digest.update(backend.to_str().encode() if backend is not None else repr(tokenizer.get_vocab()).encode())
    digest.update(str(getattr(tokenizer, "chat_template", None)).encode())
    digest.update(repr((tokenizer.eos_token_id, tokenizer.pad_token_id)).encode())
    return digest.hexdigest()


def local_tokenizer_digest(model: ModelSection) -> str | None:
    """The tokenizer's digest from its files, without loading it: for the builtin tokenizer once it is
    trained, and for a model folder. None for a hub tokenizer (or a builtin one not trained yet): its
    digest comes from loading it (:func:`tokenizer_digest`).

    This is what lets a run whose data is cached start without importing transformers for the tokenizer
    (the pre-flight's check of a cached recipe): the files, the chat template
    :func:`runner.data.prepare.load_tokenizer` adds, and the tokenizer libraries' versions decide the
    tokens, so they make the key.
    """
    from importlib import metadata

    is_builtin = model.name.startswith(builtin.BUILTIN_PREFIX)
    folder = builtin.tokenizer_dir(cache_dir()) if is_builtin else Path(model.name).expanduser()
    if not folder.is_dir() or (is_builtin and not (folder / "tokenizer.json").is_file()):
        return None
    digest = hashlib.sha256()
    for name in TOKENIZER_FILES:
        path = folder / name
        if path.is_file():
            digest.update(f"{name}:{file_digest(path)}\n".encode())
    digest.update(f"builtin:{is_builtin}\n{chat.BUILTIN_CHAT_TEMPLATE}\n".encode())
    for library in ("tokenizers", "transformers"):
        try:
            digest.update(f"{library}=={metadata.version(library)}\n".encode())
        except metadata.PackageNotFoundError:
            digest.update(f"{library} missing\n".encode())
    return "files:" + digest.hexdigest()


def cache_key(data: DataSection, tokenizer: Any, seed: int, tokenizer_id: str | None = None) -> str:
    """The key of the tokenized data (see the module docstring), 32 hex digits.

    Args:
        data: the recipe's data section.
        tokenizer: the loaded tokenizer; unused when ``tokenizer_id`` is given.
        seed: the recipe's seed (it picks an ``eval_fraction``'s rows).
        tokenizer_id: the tokenizer's digest when known without it (:func:`local_tokenizer_digest`);
            else :func:`tokenizer_digest` of ``tokenizer``.
    """
    section = data.model_dump(mode="json", exclude={"shuffle"})
    parts = {
        "version": CACHE_VERSION,
        "data": section,
        "seed": seed if data.eval_fraction > 0 else None,
        "source": source_digest(data.source),
        "eval_source": source_digest(data.eval_source) if data.eval_source else None,
        "tokenizer": tokenizer_id or tokenizer_digest(tokenizer),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


# ---------------------------------------------------------------------- the files


def cache_path(key: str) -> Path:
    """The cache file of a :func:`cache_key`."""
    return cache_dir() / "data" / f"{key}.pt"


def read_cache(path: Path) -> Cached | None:
    """The blocks a cache file holds, memory-mapped; None when it is missing or damaged (a damaged file
    is rebuilt, never trusted)."""
    import torch

    if not path.is_file():
        return None
    try:
        # mmap: the blocks are paged in as batches read them, so a large cache costs nothing up front
        saved = torch.load(path, weights_only=True, mmap=True)
        train = _unpack(saved["train"])
        assert train is not None
        return Cached(train, _unpack(saved["eval"]), saved["format"], int(saved["tokens"]))
    except Exception:  # noqa: BLE001 (whatever is wrong with the file, it is rebuilt)
        return None


def write_cache(path: Path, cached: Cached) -> None:
    """Write a cache file atomically; a cache that cannot be written only costs the next run its tokenizing."""
    import torch

    payload = {"train": _pack(cached.train), "eval": _pack(cached.eval), "format": cached.format,
               "tokens": cached.tokens}
    tmp = ""
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(prefix="tmp-", suffix=".pt", dir=path.parent)  # torch wants a plain name
        os.close(fd)
        torch.save(payload, tmp)
        os.replace(tmp, path)  # atomic: a reader sees the whole file or none
        _write_counts(path, cached)
    except (OSError, RuntimeError):
        pass
    finally:
        if tmp and os.path.exists(tmp):
            os.unlink(tmp)


def counts_path(path: Path) -> Path:
    """The JSON beside a cache file that holds its block counts (read without torch)."""
    return path.with_suffix(".json")


def _write_counts(path: Path, cached: Cached) -> None:
    """Write the counts of a cache file beside it, atomically."""
    counts = {"train_rows": cached.train.shape[0], "eval_rows": 0 if cached.eval is None else cached.eval.shape[0]}
    fd, tmp = tempfile.mkstemp(prefix="tmp-", suffix=".json", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(counts, fh)
        os.replace(tmp, counts_path(path))
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def read_train_rows(path: Path) -> int | None:
    """The train blocks of a cache file: from the counts beside it (no torch), else from the file itself,
    writing the counts for the next time (a file written before counts were kept); None when the cache
    file is damaged (the ranks rebuild it)."""
    try:
        rows = json.loads(counts_path(path).read_text())["train_rows"]
        if isinstance(rows, int) and not isinstance(rows, bool) and rows >= 0:
            return rows
    except (OSError, ValueError, KeyError, TypeError):
        pass
    cached = read_cache(path)
    if cached is None:
        return None
    try:
        _write_counts(path, cached)
    except OSError:
        pass  # counted again next time
    return cached.train.shape[0]


def _pack(blocks: Blocks | None) -> dict[str, Any] | None:
    if blocks is None:
        return None
    return {"input_ids": blocks.input_ids, "attention_mask": blocks.attention_mask, "labels": blocks.labels}


def _unpack(saved: dict[str, Any] | None) -> Blocks | None:
    if saved is None:
        return None
    return Blocks(saved["input_ids"], saved["attention_mask"], saved["labels"])
