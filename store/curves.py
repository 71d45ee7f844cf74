"""Reading and writing the metric summaries of :mod:`store.rollup` inside a store transaction."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import cast

from sqlalchemy import Table, and_, bindparam, func, insert, select, update
from sqlalchemy.orm import Session

from store.models import Metric, MetricRollup, NamedMetric, NamedMetricRollup
from store.rollup import (
    BLOCK_COLUMNS,
    ROLLUP_METRICS,
    SPANS,
    Block,
    block_from_row,
    downsample_blocks,
    merge_into,
    pick_span,
    rollup_named,
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
    _write_blocks(session, cast(Table, MetricRollup.__table__), run_id, rollup_rows(metric_rows))


def write_named_rollups(session: Session, run_id: int, inserted: Iterable[tuple[int, str, float | None]],
                        updated: Iterable[tuple[int, str, float | None]] = ()) -> None:
    """Fold freshly stored named values ``(step, name, value)`` into the run's named summaries (in the
    caller's transaction); ``updated`` values replaced one already stored for their step and are not
    counted again."""
    fresh = rollup_named(inserted)
    again = rollup_named(updated, counted=False)
    for key, block in again.items():
        if key in fresh:
            fresh[key].merge(block)
        else:
            fresh[key] = block
    _write_blocks(session, cast(Table, NamedMetricRollup.__table__), run_id, fresh)


def _write_blocks(session: Session, table: Table, run_id: int, fresh: Mapping[tuple[str, int, int], Block]) -> None:
    if not fresh:
        return
    stored: dict[tuple[str, int, int], tuple[int, Block]] = {}
    # Batches arrive in step order, so only the blocks this batch touches can already exist.
    # The names too, so that the unique (run, name, span, block) index finds them without scanning every
    # block of a long run.
    for span in {key[1] for key in fresh}:
        blocks = [key[2] for key in fresh if key[1] == span]
        query = (select(table.c.id, table.c.name, table.c.block, *(table.c[c] for c in BLOCK_COLUMNS))
                 .where(table.c.run_id == run_id, table.c.name.in_(sorted({key[0] for key in fresh})),
                        table.c.span == span, table.c.block >= min(blocks), table.c.block <= max(blocks)))
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
    metrics = cast(Table, Metric.__table__)
    column = metrics.c[name]

    def raw(runs: list[int], _names: list[str]) -> Iterable[tuple[int, str, int, float | None]]:
        query = (select(metrics.c.run_id, metrics.c.step, column)
                 .where(metrics.c.run_id.in_(runs), column.is_not(None)).order_by(metrics.c.run_id, metrics.c.step))
        return ((run_id, name, step, value) for run_id, step, value in session.execute(query))

    found = _read(session, cast(Table, MetricRollup.__table__), ids, [name], points, raw)
    return {run_id: found.get((run_id, name), Curve()) for run_id in ids}


def read_named_curves(session: Session, run_ids: Iterable[int], names: Sequence[str] | None = None,
                      points: int = 400) -> dict[int, dict[str, Curve]]:
    """Each run's named metrics (all, or ``names``) as curves of at most about ``points`` points, from
    the summaries (a series of no more than ``points`` values is read whole); by run id, then name."""
    ids = list(dict.fromkeys(run_ids))
    named = cast(Table, NamedMetric.__table__)

    def raw(runs: list[int], wanted: list[str]) -> Iterable[tuple[int, str, int, float | None]]:
        query = (select(named.c.run_id, named.c.name, named.c.step, named.c.value)
                 .where(named.c.run_id.in_(runs), named.c.name.in_(wanted), named.c.value.is_not(None))
                 .order_by(named.c.run_id, named.c.name, named.c.step))
        return ((run_id, name, step, value) for run_id, name, step, value in session.execute(query))

    found = _read(session, cast(Table, NamedMetricRollup.__table__), ids,
                  list(names) if names is not None else None, points, raw)
    out: dict[int, dict[str, Curve]] = {run_id: {} for run_id in ids}
    for (run_id, name), curve in sorted(found.items()):
        out[run_id][name] = curve
    return out


def read_named_last(session: Session, run_ids: Iterable[int]) -> dict[int, dict[str, tuple[int, float]]]:
    """Each run's named metrics' last finite value with its step, by run id then name: one summary row per
    run and name (the newest coarse block), however long the run."""
    ids = list(dict.fromkeys(run_ids))
    out: dict[int, dict[str, tuple[int, float]]] = {run_id: {} for run_id in ids}
    if not ids:
        return out
    table = cast(Table, NamedMetricRollup.__table__)
    span = max(SPANS)
    newest = (select(table.c.run_id, table.c.name, func.max(table.c.block).label("block"))
              .where(table.c.run_id.in_(ids), table.c.span == span)
              .group_by(table.c.run_id, table.c.name).subquery())
    query = (select(table.c.run_id, table.c.name, table.c.last_step, table.c.last_value)
             .join(newest, and_(table.c.run_id == newest.c.run_id, table.c.name == newest.c.name,
                                table.c.block == newest.c.block))
             .where(table.c.span == span).order_by(table.c.run_id, table.c.name))
    for run_id, name, step, value in session.execute(query):
        out[run_id][name] = (step, value)
    return out


RawReader = Callable[[list[int], list[str]], Iterable[tuple[int, str, int, float | None]]]
"""Reads (run id, name, step, value) rows of the stored series, for the runs and names given."""


def _read(session: Session, table: Table, ids: list[int], names: list[str] | None, points: int,
          raw_reader: RawReader) -> dict[tuple[int, str], Curve]:
    """Curves by (run id, name) from the summaries in ``table``; a series that fits in ``points`` is
    read whole through ``raw_reader``: nothing to thin, and no more rows than its blocks."""
    if not ids or names == []:
        return {}
    counts: dict[tuple[int, str], dict[int, int]] = {}
    values: dict[tuple[int, str], int] = {}
    query = (select(table.c.run_id, table.c.name, table.c.span, func.count(), func.sum(table.c.count))
             .where(table.c.run_id.in_(ids)).group_by(table.c.run_id, table.c.name, table.c.span))
    if names is not None:
        query = query.where(table.c.name.in_(names))
    for run_id, name, span, n, total in session.execute(query):
        counts.setdefault((run_id, name), {})[span] = n
        values[(run_id, name)] = int(total)
    whole = {key for key, total in values.items() if total <= points}
    raw: dict[tuple[int, str], list[tuple[int, float]]] = {}
    if whole:
        for run_id, name, step, value in raw_reader(sorted({k[0] for k in whole}), sorted({k[1] for k in whole})):
            if (run_id, name) in whole and value is not None and math.isfinite(value):
                raw.setdefault((run_id, name), []).append((step, value))
    chosen: dict[tuple[int, str], list[int]] = {}
    for key, by_span in counts.items():
        span = pick_span(by_span, points)
        if span is not None and key not in raw:
            chosen.setdefault((span, key[1]), []).append(key[0])
    blocks: dict[tuple[int, str], list[Block]] = {}
    for (span, name), runs in chosen.items():
        rows = (select(table.c.run_id, *(table.c[c] for c in BLOCK_COLUMNS))
                .where(table.c.run_id.in_(runs), table.c.name == name, table.c.span == span)
                .order_by(table.c.run_id, table.c.block))
        for row in session.execute(rows):
            blocks.setdefault((row[0], name), []).append(block_from_row(row[1:]))
    out = {}
    for key in counts:
        if key in raw:
            pairs = raw[key]
            out[key] = Curve(points=pairs, count=len(pairs), last_step=pairs[-1][0])
            continue
        bs = blocks.get(key, [])
        out[key] = Curve(points=downsample_blocks(bs, points), count=sum(b.count for b in bs),
                         last_step=max((b.last_step for b in bs), default=None))
    return out
