"""Per-block summaries of the metric time series, so that curves and best values never scan it.

Every metric row stays stored as written (nothing here deletes or thins the ``metrics`` table). Beside it
the store keeps, per run, metric name and block of steps (``step // span``, at each span of :data:`SPANS`),
the block's first, last, lowest and highest value with their steps and its count: MLflow's
``latest_metrics`` idea carried over to the whole curve. A curve of any run then costs a few hundred rows
to read, whatever its length, and keeps its shape: every block keeps its extremes, so the lowest loss
of a downsampled curve is the run's lowest loss.

This module is pure (no database): :func:`rollup_rows` turns freshly ingested points into blocks and
:func:`merge_into` folds them into stored ones; :func:`downsample_points` is the same rule for points
already in memory.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

SPANS = (64, 4096)
"""Block sizes in steps: the fine one for runs up to ~50k steps at display width, the coarse one beyond."""

ROLLUP_METRICS = ("loss", "lr", "grad_norm", "tokens_per_s")
"""The per-step columns summarised (the curves the monitor and compare draw)."""


@dataclass
class Block:
    """One block of one metric: its extremes and ends, with their steps."""

    count: int
    first_step: int
    first_value: float
    last_step: int
    last_value: float
    min_step: int
    min_value: float
    max_step: int
    max_value: float

    @classmethod
    def of(cls, step: int, value: float) -> Block:
        return cls(1, step, value, step, value, step, value, step, value)

    def add(self, step: int, value: float, count: int = 1) -> None:
        """Fold one point in (:meth:`merge` of a one-point block, without building it: ingest's hot loop)."""
        self.count += count
        if step < self.first_step:
            self.first_step, self.first_value = step, value
        if step >= self.last_step:
            self.last_step, self.last_value = step, value
        if value < self.min_value:
            self.min_step, self.min_value = step, value
        if value > self.max_value:
            self.max_step, self.max_value = step, value

    def merge(self, other: Block) -> None:
        """Fold ``other`` in (either may come first in steps)."""
        self.count += other.count
        if other.first_step < self.first_step:
            self.first_step, self.first_value = other.first_step, other.first_value
        if other.last_step >= self.last_step:
            self.last_step, self.last_value = other.last_step, other.last_value
        if other.min_value < self.min_value:
            self.min_step, self.min_value = other.min_step, other.min_value
        if other.max_value > self.max_value:
            self.max_step, self.max_value = other.max_step, other.max_value

    def points(self) -> list[tuple[int, float]]:
        """First, lowest, highest and last point, in step order, each step once."""
        seen: dict[int, float] = {}
        for step, value in sorted([(self.first_step, self.first_value), (self.min_step, self.min_value),
                                   (self.max_step, self.max_value), (self.last_step, self.last_value)]):
            seen.setdefault(step, value)
        return sorted(seen.items())


BLOCK_COLUMNS = ("count", "first_step", "first_value", "last_step", "last_value", "min_step", "min_value",
                 "max_step", "max_value")


def block_from_row(row: Mapping[str, object] | Sequence[object]) -> Block:
    """A :class:`Block` from a stored row (a mapping with :data:`BLOCK_COLUMNS`, or those values in order)."""
    values = [row[c] for c in BLOCK_COLUMNS] if isinstance(row, Mapping) else list(row)
    return Block(*values)  # type: ignore[arg-type]


def rollup_rows(rows: Iterable[Mapping[str, object]],
                names: Sequence[str] = ROLLUP_METRICS) -> dict[tuple[str, int, int], Block]:
    """Blocks of freshly stored metric rows (``step`` and the ``names`` columns), keyed (name, span, block).

    Non-finite values (a diverged loss) are left out of the summary; the rows themselves keep them.
    """
    out: dict[tuple[str, int, int], Block] = {}
    for row in rows:
        step = int(row["step"])  # type: ignore[call-overload]
        for name in names:
            value = row.get(name)
            if value is None:
                continue
            value = float(value)  # type: ignore[arg-type]
            if not math.isfinite(value):
                continue
            for span in SPANS:
                key = (name, span, step // span)
                block = out.get(key)
                if block is None:
                    out[key] = Block.of(step, value)
                else:
                    block.add(step, value)
    return out


def rollup_named(values: Iterable[tuple[int, str, float | None]],
                 counted: bool = True) -> dict[tuple[str, int, int], Block]:
    """Blocks of named metric values ``(step, name, value)``, keyed (name, span, block) as
    :func:`rollup_rows` keys the per-step columns. Non-finite and missing values are left out.

    ``counted=False`` gives blocks that count nothing: a value stored again for a step already summarised
    (its block's last value becomes the newer one; the older one may stay its extreme).
    """
    out: dict[tuple[str, int, int], Block] = {}
    for step, name, value in values:
        if value is None or not math.isfinite(value):
            continue
        for span in SPANS:
            key = (name, span, step // span)
            block = out.get(key)
            if block is None:
                out[key] = Block(int(counted), step, value, step, value, step, value, step, value)
            else:
                block.add(step, value, int(counted))
    return out


def merge_into(stored: Mapping[tuple[str, int, int], Block],
               fresh: Mapping[tuple[str, int, int], Block]) -> dict[tuple[str, int, int], Block]:
    """``fresh`` blocks folded into the ``stored`` ones with the same key (the result holds only keys of
    ``fresh``: the rows to update or insert)."""
    out = {}
    for key, block in fresh.items():
        old = stored.get(key)
        if old is None:
            out[key] = block
        else:
            merged = Block(**vars(old))
            merged.merge(block)
            out[key] = merged
    return out


def pick_span(block_counts: Mapping[int, int], points: int) -> int | None:
    """The coarsest span that still gives at least ``points / 4`` blocks (each block gives up to 4
    points), else the finest; None when there are no blocks."""
    present = sorted(span for span, n in block_counts.items() if n)
    if not present:
        return None
    for span in reversed(present):
        if block_counts[span] * 4 >= points:
            return span
    return present[0]


def downsample_blocks(blocks: Sequence[Block], points: int) -> list[tuple[int, float]]:
    """At most about ``points`` points from blocks in step order: neighbouring blocks merged into
    ``points / 4`` groups, each group's first, lowest, highest and last point kept."""
    if not blocks:
        return []
    groups = max(1, points // 4)
    if len(blocks) <= groups:
        merged = list(blocks)
    else:
        merged = []
        size = len(blocks) / groups
        for i in range(groups):
            chunk = blocks[int(i * size): max(int((i + 1) * size), int(i * size) + 1)]
            if not chunk:
                continue
            group = Block(**vars(chunk[0]))
            for other in chunk[1:]:
                group.merge(other)
            merged.append(group)
    out: list[tuple[int, float]] = []
    for block in merged:
        for point in block.points():
            if not out or point[0] > out[-1][0]:
                out.append(point)
    return out


def downsample_points(points: Sequence[tuple[int, float]], max_points: int) -> list[tuple[int, float]]:
    """``points`` (step order) thinned to at most about ``max_points`` for display, keeping the first
    and last point and each bucket's lowest and highest (so the curve's extremes survive); the input
    is left as it is. Non-finite values are kept only when no thinning is needed."""
    if max_points <= 0 or len(points) <= max_points:
        return list(points)
    finite = [(s, v) for s, v in points if math.isfinite(v)]
    if len(finite) <= max_points:
        return finite
    groups = max(1, max_points // 4)
    size = len(finite) / groups
    blocks = []
    for i in range(groups):
        chunk = finite[int(i * size): max(int((i + 1) * size), int(i * size) + 1)]
        if not chunk:
            continue
        block = Block.of(*chunk[0])
        for step, value in chunk[1:]:
            block.add(step, value)
        blocks.append(block)
    return downsample_blocks(blocks, max_points)
