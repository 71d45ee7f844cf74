"""CPU package energy from Intel RAPL's powercap counters (``/sys/class/powercap/intel-rapl:N``).

Each package zone holds ``energy_uj`` (a counter of microjoules since an arbitrary origin, wrapping to 0
after ``max_energy_range_uj``) and ``max_energy_range_uj``. Only the top-level zones (``intel-rapl:0``,
``intel-rapl:1``: one per socket) are read: their subzones (``intel-rapl:0:0``: cores, dram) are parts
of the package's figure and would count it twice. ``energy_uj`` is root-only on most kernels since
2020 (CVE-2020-8694): unreadable is an answer, never an error.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

POWERCAP = Path("/sys/class/powercap")
"""Where the kernel exposes the powercap zones."""

_PACKAGE = re.compile(r"intel-rapl:\d+")


def read_counters(root: Path = POWERCAP) -> dict[str, Any]:
    """One reading of every package zone under ``root``.

    Returns:
        ``{"zones": {"intel-rapl:0": {"energy_uj": int, "max_energy_range_uj": int}, ...}}`` when every
        package zone could be read, else ``{"zones": {}, "problem": "<why>"}`` (no zone, a file not
        readable): JSON, as the watcher journals it.
    """
    folders = sorted(p for p in root.glob("intel-rapl:*") if _PACKAGE.fullmatch(p.name)) if root.is_dir() else []
    if not folders:
        return {"zones": {}, "problem": f"no RAPL package zone under {root}"}
    zones: dict[str, dict[str, int]] = {}
    for folder in folders:
        try:
            zones[folder.name] = {"energy_uj": int((folder / "energy_uj").read_text().strip()),
                                  "max_energy_range_uj": int((folder / "max_energy_range_uj").read_text().strip())}
        except (OSError, ValueError) as exc:
            return {"zones": {}, "problem": f"{folder / 'energy_uj'} not readable ({type(exc).__name__})"}
    return {"zones": zones}


def joules_between(start: dict[str, Any], end: dict[str, Any]) -> float | None:
    """Joules the package zones used between two :func:`read_counters` readings, summed over zones.

    A counter lower at the end than at the start wrapped once: its energy is
    ``max_energy_range_uj - start + end``. None when either reading has no zones or they name different
    zones. Two wraps between the readings cannot be told from one: the figure is a floor for a run longer
    than a wrap (``max_energy_range_uj``, about 262 kJ on common parts: 73 minutes at 60 W).
    """
    a, b = start.get("zones") or {}, end.get("zones") or {}
    if not a or a.keys() != b.keys():
        return None
    total_uj = 0
    for name, first in a.items():
        last = b[name]
        used = last["energy_uj"] - first["energy_uj"]
        if used < 0:
            used += int(first["max_energy_range_uj"])
        total_uj += used
    return total_uj / 1e6
