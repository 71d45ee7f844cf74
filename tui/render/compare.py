"""Renderings of a :class:`runner.analysis.compare.Comparison`: a rich table, markdown, CSV, JSON, one
self-contained HTML file (inline SVG charts, no network), and a loss plot for the terminal."""

from __future__ import annotations

import csv
import html
import io
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from runner.analysis.compare import Comparison, RunRow
from tui.render.plain import row as text_row
from tui.render.report import STATUS_STYLE, fmt_bytes, fmt_seconds

PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"]
RICH_COLOURS = ["blue", "red", "green", "dark_orange", "magenta", "yellow", "cyan", "white"]


def _num(v: float | None, fmt: str, suffix: str = "") -> str:
    return "-" if v is None else format(v, fmt) + suffix


def _batch(r: RunRow) -> str:
    if r.micro_batch is None:
        return "-"
    return f"{r.micro_batch} x {r.grad_accum} (global {r.global_batch})"


def _mfu(r: RunRow) -> str:
    return "-" if r.mfu is None else f"{r.mfu * 100:.2f}% ({r.achieved_tflops * 1e3:.2f} GFLOP/s)" if r.achieved_tflops else f"{r.mfu * 100:.2f}%"


def _cpu_util(r: RunRow) -> str:
    if r.cpu_util is None:
        return "-"
    if r.cpu_threads is None:
        return f"{r.cpu_util:.0f}% of one core"
    return f"{r.cpu_util:.0f}% of {r.cpu_threads} thread{'s' if r.cpu_threads != 1 else ''}"


def _spread(r: RunRow) -> str:
    # Shown for every run sampled on several devices (also when they agree), so a reader sees it was looked at.
    if r.util_min is None or r.util_max is None:
        return "-"
    return f"{r.util_min:.0f}-{r.util_max:.0f}%"


def _mfu_cell(r: RunRow) -> str:
    if r.mfu is not None:
        return f"{r.mfu * 100:.2f}%"
    return "- (> 100%: peak not trustworthy)" if r.mfu_rejected is not None else "-"


def _status(r: RunRow) -> str:
    return r.status if not r.reason else f"{r.status}: {r.reason}"


# (header, cell) for the row-per-run formats; the sources are listed under the table.
COLUMNS: list[tuple[str, Callable[[RunRow], str]]] = [
    ("run", lambda r: str(r.run_id)),
    ("strategy", lambda r: r.strategy + (f" [{r.grid}]" if r.grid else "")),
    ("method", lambda r: r.method),
    ("devices", lambda r: str(r.devices)),
    ("micro-batch x GA", _batch),
    ("CPU % of its threads", _cpu_util),
    ("GPU busy % (NVML)", lambda r: _num(r.gpu_busy, ".0f", "%")),
    ("util min-max over devices", _spread),
    ("train time", lambda r: "-" if r.train_seconds is None else fmt_seconds(r.train_seconds)),
    ("tokens/s", lambda r: _num(r.tokens_per_s, ",.0f")),
    ("tokens/s/device", lambda r: _num(r.tokens_per_s_per_device, ",.0f")),
    ("MFU", _mfu_cell),
    ("MFU peak/device (dtype, threads)", lambda r: r.peak_label),
    ("peak mem/device (measured)", lambda r: fmt_bytes(r.mem_measured)),
    ("peak mem/device (estimated)", lambda r: fmt_bytes(r.mem_estimated)),
    ("final loss", lambda r: _num(r.final_loss, ".4f")),
    ("best loss", lambda r: _num(r.best_loss, ".4f")),
    ("speed-up", lambda r: _num(r.speedup, ".2f", "x")),
    ("status", _status),
]

EVAL_COLUMNS: list[tuple[str, Callable[[RunRow], str]]] = [
    ("final eval loss", lambda r: _num(r.final_eval_loss, ".4f")),
    ("best eval loss", lambda r: _num(r.best_eval_loss, ".4f")),
]
"""Shown when a compared run was evaluated (``train.eval_every``, an eval set)."""


def columns(cmp: Comparison) -> list[tuple[str, Callable[[RunRow], str]]]:
    """:data:`COLUMNS`, with the eval figures before ``speed-up`` when any run has them."""
    if not cmp.eval_curves:
        return list(COLUMNS)
    at = next(i for i, (h, _) in enumerate(COLUMNS) if h == "speed-up")
    return [*COLUMNS[:at], *EVAL_COLUMNS, *COLUMNS[at:]]


NOT_REPORTED = "not reported"
SCRIPT_REPORTS = frozenset({"micro-batch x GA", "train time", "tokens/s", "tokens/s/device",
                            "peak mem/device (measured)", "final loss", "best loss"})
