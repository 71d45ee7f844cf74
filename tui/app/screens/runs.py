"""The Runs screen: every run in the store, live (a thread worker reads the store every second)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Input, Static
from textual.worker import get_current_worker

from runner.spec.status import NOT_STARTED, QUEUED, STARTED
from store import MetricPoint, RunInfo, Store
from store.queue import QueueEntryInfo
from store.queue import entries as queue_entries
from tui.app.messages import CompareRuns, LaunchFailed, Notice, OpenRun, RunLaunched, RunsLoaded
from tui.app.poll import rest, run_duration, settle_abandoned
from tui.app.screens.modals import ConfirmScreen, PromptScreen
from tui.render.queue import queue_lines
from tui.render.report import STATUS_STYLE, fmt_seconds
from tui.render.words import distributed_words, strategy_words

if TYPE_CHECKING:
    from tui.app.app import FtuiApp

COLUMNS = ("sel", "id", "name", "status", "step", "loss", "tokens/s", "wall time", "strategy", "mode", "method",
           "tags · note", "started", "util")
"""What matters first comes first: at 80 columns the table scrolls sideways for the rest. ``wall time`` is
start to end (ticking while running); ``ftui runs``' ``train time`` is the trainer's, first to last step."""
EMPTY_HINT = ("No runs yet. Press 2 (Compose), check the recipe, then ctrl+l to launch it; or in a shell:\n"
              "    ftui run recipes/quickstart.toml\n"
              "Runs started anywhere on this store appear here live. ? lists every key.")
SORTS: dict[str, tuple[str, bool]] = {
    "id": ("id", True), "name": ("name", False), "status": ("status", False), "wall time": ("wall time", True),
    "tokens/s": ("tokens/s", True), "final loss": ("loss", False),
}
"""Each sort: the column it is shown on, and whether it first sorts descending (newest, fastest, longest
first; names, statuses and losses ascending). ``s`` flips the direction, then moves to the next sort."""
ARROWS = {True: "↓", False: "↑"}
"""The sorted column's header ends with the direction: ↓ descending, ↑ ascending."""


QUEUE_SHOWN = 5
"""Queue entries the Runs screen's queue section lists (then how many more ``ftui queue`` lists)."""

RUNS_SHOWN = 300
"""Runs the screen reads and polls (the newest) until ``A`` asks for every one: a team's store of 2,000
runs took 2.4 s to the first paint read whole, and re-reading it every second costs a core."""


def load_runs(store: Store, limit: int | None = RUNS_SHOWN) -> RunsLoaded:
    """The newest ``limit`` runs (every run: None), the latest logged step of each running one, and the
    queue's entries still to see to (blocking: from a worker)."""
    runs = store.list_runs(limit=limit)
    total = store.count_runs() if limit is not None and len(runs) == limit else None
    live: dict[int, MetricPoint] = {}
    for run in runs:
        if run.status == "running" and run.steps_done:
            points = store.metrics(run.id, after_step=run.steps_done - 1)
            if points:
                live[run.id] = points[-1]
    return RunsLoaded(runs, live, total, queue_entries(store, statuses=(QUEUED, STARTED, NOT_STARTED)))


def _sort_value(run: RunInfo, sort: str, now: Any) -> Any:
    return {
        "id": run.id, "name": run.name, "status": run.status, "wall time": run_duration(run, now),
        "tokens/s": run.tokens_per_s, "final loss": run.final_loss,
    }[sort]


def sort_runs(runs: list[RunInfo], sort: str, descending: bool, now: Any) -> list[RunInfo]:
    """``runs`` by ``sort`` in the direction asked; the runs without that figure (not finished) last,
    newest first, whichever the direction."""
    known = [r for r in runs if _sort_value(r, sort, now) is not None]
    missing = [r for r in runs if _sort_value(r, sort, now) is None]
    known.sort(key=lambda r: _sort_value(r, sort, now), reverse=descending)
    return known + sorted(missing, key=lambda r: -r.id)


def next_sort(sort: str, descending: bool) -> tuple[str, bool]:
    """``s``: the same sort reversed when it is in its first direction, else the next sort in its first."""
    if descending == SORTS[sort][1]:
        return sort, not descending
    names = list(SORTS)
    following = names[(names.index(sort) + 1) % len(names)]
    return following, SORTS[following][1]


