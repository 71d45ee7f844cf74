"""The planner's own track record on this host: how far its peak-memory estimate has been from the measured
peak over the runs in the store, per model family and strategy (with the engine for ZeRO:
:func:`runner.planner.error_band.band_key`).

It is kept apart from the held-out grid's error band (:mod:`runner.planner.error_band`): the band is the
project's tiny models trained on CPU; this is the user's own runs on this host, so the user sees how far to
trust the number here. Each run's error is its estimate made at prepare time
(``summary["estimate"]["per_device_bytes"]["total"]``, :mod:`runner.watch.estimate`) against the busiest
rank's measured peak (:func:`runner.spec.summary.rank_peak`: the CUDA allocator's peak on GPU, the live-tensor
peak on CPU), in percent of the measured peak (positive: the estimate was above).
"""

from __future__ import annotations

import socket
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from runner.spec.summary import RunSummary, busiest_peak, error_pct
from store import RunInfo, Store

SOURCE = "this host's completed runs in the store: estimate at prepare time vs the busiest rank's measured peak"


def peak_error_pct(summary: RunSummary) -> float | None:
    """A run's estimate error in percent of its measured peak; None without an estimate (or one marked
    approximate: the formulas do not model that architecture) or without a measured peak."""
    est: Mapping[str, Any] = summary.estimate or {}
    total = (est.get("per_device_bytes") or {}).get("total")
    if not isinstance(total, (int, float)) or est.get("approximate"):
        return None
    return error_pct(float(total), busiest_peak(summary.ranks)[0])


@dataclass(frozen=True)
class Record:
    """The estimate's error over this host's runs of one family and strategy."""

    key: str
    runs: int
    median_pct: float
    worst_pct: float
    """The error of largest magnitude, with its sign."""
    run_ids: tuple[int, ...]

    def cell(self) -> str:
        """The table's cell: the largest magnitude and the count (``≤4.1% (3)``), like the band's."""
        return f"≤{abs(self.worst_pct):.1f}% ({self.runs})"

    def sentence(self) -> str:
        return (f"{self.key}: {self.median_pct:+.1f}% median, {self.worst_pct:+.1f}% worst over {self.runs} "
                f"run(s) here")

    def json(self) -> dict[str, Any]:
        return {"key": self.key, "runs": self.runs, "median_pct": round(self.median_pct, 2),
                "worst_pct": round(self.worst_pct, 2), "run_ids": list(self.run_ids), "source": SOURCE}


def track_record(runs: Iterable[RunInfo], host: str) -> dict[str, Record]:
    """The records of the completed runs of ``host`` (the store's ``host`` column) that stored an estimate's
    key and measured a peak, by key."""
    errors: dict[str, list[tuple[int, float]]] = {}
    for run in runs:
        key = (run.summary.estimate or {}).get("band_key")
        if run.host != host or run.status != "completed" or not key:
            continue
        if (err := peak_error_pct(run.summary)) is not None:
            errors.setdefault(str(key), []).append((run.id, err))
    return {key: Record(key, len(errs), statistics.median(e for _, e in errs),
                        max((e for _, e in errs), key=abs), tuple(i for i, _ in errs))
            for key, errs in sorted(errors.items())}


def host_track_record(store: Store, host: str | None = None) -> dict[str, Record]:
    """This host's records (``host``: the name the store gives the runs started here, the hostname)."""
    return track_record(store.list_runs(status="completed"), host or socket.gethostname())


UNKNOWN_CELL = "-"
FOOTNOTE = ("host error: the largest |estimated - measured| / measured peak of this planner over this "
            "host's completed runs of the same family and strategy in the store (count in brackets); - = no "
            "such run yet; apart from \"error here\", the held-out grid's")
