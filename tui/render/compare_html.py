"""The HTML report of a comparison (``ftui report``, ``ftui compare --format html``): the verdict first,
the table of short cells with its footnotes, the runs overlaid on shared axes (loss, eval loss, lr, grad
norm, tokens/s, utilisation, measured memory), bars per run (tokens/s, peak memory estimated vs measured,
MFU), and the provenance in one collapsible block. One self-contained file: inline CSS and SVG only."""

from __future__ import annotations

import html
import socket
from collections.abc import Sequence
from datetime import UTC, datetime
from importlib import metadata
from typing import Any

from runner.analysis.compare import Comparison
from tui.render.compare_cells import columns, figure_sources, footnotes, sample_rows, summary_lines
from tui.render.svg import Series, nice_step, svg_bars, svg_lines

__all__ = ["PALETTE", "nice_step", "provenance", "svg_lines", "to_html"]

PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"]
ESTIMATED_COLOUR = "#aaaaaa"
MEASURED_COLOUR = "#1f77b4"

UTIL_BIN_S = 1.0
"""Seconds over which a run's devices' utilisation samples are averaged into one point."""


def provenance(cmp: Comparison, now: Any = None) -> dict[str, str]:
    """Where a report comes from: when and where it was made, by which ftui, over which runs, models, data."""
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


def _name(cmp: Comparison, i: int) -> tuple[str, str]:
    """A run's legend label and colour (the same in every chart)."""
    r = cmp.rows[i]
    return f"run {r.run_id} {cmp.label(r)}", PALETTE[i % len(PALETTE)]


def _series(cmp: Comparison, curves: dict[int, Any], scale: float = 1.0) -> list[Series]:
    """One line per run that has points in ``curves`` (run id to (step, value))."""
    return [(*_name(cmp, i), [(float(s), float(v) / scale) for s, v in curves[r.run_id]])
            for i, r in enumerate(cmp.rows) if curves.get(r.run_id)]


