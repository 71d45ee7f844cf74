"""A run's ledger: device-hours, energy and cost, each with where it comes from.

:func:`account` makes the stored part (``summary.ledger``, :class:`runner.spec.summary.LedgerSummary`) when
the run ends (``runner.watch.finish``), from what the run folder keeps, so ``ftui db rebuild`` makes the same:

* **device-hours**: the run's compute devices (the telemetry's, :func:`runner.analysis.utilisation.summarise`:
  its GPUs, else its ranks) x the run's wall time from the watcher's ``launch`` event to its ``exit`` event
  (the devices are held from the launch to the exit, start-up and the final save included). The training
  steps alone (the telemetry's active window, first step to last) are kept beside it.
* **GPU energy**: each GPU's NVML ``power_w`` samples integrated over their times (trapezoid rule between
  consecutive readings), summed over the GPUs. Time before a GPU's first reading and after its last is
  not counted: the figure is a floor by at most one sampling interval at each end.
* **CPU energy**: the RAPL package counters (:mod:`runner.hardware.rapl`) the watcher journals at the
  launch and at the exit (``energy_counter`` events), their difference with wrap-around.

:func:`figures` adds what depends on the reader: the cost at the price the environment sets
(:mod:`runner.spec.price`), tokens per joule and tokens per unit of cost.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from runner.hardware import DeviceSample
from runner.hardware.rapl import joules_between
from runner.spec.price import PRICE_ENV, Price, configured_price
from runner.spec.summary import LedgerSummary, RunSummary

WALL_WINDOW = "launch to exit (the watcher's journal)"
ACTIVE_WINDOW = "first step to last step (the telemetry's active window)"
NOT_MEASURABLE = "not measurable here (no NVML power, no readable RAPL)"


def gpu_energy(samples: Iterable[DeviceSample]) -> tuple[float | None, str]:
    """Joules of the run's GPUs (trapezoid over each GPU's ``power_w`` readings, summed) and the source;
    None, with the reason, when no GPU has two power readings."""
    series: dict[tuple[str, int], list[tuple[float, float]]] = {}
    sources: set[str] = set()
    for s in samples:
        if s.kind == "gpu" and s.power_w is not None:
            series.setdefault((s.host, s.index), []).append((s.time, s.power_w))
            sources.add(s.source)
    total, gpus, readings = 0.0, 0, 0
    for points in series.values():
        points.sort()
        if len(points) < 2:
            continue
        gpus += 1
        readings += len(points)
        total += sum((t1 - t0) * (p0 + p1) / 2 for (t0, p0), (t1, p1) in zip(points, points[1:], strict=False))
    if not gpus:
        return None, "no NVML power" if not series else "fewer than two NVML power readings per GPU"
    source = "/".join(sorted(sources))
    return total, f"{source} power_w, trapezoid over {readings} readings of {gpus} GPU{'s' if gpus != 1 else ''}"


def cpu_energy(counters: Sequence[Mapping[str, Any]]) -> tuple[float | None, str]:
    """Joules of the CPU packages between the ``energy_counter`` readings at the launch (``at: start``)
    and at the exit (``at: end``), and the source; None with the reason otherwise."""
    start = next((c for c in counters if c.get("at") == "start"), None)
    end = next((c for c in reversed(counters) if c.get("at") == "end"), None)
    if start is None or end is None:
        return None, "no RAPL reading at the launch and at the exit"
    for reading in (start, end):
        if reading.get("problem"):
            return None, f"no readable RAPL ({reading['problem']})"
    joules = joules_between(dict(start), dict(end))
    if joules is None:
        return None, "no readable RAPL (the zones read at the launch and at the exit differ)"
    return joules, f"RAPL energy_uj of {', '.join(sorted(start['zones']))}, launch to exit"


def account(samples: Sequence[DeviceSample], wall_s: float | None,
            telemetry: Mapping[str, Any] | None, counters: Sequence[Mapping[str, Any]],
            ranks: int | None) -> LedgerSummary:
    """The stored ledger of a run (see the module docstring).

    Args:
        samples: The run's device samples.
        wall_s: Seconds from the watcher's launch event to its exit event; None when either is unknown.
        telemetry: The run's stored telemetry summary (its compute devices, its active window), or None.
        counters: The payloads of the watcher's ``energy_counter`` events, in order.
        ranks: The run's processes (the recipe's), the devices of a run without telemetry.
    """
    overall = (telemetry or {}).get("whole") or {}
    devices: int | None
    if overall.get("kind") and overall.get("devices"):
        devices, kind = int(overall["devices"]), str(overall["kind"])
        devices_source = "sampled by NVML" if kind == "gpu" else "sampled by psutil"
    else:
        devices, kind, devices_source = ranks, "rank", "the recipe's launch.nproc, no telemetry"
    wall_s = max(0.0, wall_s) if wall_s is not None else None
    window = (telemetry or {}).get("window")
    active_s = max(0.0, float(window[1]) - float(window[0])) if window else None
    gpu_j, gpu_source = gpu_energy(samples)
    cpu_j, cpu_source = cpu_energy(counters)
    return LedgerSummary(
        devices=devices, devices_kind=kind if devices else None, devices_source=devices_source,
        wall_s=wall_s, window=WALL_WINDOW,
        device_hours=devices * wall_s / 3600 if devices and wall_s is not None else None,
        active_device_hours=devices * active_s / 3600 if devices and active_s is not None else None,
        gpu_energy_j=gpu_j, gpu_energy_source=gpu_source, cpu_energy_j=cpu_j, cpu_energy_source=cpu_source)


@dataclass(frozen=True)
class Figures:
    """A run's ledger as the views show it: each figure None where it does not exist, with the reason."""

    device_hours: float | None
    device_hours_source: str
    energy_j: float | None
    energy_source: str
    cost: float | None
    currency: str | None
    cost_source: str
    tokens_per_joule: float | None
    tokens_per_joule_source: str
    tokens_per_cost: float | None
    tokens_per_cost_source: str
    recorded: bool = True
    """False for a run without a stored ledger (older than it, or not ended)."""


