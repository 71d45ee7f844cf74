"""Compose's Save as pure functions: the loaded text with only the changed fields set (comments kept), a
missing table added, relative paths made absolute only when the file moves to another folder."""

from __future__ import annotations

from pathlib import Path

from runner.spec.recipe import load_recipe, parse_recipe
from runner.spec.recipe_edit import changed_fields, edited_text, moved_paths

TEXT = '''# my recipe: keep this comment
name = "mine"  # and this one

[data]
source = "rows.jsonl"

[train]
max_steps = 30
'''


def test_only_the_changed_fields_are_set_in_place_and_a_missing_table_is_added(tmp_path: Path) -> None:
    (tmp_path / "rows.jsonl").write_text('{"text": "hello"}\n')
    base = parse_recipe(TEXT, base_dir=tmp_path)
    recipe = parse_recipe(TEXT, overrides=["train.max_steps=7", "launch.strategy=ddp", "launch.nproc=2"],
                          base_dir=tmp_path)
    paths = ["name", "data.source", "train.max_steps", "train.lr", "launch.strategy", "launch.nproc"]
    changes = changed_fields(base, recipe, paths)
    assert changes == {"train.max_steps": 7, "launch.strategy": "ddp", "launch.nproc": 2}
    text = edited_text(TEXT, changes)
    assert text.startswith(TEXT.replace("max_steps = 30", "max_steps = 7"))
    assert '[launch]\nstrategy = "ddp"\nnproc = 2\n' in text
    saved = tmp_path / "saved.toml"
    saved.write_text(text)
    assert load_recipe(saved).model_dump() == recipe.model_dump()


def test_relative_paths_become_absolute_only_in_another_folder(tmp_path: Path) -> None:
    (tmp_path / "rows.jsonl").write_text('{"text": "hello"}\n')
    base = parse_recipe(TEXT, base_dir=tmp_path)
    assert moved_paths(TEXT, base, tmp_path, tmp_path) == {}
    moved = moved_paths(TEXT, base, tmp_path, tmp_path / "elsewhere")
    assert moved == {"data.source": str(tmp_path / "rows.jsonl")}
    (tmp_path / "elsewhere").mkdir()
    saved = tmp_path / "elsewhere" / "copy.toml"
    saved.write_text(edited_text(TEXT, moved))
    assert load_recipe(saved).data.source == str(tmp_path / "rows.jsonl")
    assert saved.read_text().startswith("# my recipe: keep this comment\nname = \"mine\"  # and this one\n")
