"""The Compare screen: the selected runs side by side, the recipe fields that differ, loss curves."""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header

from runner.compare import recipe_diff
from tui.messages import CompareLoaded
from tui.report import fmt_bytes, fmt_seconds
from tui.widgets.plot import LinePlot

if TYPE_CHECKING:
    from tui.app import FtuiApp


class CompareScreen(Screen[None]):
    """Compare runs: figures, recipe differences, overlaid loss curves."""

    BINDINGS = [Binding("escape", "app.pop_screen", "Back")]

    def __init__(self, run_ids: list[int]) -> None:
        super().__init__()
        self.run_ids = run_ids

    @property
    def ftui(self) -> FtuiApp:
        return self.app  # type: ignore[return-value]

    def compose(self) -> ComposeResult:
        yield Header()
        with Vertical(id="compare"):
            yield DataTable(id="compare-table", cursor_type="none", zebra_stripes=True)
            with Horizontal(id="compare-bottom"):
                yield DataTable(id="diff", cursor_type="none")
                yield LinePlot(id="compare-loss")
        yield Footer()

    def on_mount(self) -> None:
        self.title = "compare runs " + ", ".join(map(str, self.run_ids))
        self.load()

    @work(thread=True, exclusive=True, group="compare")
    def load(self) -> None:
        store = self.ftui.store
        runs = [r for r in (store.get_run(i) for i in self.run_ids) if r is not None]
        losses = {r.id: [m.loss for m in store.metrics(r.id) if m.loss is not None] for r in runs}
        self.post_message(CompareLoaded(runs, losses))

    def on_compare_loaded(self, message: CompareLoaded) -> None:
        runs, losses = message.runs, message.losses
        table = self.query_one("#compare-table", DataTable)
        table.clear(columns=True)
        for col in ("id", "name", "status", "strategy", "method", "nproc", "train time", "tokens/s",
                    "mean util", "final loss", "peak memory"):
            table.add_column(col, key=col)
        for r in runs:
            table.add_row(str(r.id), r.name, r.status, r.strategy, r.method, str(r.nproc),
                          fmt_seconds(r.train_seconds),
                          "-" if r.tokens_per_s is None else f"{r.tokens_per_s:,.0f}",
                          "-" if r.mean_util is None else f"{r.mean_util:.0f}%",
                          "-" if r.final_loss is None else f"{r.final_loss:.4f}",
                          fmt_bytes(r.peak_mem_bytes))
        diff = self.query_one("#diff", DataTable)
        diff.clear(columns=True)
        diff.add_column("recipe field (differs)", key="field")
        for r in runs:
            diff.add_column(f"run {r.id}", key=str(r.id))
        rows = recipe_diff([r.recipe_text for r in runs])
        for path, values in rows.items():
            diff.add_row(path, *values)
        if not rows:
            diff.add_row("(recipes identical)", *["" for _ in runs])
        plot = self.query_one("#compare-loss", LinePlot)
        plot.title = "loss (measured), overlaid"
        plot.series = [(f"run {r.id}", losses.get(r.id, [])) for r in runs]