"""Figures a script run has only when the script reports them (runner.track): '-' reads "not reported"."""


def _reported(cell: Callable[[RunRow], str]) -> Callable[[RunRow], str]:
    def text(r: RunRow) -> str:
        value = cell(r)
        return NOT_REPORTED if r.script and value == "-" else value

    return text


COLUMNS = [(h, _reported(c) if h in SCRIPT_REPORTS else c) for h, c in COLUMNS]


def sources(cmp: Comparison) -> list[str]:
    """Where each figure comes from (one line each)."""
    out = []
    util = sorted({r.util_source for r in cmp.rows if r.util_source != "-"})
    if util:
        out.append("utilisation: " + "; ".join(util))
    out.append("train time, tokens/s, loss: measured by the trainer (tokens/s over all devices; first to last step)")
    if cmp.eval_curves:
        out.append("eval loss: measured by the trainer over the whole held-out set (token-weighted mean over ranks)")
    if any(r.script for r in cmp.rows):
        out.append("script runs: what the script reported through runner.track or FtuiCallback (train time from "
                   "its start to its last step); 'not reported' where it did not")
    peaks = sorted({r.peak_source for r in cmp.rows if r.peak_source})
    if peaks:
        out.append("MFU: (6N_trainable + 4N_frozen + 12*L*H*Q*T) x tokens/s / (peak x devices), N without the input "
                   "embedding (a lookup); the peak is of one device in the run's dtype (bf16 runs: the bf16 peak), "
                   "an MFU above 100% is never shown; peak: " + "; ".join(peaks))
    out += [f"MFU '-' for run {r.run_id}: {r.mfu_note}" for r in cmp.rows if r.mfu_note]
    mem = sorted({r.mem_measured_source for r in cmp.rows if r.mem_measured is not None})
    if mem:
        out.append("peak mem measured: " + "; ".join(mem))
    est = sorted({r.mem_estimated_source for r in cmp.rows if r.mem_estimated is not None})
    if est:
        out.append("peak mem estimated: " + "; ".join(est))
    base = cmp.row(cmp.baseline_id)
    if base and base.tokens_per_s:
        out.append(f"speed-up: tokens/s over the baseline's, run {base.run_id} ({cmp.label(base)})")
    notes = sorted({f"{r.strategy}: {r.note}" for r in cmp.rows if r.note})
    out += [f"batch: {n}" for n in notes]
    return out


def summary_lines(cmp: Comparison) -> list[str]:
    return [*cmp.speedup_sentences(), cmp.recommendation()]


# ---------------------------------------------------------------------- rich


def rich_table(cmp: Comparison) -> RenderableType:
    """Figures down, one column per run; then the sources, the recipe diff and the verdict."""
    title = f"comparison{f' of sweep {cmp.sweep_id}' if cmp.sweep_id else ''}"
    table = Table(title=Text(title), show_lines=False)  # the sweep id came from the command line
    table.add_column("figure")
    for r in cmp.rows:
        mark = " *" if r.run_id == cmp.fastest_id else ""
        table.add_column(f"run {r.run_id}{mark}", justify="right", overflow="fold")
    for header, cell in columns(cmp)[1:]:
        cells: list[Any] = []
        for r in cmp.rows:
            text = cell(r)
            cells.append(Text(text, style=STATUS_STYLE.get(r.status, "")) if header == "status" else Text(text))
        table.add_row(header, *cells)
    parts: list[RenderableType] = [table]
    if cmp.fastest_id is not None:
        parts.append(Text(f"* fastest: run {cmp.fastest_id}", style="bold"))
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


def sample_rows(cmp: Comparison) -> tuple[list[int], list[tuple[str, list[str]]]]:
    """The runs with samples, and per prompt (in first-seen order) each such run's completion."""
    ids = [r.run_id for r in cmp.rows if cmp.samples.get(r.run_id)]
    prompts: dict[str, dict[int, str]] = {}
    for rid in ids:
        for sample in cmp.samples[rid]:
            prompts.setdefault(sample["prompt"], {})[rid] = sample["completion"]
    return ids, [(p, [by_run.get(rid, "-") for rid in ids]) for p, by_run in prompts.items()]


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
    lines.append("|" + "|".join("---" if h in ("strategy", "method", "status") else "---:" for h, _ in cols) + "|")
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


def to_csv(cmp: Comparison) -> str:
    buf = io.StringIO()
    fields = [k for k in RunRow.__dataclass_fields__]
    writer = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    for r in cmp.rows:
        writer.writerow(asdict(r))
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
        "sources": sources(cmp),
    }, indent=2)


