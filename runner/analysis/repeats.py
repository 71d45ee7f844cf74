"""A sweep with ``--repeat N``: each strategy ran N times; its figures are the median with the spread
(min-max), so that one lucky or unlucky run on a shared machine is not the verdict (the verdict itself:
:mod:`runner.analysis.verdict`, which compares these ranges)."""

from __future__ import annotations

from dataclasses import dataclass

from runner.analysis.compare import Comparison, RunRow
from runner.analysis.noise import Spread, spread


@dataclass(frozen=True)
class RepeatRow:
    """One strategy (and grid point) over its repeats."""

    label: str
    run_ids: list[int]
    completed: int
    tokens_per_s: Spread | None
    train_seconds: Spread | None
    final_loss: Spread | None


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


def repeated(rows: list[RepeatRow]) -> bool:
    """Whether some configuration ran more than once (the repeats table is worth printing)."""
    return any(len(r.run_ids) > 1 for r in rows)
