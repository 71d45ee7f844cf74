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
            yield DataTable(id="compare-table", cursor_type="none", zebra_stripes=True)
            yield Static("", id="compare-sources")
            with Horizontal(id="compare-bottom"):
                yield DataTable(id="diff", cursor_type="none")
                yield LinePlot(id="compare-loss")
        yield Footer()

    def on_mount(self) -> None:
        self.title = "compare runs " + ", ".join(map(str, self.run_ids))
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
        # Figures down, one column per run (as ``ftui compare`` prints them); the narrow subset at 80
        # columns keeps the table free of sideways scrolling for three or four runs.
        table = self.query_one("#compare-table", DataTable)
        table.clear(columns=True)
        table.add_column("figure", key="figure")
        recommended = cmp.recommended_id
        for r in cmp.rows:
            mark = " *" if r.run_id == recommended else ""
            table.add_column(f"run {r.run_id}{mark}", key=str(r.run_id))
        for header, cell in columns(cmp)[1:]:
            label = NARROW.get(header) if self.narrow else header
            if label is None:
                continue
            cells: list[str | Text] = []
            for r in cmp.rows:
                text = cell(r)
                cells.append(Text(text, style=STATUS_STYLE.get(r.status, "")) if header == "status" else Text(text))
            table.add_row(label, *cells, key=header)
        lines = Text()
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
        diff = self.query_one("#diff", DataTable)
        diff.clear(columns=True)
        diff.add_column("recipe field (differs)", key="field")
        for r in cmp.rows:
            diff.add_column(f"run {r.run_id}", key=str(r.run_id))
        for path, values in cmp.recipe_diff.items():
            # Recipe values are the user's text (names, paths, templates): never markup.
            diff.add_row(path, *(Text(str(v)) for v in values), key=path)  # paths: schema keys
        if not cmp.recipe_diff:
            diff.add_row("(recipes identical)", *["" for _ in cmp.rows])
        plot = self.query_one("#compare-loss", LinePlot)
        plot.title = "loss (measured) against step, overlaid" + (" (+ eval loss)" if cmp.eval_curves else "")
        plot.x_label = "step"
        plot.points = [(f"run {r.run_id}", [(float(s), float(v)) for s, v in cmp.curves.get(r.run_id, [])])
                       for r in cmp.rows] + [
            (f"run {r.run_id} eval", [(float(s), float(v)) for s, v in cmp.eval_curves[r.run_id]])
            for r in cmp.rows if cmp.eval_curves.get(r.run_id)]
