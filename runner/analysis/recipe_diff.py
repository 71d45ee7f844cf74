"""The recipe fields that differ between compared runs (``ftui compare``'s recipe diff), and the parsed
recipe text every comparison reads (parsed once per text)."""

from __future__ import annotations

import functools
import json
import tomllib
from collections.abc import Mapping, Sequence
from typing import Any


@functools.lru_cache(maxsize=256)
def parsed_recipe(text: str) -> dict[str, Any]:
    """A recipe's TOML, parsed once per comparison however many figures read it (callers only read it)."""
    return tomllib.loads(text)


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested TOML tables as dotted keys: ``{"train": {"lr": 1}}`` -> ``{"train.lr": 1}``."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, dotted + "."))
        else:
            out[dotted] = value
    return out


def recipe_diff(recipe_texts: Sequence[str]) -> dict[str, list[str]]:
    """The recipe fields whose values differ between runs, as dotted keys; ``-`` where a recipe lacks
    the key. Keys in sorted order; values rendered as JSON-like text."""
    flats = []
    for text in recipe_texts:
        try:
            flats.append(flatten(parsed_recipe(text)))
        except tomllib.TOMLDecodeError:
            flats.append({})
    keys = sorted(set().union(*flats)) if flats else []
    missing = object()
    diff: dict[str, list[str]] = {}
    for key in keys:
        values = [f.get(key, missing) for f in flats]
        rendered = ["-" if v is missing else (v if isinstance(v, str) else json.dumps(v)) for v in values]
        if len(set(rendered)) > 1:
            diff[key] = rendered
    return diff
