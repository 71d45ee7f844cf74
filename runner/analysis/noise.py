"""When a comparison's verdict may be noise: the host was busy with other work, the runs did not train the
same thing (:func:`not_comparable`: the one place that decides it), or their difference is within the
run-to-run spread measured on the host (:func:`measured_floor`). ``runner.analysis.verdict`` draws the
verdict from these; they are facts from the stored runs, never a guess.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, fields

from runner.spec.summary import TelemetrySummary
from store import RunInfo

BUSY_OTHER_PCT = 20.0
"""Host CPU % (of all cores) used by other work, beyond the run's own ranks, above which a run's speed
is flagged as not comparable (on a quiet host the rest is well under 10%)."""


def _cores(name: str) -> int | None:
    found = re.search(r"\((\d+) cores?\)", name)
    return int(found.group(1)) if found else None


def host_other_util(telemetry: TelemetrySummary | None) -> float | None:
    """Host CPU % of all cores spent on other work while the run trained (its active window).

    The telemetry's host row (psutil, all cores) minus the run's ranks (psutil, % of one core each,
    divided by the host's cores). None without a host row, or on a GPU run, whose ranks mostly wait.

    Args:
        telemetry: the run's stored utilisation (``summary.telemetry``, from
            :func:`runner.analysis.utilisation.summarise`).
    """
    devices = telemetry["devices"] if telemetry is not None else {}
    host = next((d for d in devices.values() if d["kind"] == "host"), None)
    if host is None or any(d["kind"] == "gpu" for d in devices.values()):
        return None
    cores = _cores(str(host["name"]))
    stats = host["active"] or host["whole"]
    if not cores or stats["util_mean"] is None:
        return None
    span = "active" if host["active"] else "whole"
    ranks = 0.0
    for d in devices.values():
        stat = d["active"] if span == "active" else d["whole"]
        if d["kind"] == "rank" and stat is not None:
            ranks += float(stat["util_mean"] or 0.0)
    return max(0.0, float(stats["util_mean"]) - ranks / cores)


def busy_note(run_id: int, label: str, other: float | None) -> str | None:
    """``run 3 (ddp x2): the host was busy with other work ...`` when ``other`` is above the threshold."""
    if other is None or other < BUSY_OTHER_PCT:
        return None
    return (f"run {run_id} ({label}): the host was busy with other work ({other:.0f}% of its CPU beyond the "
            f"run's own ranks, psutil): its speed is not a fair measure")


def busy_caution(runs: Sequence[tuple[int, str, float | None]]) -> str | None:
    """One caution for the runs (id, label, host's other work %) whose host was busy: :func:`busy_note` for
    one, one line naming them all for several."""
    busy = [(rid, label, other) for rid, label, other in runs if other is not None and other >= BUSY_OTHER_PCT]
    if len(busy) < 2:
        return busy_note(*busy[0]) if busy else None
    ids = ", ".join(str(rid) for rid, _, _ in busy)
    low, high = min(o for _, _, o in busy), max(o for _, _, o in busy)
    return (f"runs {ids}: the host was busy with other work ({low:.0f}-{high:.0f}% of its CPU beyond the runs' "
            "own ranks, psutil): their speeds are not a fair measure")


@dataclass(frozen=True)
class Training:
    """What two runs must share for their tokens/s to be the same measure (None: not known, never a
    difference)."""

    model: str | None = None
    data: str | None = None
    global_batch: int | None = None
    """Rows per optimizer step over all processes."""
    seq_len: int | None = None
    """``data.context_length``: tokens per row."""
    precision: str | None = None
    method: str | None = None


FIELD_WORDS = {"model": "model", "data": "data", "global_batch": "global batch", "seq_len": "sequence length",
               "precision": "precision", "method": "method"}


def differences(a: Training, b: Training) -> list[str]:
    """``global batch 8 vs 4`` for each field both runs know and that differs."""
    out = []
    for f in fields(Training):
        va, vb = getattr(a, f.name), getattr(b, f.name)
        if va is not None and vb is not None and va != vb:
            out.append(f"{FIELD_WORDS[f.name]} {va} vs {vb}")
    return out


def not_comparable(label: str, run_id: int, training: Training, base_label: str, base_id: int,
                   base: Training) -> str | None:
    """Why two runs' speeds are not the same measure (they train different things), or None: the one
    check every verdict, ratio and caution of a comparison goes through."""
    differs = differences(training, base)
    if not differs:
        return None
    return (f"{label} (run {run_id}) and {base_label} (run {base_id}) train different things "
            f"({', '.join(differs)}), so tokens/s is not a verdict")


@dataclass(frozen=True)
class NoiseFloor:
    """The run-to-run spread of tokens/s measured on a host: the relative difference two runs must exceed to
    be called faster or slower than each other."""

    relative: float
    """(max - min) / median of tokens/s over repeated runs of one configuration, as a fraction."""
    source: str
    """``repeats of ddp x2 (runs 4, 5, 6) on vm-3``."""


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


def spread(values: Sequence[float | None]) -> Spread | None:
    """Median and min-max of the known values (None when there is none)."""
    known = [float(v) for v in values if v is not None]
    if not known:
        return None
    return Spread(statistics.median(known), min(known), max(known), len(known))


def measured_floor(runs: Sequence[RunInfo], hosts: set[str], upto: int) -> NoiseFloor | None:
    """The widest run-to-run spread of tokens/s among stored repeats on ``hosts``: completed runs of the
    same recipe, strategy and process count, with ids up to ``upto`` (so a comparison gives the same verdict
    however many runs came after it). None when no configuration ran twice there."""
    groups: dict[tuple[str, str, int, str], list[RunInfo]] = {}
    for r in runs:
        if r.status == "completed" and r.tokens_per_s and r.host in hosts and r.id <= upto:
            groups.setdefault((r.recipe_hash, r.strategy, r.nproc, r.host or ""), []).append(r)
    best: NoiseFloor | None = None
    for (_, strategy, nproc, host), group in groups.items():
        if len(group) < 2:
            continue
        found = spread([r.tokens_per_s for r in group])
        rel = found.relative if found else 0.0
        if best is None or rel > best.relative:
            ids = ", ".join(str(r.id) for r in sorted(group, key=lambda r: r.id))
            name = strategy + (f" x{nproc}" if nproc > 1 else "")
            best = NoiseFloor(rel, f"repeats of {name} (runs {ids}) on {host}")
    return best