# ---------------------------------------------------------------------- html


def nice_step(span: float, ticks: int = 4) -> float:
    """A round tick step (1, 2 or 5 x 10^k) that cuts ``span`` into about ``ticks`` parts."""
    raw = span / ticks if span > 0 else 1.0
    power = 10.0 ** math.floor(math.log10(raw))
    return next(float(m * power) for m in (1, 2, 5, 10) if m * power >= raw)


def svg_lines(series: Sequence[tuple[str, str, Sequence[tuple[float, float | None]]]], title: str, xlabel: str,
              ylabel: str, width: int = 640, height: int = 300, yfmt: Callable[[float], str] = lambda v: f"{v:.3g}",
              zero_based: bool = False, band: tuple[float, float] | None = None, band_label: str = "") -> str:
    """An inline SVG line chart: axes with round ticks, one polyline per series and a legend.
    ``zero_based``: the y axis starts at 0 (utilisation, memory: a bar of 90-100% must not look like 0-100).
    ``band``: an x range shaded and labelled (a run's training window on its device timeline)."""
    pts = [(x, y) for _, _, s in series for x, y in s if y is not None]
    left, right, top, bottom = 70, 20, 30, 60
    w, h = width - left - right, height - top - bottom
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
           f'aria-label="{html.escape(title)}" style="background:#fff;font:11px sans-serif">',
           f'<text x="{width / 2}" y="18" text-anchor="middle" font-weight="bold">{html.escape(title)}</text>']
    if not pts:
        out.append(f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle">no data</text></svg>')
        return "".join(out)
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    y0, y1 = min(p[1] for p in pts), max(p[1] for p in pts)
    if band is not None:  # the whole window is on the axis even where no sample fell
        x0, x1 = min(x0, band[0]), max(x1, band[1])
    if x1 == x0:
        x1 = x0 + 1
    if y1 == y0:
        y0, y1 = y0 - 0.5, y1 + 0.5
    if zero_based:
        y0 = min(0.0, y0)
    # round ticks: the axes run from a multiple of the step to a multiple of the step
    ystep, xstep = nice_step(y1 - y0), nice_step(x1 - x0)
    if xlabel == "step":  # steps are whole numbers: no tick at step 1.5
        xstep = max(1.0, xstep)
    y0, y1 = math.floor(y0 / ystep) * ystep, math.ceil(y1 / ystep) * ystep
    x0, x1 = math.floor(x0 / xstep) * xstep, math.ceil(x1 / xstep) * xstep
    if y1 == y0:
        y1 = y0 + ystep
    if x1 == x0:
        x1 = x0 + xstep

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * w

    def sy(y: float) -> float:
        return top + h - (y - y0) / (y1 - y0) * h

    if band is not None:
        b0, b1 = max(x0, band[0]), min(x1, band[1])
        if b1 > b0:
            out.append(f'<rect class="window" x="{sx(b0):.1f}" y="{top}" width="{sx(b1) - sx(b0):.1f}" height="{h}" '
                       f'fill="#fff3c4"/><text x="{sx(b0) + 3:.1f}" y="{top + 12}" fill="#8a6d00">'
                       f'{html.escape(band_label)}</text>')
    out.append(f'<rect x="{left}" y="{top}" width="{w}" height="{h}" fill="none" stroke="#999"/>')
    for i in range(round((x1 - x0) / xstep) + 1):
        xv = x0 + i * xstep
        out.append(f'<line x1="{sx(xv):.1f}" y1="{top + h}" x2="{sx(xv):.1f}" y2="{top + h + 4}" stroke="#999"/>'
                   f'<text x="{sx(xv):.1f}" y="{top + h + 16}" text-anchor="middle">{xv:.6g}</text>')
    for i in range(round((y1 - y0) / ystep) + 1):
        yv = y0 + i * ystep
        out.append(f'<line x1="{left}" y1="{sy(yv):.1f}" x2="{left + w}" y2="{sy(yv):.1f}" stroke="#eee"/>'
                   f'<text x="{left - 6}" y="{sy(yv) + 4:.1f}" text-anchor="end">{html.escape(yfmt(yv))}</text>')
    out.append(f'<text x="{left + w / 2}" y="{top + h + 32}" text-anchor="middle">{html.escape(xlabel)}</text>')
    out.append(f'<text x="14" y="{top + h / 2}" text-anchor="middle" transform="rotate(-90 14 {top + h / 2})">'
               f'{html.escape(ylabel)}</text>')
    lx = left
    n = len(series)
    for k, (label, colour, s) in enumerate(series):
        # Earlier series are drawn wider and later ones dashed, so that curves that coincide (same seed,
        # same global batch) all stay visible.
        stroke = f'stroke-width="{2 + 2.5 * (n - 1 - k):.1f}"' + (f' stroke-dasharray="{6 + 2 * k},{4 + k}"' if k else "")
        good = [(x, float(y)) for x, y in s if y is not None]
        if len(good) == 1:
            x, y = good[0]
            out.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{colour}"/>')
        elif good:
            path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in good)
            out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" {stroke} stroke-opacity="0.85"/>')
        out.append(f'<rect x="{lx}" y="{height - 14}" width="12" height="4" fill="{colour}"/>'
                   f'<text x="{lx + 16}" y="{height - 9}">{html.escape(label)}</text>')
        lx += 16 + 7 * len(label) + 18
    out.append("</svg>")
    return "".join(out)


