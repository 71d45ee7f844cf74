"""Renderings of a :class:`runner.analysis.compare.Comparison`: a rich table, markdown, CSV, JSON, one
self-contained HTML file (inline SVG charts, no network), and a loss plot for the terminal."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable
from dataclasses import asdict, fields
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from runner.analysis.compare import Comparison, RunRow
from runner.analysis.run_figures import Kernels
from tui.render.compare_cells import (
    COLUMNS,
    columns,
    footnotes,
    sample_rows,
    sources,
    summary_lines,
)
from tui.render.compare_html import nice_step, svg_lines, to_html
from tui.render.plain import row as text_row
from tui.render.report import STATUS_STYLE

__all__ = ["COLUMNS", "RENDERERS", "columns", "footnotes", "loss_plot", "markdown", "nice_step", "repeats_table",
           "rich_table", "sample_rows", "samples_table", "sources", "summary_lines", "svg_lines", "to_csv",
           "to_html", "to_json"]

RICH_COLOURS = ["blue", "red", "green", "dark_orange", "magenta", "yellow", "cyan", "white"]


# ---------------------------------------------------------------------- rich


def rich_table(cmp: Comparison) -> RenderableType:
    """Figures down, one column per run; then the sources, the recipe diff and the verdict."""
    title = f"comparison{f' of sweep {cmp.sweep_id}' if cmp.sweep_id else ''}"
    table = Table(title=Text(title), show_lines=False)  # the sweep id came from the command line
    table.add_column("figure")
    recommended = cmp.recommended_id
    for r in cmp.rows:
        mark = " *" if r.run_id == recommended else ""
        table.add_column(f"run {r.run_id}{mark}", justify="right", overflow="fold")
    for header, cell in columns(cmp)[1:]:
        cells: list[Any] = []
        for r in cmp.rows:
            text = cell(r)
            cells.append(Text(text, style=STATUS_STYLE.get(r.status, "")) if header == "status" else Text(text))
        table.add_row(header, *cells)
    parts: list[RenderableType] = [table]
    if recommended is not None:
        parts.append(Text(f"* recommended: run {recommended} (the verdict below)", style="bold"))
    parts.append(Text("\n".join(sources(cmp)), style="dim"))
    if cmp.recipe_diff:
        diff = Table(title="recipe differences")
        diff.add_column("field")
        for r in cmp.rows:
            diff.add_column(f"run {r.run_id}")
        for key, values in cmp.recipe_diff.items():
            diff.add_row(*text_row(key, *map(str, values)))  # recipe values are the user's text
        parts.append(diff)
    if cmp.samples:
        parts.append(samples_table(cmp))
    parts.append(Text("\n".join(summary_lines(cmp)), style="bold"))
    return Group(*parts)


def samples_table(cmp: Comparison) -> Table:
    """Each ``eval.prompts`` entry with every run's greedy completion at its last evaluation, side by side."""
    ids, rows = sample_rows(cmp)
    table = Table(title="samples (greedy, last evaluation)")
    table.add_column("prompt")
    for rid in ids:
        table.add_column(f"run {rid}", overflow="fold")
    for prompt, completions in rows:
        table.add_row(*text_row(prompt, *completions))  # generated text is never markup
    return table


# ---------------------------------------------------------------------- markdown, csv, json


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(cmp: Comparison) -> str:
    lines = [f"## Comparison{f' of sweep {cmp.sweep_id}' if cmp.sweep_id else ''}", ""]
    cols = columns(cmp)
    lines.append("| " + " | ".join(h for h, _ in cols) + " |")
    text = ("strategy", "method", "attention", "compile", "status")  # left-aligned; the figures right
    lines.append("|" + "|".join("---" if h in text else "---:" for h, _ in cols) + "|")
    for r in cmp.rows:
        lines.append("| " + " | ".join(_md_cell(cell(r)) for _, cell in cols) + " |")
    lines += ["", *[f"- {s}" for s in sources(cmp)], ""]
    if cmp.recipe_diff:
        lines += ["### Recipe differences", ""]
        lines.append("| field | " + " | ".join(f"run {r.run_id}" for r in cmp.rows) + " |")
        lines.append("|---|" + "|".join("---" for _ in cmp.rows) + "|")
        for key, values in cmp.recipe_diff.items():
            lines.append(f"| {key} | " + " | ".join(_md_cell(v) for v in values) + " |")
        lines.append("")
    lines += [*[f"{s}." if not s.endswith(".") else s for s in summary_lines(cmp)], ""]
    return "\n".join(lines)


