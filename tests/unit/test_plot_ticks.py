"""The step axis' ticks: whole steps, 1, 2 or 5 times a power of ten apart, at most as many as asked
(the first step added where it has room)."""

from __future__ import annotations

import pytest

from tui.app.widgets.plot import whole_ticks


@pytest.mark.parametrize(("lo", "hi", "most", "ticks"), [
    (1, 30, 5, [1, 10, 20, 30]),
    (1, 12, 5, [1, 5, 10]),
    (1, 5, 5, [1, 2, 3, 4, 5]),
    (3, 7, 3, [3, 4, 6]),
    (0, 1000, 5, [0, 500, 1000]),
    (120, 4500, 3, [120, 2000, 4000]),
    (1, 1, 5, [1]),
])
def test_whole_ticks(lo: float, hi: float, most: int, ticks: list[int]) -> None:
    assert whole_ticks(lo, hi, most) == ticks
