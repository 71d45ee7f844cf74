"""The verdict of a comparison: which run to use, or that the runs tie or cannot be compared, and why.

A run is recommended over another only when both train the same thing
(:func:`runner.analysis.noise.not_comparable`) and the difference in tokens/s is beyond the measured
run-to-run spread: the ranges of the repeats when each side ran several times, else the spread of repeats
measured on the host (:class:`runner.analysis.noise.NoiseFloor`); with neither, the verdict says it
cannot tell. Pure: rows in, one line out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from runner.analysis.noise import NoiseFloor, Spread, busy_caution, not_comparable, spread

if TYPE_CHECKING:
    from runner.analysis.compare import RunRow

Kind = Literal["use", "tie", "incomparable", "unknown", "alone", "none"]
"""``use``: a recommendation; ``tie``: within the spread; ``incomparable``: different trainings;
``unknown``: no spread measured; ``alone``: one configuration completed; ``none``: nothing completed."""

REPEAT_HINT = "ftui sweep --repeat 3"


def label(row: RunRow) -> str:
    """``ddp x2`` or ``hsdp 2x2`` (its mesh says its devices), plus the grid values, and the kernels where they
    are not transformers' defaults (``single (eager, compiled)``): unique enough to name a run in a sentence."""
    base = row.strategy_label if row.mesh else row.strategy + (f" x{row.devices}" if row.devices > 1 else "")
    base = f"{base} [{row.grid}]" if row.grid else base
    words = row.kernels.words() if row.kernels is not None else ""
    return f"{base} ({words})" if words else base


@dataclass(frozen=True)
class Group:
    """The completed runs of one configuration (strategy x devices, grid values) with a throughput."""

    label: str
    rows: list[RunRow]

    @property
    def tokens(self) -> Spread:
        found = spread([r.tokens_per_s for r in self.rows])
        assert found is not None  # a group holds only rows with a throughput
        return found

    def runs(self) -> str:
        ids = [str(r.run_id) for r in self.rows]
        return f"run {ids[0]}" if len(ids) == 1 else f"runs {', '.join(ids)}"


def groups(rows: Sequence[RunRow]) -> list[Group]:
    """The completed rows with a throughput, grouped by configuration, in first-seen order."""
    out: dict[str, list[RunRow]] = {}
    for r in rows:
        if r.status == "completed" and r.tokens_per_s:
            out.setdefault(label(r), []).append(r)
    return [Group(k, v) for k, v in out.items()]


def repeat_floor(found: Sequence[Group]) -> NoiseFloor | None:
    """The widest spread among the compared configurations that ran more than once."""
    repeated = [g for g in found if len(g.rows) > 1]
    if not repeated:
        return None
    widest = max(repeated, key=lambda g: g.tokens.relative)
    return NoiseFloor(widest.tokens.relative, f"repeats of {widest.label} ({widest.runs()})")


@dataclass(frozen=True)
class Pair:
    """How one configuration's throughput stands against another's."""

    kind: Kind
    """``use`` (beyond the spread), ``tie``, ``incomparable`` or ``unknown``."""
    ratio: float
    """Median tokens/s of the first over the second's."""
    why: str
    """Why the ratio is or is not a verdict: the spread it was measured against, or what differs."""


def compare_pair(a: Group, b: Group, floor: NoiseFloor | None) -> Pair:
    """Whether ``a``'s throughput differs from ``b``'s beyond the run-to-run spread."""
    ratio = a.tokens.median / b.tokens.median
    first, base = a.rows[0], b.rows[0]
    differs = not_comparable(a.label, first.run_id, first.training, b.label, base.run_id, base.training)
    if differs:
        return Pair("incomparable", ratio, differs)
    if len(a.rows) > 1 and len(b.rows) > 1:
        ta, tb = a.tokens, b.tokens
        apart = ta.low > tb.high or tb.low > ta.high
        why = (f"ranges {ta.low:,.0f}-{ta.high:,.0f} and {tb.low:,.0f}-{tb.high:,.0f} tokens/s over "
               f"{ta.n} and {tb.n} runs {'do not overlap' if apart else 'overlap'}")
        return Pair("use" if apart else "tie", ratio, why)
    if floor is None:
        return Pair("unknown", ratio, "one run each and no run-to-run spread measured on this host "
                                      f"(measure it: {REPEAT_HINT})")
    beyond = abs(ratio - 1) > floor.relative
    why = (f"{'beyond' if beyond else 'within'} the run-to-run spread of {floor.relative * 100:.0f}% "
           f"({floor.source})")
    return Pair("use" if beyond else "tie", ratio, why)


