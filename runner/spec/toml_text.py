"""Recipes written back as TOML text (``Recipe.to_toml``, a sweep's stored recipe): nested dicts of TOML
scalars and lists, no library (tomllib only reads)."""

from __future__ import annotations

from typing import Any


def dump_toml(data: dict[str, Any]) -> str:
    """Write nested dicts of TOML scalars/lists as TOML text (scalars first, then sections)."""
    lines: list[str] = []
    _dump_table(data, [], lines)
    return "\n".join(lines).strip() + "\n"


def _dump_table(table: dict[str, Any], prefix: list[str], lines: list[str]) -> None:
    scalars = {k: v for k, v in table.items() if not isinstance(v, dict)}
    tables = {k: v for k, v in table.items() if isinstance(v, dict)}
    if prefix and scalars:
        lines.append(f"\n[{'.'.join(prefix)}]")
    for key, value in scalars.items():
        if value is None:
            continue  # TOML has no null: an absent key means the default (None)
        lines.append(f"{key} = {_toml_value(value)}")
    for key, value in tables.items():
        _dump_table(value, [*prefix, key], lines)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")