def figures(summary: RunSummary, price: Price | None = None, read_price: bool = True) -> Figures:
    """The ledger of a stored run, with the cost at ``price`` (by default the environment's,
    :func:`runner.spec.price.configured_price`; ``read_price=False``: none)."""
    ledger = summary.ledger
    price = price if price is not None or not read_price else configured_price()
    if ledger is None:
        why = "not recorded (a run older than the ledger, or one that has not ended)"
        return Figures(None, why, None, why, None, None, why, None, why, None, why, recorded=False)
    hours = ledger["device_hours"]
    hours_source = (f"{_devices(ledger)} x {ledger['wall_s']:.1f} s, {ledger['window']}"
                    if hours is not None else "wall time or devices unknown")
    energy, energy_source = _energy(ledger)
    cost = hours * price.amount if hours is not None and price is not None else None
    cost_source = (f"device-hours x {price.label()}" if price is not None and hours is not None
                   else f"no price set ({PRICE_ENV})" if price is None else hours_source)
    tokens = summary.tokens
    per_j = tokens / energy if tokens and energy else None
    per_cost = tokens / cost if tokens and cost else None
    no_tokens = "no token count (the trainer's end event)"
    return Figures(
        device_hours=hours, device_hours_source=hours_source, energy_j=energy, energy_source=energy_source,
        cost=cost, currency=price.currency if price is not None else None, cost_source=cost_source,
        tokens_per_joule=per_j,
        tokens_per_joule_source=("tokens trained / energy" if per_j is not None
                                 else no_tokens if energy is not None else f"energy {energy_source}"),
        tokens_per_cost=per_cost,
        tokens_per_cost_source=("tokens trained / cost" if per_cost is not None
                                else no_tokens if cost is not None else cost_source))


def _devices(ledger: LedgerSummary) -> str:
    """``2 GPUs (sampled by NVML)``, ``1 rank (the recipe's launch.nproc, no telemetry)``."""
    n = ledger["devices"] or 0
    noun = "GPU" if ledger["devices_kind"] == "gpu" else "rank"
    return f"{n} {noun}{'s' if n != 1 else ''} ({ledger['devices_source']})"


def _energy(ledger: LedgerSummary) -> tuple[float | None, str]:
    """The run's energy (GPU and CPU packages, each where measured) and its source."""
    parts = [(j, f"GPU: {ledger['gpu_energy_source']}") if (j := ledger["gpu_energy_j"]) is not None else None,
             (j, f"CPU: {ledger['cpu_energy_source']}") if (j := ledger["cpu_energy_j"]) is not None else None]
    have = [p for p in parts if p is not None]
    if not have:
        return None, NOT_MEASURABLE
    return sum(j for j, _ in have), "; ".join(source for _, source in have)