def pair_sentence(a: Group, b: Group, floor: NoiseFloor | None) -> str:
    """``ddp x2 (run 2) 1.90x faster than single (run 1): beyond ...``, or the ratio and why it is not a
    verdict."""
    pair = compare_pair(a, b, floor)
    who, base = f"{a.label} ({a.runs()})", f"{b.label} ({b.runs()})"
    if pair.kind == "incomparable":
        return f"{pair.why} (tokens/s ratio {pair.ratio:.2f}x)"
    if pair.kind != "use":
        return f"{who} {pair.ratio:.2f}x the tokens/s of {base}: not a verdict, {pair.why}"
    if pair.ratio >= 1:
        return f"{who} {pair.ratio:.2f}x faster than {base}: {pair.why}"
    return f"{who} {1 / pair.ratio:.2f}x slower than {base}: {pair.why}"


@dataclass(frozen=True)
class Verdict:
    """What a comparison concludes, in one line."""

    kind: Kind
    text: str
    run_id: int | None
    """The recommended run (``use`` only)."""


def _figures(best: RunRow) -> str:
    parts = [f"{best.tokens_per_s:,.0f} tokens/s" if best.tokens_per_s else None,
             f"{best.train_seconds:.1f}s of training" if best.train_seconds else None,
             f"MFU {best.mfu * 100:.2f}%" if best.mfu is not None else None]
    return ", ".join(p for p in parts if p)


def _incomparable(rows: Sequence[RunRow]) -> str | None:
    """Why some of the completed runs train different things, or None."""
    first = rows[0]
    for row in rows[1:]:
        why = not_comparable(label(row), row.run_id, row.training, label(first), first.run_id, first.training)
        if why:
            return why
    return None


def decide(rows: Sequence[RunRow], floor: NoiseFloor | None = None) -> Verdict:
    """The comparison's verdict (see the module's docstring); ``floor`` is the spread measured on the host
    from stored repeats, used when a configuration of the comparison ran once."""
    found = groups(rows)
    if not found:
        if any(r.status == "completed" for r in rows):
            return Verdict("none", "No completed run has a steady-state tokens/s (each trained only its "
                                   "memory-metered first steps), so there is nothing to compare.", None)
        return Verdict("none", "No run completed, so there is nothing to recommend; see the reasons above.", None)
    why = _incomparable([r for g in found for r in g.rows])
    if why:
        return Verdict("incomparable", f"No recommendation: {why}.", None)
    if len(found) == 1:
        only = found[0]
        if len(only.rows) == 1:
            return Verdict("alone", f"Only {only.label} (run {only.rows[0].run_id}) completed with a throughput: "
                                    "nothing to compare it with.", None)
        return Verdict("tie", f"The runs tie: all {len(only.rows)} are {only.label} training the same thing, so "
                              f"their tokens/s spread ({only.tokens.relative * 100:.0f}%) is run-to-run noise.", None)
    ranked = sorted(found, key=lambda g: -g.tokens.median)
    best, second = ranked[0], ranked[1]
    pair = compare_pair(best, second, repeat_floor(found) or floor)
    if pair.kind == "unknown":
        return Verdict("unknown", f"Cannot tell: {best.label} had {pair.ratio:.2f}x the tokens/s of {second.label}, "
                                  f"but with {pair.why}.", None)
    if pair.kind == "tie":
        return Verdict("tie", f"{best.label} and {second.label} tie: {pair.ratio:.2f}x in tokens/s, {pair.why}.",
                       None)
    top = max(best.rows, key=lambda r: r.tokens_per_s or 0.0)
    text = (f"Use {best.label} (run {top.run_id}): the fastest that completed, {_figures(top)}, "
            f"{pair.ratio:.2f}x the throughput of {second.label}, {pair.why}")
    return Verdict("use", text, top.run_id)


def recommendation(rows: Sequence[RunRow], floor: NoiseFloor | None = None) -> str:
    """The verdict's line, with how many runs did not complete and what made a run's speed unfair."""
    text = decide(rows, floor).text.rstrip(".")
    others = [r for r in rows if r.status != "completed"]
    if others:
        text += f"; {len(others)} did not complete"
    busy = busy_caution([(r.run_id, label(r), r.host_other_util) for r in rows if r.status == "completed"])
    return text + "." + (f" Caution: {busy}." if busy else "")
