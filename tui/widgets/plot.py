"""Small text charts: a line plot of one or more series, bars and sparklines as rich Text."""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from tui.screens.data import downsample

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


def bar(fraction: float | None, width: int, style: str = "green") -> Text:
    """A horizontal bar ``width`` cells wide filled to ``fraction`` (0..1)."""
    if fraction is None:
        return Text("·" * width, style="dim")
    fraction = min(1.0, max(0.0, fraction))
    full = int(fraction * width)
    return Text("█" * full, style=style) + Text("░" * (width - full), style="dim")


class LinePlot(Widget):
    """Overlaid line plots of named series, y scaled to the data, x to the longest series.

    Each series is downsampled to the widget's width for display; the caller keeps the data.
    """

    DEFAULT_CSS = """
    LinePlot { height: 10; }
    """

    series: reactive[list[tuple[str, list[float]]]] = reactive(list, always_update=True)
    """``[(name, values)]``; values are plotted left to right."""
    title: reactive[str] = reactive("")
    """Shown on the first line."""

    def render(self) -> Text:
        width = max(10, self.size.width - 10)
        height = max(3, self.size.height - 2)
        series = [(n, downsample(v, width)) for n, v in self.series if v]
        out = Text(self.title + "\n", style="bold")
        if not series:
            return out + Text("no data yet", style="dim")
        lo = min(min(v) for _, v in series)
        hi = max(max(v) for _, v in series)
        span = (hi - lo) or 1.0
        grid = [[" "] * width for _ in range(height)]
        colors = [[""] * width for _ in range(height)]
        longest = max(len(v) for _, v in series)
        for i, (_name, values) in enumerate(series):
            for j, value in enumerate(values):
                x = j if longest <= 1 else round(j * (width - 1) / max(1, longest - 1))
                y = height - 1 - round((value - lo) / span * (height - 1))
                grid[y][x] = "•"
                colors[y][x] = COLORS[i % len(COLORS)]
        for row in range(height):
            label = f"{hi:8.3f} " if row == 0 else f"{lo:8.3f} " if row == height - 1 else " " * 9
            out.append(label, style="dim")
            out.append("│")
            for x in range(width):
                out.append(grid[row][x], style=colors[row][x])
            out.append("\n")
        legend = Text(" " * 9)
        for i, (name, _v) in enumerate(series):
            legend.append(f"• {name}  ", style=COLORS[i % len(COLORS)])
        return out + legend
