"""The pre-launch check of a recipe's data, cheap enough for every ``ftui run``.

Problems found here would otherwise fail the run seconds after launch, with a ``failed`` row.
"""

from __future__ import annotations

import codecs
from pathlib import Path
from typing import TYPE_CHECKING

from runner.data import chat
from runner.data.rows import (
    CHECK_ROWS,
    DataError,
    check_row,
    check_source,
    head_rows,
    is_dataset_source,
    is_file_source,
    read_rows,
    row_text,
)
from runner.spec.builtin import BUILTIN_PREFIX

if TYPE_CHECKING:
    from runner.spec.recipe import DataSection

_HEAD_BYTES = 64 * 1024


def check_data(data: DataSection) -> None:
    """Check the data before launch: the file exists, is a readable non-empty file, is text (not binary)
    in UTF-8, parses as its suffix says and its first :data:`runner.data.rows.CHECK_ROWS` rows have
    ``data.text_field`` (or every field ``data.template`` names), or fit their chat or prompt/completion
    format; a Hugging Face dataset loads (offline) with its split (:func:`check_dataset`).

    Raises:
        DataError: one line naming the field, the file and, where it applies, the row.
    """
    check_source(data.source)
    if data.eval_source is not None:
        check_source(data.eval_source, "data.eval_source")
    check_dataset_fields(data)
    if data.source.startswith(BUILTIN_PREFIX):
        if data.train_on == "completions" or data.format in ("chat", "completion"):
            raise DataError(f"data.train_on: {data.source} is plain text: no prompts or assistant turns "
                            "(use chat or prompt/completion rows)")
        return
    if not is_file_source(data.source):
        check_dataset(data)
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
    rows = head_rows(path, CHECK_ROWS)
    if not rows:
        raise DataError(f"data.source: {path}: no rows")
    fmt = chat.row_format(rows[0], data)
    for index, row in enumerate(rows):
        if fmt == "text":
            row_text(row, data, path, index)
        else:
            check_row(row, fmt, data, f"data.source: {path.name} row {index + 1}")


def check_dataset_fields(data: DataSection) -> None:
    """``data.split``, ``data.subset`` and ``data.eval_split`` name parts of a Hugging Face dataset: given
    for a file or the builtin corpus, which have none, they would be ignored.

    Raises:
        DataError: one line naming the field.
    """
    def refuse(field: str, value: str, source: str) -> None:
        raise DataError(f"{field}: {value[:60]!r} names a part of a Hugging Face dataset, and {source} is not one "
                        "(it has no splits or subsets)")

    if not is_dataset_source(data.source):
        if data.split != "train":
            refuse("data.split", data.split, data.source)
        if data.subset is not None:
            refuse("data.subset", data.subset, data.source)
    eval_source = data.eval_source or data.source
    if data.eval_split is not None and not is_dataset_source(eval_source):
        refuse("data.eval_split", data.eval_split, eval_source)


def check_dataset(data: DataSection) -> None:
    """Check a Hugging Face dataset source: it loads (offline), the split exists, it has rows and its first
    rows fit the format.

    Raises:
        DataError: one line naming the field, the dataset and, where it applies, the row.
    """
    rows, name = read_rows(data.source, data, data.split)
    if not rows:
        raise DataError(f"data.source: {name}: split {data.split!r} has no rows")
    fmt = chat.row_format(rows[0], data)
    for index, row in enumerate(rows[:CHECK_ROWS]):
        if fmt == "text":
            row_text(row, data, Path(name), index)
        else:
            check_row(row, fmt, data, f"data.source: {name} row {index + 1}")
