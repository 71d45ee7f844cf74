"""The Compare screen: the selected runs side by side, the same figures and sources as
``ftui compare`` (``runner.analysis.compare.load_comparison`` rendered with ``tui.render.compare.COLUMNS``),
the recipe fields that differ, and the loss curves overlaid against the step."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Static

from runner.analysis.compare import Comparison, load_comparison
from tui.app.messages import CompareLoaded
from tui.app.widgets.plot import LinePlot
from tui.render.compare import columns, sample_rows, sources, summary_lines
from tui.render.report import STATUS_STYLE

if TYPE_CHECKING:
    from tui.app.app import FtuiApp

NARROW = {
    "strategy": "strategy", "devices": "dev", "tokens/s": "tokens/s", "MFU": "MFU",
    "mem/device measured": "peak mem", "final loss": "final loss", "status": "status",
    "final eval loss": "eval loss",
}
"""Under 100 columns: these figures only, with short labels (every source line is still shown)."""
RUNS_SHOWN_WIDE = 3
RUNS_SHOWN_NARROW = 2
"""Runs side by side at 100 columns and more, and under: a run's column is capped to fit them; the
others are reached with Left/Right (the table holds the focus and its column cursor moves by one run)."""
CELL_PAD = 2
"""A DataTable column's padding: one cell either side."""
CHROME = 4
"""Cells of the screen's width the table cannot use: the scroll bar and the borders' slack."""


