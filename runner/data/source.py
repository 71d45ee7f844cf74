"""Training data: the builtin corpus or a local file, tokenized into fixed-length blocks.

Local files: ``.jsonl`` (one JSON object a line), ``.json`` (a list of objects), ``.csv`` (a header
row), ``.parquet`` (needs pyarrow) and ``.txt`` (one row per non-empty line). A row's text is
``data.template.format(**row)`` when a template is given, else ``row[data.text_field]``.
"""

from __future__ import annotations

import codecs
import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runner.spec.builtin import BUILTIN_PREFIX, PYDOC_CORPUS, corpus_documents

if TYPE_CHECKING:
    import torch

    from runner.spec.recipe import DataSection

SUFFIXES = (".jsonl", ".json", ".csv", ".parquet", ".txt")


class DataError(ValueError):
    """A data problem phrased for the user (names the field or file)."""


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


def check_source(source: str, field: str = "data.source") -> None:
    """Cheap pre-launch check of ``data.source`` (the file exists and has a known suffix, or it names
    a Hugging Face dataset: :mod:`runner.data.hf_datasets`)."""
    from runner.data.hf_datasets import is_dataset_source

    if source.startswith(BUILTIN_PREFIX):
        if source != PYDOC_CORPUS:
            raise DataError(f"{field}: unknown builtin corpus {source!r} (have {PYDOC_CORPUS})")
        return
    if is_dataset_source(source):
        return
    path = Path(source).expanduser()
    if path.is_dir():
        raise DataError(f"data.source: {source}: is a folder, not a data file")
    if not path.is_file():
        raise DataError(f"data.source: file not found: {source}")
    if path.suffix.lower() not in SUFFIXES:
        raise DataError(f"data.source: {path.name}: unsupported format (use one of {', '.join(SUFFIXES)})")


CHECK_ROWS = 20
"""Rows :func:`check_data` reads before launch (the whole file is read by the trainer)."""
_HEAD_BYTES = 64 * 1024


def check_data(data: DataSection) -> None:
    """Pre-launch check of the data, cheap enough for every ``ftui run``: the file exists, is a
    readable non-empty file, is text (not binary) in UTF-8, parses as its suffix says and its first
    :data:`CHECK_ROWS` rows have ``data.text_field`` (or every field ``data.template`` names).

    Problems found here would otherwise fail the run seconds after launch, with a ``failed`` row.

    Raises:
        DataError: one line naming the field, the file and, where it applies, the row.
    """
    check_source(data.source)
    if data.eval_source is not None:
        check_source(data.eval_source, "data.eval_source")
    from runner.data import prepare

    if data.source.startswith(BUILTIN_PREFIX):
        if data.train_on == "completions" or data.format in ("chat", "completion"):
            raise DataError(f"data.train_on: {data.source} is plain text: no prompts or assistant turns "
                            "(use chat or prompt/completion rows)")
        return
    if not prepare.is_file_source(data.source):
        prepare.check_dataset(data)
        return
    path = Path(data.source).expanduser()
    try:
        with open(path, "rb") as fh:
            head = fh.read(_HEAD_BYTES)
    except OSError as exc:
        raise DataError(f"data.source: {path}: cannot read: {exc.strerror or exc}") from None
    if not head:
        raise DataError(f"data.source: {path}: empty file")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        if not head.startswith(b"PAR1"):
            raise DataError(f"data.source: {path}: not a parquet file (no PAR1 header)")
    else:
        if b"\0" in head:
            raise DataError(f"data.source: {path}: binary file, not {suffix[1:]} text")
        try:
            codecs.getincrementaldecoder("utf-8")().decode(head, final=len(head) < _HEAD_BYTES)
        except UnicodeDecodeError as exc:
            raise DataError(f"data.source: {path}: not UTF-8 text (byte {exc.start + 1})") from None
    rows = _head_rows(path, CHECK_ROWS)
    if not rows:
        raise DataError(f"data.source: {path}: no rows")
    fmt = prepare.source_format(rows[0], data)
    for index, row in enumerate(rows):
        if fmt == "text":
            _row_text(row, data, path, index)
        else:
            prepare.check_row(row, fmt, data, f"data.source: {path.name} row {index + 1}")


