"""What ``?`` (or F4) lists: the keys of the screen in front first, then the screen keys of the app, then
the rule for text fields. Built from the bindings themselves, so that the list cannot drift from them."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from textual.binding import Binding

KEY_NAMES = {"question_mark": "?", "slash": "/", "escape": "esc"}

TEXT_FIELD_RULE = [
    ("tab / shift+tab", "the next / previous field"),
    ("F-keys, ctrl+, esc", "act everywhere, in a text field too"),
    ("letters, digits, ?, /", "type in a text field; act anywhere else"),
]
"""The one key rule of the dashboard (the app's BINDINGS say why)."""

PALETTE = ("ctrl+p", "the command palette: screens, runs, fields")


def key_label(key: str) -> str:
    """A key as a person types it: ``?`` for question_mark, ``F1`` for f1."""
    key = key.strip()
    if key in KEY_NAMES:
        return KEY_NAMES[key]
    return key.upper() if re.fullmatch(r"f\d+", key) else key


def binding_rows(bindings: Iterable[Any]) -> list[tuple[str, str]]:
    """One row per action, in the order bound: its keys joined by `` / `` and what it does (the binding's
    tooltip, else its description). A binding with neither is left out (Textual's own plumbing)."""
    rows: dict[str, tuple[list[str], str]] = {}
    for binding in Binding.make_bindings(bindings):
        what = binding.tooltip or binding.description
        if not what:
            continue
        keys, _ = rows.setdefault(binding.action, ([], what))
        keys.append(key_label(binding.key))
    return [(" / ".join(keys), what) for keys, what in rows.values()]


def help_sections(screen: type, app: type) -> list[tuple[str, list[tuple[str, str]]]]:
    """``[(heading, [(keys, what)])]`` for a screen class in an app class: the screen's own keys (its
    bindings, then any ``HELP_ROWS`` it declares), the app's, then the text-field rule. The widgets'
    generic keys (a table's cursor, an input's editing) are left out: they are the same in every
    Textual app."""
    own = binding_rows(getattr(screen, "BINDINGS", [])) + list(getattr(screen, "HELP_ROWS", []))
    app_rows = binding_rows(app.BINDINGS) + [PALETTE]  # type: ignore[attr-defined]
    sections = [(f"{screen.__name__.removesuffix('Screen')} keys", own)] if own else []
    return [*sections, ("Screens and the app", app_rows), ("Text fields", list(TEXT_FIELD_RULE))]
