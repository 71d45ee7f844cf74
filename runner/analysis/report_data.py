"""What the HTML report reads beyond a comparison's table: each run's measured peak memory against the
step (the busiest rank's, from its ``memory`` events: the figure the table shows), or, where the events
hold only the process RSS (a CPU run's memory events), that RSS as a series of its own, and its device
timelines."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from runner.analysis.compare import Comparison, load_comparison
from runner.spec.summary import rank_peak
from store import EventInfo, Store


def memory_curve(events: Sequence[EventInfo]) -> tuple[list[tuple[int, int]], str, list[tuple[int, int]]]:
    """From a run's ``memory`` events: (step, busiest rank's measured peak so far) and its source, and
    (step, largest rank's process RSS) for the events that measured only RSS."""
    out: list[tuple[int, int]] = []
    rss: list[tuple[int, int]] = []
    source = ""
    for event in events:
        step = event.payload.get("step")
        ranks = [r for r in event.payload.get("ranks") or [] if isinstance(r, dict)]
        known = [(v, src) for v, src in map(rank_peak, ranks) if v is not None]
        resident = [int(r["rss_bytes"]) for r in ranks if isinstance(r.get("rss_bytes"), int)]
        if isinstance(step, int) and known:
            value, source = max(known)
            out.append((step, value))
        elif isinstance(step, int) and resident:
            rss.append((step, max(resident)))
    return out, source, rss


def load_report(store: Store, run_ids: Sequence[int], baseline_id: int | None = None,
                peak_tflops: float | None = None, sweep_id: str | None = None) -> Comparison:
    """A comparison with everything the HTML report draws (device timelines, memory curves); KeyError for
    a missing run, as :func:`runner.analysis.compare.load_comparison`."""
    cmp = load_comparison(store, run_ids, baseline_id=baseline_id, peak_tflops=peak_tflops, sweep_id=sweep_id,
                          with_samples=True)
    measured: dict[int, list[tuple[int, int]]] = {}
    rss: dict[int, list[tuple[int, int]]] = {}
    sources: set[str] = set()
    for run_id in run_ids:
        curve, source, resident = memory_curve(store.events(run_id, "memory"))
        if curve:
            measured[run_id] = curve
            sources.add(source)
        elif resident:
            rss[run_id] = resident
    return replace(cmp, memory_curves=measured, memory_source="; ".join(sorted(sources)), rss_curves=rss)
