"""A plan's candidates ranked by steady-state tokens/s (median and spread over their repeats), with the
decision: the leader is named only when the verdict's rule (:mod:`runner.analysis.verdict`: ranges of the
repeats, else the host's measured run-to-run spread) says it leads the second beyond the spread; otherwise
the candidates that tie with the leader are named. Pure: a comparison's rows in, standings out.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from runner.analysis import verdict
from runner.analysis.compare import RunRow
from runner.analysis.noise import NoiseFloor, Spread, spread
from runner.analysis.time_split import TimeSplit, merge
from runner.spec import first_step as fs


@dataclass(frozen=True)
class Standing:
    """One candidate's measured figures over its trials."""

    label: str
    run_ids: list[int]
    completed: int
    status: str
    """``completed`` (some trial completed with a throughput), else the last trial's status."""
    reason: str | None
    """Why its last trial did not complete."""
    tokens_per_s: Spread | None
    """Steady-state tokens/s over the completed trials: median, min, max."""
    mem_measured: int | None
    """The largest measured peak per device over its trials (compare's measured figure)."""
    mem_estimated: int | None
    mem_source: str
    util: float | None
    """Mean device utilisation (CPU % of the ranks' threads, or GPU busy %), median over the trials."""
    util_source: str
    first_step_s: Spread | None
    """Seconds from the launch to the end of step 1 (:mod:`runner.spec.first_step`; to its start for a trial
    stored without the breakdown), over the trials."""
    first_step_split: dict[str, float | None] = field(default_factory=dict)
    """Median seconds of each stage to the first step over the trials that stored it (None: unknown)."""
    time_split: TimeSplit | None = None
    """Where a step's time went (:mod:`runner.analysis.time_split`), median over the completed trials."""
    standing: str = ""
    """``leader``, ``tie`` (within the spread of the leader), ``slower``, ``cannot tell``, or empty."""


@dataclass(frozen=True)
class Ranking:
    standings: list[Standing]
    """Completed candidates by median tokens/s, fastest first, then the others."""
    decision: verdict.Verdict
    ties: list[str]
    """The candidates that tie with the leader (the leader first); empty when the decision names a winner."""
    text: str
    """The decision in one line."""


def _standing(label: str, rows: Sequence[RunRow], first_step: Mapping[int, float],
              splits: Mapping[int, TimeSplit]) -> Standing:
    done = [r for r in rows if r.status == "completed" and r.tokens_per_s]
    last = rows[-1]
    utils = [u for r in done if (u := (r.gpu_busy if r.gpu_busy is not None else r.cpu_util)) is not None]
    measured = [r.mem_measured for r in rows if r.mem_measured is not None]
    estimated = [r.mem_estimated for r in rows if r.mem_estimated is not None]
    return Standing(label=label, run_ids=[r.run_id for r in rows], completed=len(done),
                    status="completed" if done else last.status, reason=None if done else last.reason,
                    tokens_per_s=spread([r.tokens_per_s for r in done]),
                    mem_measured=max(measured) if measured else None,
                    mem_estimated=max(estimated) if estimated else None, mem_source=last.mem_measured_source,
                    util=statistics.median(utils) if utils else None, util_source=last.util_source,
                    first_step_s=spread([fs.total_seconds(r.first_step) or first_step.get(r.run_id) for r in done]),
                    first_step_split=_median_stages([r.first_step for r in done if r.first_step]),
                    time_split=merge(splits.get(r.run_id) for r in done))


def _median_stages(records: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
    """Each stage's median over the stored breakdowns that know it (every stage any of them has); empty
    without any."""
    if not records:
        return {}
    per = [fs.stage_seconds(r) for r in records]
    out: dict[str, float | None] = {}
    for stage in fs.median_order(records):
        known = [v for p in per if (v := p.get(stage)) is not None]
        out[stage] = statistics.median(known) if known else None
    return out


def rank(rows: Sequence[RunRow], floor: NoiseFloor | None, first_step: Mapping[int, float] | None = None,
         splits: Mapping[int, TimeSplit] | None = None) -> Ranking:
    """The standings and the decision of a plan's trials (``rows``: one per trial, of every candidate).

    Args:
        rows: the trials as a comparison builds them (:func:`runner.analysis.compare.build_comparison`).
        floor: the run-to-run spread measured on the host from stored repeats (the comparison's).
        first_step: seconds from launch to first step by run id.
        splits: where a step's time went, by run id.
    """
    by_label: dict[str, list[RunRow]] = {}
    for r in rows:
        by_label.setdefault(verdict.label(r), []).append(r)
    standings = [_standing(k, v, first_step or {}, splits or {}) for k, v in by_label.items()]
    decision = verdict.decide(rows, floor)
    found = sorted(verdict.groups(rows), key=lambda g: -g.tokens.median)
    ties: list[str] = []
    marks: dict[str, str] = {}
    if found:
        best = found[0]
        spread_floor = verdict.repeat_floor(found) or floor
        marks[best.label] = "leader"
        for g in found[1:]:
            kind = verdict.compare_pair(best, g, spread_floor).kind
            marks[g.label] = {"use": "slower", "tie": "tie", "unknown": "cannot tell"}.get(kind, kind)
        if decision.kind != "use" and len(found) > 1:
            ties = [best.label, *(g.label for g in found[1:] if marks[g.label] in ("tie", "cannot tell"))]
            marks[best.label] = "cannot tell" if decision.kind == "unknown" else "tie"
    order = {g.label: i for i, g in enumerate(found)}
    standings = sorted((replace(s, standing=marks.get(s.label, "")) for s in standings),
                       key=lambda s: order.get(s.label, len(order)))
    text = decision.text
    if len(ties) > 2:
        words = "cannot be told from the leader" if decision.kind == "unknown" else "tied with the leader"
        text = f"{text.rstrip('.')}; {words}: {', '.join(ties[1:])}."
    return Ranking(standings, decision, ties, text)

