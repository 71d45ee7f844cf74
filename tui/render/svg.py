"""Inline SVG charts for the HTML report: lines on shared axes with round ticks, and bars per run. No
script and no network: the page opens offline."""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence

Series = tuple[str, str, Sequence[tuple[float, float | None]]]
"""(legend label, colour, (x, y) points)."""

def nice_step(span: float, ticks: int = 4) -> float:
    """A round tick step (1, 2 or 5 x 10^k) that cuts ``span`` into about ``ticks`` parts."""
    raw = span / ticks if span > 0 else 1.0
    power = 10.0 ** math.floor(math.log10(raw))
    return next(float(m * power) for m in (1, 2, 5, 10) if m * power >= raw)


def svg_lines(series: Sequence[tuple[str, str, Sequence[tuple[float, float | None]]]], title: str, xlabel: str,
              ylabel: str, width: int = 440, height: int = 300, yfmt: Callable[[float], str] = lambda v: f"{v:.3g}",
              zero_based: bool = False, band: tuple[float, float] | None = None, band_label: str = "",
              y_max: float | None = None) -> str:
    """An inline SVG line chart: axes with round ticks, one polyline per series and a legend.
    ``zero_based``: the y axis starts at 0 (utilisation, memory: a bar of 90-100% must not look like 0-100).
    ``band``: an x range shaded and labelled (a run's training window on its device timeline).
    ``y_max``: the axis's top, values above it drawn at it (utilisation: 100%)."""
    if y_max is not None:
        series = [(label, colour, [(x, None if y is None else min(float(y), y_max)) for x, y in s])
                  for label, colour, s in series]
    pts = [(x, y) for _, _, s in series for x, y in s if y is not None]
    places, rows = legend_layout([label for label, _, _ in series], 70, width - 20)
    left, right, top, bottom = 70, 20, 30, 46 + 14 * rows
    w, h = width - left - right, height - top - bottom
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{width}" height="{height}" role="img" '
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
    if y_max is not None:
        y1 = y_max
    # round ticks: the axes run from a multiple of the step to a multiple of the step
    ystep, xstep = nice_step(y1 - y0), nice_step(x1 - x0)
    if xlabel == "step":  # steps are whole numbers: no tick at step 1.5
        xstep = max(1.0, xstep)
    y0, y1 = math.floor(y0 / ystep) * ystep, (y1 if y_max is not None else math.ceil(y1 / ystep) * ystep)
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
        lx, row = places[k]
        ly = top + h + 44 + 14 * row
        out.append(f'<rect x="{lx}" y="{ly - 5}" width="12" height="4" fill="{colour}"/>'
                   f'<text x="{lx + 16}" y="{ly}">{html.escape(label)}</text>')
    out.append("</svg>")
    return "".join(out)


def legend_layout(labels: Sequence[str], left: float, right: float) -> tuple[list[tuple[float, int]], int]:
    """Where each legend entry goes (x, row), wrapping before ``right``, and how many rows it takes."""
    places: list[tuple[float, int]] = []
    x, row = left, 0
    for label in labels:
        size = 16 + 7 * len(label) + 18
        if x > left and x + size - 18 > right:
            x, row = left, row + 1
        places.append((x, row))
        x += size
    return places, row + 1


def svg_bars(groups: Sequence[tuple[str, Sequence[tuple[str, str, float | None]]]], title: str, ylabel: str,
             width: int = 440, height: int = 260, yfmt: Callable[[float], str] = lambda v: f"{v:,.3g}") -> str:
    """An inline SVG bar chart: one group per run (its label under it), one bar per (name, colour, value) in
    it, zero-based with round ticks; a value it lacks is a ``-`` in its place."""
    values = [v for _, bars in groups for _, _, v in bars if v is not None]
    left, right, top, bottom = 70, 20, 30, 60
    w, h = width - left - right, height - top - bottom
    esc = html.escape
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart bars" width="{width}" height="{height}" '
           f'role="img" aria-label="{esc(title)}" style="background:#fff;font:11px sans-serif">',
           f'<text x="{width / 2}" y="18" text-anchor="middle" font-weight="bold">{esc(title)}</text>']
    if not values or not groups:
        out.append(f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle">no data</text></svg>')
        return "".join(out)
    step = nice_step(max(values))
    top_value = math.ceil(max(values) / step) * step or step
    out.append(f'<rect x="{left}" y="{top}" width="{w}" height="{h}" fill="none" stroke="#999"/>')
    for i in range(round(top_value / step) + 1):
        y = top + h - i * step / top_value * h
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + w}" y2="{y:.1f}" stroke="#eee"/>'
                   f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{esc(yfmt(i * step))}</text>')
    slot = w / len(groups)
    names: dict[str, str] = {}
    for g, (label, group) in enumerate(groups):
        bar_w = slot * 0.7 / max(1, len(group))
        x = left + g * slot + slot * 0.15
        for name, colour, value in group:
            names.setdefault(name, colour)
            if value is None:
                out.append(f'<text x="{x + bar_w / 2:.1f}" y="{top + h - 4}" text-anchor="middle">-</text>')
            else:
                bh = value / top_value * h
                out.append(f'<rect class="bar" x="{x:.1f}" y="{top + h - bh:.1f}" width="{bar_w:.1f}" '
                           f'height="{bh:.1f}" fill="{colour}"><title>{esc(label)} {esc(name)}: '
                           f'{esc(yfmt(value))}</title></rect>')
            x += bar_w
        out.append(f'<text x="{left + (g + 0.5) * slot:.1f}" y="{top + h + 16}" text-anchor="middle">'
                   f'{esc(label)}</text>')
    out.append(f'<text x="14" y="{top + h / 2}" text-anchor="middle" transform="rotate(-90 14 {top + h / 2})">'
               f'{esc(ylabel)}</text>')
    lx = left
    for name, colour in names.items():
        if len(names) > 1:
            out.append(f'<rect x="{lx}" y="{height - 14}" width="12" height="8" fill="{colour}"/>'
                       f'<text x="{lx + 16}" y="{height - 7}">{esc(name)}</text>')
            lx += 16 + 7 * len(name) + 18
    out.append("</svg>")
    return "".join(out)
