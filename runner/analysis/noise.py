"""When a comparison's verdict may be noise: the host was busy with other work, or the runs did not
train the same thing (different global batch or tokens per step). ``runner.analysis.compare`` attaches these
to its rows and sentences; they are facts from the stored summary, never a guess.
"""

from __future__ import annotations

import re

from runner.spec.summary import TelemetrySummary

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


def batch_note(label: str, run_id: int, batch: int | None, base_label: str, base_id: int,
               base_batch: int | None) -> str | None:
    """Why two runs' speeds are not the same measure: their global batches differ."""
    if batch is None or base_batch is None or batch == base_batch:
        return None
    return (f"{label} (run {run_id}) trains a global batch of {batch} rows per step, {base_label} "
            f"(run {base_id}) {base_batch}: not the same training, so tokens/s is not a verdict")
