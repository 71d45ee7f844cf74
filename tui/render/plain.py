"""Cells of rich tables as text, never markup.

rich parses a ``str`` given to ``Table.add_row`` (and a table's title) as console markup, so a run
named ``[/]`` raises ``MarkupError`` and ``ablation [v2]`` loses its ``[v2]``. Every row that can carry
text from a run or a user (names, errors, recipe values, paths, host and device names) goes through
:func:`row`.
"""

from __future__ import annotations

from rich.console import RenderableType
from rich.text import Text


def cell(value: RenderableType) -> RenderableType:
    """``value`` as a renderable: a ``str`` becomes plain :class:`~rich.text.Text`."""
    return Text(value) if isinstance(value, str) else value


def row(*values: RenderableType) -> list[RenderableType]:
    """The cells of one table row, strings as plain text."""
    return [cell(v) for v in values]