def cell_width(space: int, label_width: int, runs: int) -> int:
    """The widest a run's cell may be for ``runs`` columns to fit beside the labels in ``space`` cells."""
    return max(8, (space - label_width - CELL_PAD) // max(1, runs) - CELL_PAD)


def clip(value: str, width: int, style: str = "") -> tuple[Text, bool]:
    """``value`` as text (a run's or user's text: never markup), cut to ``width`` cells with an ellipsis;
    and whether it was cut (then its full text is listed below the table)."""
    text = Text(value, style=style)
    if text.cell_len <= width:
        return text, False
    text.truncate(width, overflow="ellipsis")
    return text, True


class CompareScreen(Screen[None]):
    """Compare runs: figures (one column per run) with their sources, recipe differences, loss curves."""

    BINDINGS = [Binding("escape", "app.pop_screen", "Back")]

    def __init__(self, run_ids: list[int]) -> None:
        super().__init__()
        self.run_ids = run_ids
        self.comparison: Comparison | None = None

    @property
    def ftui(self) -> FtuiApp:
        return self.app  # type: ignore[return-value]

    def compose(self) -> ComposeResult:
        yield Header()
        with VerticalScroll(id="compare"):
            yield DataTable(id="compare-table", cursor_type="column", zebra_stripes=True, fixed_columns=1)
            yield Static("", id="compare-full")
            yield Static("", id="compare-sources")
            with Horizontal(id="compare-bottom"):
                yield DataTable(id="diff", cursor_type="none")
                yield LinePlot(id="compare-loss")
        yield Footer()

    def on_mount(self) -> None:
        self.title = "compare runs " + ", ".join(map(str, self.run_ids))
        self.sub_title = "←/→ a run at a time, ↓ more"
        self.query_one("#compare-sources", Static).update(Text("reading the runs…", style="dim"))
        self.load()

    @work(thread=True, exclusive=True, group="compare")
    def load(self) -> None:
        try:
            self.post_message(CompareLoaded(load_comparison(self.ftui.store, self.run_ids)))
        except KeyError as exc:
            self.post_message(CompareLoaded(None, f"run {exc.args[0]} is not in the store"))
        except Exception as exc:  # noqa: BLE001 (a busy database: one line instead of a crash)
            self.post_message(CompareLoaded(None, f"store: {exc}"))

    def on_compare_loaded(self, message: CompareLoaded) -> None:
        self.comparison = message.comparison
        if message.comparison is None:
            self.query_one("#compare-sources", Static).update(Text(message.error, style="red"))
            return
        self.render_comparison()

    def on_resize(self) -> None:
        self.render_comparison()

    @property
    def narrow(self) -> bool:
        return self.app.size.width < 100

    def render_comparison(self) -> None:
        cmp = self.comparison
        if cmp is None or not self.is_mounted:
            return
        clipped = self._render_figures(cmp)
        clipped += self._render_diff(cmp)
        full = self.query_one("#compare-full", Static)
        full.display = bool(clipped)
        full.update(Text("cut above, in full:\n", style="dim") + Text("\n").join(
            Text.assemble(f"  run {run_id} · {label}: ", (value, "")) for run_id, label, value in clipped))
        self._render_notes(cmp)
        self._render_plot(cmp)

    def _render_figures(self, cmp: Comparison) -> list[tuple[int, str, str]]:
        """Figures down, one column per run (as ``ftui compare`` prints them), each run's column capped so
        that three fit at 120 columns and two at 80 (the narrow subset of figures). Returns the cells cut
        short: (run, figure, full text)."""
        table = self.query_one("#compare-table", DataTable)
        first = not table.columns
        cursor = table.cursor_column
        table.clear(columns=True)
        figures = [(header, NARROW.get(header) if self.narrow else header, cell) for header, cell in columns(cmp)[1:]]
        label_width = max([len("figure"), *(len(label) for _, label, _ in figures if label is not None)])
        fit = RUNS_SHOWN_NARROW if self.narrow else RUNS_SHOWN_WIDE
        width = cell_width(self.app.size.width - CHROME, label_width, min(fit, len(cmp.rows)))
        table.add_column("figure", key="figure")
        recommended = cmp.recommended_id
        for r in cmp.rows:
            mark = " *" if r.run_id == recommended else ""
            table.add_column(f"run {r.run_id}{mark}", key=str(r.run_id))
        clipped: list[tuple[int, str, str]] = []
        for header, label, cell in figures:
            if label is None:
                continue
            cells: list[Text] = []
            for r in cmp.rows:
                value = cell(r)
                text, cut = clip(value, width, STATUS_STYLE.get(r.status, "") if header == "status" else "")
                cells.append(text)
                if cut:
                    clipped.append((r.run_id, label, value))
            table.add_row(Text(label), *cells, key=header)
        # The column cursor starts on the first run (not on the figure names) and stays where it was
        # across a re-layout; the table takes the focus once, so that Left/Right move between runs at once.
        table.move_cursor(column=max(1, min(cursor, len(cmp.rows))), animate=False)
        if first:
            table.focus()
        return clipped

    def _render_diff(self, cmp: Comparison) -> list[tuple[int, str, str]]:
        """The recipe fields that differ, each value cut to fit beside the loss chart (half the width at 100
        columns and more); returns the values cut short: (run, field, full text)."""
        diff = self.query_one("#diff", DataTable)
        diff.clear(columns=True)
        header = "recipe field (differs)"
        diff.add_column(header, key="field")
        for r in cmp.rows:
            diff.add_column(f"run {r.run_id}", key=str(r.run_id))
        space = self.app.size.width - CHROME
        space = space if self.narrow else space // 2 - 1
        label_width = max([len(header), *(len(path) for path in cmp.recipe_diff)])
        fit = RUNS_SHOWN_NARROW if self.narrow else RUNS_SHOWN_WIDE
        width = cell_width(space, label_width, min(fit, len(cmp.rows)))
        clipped: list[tuple[int, str, str]] = []
        for path, values in cmp.recipe_diff.items():
            cells = []
            for r, v in zip(cmp.rows, values, strict=True):
                # Recipe values are the user's text (names, paths, templates): never markup.
                text, cut = clip(str(v), width)
                cells.append(text)
                if cut:
                    clipped.append((r.run_id, path, str(v)))
            diff.add_row(path, *cells, key=path)  # paths: schema keys (no markup)
        if not cmp.recipe_diff:
            diff.add_row("(recipes identical)", *["" for _ in cmp.rows])
        return clipped

    def _render_notes(self, cmp: Comparison) -> None:
        """The recommended run, where each figure comes from, the verdicts and the eval samples."""
        lines = Text()
        recommended = cmp.recommended_id
        if recommended is not None:
            lines.append(f"* recommended: run {recommended}\n", style="bold")
        lines.append("sources:\n" + "\n".join(f"  {s}" for s in sources(cmp)) + "\n", style="dim")
        lines.append("\n".join(summary_lines(cmp)), style="bold")
        if cmp.samples:  # eval.prompts: each run's completion side by side (generated text: never markup)
            ids, rows = sample_rows(cmp)
            lines.append("\n\nsamples (greedy, last evaluation):\n", style="bold")
            for prompt, completions in rows:
                lines.append(f"  {prompt}\n")
                for rid, completion in zip(ids, completions, strict=True):
                    lines.append(f"    run {rid}: {completion}\n", style="dim")
        self.query_one("#compare-sources", Static).update(lines)

    def _render_plot(self, cmp: Comparison) -> None:
        plot = self.query_one("#compare-loss", LinePlot)
        plot.title = "loss (measured) against step, overlaid" + (" (+ eval loss)" if cmp.eval_curves else "")
        plot.x_label = "step"
        plot.points = [(f"run {r.run_id}", [(float(s), float(v)) for s, v in cmp.curves.get(r.run_id, [])])
                       for r in cmp.rows] + [
            (f"run {r.run_id} eval", [(float(s), float(v)) for s, v in cmp.eval_curves[r.run_id]])
            for r in cmp.rows if cmp.eval_curves.get(r.run_id)]
