"""What the HTML report reads beyond a comparison's table: each run's measured peak memory against the
step (the busiest rank's, from its ``memory`` events: the figure the table shows, never RSS) and its
device timelines."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from runner.analysis.compare import Comparison, load_comparison
from runner.spec.summary import rank_peak
from store import EventInfo, RunInfo, Store


def memory_curve(events: Sequence[EventInfo]) -> tuple[list[tuple[int, int]], str]:
    """(step, busiest rank's measured peak so far) from a run's ``memory`` events, and its source."""
    out: list[tuple[int, int]] = []
    source = ""
    for event in events:
        step = event.payload.get("step")
        peaks = [rank_peak(r) for r in event.payload.get("ranks") or [] if isinstance(r, dict)]
        known = [(v, src) for v, src in peaks if v is not None]
        if isinstance(step, int) and known:
            value, source = max(known)
            out.append((step, value))
    return out, source


def memory_curves(store: Store, runs: Sequence[RunInfo]) -> tuple[dict[int, list[tuple[int, int]]], str]:
    """Each run's :func:`memory_curve`, and the sources they come from (``measured: live-tensor peak``)."""
    curves: dict[int, list[tuple[int, int]]] = {}
    sources: set[str] = set()
    for run in runs:
        curve, source = memory_curve(store.events(run.id, "memory"))
        if curve:
            curves[run.id] = curve
            sources.add(source)
    return curves, "; ".join(sorted(sources))


def load_report(store: Store, run_ids: Sequence[int], baseline_id: int | None = None,
                peak_tflops: float | None = None, sweep_id: str | None = None) -> Comparison:
    """A comparison with everything the HTML report draws (device timelines, measured memory curves);
    KeyError for a missing run, as :func:`runner.analysis.compare.load_comparison`."""
    cmp = load_comparison(store, run_ids, baseline_id=baseline_id, peak_tflops=peak_tflops, sweep_id=sweep_id,
                          with_samples=True)
    curves, source = memory_curves(store, store.get_runs(run_ids))
    return replace(cmp, memory_curves=curves, memory_source=source)
