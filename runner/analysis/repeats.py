"""A sweep with ``--repeat N``: each strategy ran N times; its figures are the median with the spread
(min-max), so that one lucky or unlucky run on a shared machine is not the verdict."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from runner.analysis.compare import Comparison, RunRow


@dataclass(frozen=True)
class Spread:
    """The median of a figure over the repeats that completed, and its min and max."""

    median: float
    low: float
    high: float
    n: int

    @property
    def relative(self) -> float:
        """(max - min) / median: the run-to-run noise, as a fraction."""
        return (self.high - self.low) / self.median if self.median else 0.0


@dataclass(frozen=True)
class RepeatRow:
    """One strategy (and grid point) over its repeats."""

    label: str
    run_ids: list[int]
    completed: int
    tokens_per_s: Spread | None
    train_seconds: Spread | None
    final_loss: Spread | None


def spread(values: Sequence[float | None]) -> Spread | None:
    """Median and min-max of the known values (None when there is none)."""
    known = [float(v) for v in values if v is not None]
    if not known:
        return None
    return Spread(statistics.median(known), min(known), max(known), len(known))


def by_strategy(cmp: Comparison) -> list[RepeatRow]:
    """The comparison's runs grouped by label (strategy x processes, grid values), in first-seen order."""
    groups: dict[str, list[RunRow]] = {}
    for row in cmp.rows:
        groups.setdefault(cmp.label(row), []).append(row)
    out = []
    for label, rows in groups.items():
        done = [r for r in rows if r.status == "completed"]
        out.append(RepeatRow(label=label, run_ids=[r.run_id for r in rows], completed=len(done),
                             tokens_per_s=spread([r.tokens_per_s for r in done]),
                             train_seconds=spread([r.train_seconds for r in done]),
                             final_loss=spread([r.final_loss for r in done])))
    return out


def verdict(rows: Sequence[RepeatRow]) -> str:
    """One sentence: the fastest median, and whether its lead is larger than the spread (else: noise)."""
    ranked = sorted((r for r in rows if r.tokens_per_s), key=lambda r: -r.tokens_per_s.median)  # type: ignore[union-attr]
    if not ranked:
        return "No strategy completed a run."
    best = ranked[0]
    assert best.tokens_per_s is not None
    if len(ranked) == 1:
        return f"{best.label}: median {best.tokens_per_s.median:,.0f} tokens/s over {best.completed} run(s)."
    second = ranked[1]
    assert second.tokens_per_s is not None
    text = (f"{best.label} has the highest median, {best.tokens_per_s.median:,.0f} tokens/s over {best.completed} "
            f"runs, against {second.label}'s {second.tokens_per_s.median:,.0f}")
    if best.tokens_per_s.low <= second.tokens_per_s.high:
        return text + ": their ranges overlap, so the difference is within run-to-run noise."
    return text + ": every run of it was faster than every run of the other."
