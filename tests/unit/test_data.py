"""Local data files in every supported format, with a text field or a template."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.data.rows import DataError, read_texts
from runner.spec.recipe import parse_recipe

ROWS = [{"prompt": "What is 2+2?", "response": "4"}, {"prompt": "Capital of France?", "response": "Paris"}]
TEMPLATE = "Q: {prompt}\nA: {response}"
EXPECTED = ["Q: What is 2+2?\nA: 4", "Q: Capital of France?\nA: Paris"]


def _data(path: Path, **extra: object) -> object:
    fields = "".join(f"{k} = {json.dumps(v)}\n" for k, v in extra.items())
    return parse_recipe(f"[data]\nsource = {json.dumps(str(path))}\n{fields}").data


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".csv"])
def test_rows_with_a_template(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"rows{suffix}"
    if suffix == ".jsonl":
        path.write_text("\n".join(json.dumps(r) for r in ROWS) + "\n")
    elif suffix == ".json":
        path.write_text(json.dumps({"train": ROWS}))
    else:
        path.write_text("prompt,response\n" + "".join(f'"{r["prompt"]}",{r["response"]}\n' for r in ROWS))
    assert read_texts(_data(path, template=TEMPLATE)) == EXPECTED  # type: ignore[arg-type]
    assert read_texts(_data(path, template=TEMPLATE, rows=1)) == EXPECTED[:1]  # type: ignore[arg-type]


def test_text_files_and_text_fields(tmp_path: Path) -> None:
    txt = tmp_path / "corpus.txt"
    txt.write_text("first line\n\nsecond line\n")
    assert read_texts(_data(txt)) == ["first line", "second line"]  # type: ignore[arg-type]
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text('{"content": "a"}\n{"content": "b"}\n')
    assert read_texts(_data(jsonl, text_field="content")) == ["a", "b"]  # type: ignore[arg-type]


def test_data_problems_name_the_field_or_file(tmp_path: Path) -> None:
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text('{"content": "a"}\nnot json\n')
    with pytest.raises(DataError, match=r"docs.jsonl:2: invalid JSON line"):
        read_texts(_data(jsonl, text_field="content"))  # type: ignore[arg-type]
    jsonl.write_text('{"content": "a"}\n')
    with pytest.raises(DataError, match=r"data.text_field: row 1 of docs.jsonl has no field 'text' \(fields: content\)"):
        read_texts(_data(jsonl))  # type: ignore[arg-type]
    with pytest.raises(DataError, match=r"data.template: row 1 of docs.jsonl has no field 'prompt'"):
        read_texts(_data(jsonl, template=TEMPLATE))  # type: ignore[arg-type]
    other = tmp_path / "data.xml"
    other.write_text("<x/>")
    with pytest.raises(DataError, match="data.source: data.xml: unsupported format"):
        read_texts(_data(other))  # type: ignore[arg-type]