class RunsScreen(Screen[None]):
    """Every run: filter, sort, tag, note, open, compare, delete, re-run."""

    BINDINGS = [
        Binding("enter", "open", "Open", priority=False, tooltip="open the run's Monitor"),
        Binding("space", "toggle_select", "Select"),
        Binding("c", "compare", "Compare"),
        Binding("s", "cycle_sort", "Sort"),
        Binding("slash", "focus_filter", "Filter"),
        # Off the footer (it would overflow at 80 columns); ? lists them.
        Binding("t", "tags", "Tags", show=False),
        Binding("n", "note", "Note", show=False),
        Binding("r", "rerun", "Re-run", show=False,
                tooltip="re-run: a new run of the same recipe, from step 0; opens its Monitor"),
        Binding("R", "resume", "Resume", show=False,
                tooltip="resume: a new run from the newest checkpoint; opens its Monitor"),
        Binding("d", "delete", "Delete", show=False),
        Binding("A", "all_runs", "All runs", show=False),
    ]

    filter_text: reactive[str] = reactive("")
    """Only runs whose id, name, strategy, method, status, tags or note contain this (any case)."""
    sort_column: reactive[str] = reactive("id")
    """What the table is sorted by (a key of :data:`SORTS`)."""
    sort_descending: reactive[bool] = reactive(True)
    """The sort's direction (shown by an arrow in the sorted column's header)."""
    selected: reactive[frozenset[int]] = reactive(frozenset)
    """Runs marked for comparison."""

    def __init__(self) -> None:
        super().__init__()
        self.runs: list[RunInfo] = []
        self.live: dict[int, MetricPoint] = {}
        """The latest step of each running run (from the poll)."""
        self._shown: tuple[Any, ...] = ()
        self.limit: int | None = RUNS_SHOWN
        """Runs read and polled (the newest); None after ``A``: every run."""
        self.total: int | None = None
        """How many runs the store holds when only the newest are shown."""
        self.loaded = False
        """The first read of the store is on screen (bench/bench_tui.py times spawn to this)."""

    @property
    def ftui(self) -> FtuiApp:
        return self.app  # type: ignore[return-value]

    def compose(self) -> ComposeResult:
        yield Header()
        yield Input(placeholder="filter: name, status, strategy, tag… (/)", id="filter")
        yield DataTable(id="runs-table", cursor_type="row", zebra_stripes=True)
        yield Static(EMPTY_HINT, id="runs-empty", markup=False)
        yield Static("", id="runs-queue")
        yield Static("reading the store…", id="runs-status")
        yield Footer()

    def on_mount(self) -> None:
        self._set_headers()
        self.query_one(DataTable).focus()
        self.poll_runs()

    @work(thread=True, exclusive=True, group="runs")
    def poll_runs(self) -> None:
        worker = get_current_worker()
        first = True
        checked = time.monotonic()  # ftui's start recovered what it found; then every watcher_check_s
        while not worker.is_cancelled:
            try:
                if time.monotonic() - checked >= self.ftui.watcher_check_s:
                    checked = time.monotonic()
                    for line in settle_abandoned(self.ftui.store, self.ftui.fake_gpus):
                        self.post_message(Notice(f"recover: {line}"))
                # Under another screen (the Monitor, Compare) the list is not shown: re-reading and redrawing
                # every run each second there cost the Monitor 45-65% of a core on a 2,000-run store
                # (BENCHMARKS.md). Not ``is_current``: it is also true for a screen in the background.
                if first or self.app.screen is self:
                    self.post_message(load_runs(self.ftui.store, self.limit))
                first = False
            except Exception as exc:  # noqa: BLE001 (a locked or vanished database: say so, keep polling)
                if self.ftui.store_error is not None:
                    return  # it could not be opened: the app is exiting with that line
                self.post_message(LaunchFailed(f"store: {exc}"))
            if rest(lambda: worker.is_cancelled, self.ftui.refresh_s):
                return

    def on_runs_loaded(self, message: RunsLoaded) -> None:
        self.runs = message.runs
        self.live = message.live
        self.total = message.total
        self.show_queue(message.queue)
        self.ftui.runs = message.runs
        self.ftui.runs_polled(message.runs)  # a run that ended: bell and notification, when set
        self.loaded = True
        self.refresh_table()

    def show_queue(self, entries: list[QueueEntryInfo]) -> None:
        """The queue section under the table: the entries waiting, running or not started (``ftui queue``
        lists every one); hidden while there are none."""
        lines = queue_lines(entries, QUEUE_SHOWN)
        self.set_class(bool(lines), "-queued")
        if lines:
            self.query_one("#runs-queue", Static).update(Text("\n").join([Text("queue (ftui queue)", style="bold"),
                                                                           *lines]))

    def watch_filter_text(self) -> None:
        self.refresh_table()

    def watch_sort_column(self) -> None:
        self.refresh_table()

    def watch_sort_descending(self) -> None:
        self.refresh_table()

    def _set_headers(self) -> bool:
        """Give the table its columns, the sorted one with its arrow; True when they changed (then every
        row is added again: a DataTable sizes a column by its header only when the column is added)."""
        table = self.query_one(DataTable)
        sorted_on = SORTS[self.sort_column][0]
        labels = [f"{c} {ARROWS[self.sort_descending]}" if c == sorted_on else c for c in COLUMNS]
        if [str(c.label) for c in table.columns.values()] == labels:
            return False
        table.clear(columns=True)
        for col, label in zip(COLUMNS, labels, strict=True):
            table.add_column(label, key=col)
        return True

    def watch_selected(self) -> None:
        self.refresh_table()

    def visible_runs(self) -> list[RunInfo]:
        needle = self.filter_text.lower().strip()
        runs = [r for r in self.runs if not needle or needle in " ".join(
            [str(r.id), r.name, r.strategy, r.method, r.status, r.note, *r.tags]).lower()]
        return sort_runs(runs, self.sort_column, self.sort_descending, self.ftui.now)

    def refresh_table(self) -> None:
        if not self.is_mounted:
            return
        table = self.query_one(DataTable)
        now = self.ftui.now
        rows = []
        for r in self.visible_runs():
            live = self.live.get(r.id) if r.status == "running" else None
            tps = live.tokens_per_s if live is not None else r.tokens_per_s
            loss = live.loss if live is not None else r.final_loss
            step = live.step if live is not None else r.steps_done
            by_column: dict[str, str | Text] = {
                "sel": "✓" if r.id in self.selected else " ",
                "id": str(r.id), "name": r.name,
                "status": Text(r.status, style=STATUS_STYLE.get(r.status, "")),
                "step": f"{step or 0}/{r.total_steps or '?'}" if step or r.total_steps else "-",
                "loss": "-" if loss is None else f"{loss:.4f}",
                "tokens/s": "-" if tps is None else f"{tps:,.0f}",
                "wall time": fmt_seconds(run_duration(r, now)),
                "strategy": strategy_words(r.strategy, r.nproc), "mode": distributed_words(r.distributed_type),
                "method": r.method,
                "tags · note": " · ".join(x for x in (",".join(r.tags), r.note.replace("\n", " ")) if x),
                "started": r.started_at.strftime("%m-%d %H:%M") if r.started_at else "-",
                "util": "-" if r.mean_util is None else f"{r.mean_util:.0f}%",
            }
            rows.append((str(r.id), tuple(by_column[c] for c in COLUMNS)))
        shown = tuple((k, tuple(str(c) for c in cells)) for k, cells in rows)
        current = self.current_id()
        if self._set_headers() or shown != self._shown:
            self._shown = shown
            table.clear()
            for key, cells in rows:
                # Strings given to a DataTable are parsed as markup: a run named "[/]" must stay text.
                table.add_row(*(Text(c) if isinstance(c, str) else c for c in cells), key=key)
            if current is not None:
                try:
                    table.move_cursor(row=table.get_row_index(str(current)), animate=False)
                except Exception:  # noqa: BLE001 (the run is filtered out or deleted)
                    pass
        # The table stays (it holds the focus, so that keys are not typed into the filter); the hint shows below.
        self.set_class(self.loaded and not self.runs, "-empty")  # not "No runs yet" before the store answered
        if not self.loaded:
            self.query_one("#runs-status", Static).update(Text("reading the store…"))
            return
        self.query_one("#runs-status", Static).update(Text(
            f"{len(rows)} of {len(self.runs)} runs"
            + (f" (the newest of {self.total:,}: A reads all)" if self.total and self.total > len(self.runs) else "")
            + f" · sort: {self.sort_column} {ARROWS[self.sort_descending]} (s) · selected: "
            f"{', '.join(map(str, sorted(self.selected))) or 'none'} · ? keys · step, loss, tokens/s: trainer "
            "(live while running) · wall time: start to end · util: telemetry mean"
        ))

    def current_id(self) -> int | None:
        table = self.query_one(DataTable)
        if table.row_count == 0:
            return None
        try:
            key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key
        except Exception:  # noqa: BLE001
            return None
        return int(key.value) if key.value is not None else None

    def current_run(self) -> RunInfo | None:
        run_id = self.current_id()
        return next((r for r in self.runs if r.id == run_id), None)

    # ------------------------------------------------------------------ events and actions

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "filter":
            self.filter_text = event.value

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.query_one(DataTable).focus()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_open()

    def action_focus_filter(self) -> None:
        self.query_one("#filter", Input).focus()

    def action_open(self) -> None:
        run_id = self.current_id()
        if run_id is not None:
            self.post_message(OpenRun(run_id))

    def action_toggle_select(self) -> None:
        run_id = self.current_id()
        if run_id is not None:
            self.selected = self.selected ^ {run_id}

    def action_compare(self) -> None:
        ids = sorted(self.selected)
        if len(ids) < 2:
            self.notify("select two runs or more with space, then press c", severity="warning")
            return
        self.post_message(CompareRuns(ids))

    def action_cycle_sort(self) -> None:
        self.sort_by(*next_sort(self.sort_column, self.sort_descending))

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        """A click on a sortable header sorts by it; a second click reverses the direction."""
        sort = next((name for name, (column, _) in SORTS.items() if column == event.column_key.value), None)
        if sort is None:
            return
        self.sort_by(sort, not self.sort_descending if sort == self.sort_column else SORTS[sort][1])

    def sort_by(self, sort: str, descending: bool) -> None:
        self.set_reactive(RunsScreen.sort_column, sort)  # both set, then one redraw
        self.set_reactive(RunsScreen.sort_descending, descending)
        self.refresh_table()

    def action_tags(self) -> None:
        run = self.current_run()
        if run is None:
            return

        def done(text: str | None) -> None:
            if text is not None:
                self.update_run(run.id, tags=[t.strip() for t in text.split(",") if t.strip()])

        self.app.push_screen(PromptScreen(f"tags of run {run.id} (comma separated)", ",".join(run.tags)), done)

    def action_note(self) -> None:
        run = self.current_run()
        if run is None:
            return

        def done(text: str | None) -> None:
            if text is not None:
                self.update_run(run.id, note=text)

        self.app.push_screen(PromptScreen(f"note on run {run.id}", run.note), done)

    def action_all_runs(self) -> None:
        """Read every run, not only the newest (:data:`RUNS_SHOWN`); polled whole from then on."""
        if self.limit is None:
            return
        self.limit = None
        self.reload_runs()

    @work(thread=True, group="edit")
    def reload_runs(self) -> None:
        try:
            self.post_message(load_runs(self.ftui.store, self.limit))
        except Exception as exc:  # noqa: BLE001 (a locked database: say so)
            self.post_message(LaunchFailed(f"store: {exc}"))

    def action_delete(self) -> None:
        run = self.current_run()
        if run is None:
            return
        if run.status == "running":
            self.notify(f"run {run.id} is running: stop it first (open it, press s)", severity="warning")
            return

        def done(yes: bool | None) -> None:
            if yes:
                self.selected = self.selected - {run.id}
                self.delete_run(run.id, run.run_dir)

        self.app.push_screen(ConfirmScreen(f"Delete run {run.id} ({run.name}) from the store?"), done)

    @work(thread=True, group="edit")
    def update_run(self, run_id: int, **changes: Any) -> None:
        """Write tags or a note, then post the fresh list (the table shows it at once)."""
        try:
            self.ftui.store.update_run(run_id, **changes)
            self.post_message(load_runs(self.ftui.store, self.limit))
        except Exception as exc:  # noqa: BLE001 (a locked database: say so)
            self.post_message(LaunchFailed(f"run {run_id}: not saved: {exc}"))

    @work(thread=True, group="edit")
    def delete_run(self, run_id: int, run_dir: str) -> None:
        try:
            self.ftui.store.delete_run(run_id)
            self.post_message(load_runs(self.ftui.store, self.limit))
        except Exception as exc:  # noqa: BLE001 (a locked database: say so)
            self.post_message(LaunchFailed(f"run {run_id}: not deleted: {exc}"))
            return
        self.post_message(Notice(f"deleted run {run_id} from the store (its folder stays: {run_dir})"))

    def action_rerun(self) -> None:
        run = self.current_run()
        if run is None:
            return
        self.notify(f"re-running run {run.id}'s recipe…")
        self.rerun(run)

    def action_resume(self) -> None:
        """Continue the current run from its newest complete checkpoint, as a new run (``ftui resume``)."""
        run = self.current_run()
        if run is None:
            return
        self.notify(f"resuming run {run.id} from its newest checkpoint…", markup=False)
        self.resume(run)

    @work(thread=True, group="launch")
    def resume(self, run: RunInfo) -> None:
        # Deferred, with the planner and the store's writers: none is needed before the first paint.
        from runner.service import launch  # deferred: pydantic
        from runner.spec.recipe import RecipeError  # deferred: pydantic

        try:
            run_id = launch.resume_detached(self.ftui.store, run.id, self.ftui.fake_gpus)
        except (RecipeError, OSError) as exc:
            self.post_message(LaunchFailed(str(exc)))
            return
        self.post_message(RunLaunched(run_id, []))

    @work(thread=True, group="launch")
    def rerun(self, run: RunInfo) -> None:
        # Deferred, with the planner and the store's writers: none is needed before the first paint.
        from runner.service import launch  # deferred: pydantic
        from runner.spec.recipe import RecipeError, parse_recipe  # deferred: pydantic

        try:
            recipe = parse_recipe(run.recipe_text, source=f"run {run.id}")
            launched = launch.launch_detached(self.ftui.store, launch.LaunchRequest(recipe, run.recipe_source),
                                              self.ftui.fake_gpus)
        except (RecipeError, OSError) as exc:
            self.post_message(LaunchFailed(str(exc)))
            return
        self.post_message(RunLaunched(launched.run_id, launched.warnings))
