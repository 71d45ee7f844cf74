"""The Plan view: one ``ftui plan`` in progress or finished, its decision and reason on top, a row per candidate
(``ftui plan``'s own table: :func:`tui.render.plan.cells` of :func:`tui.render.plan.plan_report`) with those
not raced and why, refreshed from the store as trials end; ``c`` commits the winner (``ftui plan ...
--commit`` in the background). The Plans list (the palette's "Plans") opens any plan the store or this host
knows."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Static
from textual.worker import get_current_worker

from runner.service import plan_record
from runner.service.plan_record import Listing, Process
from tui.app.messages import LaunchFailed, OpenPlan, OpenRun, PlanCommitStarted, PlanLoaded, PlansLoaded
from tui.app.plans import PlanFeed, PlanView, command_line, start_commit
from tui.app.poll import rest
from tui.render.plan import HEADERS, cells, model_lines, note_line, track_lines
from tui.render.report import fmt_bytes

if TYPE_CHECKING:
    from tui.app.app import FtuiApp

RESULT_STYLE = {"leader": "bold green", "failed": "red", "waiting": "dim", "not raced": "dim", "running": "yellow"}
"""The result column's colours (the rest plain)."""
STATE_STYLE = {"racing": "yellow", "ended": "green", "not finished": "red"}
"""The Plans list's state column's colours."""


def race_line(view: PlanView) -> str:
    """Where the plan stands: racing (which trial), or how its race ended, and its committed run."""
    record = view.record
    if view.racing and view.process is not None:
        if record is None or record.process != view.process:
            return f"starting (process {view.process.pid}): it checks the recipe, its data and the candidates"
        trials = ", ".join(f"run {r.id} ({r.strategy} x {r.nproc}) {r.status}" for r in view.running)
        doing = "committing" if any(r.id == record.commit_run for r in view.running) else "racing"
        return f"{doing} (process {view.process.pid}): " + (trials or "between trials")
    if record is None:
        return "no record of this plan on this host: its stored trials only"
    if record.ended is None:
        return "its process ended before the race did (stopped or killed): the command below continues it"
    if record.ended.stopped:
        return "ended: a trial was stopped; the command below continues the plan"
    left = len(record.ended.over_budget)
    return f"ended: the --budget left {left} trial(s) out" if left else "ended: every candidate raced"


def commit_line(view: PlanView) -> str:
    """What ``--commit`` did, as the plan's record says (empty: not asked)."""
    record = view.record
    if record is None or (record.commit_run is None and record.commit_refused is None):
        return ""
    if record.commit_refused:
        return record.commit_refused
    status = view.committed.status if view.committed else "not in the store"
    return f"committed: run {record.commit_run} ({status}; in Runs)"


class PlanScreen(Screen[None]):
    """One plan: the decision, every candidate, the plan's state; commit the winner."""

    BINDINGS = [
        Binding("c", "commit", "Commit", tooltip="run the winner for real: ftui plan ... --commit in the "
                "background (a plan without a winner starts nothing and says why)"),
        Binding("enter", "open", "Open", priority=False, tooltip="open the candidate's latest trial in the Monitor"),
        Binding("escape", "app.pop_screen", "Back"),
    ]

    def __init__(self, pid: str, started: Process | None = None) -> None:
        super().__init__()
        self.pid = pid
        self.started = started
        self.view: PlanView | None = None
        self.commit_said = ""
        """The commit key's last line (why nothing started, or what did)."""

    @property
    def ftui(self) -> FtuiApp:
        return self.app  # type: ignore[return-value]

    def compose(self) -> ComposeResult:
        yield Header()
        with VerticalScroll(id="plan"):
            yield Static(Text("reading the plan…", style="dim"), id="plan-decision")
            yield Static("", id="plan-status")
            yield DataTable(id="plan-table", cursor_type="row", zebra_stripes=True)
            yield Static("", id="plan-notes")
        yield Footer()

    def on_mount(self) -> None:
        self.title = f"plan {self.pid}"
        table = self.query_one(DataTable)
        for h in HEADERS:
            table.add_column(h, key=h)
        table.focus()
        self.poll_plan()

    @work(thread=True, exclusive=True, group="plan")
    def poll_plan(self) -> None:
        worker = get_current_worker()
        feed = PlanFeed(self.ftui.store, self.pid, self.started)
        first = True
        while not worker.is_cancelled:
            try:
                # Under another screen (a trial's Monitor) the plan is not shown: it is read again on return.
                if (first or self.app.screen is self) and (view := feed.poll()) is not None:
                    self.post_message(PlanLoaded(view))
                first = False
            except Exception as exc:  # noqa: BLE001 (a locked or vanished database: say so, keep polling)
                self.post_message(LaunchFailed(f"plan {self.pid}: {exc}"))
            if rest(lambda: worker.is_cancelled, self.ftui.refresh_s):
                return

    def on_plan_loaded(self, message: PlanLoaded) -> None:
        self.view = message.view
        self.render_view()

    def render_view(self) -> None:
        view = self.view
        if view is None or not self.is_mounted:
            return
        report = view.report
        decision = report["decision"]["text"] if report else "Nothing is known of this plan yet."
        self.query_one("#plan-decision", Static).update(Text(decision, style="bold"))
        lines = [race_line(view), *(x for x in (commit_line(view), self.commit_said) if x)]
        self.query_one("#plan-status", Static).update(Text("\n".join(lines)))
        self._render_table(report)
        self._render_notes(view)

    def _render_table(self, report: dict[str, Any] | None) -> None:
        table = self.query_one(DataTable)
        current = table.cursor_row
        table.clear()
        for e in report["candidates"] if report else []:
            row = [Text(c) for c in cells(e)]  # labels and reasons are run text: never markup
            row[1].stylize(RESULT_STYLE.get(row[1].plain, ""))
            table.add_row(*row, key=e["label"])
        if table.row_count:
            table.move_cursor(row=min(current, table.row_count - 1), animate=False)

    def _render_notes(self, view: PlanView) -> None:
        out = Text()
        report = view.report
        if report:
            out.append("\n".join(note_line(e) for e in report["candidates"]) + "\n", style="dim")
            out.append("".join(f"{line}\n" for line in track_lines(report)), style="dim")
            out.append("".join(f"{line}\n" for line in model_lines(report)), style="dim")
            mem = report["memory"]
            out.append(f"memory judged against: {fmt_bytes(mem['bytes'])} ({mem['source']})\n", style="dim")
        if view.record is not None:
            out.append(f"continue: {command_line(view.record.command)}\n", style="dim")
        if view.log:
            out.append(f"its output ({plan_record.log_path(view.pid)}), last lines:\n", style="dim")
            out.append("".join(f"  {line}\n" for line in view.log))
        self.query_one("#plan-notes", Static).update(out)

    def action_open(self) -> None:
        """The trial run of the candidate under the cursor (its latest) in the Monitor."""
        report = self.view.report if self.view else None
        table = self.query_one(DataTable)
        if not report or not table.row_count:
            return
        entry = report["candidates"][table.cursor_row]
        if entry["run_ids"]:
            self.post_message(OpenRun(entry["run_ids"][-1]))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_open()

    def action_commit(self) -> None:
        if self.view is None:
            return
        self.notify(f"commit: checking plan {self.pid}…", markup=False)
        self.commit(self.view)

    @work(thread=True, group="launch")
    def commit(self, view: PlanView) -> None:
        self.post_message(PlanCommitStarted(start_commit(view, self.ftui.store.url)))

    def on_plan_commit_started(self, message: PlanCommitStarted) -> None:
        self.commit_said = message.start.line
        if message.start.process is not None:
            self.started = message.start.process
            self.poll_plan()  # the feed follows the commit's process from now
        self.notify(message.start.line, severity="information" if message.start.process else "warning",
                    markup=False)
        self.render_view()