def provenance(cmp: Comparison, now: Any = None) -> dict[str, str]:
    """Where a report comes from: when and where it was made, by which ftui, over which runs, models, data."""
    import socket
    from datetime import UTC, datetime
    from importlib import metadata

    try:
        version = metadata.version("ftui")
    except metadata.PackageNotFoundError:
        version = "unknown (not installed)"
    when = now or datetime.now(UTC)
    return {
        "made": f"{when:%Y-%m-%d %H:%M} UTC on {socket.gethostname()} by ftui {version}",
        "runs": ", ".join(f"{r.run_id} {r.name}" for r in cmp.rows),
        "run hosts": ", ".join(sorted(set(cmp.hosts.values()))) or "-",
        "models": ", ".join(sorted(set(cmp.models.values()))) or "-",
        "data": ", ".join(sorted(set(cmp.data.values()))) or "-",
        **({"sweep": cmp.sweep_id} if cmp.sweep_id else {}),
    }


def to_html(cmp: Comparison) -> str:
    """One self-contained page: the table, the loss curves overlaid, utilisation and memory per
    device for each run, the recipe diff. Inline CSS and SVG only: it opens offline."""
    esc = html.escape
    # Transposed (a figure a line, a run a column), 5 runs a table: 19 figures side by side never fit 900 px.
    tables = []
    for start in range(0, len(cmp.rows), 5):
        chunk = cmp.rows[start:start + 5]
        head = "".join(f'<th{" class=fastest" if r.run_id == cmp.fastest_id else ""}>run {r.run_id}</th>'
                       for r in chunk)
        body = "".join(f"<tr><th>{esc(h)}</th>" + "".join(
            f'<td{" class=fastest" if r.run_id == cmp.fastest_id else ""}>{esc(cell(r))}</td>' for r in chunk)
            + "</tr>" for h, cell in columns(cmp))
        tables.append(f'<table class="runs"><tr><th>figure</th>{head}</tr>{body}</table>')
    # Eval loss: a second curve per run, after the training curves (later series are drawn dashed).
    evals = [(f"run {r.run_id} {cmp.label(r)} eval", PALETTE[i % len(PALETTE)],
              [(float(s), float(v)) for s, v in cmp.eval_curves.get(r.run_id, [])])
             for i, r in enumerate(cmp.rows) if cmp.eval_curves.get(r.run_id)]
    loss = svg_lines([(f"run {r.run_id} {cmp.label(r)}", PALETTE[i % len(PALETTE)],
                       [(float(s), float(v)) for s, v in cmp.curves.get(r.run_id, [])])
                      for i, r in enumerate(cmp.rows)] + evals,
                     "training loss" + (" and eval loss" if evals else "") + ", all runs", "step", "loss",
                     width=900, height=360)
    lr = svg_lines([(f"run {r.run_id} {cmp.label(r)}", PALETTE[i % len(PALETTE)],
                     [(float(st), float(v)) for st, v in cmp.lr_curves.get(r.run_id, [])])
                    for i, r in enumerate(cmp.rows)], "learning rate", "step", "lr", width=440, height=260,
                   yfmt=lambda v: f"{v:.1e}", zero_based=True)
    grad = svg_lines([(f"run {r.run_id} {cmp.label(r)}", PALETTE[i % len(PALETTE)],
                       [(float(st), float(v)) for st, v in cmp.grad_curves.get(r.run_id, [])])
                      for i, r in enumerate(cmp.rows)], "gradient norm (before clipping)", "step", "grad norm",
                     width=440, height=260, zero_based=True)
    timelines = []
    for r in cmp.rows:
        devices = cmp.timelines.get(r.run_id) or {}
        if not devices:
            continue
        steps = cmp.curves.get(r.run_id) or []
        window: dict[str, Any] = {}
        if r.run_id in cmp.windows:  # the loss chart's steps happened inside this band
            span = f"steps {steps[0][0]}-{steps[-1][0]}" if steps else "training"
            window = {"band": cmp.windows[r.run_id], "band_label": f"training ({span})"}
        util = svg_lines([(d, PALETTE[i % len(PALETTE)], [(t, u) for t, u, _ in pts])
                          for i, (d, pts) in enumerate(devices.items())],
                         f"run {r.run_id} {cmp.label(r)}: utilisation per device", "seconds", "util %",
                         width=440, height=240, yfmt=lambda v: f"{v:.0f}", zero_based=True, **window)
        # in MiB or GiB, so that the ticks are round numbers of the unit shown
        top_bytes = max((m for pts in devices.values() for _, _, m in pts if m is not None), default=0)
        unit, scale = ("GiB", 2.0**30) if top_bytes >= 4 * 2**30 else ("MiB", 2.0**20)
        mem = svg_lines([(d, PALETTE[i % len(PALETTE)], [(t, m / scale if m is not None else None) for t, _, m in pts])
                         for i, (d, pts) in enumerate(devices.items())],
                        f"run {r.run_id} {cmp.label(r)}: memory per device", "seconds", f"memory ({unit})",
                        width=440, height=240, yfmt=lambda v: f"{v:,.6g}", zero_based=True, **window)
        timelines.append(f'<div class="pair">{util}{mem}</div>')
    curves = [tuple(cmp.curves.get(r.run_id, [])) for r in cmp.rows if cmp.curves.get(r.run_id)]
    same = ""
    if len(curves) > 1 and all(len(c) == len(curves[0]) and all(abs(a[1] - b[1]) < 1e-3 for a, b in zip(c, curves[0], strict=True))
                               for c in curves):
        same = ("<p>The curves coincide (within 0.001): the runs train the same global batch from the same seed, so "
                "every strategy computes the same updates; only the time they take differs.</p>")
    diff = ""
    if cmp.recipe_diff:
        dh = "".join(f"<th>run {r.run_id}</th>" for r in cmp.rows)
        rows = "".join(f"<tr><td><code>{esc(k)}</code></td>" + "".join(f"<td>{esc(v)}</td>" for v in vs) + "</tr>"
                       for k, vs in cmp.recipe_diff.items())
        diff = f"<h2>Recipe differences</h2><table><tr><th>field</th>{dh}</tr>{rows}</table>"
    notes = "".join(f"<li>{esc(s)}</li>" for s in sources(cmp))
    if cmp.samples:
        ids, sample_lines = sample_rows(cmp)
        sh = "".join(f"<th>run {rid}</th>" for rid in ids)
        srows = "".join(f"<tr><td>{esc(p)}</td>" + "".join(f"<td>{esc(c)}</td>" for c in cs) + "</tr>"
                        for p, cs in sample_lines)
        diff += f"<h2>Samples (greedy, last evaluation)</h2><table><tr><th>prompt</th>{sh}</tr>{srows}</table>"
    verdict = "".join(f"<p>{esc(s)}</p>" for s in summary_lines(cmp))
    title = f"ftui comparison{f' - {cmp.sweep_id}' if cmp.sweep_id else ''}"
    prov = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in provenance(cmp).items())
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>
<style>
body {{ font: 14px/1.4 sans-serif; margin: 20px; color: #222; }}
table {{ border-collapse: collapse; margin: 8px 0 16px; }}
th, td {{ border: 1px solid #ccc; padding: 3px 7px; text-align: right; font-size: 12px; }}
th {{ background: #f0f0f0; text-align: left; }}
table.runs {{ max-width: 900px; }}
table.runs td {{ max-width: 150px; overflow-wrap: anywhere; }}
table.provenance td {{ text-align: left; }}
.fastest {{ background: #e6f5e6; font-weight: bold; }}
.pair svg {{ margin: 0 8px 8px 0; border: 1px solid #eee; }}
.verdict {{ font-weight: bold; }}
</style></head><body>
<h1>{esc(title)}</h1>
<table class="provenance">{prov}</table>
{"".join(tables)}
<div class="verdict">{verdict}</div>
<ul>{notes}</ul>
<h2>Loss</h2>{loss}{same}
<div class="pair">{lr}{grad}</div>
<h2>Utilisation and memory per device</h2>{"".join(timelines) or "<p>no telemetry samples</p>"}
{diff}
</body></html>
"""


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