def util_series(cmp: Comparison) -> tuple[list[Series], str]:
    """Each run's utilisation, the mean over its devices per second of its training window (seconds from the
    window's start): GPU busy % (NVML), or CPU % of the rank's threads (psutil's % of one core over the
    threads, as the table shows it); and the axis's unit."""
    out: list[Series] = []
    units: set[str] = set()
    for i, r in enumerate(cmp.rows):
        devices = cmp.timelines.get(r.run_id) or {}
        start, end = cmp.windows.get(r.run_id, (None, None))
        bins: dict[int, list[float]] = {}
        for key, points in devices.items():
            gpu = key.startswith("gpu:")
            units.add("GPU busy % (NVML)" if gpu else "CPU % of its threads (psutil)")
            divide = 1 if gpu or not r.cpu_threads else r.cpu_threads
            for t, util, _ in points:
                if util is None or (start is not None and end is not None and not start <= t <= end):
                    continue
                bins.setdefault(int((t - (start or 0.0)) // UTIL_BIN_S), []).append(util / divide)
        if bins:
            out.append((*_name(cmp, i), [(k * UTIL_BIN_S, sum(v) / len(v)) for k, v in sorted(bins.items())]))
    return out, "; ".join(sorted(units)) or "util %"


def _mib_or_gib(values: Sequence[float]) -> tuple[str, float]:
    return ("GiB", 2.0**30) if max(values, default=0) >= 4 * 2**30 else ("MiB", 2.0**20)


def line_charts(cmp: Comparison) -> list[str]:
    """The runs overlaid on shared axes, one chart per figure the runs have."""
    charts = [svg_lines(_series(cmp, cmp.curves), "training loss", "step", "loss")]
    if cmp.eval_curves:
        charts.append(svg_lines(_series(cmp, cmp.eval_curves), "eval loss (whole held-out set)", "step",
                                "eval loss"))
    charts.append(svg_lines(_series(cmp, cmp.lr_curves), "learning rate", "step", "lr",
                            yfmt=lambda v: f"{v:.1e}", zero_based=True))
    charts.append(svg_lines(_series(cmp, cmp.grad_curves), "gradient norm (before clipping)", "step", "grad norm",
                            zero_based=True))
    charts.append(svg_lines(_series(cmp, cmp.tokens_curves), "tokens/s per step (all devices)", "step", "tokens/s",
                            yfmt=lambda v: f"{v:,.0f}", zero_based=True))
    util, unit = util_series(cmp)
    if util:
        charts.append(svg_lines(util, "utilisation, mean over devices", "seconds of training", unit,
                                yfmt=lambda v: f"{v:.0f}", zero_based=True, y_max=100.0))
    if cmp.memory_curves:
        unit_name, scale = _mib_or_gib([v for c in cmp.memory_curves.values() for _, v in c])
        charts.append(svg_lines(_series(cmp, cmp.memory_curves, scale), "peak memory per device, busiest rank",
                                "step", f"{unit_name} ({cmp.memory_source})", yfmt=lambda v: f"{v:,.6g}",
                                zero_based=True))
    if cmp.rss_curves:  # a run that measured only its RSS: never drawn as the table's memory
        unit_name, scale = _mib_or_gib([v for c in cmp.rss_curves.values() for _, v in c])
        charts.append(svg_lines(_series(cmp, cmp.rss_curves, scale), "process RSS, largest rank (not training memory)",
                                "step", f"{unit_name} (process RSS, /proc)", yfmt=lambda v: f"{v:,.6g}",
                                zero_based=True))
    return charts


def bar_charts(cmp: Comparison) -> list[str]:
    """Per run: tokens/s, peak memory per device (estimated against measured) and MFU, each drawn when some
    run has the figure."""
    runs = [(f"run {r.run_id}", r) for r in cmp.rows]
    tps = svg_bars([(name, [("tokens/s", PALETTE[i % len(PALETTE)], r.tokens_per_s)])
                    for i, (name, r) in enumerate(runs)], "tokens/s per run (all devices)", "tokens/s",
                   yfmt=lambda v: f"{v:,.0f}")
    unit, scale = _mib_or_gib([float(v) for _, r in runs for v in (r.mem_measured, r.mem_estimated) if v])
    mem = svg_bars([(name, [("estimated", ESTIMATED_COLOUR, r.mem_estimated / scale if r.mem_estimated else None),
                            ("measured", MEASURED_COLOUR, r.mem_measured / scale if r.mem_measured else None)])
                    for i, (name, r) in enumerate(runs)], "peak memory per device: estimated vs measured",
                   f"peak memory ({unit})")
    mfu = svg_bars([(name, [("MFU", PALETTE[i % len(PALETTE)], r.mfu * 100 if r.mfu is not None else None)])
                    for i, (name, r) in enumerate(runs)], "MFU per run", "MFU (%)", yfmt=lambda v: f"{v:.3g}")
    return [tps] + ([mem] if any(r.mem_measured or r.mem_estimated for r in cmp.rows) else []) + (
        [mfu] if any(r.mfu is not None for r in cmp.rows) else [])


def _tables(cmp: Comparison) -> str:
    """The figures transposed (a figure a line, a run a column), five runs a table, short cells."""
    esc = html.escape
    best = cmp.recommended_id
    out = []
    cols = columns(cmp)
    for start in range(0, len(cmp.rows), 5):
        chunk = cmp.rows[start:start + 5]
        head = "".join(f'<th{" class=recommended" if r.run_id == best else ""}>run {r.run_id}</th>' for r in chunk)
        body = "".join(f"<tr><th>{esc(h)}</th>" + "".join(
            f'<td{" class=recommended" if r.run_id == best else ""}>{esc(cell(r))}</td>' for r in chunk)
            + "</tr>" for h, cell in cols)
        out.append(f'<table class="runs"><tr><th>figure</th>{head}</tr>{body}</table>')
    return "".join(out)


def _details(cmp: Comparison) -> str:
    """The provenance block: where the report and every figure come from, the peaks' full sources."""
    esc = html.escape
    prov = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in provenance(cmp).items())
    peaks = "".join(f"<li>run {r.run_id}: {esc(r.peak_label)}; {esc(r.peak_source)}</li>"
                    for r in cmp.rows if r.peak_source)
    formula = ("MFU = (6N_trainable + 4N_frozen + 12*L*H*Q*T) x tokens/s / (peak x devices), N without the input "
               "embedding (a lookup); the peak is of one device in the run's dtype (on CPU: FLOPs per CPU-second "
               "probed beside the run, and the devices are the CPUs its ranks ran over their steady steps); an MFU "
               "above 100% is never shown")
    notes = "".join(f"<li>{esc(s)}</li>" for s in figure_sources(cmp))
    return (f'<details class="provenance"><summary>Provenance: where this report and its figures come from'
            f'</summary><table class="provenance">{prov}</table><ul>{notes}<li>{esc(formula)}</li></ul>'
            f"<p>MFU peaks:</p><ul>{peaks or '<li>none</li>'}</ul></details>")


def _extras(cmp: Comparison) -> str:
    """The recipe fields that differ and the evaluation samples side by side."""
    esc = html.escape
    out = ""
    if cmp.recipe_diff:
        dh = "".join(f"<th>run {r.run_id}</th>" for r in cmp.rows)
        rows = "".join(f"<tr><td><code>{esc(k)}</code></td>" + "".join(f"<td>{esc(v)}</td>" for v in vs) + "</tr>"
                       for k, vs in cmp.recipe_diff.items())
        out += f"<h2>Recipe differences</h2><table><tr><th>field</th>{dh}</tr>{rows}</table>"
    if cmp.samples:
        ids, sample_lines = sample_rows(cmp)
        sh = "".join(f"<th>run {rid}</th>" for rid in ids)
        srows = "".join(f"<tr><td>{esc(p)}</td>" + "".join(f"<td>{esc(c)}</td>" for c in cs) + "</tr>"
                        for p, cs in sample_lines)
        out += f"<h2>Samples (greedy, last evaluation)</h2><table><tr><th>prompt</th>{sh}</tr>{srows}</table>"
    return out


def _same_curves(cmp: Comparison) -> str:
    curves = [tuple(cmp.curves.get(r.run_id, [])) for r in cmp.rows if cmp.curves.get(r.run_id)]
    if len(curves) > 1 and all(len(c) == len(curves[0]) and all(abs(a[1] - b[1]) < 1e-3
                                                                for a, b in zip(c, curves[0], strict=True))
                               for c in curves):
        return ("<p>The loss curves coincide (within 0.001): the runs train the same global batch from the same "
                "seed, so every strategy computes the same updates; only the time they take differs.</p>")
    return ""


STYLE = """
body { font: 14px/1.4 sans-serif; margin: 20px; color: #222; max-width: 900px; }
table { border-collapse: collapse; margin: 8px 0 16px; }
th, td { border: 1px solid #ccc; padding: 3px 7px; text-align: right; font-size: 12px; }
th { background: #f0f0f0; text-align: left; }
table.runs { max-width: 900px; }
table.runs td { max-width: 170px; overflow-wrap: anywhere; }
table.provenance td { text-align: left; }
.recommended { background: #e6f5e6; font-weight: bold; }
.charts svg { margin: 0 8px 8px 0; border: 1px solid #eee; }
.verdict { font-weight: bold; font-size: 15px; border-left: 4px solid #2ca02c; padding: 4px 10px; }
.verdict p + p { font-weight: normal; font-size: 13px; }
.footnotes { font-size: 12px; color: #555; }
"""


def to_html(cmp: Comparison) -> str:
    """One self-contained page (see the module's docstring)."""
    esc = html.escape
    title = f"ftui comparison{f' - {cmp.sweep_id}' if cmp.sweep_id else ''}"
    lines = summary_lines(cmp)  # the verdict first, then the ratios it was drawn from
    verdict = "".join(f"<p>{esc(s)}</p>" for s in [lines[-1], *lines[:-1]])
    notes = "".join(f"<div>{esc(n)}</div>" for n in footnotes(cmp))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>
<style>{STYLE}</style></head><body>
<h1>{esc(title)}</h1>
<div class="verdict">{verdict}</div>
{_tables(cmp)}
<div class="footnotes">{notes}</div>
<h2>Runs overlaid</h2><div class="charts">{"".join(line_charts(cmp))}</div>{_same_curves(cmp)}
<h2>Per run</h2><div class="charts">{"".join(bar_charts(cmp))}</div>
{_extras(cmp)}
{_details(cmp)}
</body></html>
"""