def plan_state(listing: Listing) -> str:
    """A plan in the list: ``racing`` (its process runs), ``ended``, ``not finished`` (its process ended
    before its race did), or ``no record here``. Blocking (asks for the process): from a worker."""
    record = listing.record
    if record is None:
        return "no record here"
    if record.process is not None and record.process.alive():
        return "racing"
    return "ended" if record.ended else "not finished"


class PlansScreen(Screen[None]):
    """Every plan the store holds trials of, and those this host started with none yet; enter opens one."""

    BINDINGS = [
        Binding("enter", "open", "Open", priority=False, tooltip="open the plan's view"),
        Binding("escape", "app.pop_screen", "Back"),
    ]
    COLUMNS = ("plan", "recipe", "trials", "state")

    def __init__(self) -> None:
        super().__init__()
        self.plans: list[Listing] | None = None

    @property
    def ftui(self) -> FtuiApp:
        return self.app  # type: ignore[return-value]

    def compose(self) -> ComposeResult:
        yield Header()
        yield DataTable(id="plans-table", cursor_type="row", zebra_stripes=True)
        yield Static(Text("reading the plans…", style="dim"), id="plans-status")
        yield Footer()

    def on_mount(self) -> None:
        self.title = "plans"
        table = self.query_one(DataTable)
        for c in self.COLUMNS:
            table.add_column(c, key=c)
        table.focus()

    def on_screen_resume(self) -> None:
        """Read the plans each time the list comes to the front (on opening, and back from a plan)."""
        self.load()

    @work(thread=True, exclusive=True, group="plans")
    def load(self) -> None:
        try:
            found = plan_record.list_plans(self.ftui.store)
            self.post_message(PlansLoaded(found, [plan_state(p) for p in found]))
        except Exception as exc:  # noqa: BLE001 (a busy database: one line instead of a crash)
            self.post_message(PlansLoaded([], [], f"store: {exc}"))

    def on_plans_loaded(self, message: PlansLoaded) -> None:
        self.plans = message.plans
        table = self.query_one(DataTable)
        table.clear()
        for p, state in zip(message.plans, message.states, strict=True):
            name = p.record.setup.base.name if p.record else ""
            table.add_row(Text(p.pid), Text(name), str(p.trials), Text(state, style=STATE_STYLE.get(state, "")),
                          key=p.pid)
        status = message.error or (f"{len(message.plans)} plan(s) · enter opens one · ftui plan RECIPE starts one "
                                   "(or ctrl+r on Compose)" if message.plans else
                                   "No plan yet: ctrl+r on Compose races the recipe's strategies (ftui plan RECIPE).")
        self.query_one("#plans-status", Static).update(Text(status, style="red" if message.error else "dim"))

    def action_open(self) -> None:
        table = self.query_one(DataTable)
        if self.plans and table.row_count:
            self.post_message(OpenPlan(self.plans[table.cursor_row].pid))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_open()
