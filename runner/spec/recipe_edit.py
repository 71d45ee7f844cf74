"""Writing a recipe back as its own file: the loaded TOML with only the changed fields set (tomlkit keeps
its comments, order and layout), instead of every field with its default (``Recipe.to_toml``)."""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import tomlkit

from runner.spec.recipe import PATH_FIELDS, Recipe


def plain_value(recipe: Recipe, path: str) -> Any:
    """The value at ``path`` (``train.lr``) as TOML can hold it (enums as their strings, tuples as lists)."""
    node: Any = recipe.model_dump(mode="json")
    for part in path.split("."):
        node = node[part]
    return node


def changed_fields(base: Recipe, recipe: Recipe, paths: Iterable[str]) -> dict[str, Any]:
    """``{path: value}`` of the fields in ``paths`` whose value in ``recipe`` differs from ``base`` (the
    recipe as loaded); a value that became None is left out (TOML has no null: the file's value stays)."""
    changes = {p: plain_value(recipe, p) for p in paths}
    return {p: v for p, v in changes.items() if v is not None and v != plain_value(base, p)}


def moved_paths(base_text: str, base: Recipe, base_dir: Path, target_dir: Path) -> dict[str, Any]:
    """``{path: absolute}`` for each relative path the text names (``data.source``…) when the file is
    written into another folder than ``base_dir``: relative there, it would name another file."""
    if base_dir.resolve() == target_dir.resolve():
        return {}
    raw = tomllib.loads(base_text)
    moved = {}
    for dotted in PATH_FIELDS:
        section, key = dotted.split(".")
        written = raw.get(section, {}).get(key) if isinstance(raw.get(section), dict) else None
        resolved = plain_value(base, dotted)
        if isinstance(written, str) and isinstance(resolved, str) and written != resolved:
            moved[dotted] = resolved
    return moved


def edited_text(base_text: str, changes: Mapping[str, Any]) -> str:
    """``base_text`` with each ``{dotted.path: value}`` of ``changes`` set in place; comments, key order
    and layout are kept, and a table the text lacks (``[method.lora]``) is added at its end."""
    doc = tomlkit.parse(base_text)
    for path, value in changes.items():
        *tables, key = path.split(".")
        node: Any = doc
        for name in tables:
            if name not in node:
                node[name] = tomlkit.table()
            node = node[name]
        node[key] = value
    return tomlkit.dumps(doc)