def _head_rows(path: Path, n: int) -> list[Any]:
    """The first ``n`` rows of a local file, parsed as :func:`_read_rows` parses them all."""
    suffix = path.suffix.lower()
    try:
        if suffix == ".jsonl":
            return _jsonl_rows(path, limit=n, prefix="data.source: ")
        if suffix == ".csv":
            with open(path, encoding="utf-8", newline="") as fh:
                reader = csv.DictReader(fh)
                return [row for _, row in zip(range(n), reader, strict=False)]
        if suffix == ".txt":
            with open(path, encoding="utf-8") as fh:
                lines = (line.rstrip("\n") for line in fh)
                return [{"text": line} for _, line in zip(range(n), (x for x in lines if x.strip()), strict=False)]
        if suffix == ".parquet":
            try:
                import pyarrow.parquet as pq
            except ImportError:
                raise DataError(f"data.source: {path}: reading parquet needs pyarrow (pip install pyarrow)") from None
            try:
                batch = next(pq.ParquetFile(path).iter_batches(batch_size=n), None)
            except Exception as exc:  # noqa: BLE001 (pyarrow raises its own error types)
                raise DataError(f"data.source: {path}: not a readable parquet file ({exc})") from None
            return [] if batch is None else list(batch.to_pylist())
        return _read_rows(path)[:n]  # .json: one document, parsed whole
    except (csv.Error, UnicodeDecodeError, OSError) as exc:
        raise DataError(f"data.source: {path}: cannot parse as {suffix[1:]}: {exc}") from None
    except RecursionError:
        raise DataError(f"data.source: {path}: nested too deeply") from None


def read_texts(data: DataSection) -> list[str]:
    """The texts of the data source, one per row, after ``rows`` is applied."""
    check_source(data.source)
    if data.source == PYDOC_CORPUS:
        texts = corpus_documents()
    else:
        path = Path(data.source).expanduser()
        texts = [_row_text(row, data, path, i) for i, row in enumerate(_read_rows(path))]
    if data.rows:
        texts = texts[: data.rows]
    if not texts:
        raise DataError(f"data.source: {data.source}: no rows")
    return texts


def load_blocks(data: DataSection, tokenizer: Any) -> Blocks:
    """Tokenize the data source into blocks of ``data.context_length`` tokens."""
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


def _jsonl_rows(path: Path, limit: int | None = None, prefix: str = "") -> list[Any]:
    """The rows of a JSONL file (the first ``limit`` of them); a bad line is a DataError naming the line."""
    rows: list[Any] = []
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise DataError(f"{prefix}{path}:{number}: invalid JSON line: {exc.msg}") from None
            if limit is not None and len(rows) >= limit:
                break
    return rows


def _read_rows(path: Path) -> list[dict[str, Any]]:
    suffix = path.suffix.lower()
    try:
        if suffix == ".jsonl":
            return _jsonl_rows(path)
        if suffix == ".json":
            loaded = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(loaded, dict):  # {"data": [...]} or {"train": [...]}: take the one list
                lists = [v for v in loaded.values() if isinstance(v, list)]
                loaded = lists[0] if len(lists) == 1 else loaded
            if not isinstance(loaded, list):
                raise DataError(f"{path}: expected a JSON list of objects")
            return loaded
        if suffix == ".csv":
            with open(path, encoding="utf-8", newline="") as fh:
                return list(csv.DictReader(fh))
        if suffix == ".parquet":
            try:
                import pyarrow.parquet as pq
            except ImportError:
                raise DataError(f"{path}: reading parquet needs pyarrow (pip install pyarrow)") from None
            return list(pq.read_table(path).to_pylist())
        return [{"text": line} for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: invalid JSON: {exc.msg} (line {exc.lineno})") from None
    except UnicodeDecodeError:
        raise DataError(f"{path}: not UTF-8 text") from None


def _row_text(row: Any, data: DataSection, path: Path, index: int) -> str:
    if not isinstance(row, dict):
        raise DataError(f"{path}: row {index + 1} is not an object")
    if data.template is not None:
        try:
            return data.template.format(**row)
        except KeyError as exc:
            raise DataError(f"data.template: row {index + 1} of {path.name} has no field {exc.args[0]!r}") from None
        except (ValueError, IndexError, AttributeError, TypeError) as exc:  # "{", "{0}", "{a.b}", "{a:d}"
            raise DataError(f"data.template: cannot format row {index + 1} of {path.name}: {exc}") from None
    if data.text_field not in row:
        raise DataError(
            f"data.text_field: row {index + 1} of {path.name} has no field {data.text_field!r} "
            f"(fields: {', '.join(map(str, row))})"
        )
    return str(row[data.text_field])
