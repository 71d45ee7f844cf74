"""How far this planner's estimate has been from the measured peak, per model family and strategy: the
error band that ``ftui estimate`` and ``ftui show`` print beside an estimate.

The figures come from the project's own held-out grid (``bench/bench_memory_grid.py``: tiny models of
several architectures, trained for real, the busiest rank's live-tensor peak against the estimate of the
same recipe). ``python bench/bench_memory_grid.py --write-band`` re-estimates every stored measurement with
the current formulas and writes :data:`BAND_FILE`, which ships with the package. A family and strategy
that the grid never measured has no band: its error is unknown, and it is printed as unknown.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runner.planner.inputs import EstimateInput

BAND_FILE = Path(__file__).with_name("measured_error.json")
"""The bands, written by ``bench/bench_memory_grid.py --write-band`` from ``bench/memory_grid.jsonl``."""
ZERO_ENGINES = ("zero1", "zero2", "zero3")


def band_key(family: str, strategy: str, engine: str = "auto", fsdp_version: int = 2, offload: bool = False) -> str:
    """``family/strategy``, with the engine for the ZeRO stages (``llama/zero2@torch``), FSDP1 for fsdp
    (``llama/fsdp@fsdp1``) and ``+offload`` when optimizer states or weights live on the host
    (``llama/zero3@deepspeed+offload``): each holds different buffers, so one's error says nothing of the
    other's."""
    if strategy in ZERO_ENGINES:
        key = f"{family}/{strategy}@{'torch' if engine == 'torch' else 'deepspeed'}"
    elif strategy == "fsdp" and fsdp_version == 1:
        key = f"{family}/fsdp@fsdp1"
    else:
        key = f"{family}/{strategy}"
    return key + ("+offload" if offload else "")


@dataclass(frozen=True)
class Band:
    """The estimate's error over the measured runs of one family and strategy, in percent of the measured
    peak (positive: the estimate was above)."""

    key: str
    runs: int
    median_pct: float
    worst_pct: float
    """The error of largest magnitude, with its sign."""
    source: str

    def cell(self) -> str:
        """The table's cell: the largest magnitude and the count (``≤1.2% (16)``)."""
        return f"≤{abs(self.worst_pct):.1f}% ({self.runs})"

    def sentence(self) -> str:
        return (f"{self.key}: {self.median_pct:+.1f}% median, {self.worst_pct:+.1f}% worst over {self.runs} "
                f"measured runs ({self.source})")


def bands_from_rows(rows: Iterable[Mapping[str, Any]], source: str) -> dict[str, Band]:
    """The bands of grid rows (``config`` label, ``error_pct``; rows without a measurement are skipped)."""
    errors: dict[str, list[float]] = {}
    for row in rows:
        if row.get("error_pct") is None:
            continue
        words = str(row["config"]).split()
        # The grid's variants of an architecture (``mistral-sw``, ``llama-deep``) count as their family.
        family, strategy = words[0].split("-")[0], words[3]
        name, _, engine = strategy.partition("@")
        engine, offload = engine.removesuffix("+offload"), engine.endswith("+offload")
        errors.setdefault(band_key(family, name, engine or "auto", 1 if engine == "fsdp1" else 2, offload),
                          []).append(float(row["error_pct"]))
    return {key: Band(key, len(errs), statistics.median(errs), max(errs, key=abs), source)
            for key, errs in sorted(errors.items())}


def write_bands(bands: Mapping[str, Band], path: Path = BAND_FILE) -> None:
    path.write_text(json.dumps({k: asdict(b) for k, b in bands.items()}, indent=1, sort_keys=True) + "\n")


@cache
def _load(path: Path) -> dict[str, Band]:
    if not path.is_file():
        return {}
    return {k: Band(**v) for k, v in json.loads(path.read_text()).items()}


def band_for(family: str, strategy: str, engine: str = "auto", fsdp_version: int = 2, offload: bool = False,
             path: Path = BAND_FILE) -> Band | None:
    """The band of this family and strategy, None when the grid never measured it (the error is unknown)."""
    return _load(path).get(band_key(family, strategy, engine, fsdp_version, offload))


def widest_band(path: Path = BAND_FILE) -> Band | None:
    """The band of largest worst error over every family and strategy measured (None: no band shipped)."""
    return max(_load(path).values(), key=lambda b: abs(b.worst_pct), default=None)


UNKNOWN_CELL = "?"
FOOTNOTE = ("error here: the largest |estimated - measured| / measured of this planner over the runs of the "
            "same model family and strategy on the project's held-out grid (tiny models trained on CPU; count "
            "in brackets; bench/memory_grid.jsonl); ? = never measured: the error is unknown")


def key_of(inp: EstimateInput, strategy: str | None = None) -> str:
    """:func:`band_key` of an estimate's input (under ``strategy`` instead of its own, when given)."""
    return band_key(inp.shape.family, strategy or inp.strategy, inp.engine, inp.fsdp_version,
                    inp.offload_optimizer or inp.offload_params)


def band_of(inp: EstimateInput, strategy: str | None = None) -> Band | None:
    """:func:`band_for` of an estimate's input (under ``strategy`` instead of its own, when given)."""
    return _load(BAND_FILE).get(key_of(inp, strategy))