def _flat(r: RunRow) -> dict[str, Any]:
    """A row's fields, what it trains as ``training_*`` columns, its ledger as ``ledger_*``, its kernels as
    ``kernels_*`` (empty when the run did not record them)."""
    data = asdict(r)
    ledger = data.pop("ledger") or {}
    kernels = data.pop("kernels") or dict.fromkeys(f.name for f in fields(Kernels))
    return {**data, **{f"training_{k}": v for k, v in data.pop("training").items()},
            **{f"ledger_{k}": v for k, v in ledger.items()}, **{f"kernels_{k}": v for k, v in kernels.items()}}


def to_csv(cmp: Comparison) -> str:
    buf = io.StringIO()
    rows = [_flat(r) for r in cmp.rows]
    fields = list(rows[0]) if rows else [k for k in RunRow.__dataclass_fields__]
    writer = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow(row)
    return buf.getvalue()


def to_json(cmp: Comparison) -> str:
    return json.dumps({
        "sweep_id": cmp.sweep_id,
        "baseline_id": cmp.baseline_id,
        "fastest_id": cmp.fastest_id,
        "runs": [asdict(r) for r in cmp.rows],
        "recipe_diff": cmp.recipe_diff,
        "speedups": cmp.speedup_sentences(),
        "recommendation": cmp.recommendation(),
        "verdict": {"kind": cmp.decision().kind, "run_id": cmp.recommended_id},
        "sources": sources(cmp),
    }, indent=2)


# ---------------------------------------------------------------------- terminal plot


def loss_plot(cmp: Comparison, width: int = 72, height: int = 16) -> RenderableType:
    """The loss curves of all runs overlaid, drawn with unicode dots (one colour per run)."""
    series = [(r, cmp.curves.get(r.run_id, [])) for r in cmp.rows]
    pts = [p for _, s in series for p in s]
    if not pts:
        return Text("no loss recorded")
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    y0, y1 = min(p[1] for p in pts), max(p[1] for p in pts)
    x1 = x1 if x1 > x0 else x0 + 1
    y1 = y1 if y1 > y0 else y0 + 1e-9
    grid: list[list[tuple[str, str] | None]] = [[None] * width for _ in range(height)]

    def cell(x: float, y: float) -> tuple[int, int]:
        col = round((x - x0) / (x1 - x0) * (width - 1))
        row = height - 1 - round((y - y0) / (y1 - y0) * (height - 1))
        return row, col

    for i, (_, s) in enumerate(series):
        colour = RICH_COLOURS[i % len(RICH_COLOURS)]
        s = sorted(s)
        for (xa, ya), (xb, yb) in zip(s, s[1:], strict=False):  # interpolate between steps
            ra, ca = cell(xa, ya)
            rb, cb = cell(xb, yb)
            for c in range(ca, cb + 1):
                frac = 0 if cb == ca else (c - ca) / (cb - ca)
                grid[round(ra + (rb - ra) * frac)][c] = ("·", colour)
        for x, y in s:
            r, c = cell(x, y)
            grid[r][c] = ("●", colour)
    text = Text()
    for i, line in enumerate(grid):
        yv = y1 - (y1 - y0) * i / (height - 1)
        text.append(f"{yv:8.3f} ┤" if i % 4 == 0 or i == height - 1 else "         │")
        for mark in line:
            text.append(mark[0] if mark else " ", style=mark[1] if mark else "")
        text.append("\n")
    text.append("         └" + "─" * width + "\n")
    text.append(f"          step {x0:g}{' ' * max(1, width - 12 - len(f'{x0:g}{x1:g}'))}step {x1:g}\n")
    for i, (run, _) in enumerate(series):
        text.append("  ● ", style=RICH_COLOURS[i % len(RICH_COLOURS)])
        text.append(f"run {run.run_id} {cmp.label(run)}")
    return Group(Text("loss (measured, per step)", style="bold"), text)


RENDERERS: dict[str, Callable[[Comparison], str]] = {"md": markdown, "csv": to_csv, "json": to_json, "html": to_html}


def repeats_table(rows: Any) -> Table:
    """``ftui sweep --repeat N``: per strategy, the median of each figure and its min-max over the runs."""
    table = Table(title="over the repeats: median (min-max)",
                  caption="measured by the trainer; spread = (max - min) / median of tokens/s")
    for col in ("strategy", "runs", "tokens/s", "spread", "train time", "final loss"):
        table.add_column(col, justify="left" if col == "strategy" else "right", no_wrap=col != "strategy")

    def cell(s: Any, fmt: str) -> str:
        return "-" if s is None else f"{s.median:{fmt}} ({s.low:{fmt}}-{s.high:{fmt}})"

    for r in rows:
        table.add_row(Text(r.label), f"{r.completed}/{len(r.run_ids)}", cell(r.tokens_per_s, ",.0f"),
                      "-" if r.tokens_per_s is None else f"{r.tokens_per_s.relative * 100:.0f}%",
                      cell(r.train_seconds, ".1f"), cell(r.final_loss, ".4f"))
    return table
