"""Reading and writing the metric summaries of :mod:`store.rollup` inside a store transaction."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import cast

from sqlalchemy import Table, bindparam, func, insert, select, update
from sqlalchemy.orm import Session

from store.models import Metric, MetricRollup
from store.rollup import (
    BLOCK_COLUMNS,
    ROLLUP_METRICS,
    Block,
    block_from_row,
    downsample_blocks,
    merge_into,
    pick_span,
    rollup_rows,
)


@dataclass(frozen=True)
class Curve:
    """One metric of one run, downsampled for display (every stored row is still in ``metrics``)."""

    points: list[tuple[int, float]] = field(default_factory=list)
    """(step, value) in step order: each group's first, lowest, highest and last point."""
    count: int = 0
    """Finite values stored for this metric (the whole series, not the points shown)."""
    last_step: int | None = None
    """The newest step summarised: read metric rows after it to follow the run."""

    @property
    def best(self) -> float | None:
        """The lowest value of the whole series (kept by every downsampling)."""
        return min((v for _, v in self.points), default=None)


def write_rollups(session: Session, run_id: int, metric_rows: Sequence[Mapping[str, object]]) -> None:
    """Fold freshly inserted metric rows into the run's summaries (in the caller's transaction)."""
    fresh = rollup_rows(metric_rows)
    if not fresh:
        return
    table = cast(Table, MetricRollup.__table__)
    stored: dict[tuple[str, int, int], tuple[int, Block]] = {}
    # Batches arrive in step order, so only the blocks this batch touches can already exist.
    for span in {key[1] for key in fresh}:
        blocks = [key[2] for key in fresh if key[1] == span]
        query = (select(table.c.id, table.c.name, table.c.block, *(table.c[c] for c in BLOCK_COLUMNS))
                 .where(table.c.run_id == run_id, table.c.span == span,
                        table.c.block >= min(blocks), table.c.block <= max(blocks)))
        for row in session.execute(query):
            stored[(row[1], span, row[2])] = (row[0], block_from_row(row[3:]))
    merged = merge_into({k: b for k, (_, b) in stored.items()}, fresh)
    updates = [{"row_id": stored[key][0], **vars(block)} for key, block in merged.items() if key in stored]
    inserts = [{"run_id": run_id, "name": key[0], "span": key[1], "block": key[2], **vars(block)}
               for key, block in merged.items() if key not in stored]
    if inserts:
        session.execute(insert(table), inserts)
    if updates:
        stmt = (update(table).where(table.c.id == bindparam("row_id"))
                .values({c: bindparam(c) for c in BLOCK_COLUMNS}))
        session.connection().execute(stmt, updates)


def read_curves(session: Session, run_ids: Iterable[int], name: str = "loss",
                points: int = 400) -> dict[int, Curve]:
    """Each run's ``name`` curve in at most about ``points`` points, from the summaries alone."""
    if name not in ROLLUP_METRICS:
        raise ValueError(f"metric {name!r} is not summarised (one of {', '.join(ROLLUP_METRICS)})")
    ids = list(dict.fromkeys(run_ids))
    if not ids:
        return {}
    table = cast(Table, MetricRollup.__table__)
    counts: dict[int, dict[int, int]] = {}
    values: dict[int, int] = {}
    for run_id, span, n, total in session.execute(
            select(table.c.run_id, table.c.span, func.count(), func.sum(table.c.count))
            .where(table.c.run_id.in_(ids), table.c.name == name)
            .group_by(table.c.run_id, table.c.span)):
        counts.setdefault(run_id, {})[span] = n
        values[run_id] = int(total)
    # A series that fits in ``points`` is read whole: nothing to thin, and no more rows than the blocks.
    whole = [run_id for run_id, total in values.items() if total <= points]
    raw: dict[int, list[tuple[int, float]]] = {}
    if whole:
        metrics = cast(Table, Metric.__table__)
        column = metrics.c[name]
        for run_id, step, value in session.execute(
                select(metrics.c.run_id, metrics.c.step, column)
                .where(metrics.c.run_id.in_(whole), column.is_not(None)).order_by(metrics.c.run_id, metrics.c.step)):
            if math.isfinite(value):
                raw.setdefault(run_id, []).append((step, value))
    chosen: dict[int, list[int]] = {}
    for run_id, by_span in counts.items():
        span = pick_span(by_span, points)
        if span is not None and run_id not in raw:
            chosen.setdefault(span, []).append(run_id)
    blocks: dict[int, list[Block]] = {}
    for span, runs in chosen.items():
        query = (select(table.c.run_id, *(table.c[c] for c in BLOCK_COLUMNS))
                 .where(table.c.run_id.in_(runs), table.c.name == name, table.c.span == span)
                 .order_by(table.c.run_id, table.c.block))
        for row in session.execute(query):
            blocks.setdefault(row[0], []).append(block_from_row(row[1:]))
    out = {}
    for run_id in ids:
        if run_id in raw:
            pairs = raw[run_id]
            out[run_id] = Curve(points=pairs, count=len(pairs), last_step=pairs[-1][0])
            continue
        bs = blocks.get(run_id, [])
        out[run_id] = Curve(points=downsample_blocks(bs, points), count=sum(b.count for b in bs),
                            last_step=max((b.last_step for b in bs), default=None))
    return out
