"""Rows of any data source: which kind of source ``data.source`` names, every row of it, and a row's text.

Sources: the builtin corpus (``builtin:...``), a local file, or a Hugging Face dataset
(:mod:`runner.data.hf_datasets`). Local files: ``.jsonl`` (one JSON object a line), ``.json`` (a list of
objects), ``.csv`` (a header row), ``.parquet`` (needs pyarrow) and ``.txt`` (one row per non-empty line).
A text row's text is ``data.template.format(**row)`` when a template is given, else ``row[data.text_field]``;
chat and prompt/completion rows are checked here and tokenized by :mod:`runner.data.chat`.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runner.data import chat, hf_datasets
from runner.spec.builtin import BUILTIN_PREFIX, PYDOC_CORPUS, corpus_documents

if TYPE_CHECKING:
    from runner.spec.recipe import DataSection

SUFFIXES = (".jsonl", ".json", ".csv", ".parquet", ".txt")
"""The local file formats a data source may have."""
CHECK_ROWS = 20
"""Rows the pre-launch check reads (the whole source is read by the trainer)."""


class DataError(ValueError):
    """A data problem phrased for the user (names the field or file)."""


# ---------------------------------------------------------------------- kinds of source


def is_dataset_source(source: str) -> bool:
    """Whether ``source`` names a Hugging Face dataset (a folder, ``hf:name`` or an ``org/name`` id that is
    not a local file) rather than a data file."""
    if source.startswith(hf_datasets.HUB_PREFIX):
        return True
    path = Path(source).expanduser()
    if path.is_dir():
        return True
    if path.exists():
        return False
    parts = source.split("/")
    return len(parts) == 2 and all(parts) and not source.startswith((".", "~")) and not source.lower().endswith(SUFFIXES)


def is_file_source(source: str) -> bool:
    """A local data file (not the builtin corpus, not a Hugging Face dataset)."""
    return not source.startswith(BUILTIN_PREFIX) and not is_dataset_source(source)


def check_source(source: str, field: str = "data.source") -> None:
    """Cheap check of what ``source`` names: a known builtin corpus, a Hugging Face dataset, or an existing
    file of a known format.

    Raises:
        DataError: one line naming the field and the source.
    """
    if source.startswith(BUILTIN_PREFIX):
        if source != PYDOC_CORPUS:
            raise DataError(f"{field}: unknown builtin corpus {source!r} (have {PYDOC_CORPUS})")
        return
    if is_dataset_source(source):
        return
    path = Path(source).expanduser()
    if path.is_dir():
        raise DataError(f"{field}: {source}: is a folder, not a data file")
    if not path.is_file():
        raise DataError(f"{field}: file not found: {source}")
    if path.suffix.lower() not in SUFFIXES:
        raise DataError(f"{field}: {path.name}: unsupported format (use one of {', '.join(SUFFIXES)})")


# ---------------------------------------------------------------------- reading rows


def read_rows(source: str, data: DataSection, split: str, field: str = "data.source") -> tuple[list[Any], str]:
    """Every row of ``source`` and the name errors give it (a file name, a dataset id).

    Args:
        source: ``data.source`` or ``data.eval_source``.
        data: the recipe's data section (a dataset's subset).
        split: the split of a dataset source.
        field: the recipe field that names ``source``, for errors.

    Raises:
        DataError: unreadable, missing, or a missing split/subset of a dataset; one line.
    """
    if source == PYDOC_CORPUS:
        return [{"text": text} for text in corpus_documents()], source
    if is_dataset_source(source):
        try:
            return list(hf_datasets.load_rows(source, split, data.subset, field)), source
        except hf_datasets.HFDataError as exc:
            raise DataError(str(exc)) from None
    path = Path(source).expanduser()
    if not path.is_file():
        raise DataError(f"{field}: file not found: {source}")
    try:
        return list(read_file_rows(path)), path.name
    except DataError as exc:
        raise DataError(f"{field}: {exc}") from None


def read_file_rows(path: Path) -> list[dict[str, Any]]:
    """Every row of a local data file, parsed as its suffix says.

    Raises:
        DataError: the file does not parse (names the file and, for JSON, the line).
    """
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


def head_rows(path: Path, n: int) -> list[Any]:
    """The first ``n`` rows of a local file, parsed as :func:`read_file_rows` parses them all (without
    reading the rest of a line-based file).

    Raises:
        DataError: the head does not parse; one line naming the file.
    """
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
        return read_file_rows(path)[:n]  # .json: one document, parsed whole
    except (csv.Error, UnicodeDecodeError, OSError) as exc:
        raise DataError(f"data.source: {path}: cannot parse as {suffix[1:]}: {exc}") from None
    except RecursionError:
        raise DataError(f"data.source: {path}: nested too deeply") from None


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


# ---------------------------------------------------------------------- one row


def row_text(row: Any, data: DataSection, path: Path, index: int) -> str:
    """The text of a text row: ``data.template`` filled from it, else its ``data.text_field``.

    Args:
        row: the row as read.
        data: the recipe's data section.
        path: the source (its name is in errors).
        index: the row's 0-based index in its source.

    Raises:
        DataError: not an object, or a field the template or ``data.text_field`` names is missing.
    """
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


def check_row(row: Any, fmt: chat.Format, data: DataSection, where: str) -> None:
    """Check one chat or prompt/completion row's structure; ``where`` names it in the error.

    Raises:
        DataError: ``where`` and what is wrong with the row.
    """
    try:
        if fmt == "chat":
            chat.check_messages(row, data)
        elif fmt == "completion":
            chat.check_completion(row, data)
    except chat.RowError as exc:
        raise DataError(f"{where}: {exc}") from None


def read_texts(data: DataSection) -> list[str]:
    """The texts of a text source, one per row, after ``data.rows`` is applied.

    Raises:
        DataError: a bad source or row, or no rows; one line.
    """
    check_source(data.source)
    if data.source == PYDOC_CORPUS:
        texts = corpus_documents()
    else:
        path = Path(data.source).expanduser()
        texts = [row_text(row, data, path, i) for i, row in enumerate(read_file_rows(path))]
    if data.rows:
        texts = texts[: data.rows]
    if not texts:
        raise DataError(f"data.source: {data.source}: no rows")
    return texts
