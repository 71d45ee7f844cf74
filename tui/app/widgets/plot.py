"""Small text charts: line plots (plotext, through textual-plotext), bars and sparklines as rich Text."""

from __future__ import annotations

import math

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget
from textual_plotext import PlotextPlot

from tui.app.poll import downsample

BLOCKS = " ▁▂▃▄▅▆▇█"
COLORS = ["cyan", "magenta", "yellow", "green", "red", "blue", "white"]
X_TICKS = 6
"""Ticks on a step axis: as many at 80 columns as at 120 (a fixed count: the plot's width is not known
yet when its data first arrives)."""


def spark(values: list[float], width: int, top: float | None = None) -> str:
    """A one-line sparkline of the last ``width`` values (scaled to ``top``, default their max)."""
    vals = values[-width:]
    if not vals:
        return " " * width
    hi = top if top else (max(vals) or 1.0)
    chars = [BLOCKS[min(8, max(0, round(8 * v / hi)))] for v in vals]
    return "".join(chars).rjust(width)


def spark_rows(values: list[float], width: int, rows: int = 2, style: str = "cyan") -> Text:
    """A sparkline ``rows`` lines tall (8 levels per line), the last ``width`` values scaled between
    their min and max, so that a slowly moving curve (a decaying lr) is still seen to move."""
    vals = downsample(values, width)
    if not vals:
        return Text("\n".join(" " * width for _ in range(rows)), style="dim")
    lo, hi = min(vals), max(vals)
    span = (hi - lo) or 1.0
    levels = [round((v - lo) / span * (8 * rows - 1)) + 1 if hi > lo else 4 for v in vals]
    lines = []
    for r in range(rows - 1, -1, -1):  # top line first
        line = "".join(BLOCKS[min(8, max(0, lv - 8 * r))] for lv in levels)
        lines.append(line.ljust(width))
    return Text("\n".join(lines), style=style)


def whole_ticks(lo: float, hi: float, most: int = 5) -> list[int]:
    """At most ``most`` whole-number ticks from ``lo`` to ``hi`` (steps), 1, 2 or 5 times a power of ten
    apart, so that a step axis never reads 8.2 or 15.5."""
    first, last = math.ceil(lo), math.floor(hi)
    if last <= first:
        return [first] if first <= hi else [round(lo)]
    span = last - first
    gap = 1
    for power in range(0, 12):
        gap = next((m * 10**power for m in (1, 2, 5) if span // (m * 10**power) + 1 <= max(2, most)), 0)
        if gap:
            break
    start = math.ceil(first / gap) * gap
    ticks = list(range(start, last + 1, gap))
    if not ticks or ticks[0] - first >= gap / 2:  # the first step too, where it has room
        ticks.insert(0, first)
    return ticks


def level_style(value: float | None, warn: float = 60.0, high: float = 85.0) -> str:
    """nvitop's thresholds: green below ``warn``, yellow to ``high``, red above (percent or °C)."""
    if value is None:
        return "dim"
    return "green" if value < warn else "yellow" if value < high else "red"


def bar(fraction: float | None, width: int, style: str = "green") -> Text:
    """A horizontal bar ``width`` cells wide filled to ``fraction`` (0..1)."""
    if fraction is None:
        return Text("·" * width, style="dim")
    fraction = min(1.0, max(0.0, fraction))
    full = int(fraction * width)
    return Text("█" * full, style=style) + Text("░" * (width - full), style="dim")


class LinePlot(PlotextPlot):
    """Overlaid line plots of named series, drawn by plotext (axes with ticks, a legend, braille lines).

    ``series`` are plotted against their position (1, 2, ...: each logged step); ``points`` are
    ``(x, y)`` pairs plotted against x (a shared x axis, labelled ``x_label``), so that curves logged
    at different steps line up. The caller keeps the data; the plot is rebuilt when any of it changes.
    Names (run names) reach the terminal through ``Text.from_ansi``, never as markup.
    """

    DEFAULT_CSS = """
    LinePlot { height: 10; }
    """

    series: reactive[list[tuple[str, list[float]]]] = reactive(list, always_update=True)
    """``[(name, values)]``; values are plotted left to right."""
    points: reactive[list[tuple[str, list[tuple[float, float]]]]] = reactive(list, always_update=True)
    """``[(name, [(x, y)])]``; plotted against x (used instead of ``series`` when set)."""
    x_label: reactive[str] = reactive("")
    """The x axis' name."""
    title: reactive[str] = reactive("")
    """Shown above the plot."""

    def on_mount(self) -> None:
        super().on_mount()
        self.replot()

    def watch_series(self) -> None:
        self.replot()

    def watch_points(self) -> None:
        self.replot()

    def watch_title(self) -> None:
        self.replot()

    def watch_x_label(self) -> None:
        self.replot()

    def replot(self) -> None:
        plt = self.plt
        plt.clear_figure()
        plt.title(self.title)
        if self.points:
            curves = [(n, [x for x, _ in p], [y for _, y in p]) for n, p in self.points if p]
        else:
            curves = [(n, list(range(1, len(v) + 1)), list(v)) for n, v in self.series if v]
        for i, (name, xs, ys) in enumerate(curves):
            plt.plot(xs, ys, label=name, marker="braille", color=COLORS[i % len(COLORS)])
        every_x = [x for _, xs, _ in curves for x in xs]
        if every_x and all(float(x).is_integer() for x in every_x):  # steps: whole ticks, never 8.2
            ticks = whole_ticks(min(every_x), max(every_x), X_TICKS)
            plt.xticks([float(t) for t in ticks], [str(t) for t in ticks])
        if not curves:
            plt.text("no data yet", 0.5, 0.5, alignment="center")
            plt.xlim(0, 1)
            plt.ylim(0, 1)
        if self.x_label:
            plt.xlabel(self.x_label)
        self.refresh()


class Curves(Widget):
    """Small curves stacked: each a title line (latest value, min..max) and a sparkline one or two
    lines tall (two when the widget is tall enough), drawn at the widget's own width."""

    curves: reactive[list[tuple[str, list[float], str, str]]] = reactive(list, always_update=True)
    """``[(name, values, number format, style)]``."""

    def render(self) -> Text:
        width = max(10, self.size.width)
        rows = 2 if self.size.height >= 3 * len(self.curves) + len(self.curves) else 1
        out = Text(no_wrap=True, overflow="ellipsis")
        for i, (name, values, fmt, style) in enumerate(self.curves):
            if i:
                out.append("\n")
            if values:
                lo, hi, last = min(values), max(values), values[-1]
                out.append(f"{name} {last:{fmt}}", style=f"bold {style}")
                out.append(f"  {lo:{fmt}}..{hi:{fmt}}\n", style="dim")
                out.append_text(spark_rows(values, width, rows, style))
            else:
                out.append(f"{name}: none logged\n", style="dim")
                out.append("\n" * (rows - 1))
            if rows == 2:
                out.append("\n")
        return out
