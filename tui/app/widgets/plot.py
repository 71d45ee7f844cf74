"""Small text charts: a line plot of one or more series, bars and sparklines as rich Text."""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from tui.app.screens.data import downsample

BLOCKS = " ▁▂▃▄▅▆▇█"
COLORS = ["cyan", "magenta", "yellow", "green", "red", "blue", "white"]


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


class LinePlot(Widget):
    """Overlaid line plots of named series, y scaled to the data.

    ``series`` are plotted left to right by index (each downsampled to the widget's width);
    ``points`` are ``(x, y)`` pairs plotted against x (a shared x axis, labelled ``x_label``), so that
    curves logged at different steps line up. The caller keeps the data.
    """

    DEFAULT_CSS = """
    LinePlot { height: 10; }
    """

    series: reactive[list[tuple[str, list[float]]]] = reactive(list, always_update=True)
    """``[(name, values)]``; values are plotted left to right."""
    points: reactive[list[tuple[str, list[tuple[float, float]]]]] = reactive(list, always_update=True)
    """``[(name, [(x, y)])]``; plotted against x (used instead of ``series`` when set)."""
    x_label: reactive[str] = reactive("")
    """The x axis' name, shown under the plot with its range (for ``points``)."""
    title: reactive[str] = reactive("")
    """Shown on the first line."""

    def render(self) -> Text:
        width = max(10, self.size.width - 10)
        height = max(3, self.size.height - (3 if self.points else 2))
        out = Text(self.title + "\n", style="bold")
        if self.points:
            curves = [(n, list(p)) for n, p in self.points if p]
        else:
            curves = [(n, [(float(j), v) for j, v in enumerate(downsample(vals, width))]) for n, vals in self.series
                      if vals]
        if not curves:
            return out + Text("no data yet", style="dim")
        x0 = min(x for _, p in curves for x, _ in p)
        x1 = max(x for _, p in curves for x, _ in p)
        lo = min(y for _, p in curves for _, y in p)
        hi = max(y for _, p in curves for _, y in p)
        span, xspan = (hi - lo) or 1.0, (x1 - x0) or 1.0
        grid = [[" "] * width for _ in range(height)]
        colors = [[""] * width for _ in range(height)]
        for i, (_name, pts) in enumerate(curves):
            columns: dict[int, list[float]] = {}
            for x, y in pts:  # the mean of the points that fall in one column
                columns.setdefault(round((x - x0) / xspan * (width - 1)), []).append(y)
            for col, ys in columns.items():
                row = height - 1 - round((sum(ys) / len(ys) - lo) / span * (height - 1))
                grid[row][col] = "•"
                colors[row][col] = COLORS[i % len(COLORS)]
        for row in range(height):
            label = f"{hi:8.3f} " if row == 0 else f"{lo:8.3f} " if row == height - 1 else " " * 9
            out.append(label, style="dim")
            out.append("│")
            for x in range(width):
                out.append(grid[row][x], style=colors[row][x])
            out.append("\n")
        if self.points:
            left, right = f"{x0:g}", f"{x1:g}"
            middle = f" {self.x_label} "
            gap = max(1, width - len(left) - len(right) - len(middle))
            out.append(" " * 10 + left + " " * (gap // 2) + middle + " " * (gap - gap // 2) + right + "\n", style="dim")
        legend = Text(" " * 9)
        for i, (name, _v) in enumerate(curves):
            legend.append(f"• {name}  ", style=COLORS[i % len(COLORS)])
        return out + legend


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
