"""``ftui estimate``'s table, fitted to the terminal: the parts of the peak that do not fit are summed
into one "other" column (so the row still adds up to the total), never cut or wrapped."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from runner.analysis import track_record as record
from runner.planner.error_band import FOOTNOTE, UNKNOWN_CELL, Band
from tui.render.report import fmt_bytes

HEADERS = {"activations": "activ-\nations", "grad_buckets": "grad\nbuckets", "recompute": "recom-\npute",
           "ds_reduce_bucket": "reduce\nbucket", "ds_gathered": "zero3\ngathered",
           "ds_prefetch": "zero3\nprefetch"}
"""Two-line headers where the word is wider than its figures."""


def error_cell(band: dict[str, Any] | None) -> str:
    """The "error here" cell of a strategy's :class:`runner.planner.error_band.Band` (as JSON)."""
    return UNKNOWN_CELL if band is None else Band(**band).cell()


def record_cell(track: dict[str, Any] | None) -> str:
    """The "error this host" cell of a strategy's :class:`runner.analysis.track_record.Record` (as JSON)."""
    return record.UNKNOWN_CELL if track is None else f"≤{abs(track['worst_pct']):.1f}% ({track['runs']})"


def _header(part: str) -> str:
    return HEADERS.get(part, part.replace("_", " "))


def _natural(header: str, cells: list[str]) -> int:
    """A column's width with its padding (1 each side) and the blank line that separates it (1)."""
    return max(len(line) for line in [*header.split("\n"), *cells]) + 3


def estimate_table(report: dict[str, Any], parts_order: tuple[str, ...], title: str,
                   width: int | None = None) -> RenderableType:
    """The per-strategy estimate: strategy, the largest parts, "other" (the rest), total, phase, fits, GPUs.

    Args:
        report: :func:`runner.planner.estimate_report`'s result.
        parts_order: every part, in the planner's order (``runner.planner.PARTS``).
        title: what was estimated (method, precision, batch, GPUs), printed above the table.
        width: the terminal's columns (None: every part).
    """
    rec = report["recommendation"]["strategy"]
    rows = [(name + (" *" if name == rec else ""), entry) for name, entry in report["strategies"].items()]
    sizes = [entry["per_device_bytes"] for _, entry in rows]
    present = [p for p in parts_order if any(b[p] for b in sizes)]
    zero = [p for p in parts_order if p not in present]
    fixed: list[tuple[str, list[str]]] = [
        ("total", [fmt_bytes(b["total"]) for b in sizes]),
        ("peak\nphase", [str(b.get("peak_phase", "-")) for b in sizes]),
        ("fits", ["yes" if entry["fits"] else "no" for _, entry in rows]),
        ("GPUs\nneeded", ["-" if entry["gpus_needed"] is None else str(entry["gpus_needed"]) for _, entry in rows]),
        ("error\nhere", [error_cell(entry.get("error_band")) for _, entry in rows]),
        ("host\nerror", [record_cell(entry.get("track_record")) for _, entry in rows]),
    ]

    def part_width(p: str) -> int:
        return _natural(_header(p), [fmt_bytes(b[p]) for b in sizes])

    # the outer edges have no padding (pad_edge=False) and no edge (show_edge=False): -3
    base = _natural("strategy", [name for name, _ in rows]) + sum(_natural(h, c) for h, c in fixed) - 3
    shown = list(present)
    if width is not None and base + sum(map(part_width, present)) > width:
        # the largest parts get a column each, the rest one "other" column (the row still adds up)
        used = base + _natural("other", ["999.9 MiB"])
        keep: set[str] = set()
        for p in sorted(present, key=lambda p: -max(b[p] for b in sizes)):
            if used + part_width(p) > width:
                break
            used += part_width(p)
            keep.add(p)
        shown = [p for p in present if p in keep]
    other = [p for p in present if p not in shown]

    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    table.add_column("strategy", no_wrap=True)
    for p in shown:
        table.add_column(_header(p), justify="right", no_wrap=True)
    if other:
        table.add_column("other", justify="right", no_wrap=True)
    for header, _ in fixed:
        table.add_column(header, justify="right", no_wrap=True)
    for i, (name, entry) in enumerate(rows):
        b = sizes[i]
        table.add_row(
            Text(name, style="bold" if name.endswith(" *") else ""),
            *(fmt_bytes(b[p]) for p in shown),
            *([fmt_bytes(sum(b[p] for p in other))] if other else []),
            fixed[0][1][i], fixed[1][1][i],
            Text(fixed[2][1][i], style="green" if entry["fits"] else "red"),
            fixed[3][1][i],
            Text(fixed[4][1][i], style="dim" if fixed[4][1][i] == UNKNOWN_CELL else ""),
            Text(fixed[5][1][i], style="dim" if fixed[5][1][i] == record.UNKNOWN_CELL else ""),
        )
    notes = ["every figure is estimated (runner.planner; docs/memory-model.md): the parts alive at the "
             "step's peak add up to the total; * marks the recommended strategy", FOOTNOTE, record.FOOTNOTE]
    if other:
        notes.append(f"other = {' + '.join(other)} (a wider terminal shows each)")
    if zero:
        notes.append(f"0 for every strategy, not shown: {', '.join(zero)}")
    if {"ds_reduce_bucket", "ds_gathered", "ds_prefetch"} & set(present):
        notes.append("reduce bucket: DeepSpeed's reduce_bucket_size from the config ftui writes; zero3 gathered: "
                     "DeepSpeed ZeRO-3's parameters gathered at the peak; zero3 prefetch: the flat buffer of "
                     "its prefetch bucket, alive until the head is fetched")
    if "buffers" in present:
        notes.append("buffers: autocast's 16-bit weight copies, or the gathered units under zero3/fsdp")
    return Group(Text(title, style="bold"), table, *(Text(n, style="dim") for n in notes))


def library_line(term: dict[str, Any]) -> str:
    """The estimate's maths-library line (:class:`runner.spec.library.LibraryTerm`): its bytes per process,
    beside the tensor total (never added to it), or why it was not measured."""
    if "bytes" not in term:
        return str(term["label"])
    return f"{term['label']}: {fmt_bytes(int(term['bytes']))} per process, beside the tensor total (not in it)"
