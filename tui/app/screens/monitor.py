"""The Monitor screen: one run, live from the store (devices, ranks, loss, progress, logs)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.cells import cell_len
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Static
from textual.worker import get_current_worker

from runner.analysis.shard_verdict import run_verdict
from runner.spec.status import TERMINAL
from tui.app.messages import DeviceView, MonitorSnapshot, MonitorUpdate, Notice
from tui.app.poll import MonitorFeed, fmt_elapsed, rest
from tui.app.screens.modals import ConfirmScreen
from tui.app.widgets.plot import Curves, LinePlot, bar, level_style, spark
from tui.render.report import STATUS_STYLE, fmt_bytes, fmt_seconds
from tui.render.words import distributed_words

if TYPE_CHECKING:
    from tui.app.app import FtuiApp

SPARK = 12
BAR = 10
TABLES_EVERY = 2
"""The device and rank tables redraw on every TABLES_EVERY-th poll: every 2 s at the default 1 s poll,
nvitop's default interval. Each redraw renders every cell of both tables, the largest part of the
Monitor's CPU (BENCHMARKS.md); the loss, progress and curves follow every poll."""


class MonitorScreen(Screen[None]):
    """Watch one run; stop it (graceful: the ranks finish their step and save) or kill it (SIGKILL,
    confirmed); both through :func:`runner.service.stop.request_stop`."""

    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back", tooltip="back to the screen it was opened from"),
        Binding("s", "stop", "Stop", tooltip="stop gracefully: the ranks finish their step and save (asks first)"),
        Binding("k", "kill", "Kill", tooltip="kill: SIGKILL every process of the run (asks first)"),
        Binding("l", "toggle_logs", "Logs", tooltip="show or hide the tail of the rank logs"),
    ]

    # repaint=False: a new snapshot updates the widgets that changed (each repaints its own region); a
    # repaint of the screen itself would redraw every cell of it once a second.
    snapshot: reactive[MonitorSnapshot | None] = reactive(None, always_update=True, repaint=False)
    """The latest snapshot of the run from the feed."""
    logs_toggled: reactive[bool] = reactive(False)
    """Whether ``l`` flipped the rank-log panel from its default (hidden under 100 columns, shown above)."""

    def __init__(self, run_id: int) -> None:
        super().__init__()
        self.run_id = run_id
        self._shown: dict[str, str] = {}
        self._skipped_tables = 0  # snapshots since the device and rank tables were last redrawn

    @property
    def ftui(self) -> FtuiApp:
        return self.app  # type: ignore[return-value]

    def compose(self) -> ComposeResult:
        yield Header()
        with Vertical(id="monitor"):
            yield Static(f"run {self.run_id}: loading…", id="progress")
            with Horizontal(id="monitor-top"):
                yield LinePlot(id="loss")
                yield Curves(id="curves")
            yield Static("", id="named")
            yield Static("", id="logs")
            yield DataTable(id="devices", cursor_type="none", zebra_stripes=True)
            yield DataTable(id="ranks", cursor_type="none")
        yield Footer()

    def on_mount(self) -> None:
        self.title = f"run {self.run_id}"
        self._layout_tables()
        self.follow()

    @property
    def narrow(self) -> bool:
        """Under 100 columns (the app's breakpoint) the tables drop the source column and name the
        source in the column headers instead, and bars and sparklines shrink, so 80x24 needs no
        sideways scrolling."""
        return self.app.size.width < 100

    def _layout_tables(self, util_header: str = "util", gpu_source: str = "", gpus: bool = False) -> None:
        """(Re)build the columns for the width and the sources now known; rows are re-added."""
        layout = (self.narrow, util_header, gpu_source, gpus)
        if getattr(self, "_layout", None) == layout:
            return
        self._layout = layout
        devices = self.query_one("#devices", DataTable)
        ranks = self.query_one("#ranks", DataTable)
        devices.clear(columns=True)
        ranks.clear(columns=True)
        device_cols: tuple[str, ...]
        rank_cols: tuple[str, ...]
        if self.narrow:
            # 80 columns: GPUs trade the memory history for temperature and power (nothing cut).
            device_cols = (("device", util_header, "history", "memory", "°C", "W") if gpus else
                            ("device", util_header, "history", "memory", "history "))
            rank_cols = ("rank", "pid", "CPU %/core (psutil)", "RSS (psutil)", f"GPU mem ({gpu_source or 'NVML'})")
        else:
            device_cols = ("device", "source", "util", "util history", "memory", "mem history")
            if gpus:  # the source moves into the header to make room for temperature and power
                device_cols = ("device", f"util ({gpu_source})", "util history", "memory", "mem history", "temp",
                               "power")
            rank_cols = ("rank", "pid", "CPU %/core", "RSS", "GPU memory", "source (CPU, RSS / GPU)")
        for col in device_cols:
            devices.add_column(col, key=col)
        for col in rank_cols:
            ranks.add_column(col, key=col)

    def on_resize(self) -> None:
        if getattr(self, "_layout", (None,))[0] != self.narrow:
            self._layout_tables(*self._layout[1:])
            self._shown.clear()
            self.watch_snapshot(self.snapshot)
            # The wide columns overflowed the narrowed terminal for a moment and gave the tables a horizontal
            # scrollbar (a line); with the narrow columns they fit again, and Textual decides its scrollbars
            # again only when told to (its own call on a size change came before the columns changed).
            for table in self.query(DataTable):
                table.call_after_refresh(table._refresh_scrollbars)

    @work(thread=True, exclusive=True, group="monitor")
    def follow(self) -> None:
        worker = get_current_worker()
        feed = MonitorFeed(self.ftui.store, self.run_id, now=self.ftui.now)
        while not worker.is_cancelled:
            try:
                snap = feed.poll()
            except Exception as exc:  # noqa: BLE001 (a busy or vanished database: keep trying)
                self.log.warning(f"monitor poll: {exc}")
            else:
                self.post_message(MonitorUpdate(snap))
                if snap.run is not None and snap.run.status in TERMINAL:
                    # Finished runs do not change; one last read and the worker rests.
                    return
            if rest(lambda: worker.is_cancelled, self.ftui.monitor_s):
                return

    def on_monitor_update(self, message: MonitorUpdate) -> None:
        self.snapshot = message.snapshot

    def watch_snapshot(self, snap: MonitorSnapshot | None) -> None:
        if snap is None or not self.is_mounted:
            return
        run = snap.run
        if run is None:
            self.query_one("#progress", Static).update(Text(f"run {self.run_id}: not in the store", style="red"))
            return
        sub_title = f"{run.name} · {run.status}"
        if self.sub_title != sub_title:  # the header re-lays itself out on every assignment
            self.sub_title = sub_title
        narrow = self.narrow
        self._update_static("#progress", self.progress_text(snap))
        plot = self.query_one("#loss", LinePlot)
        plot.title = f"loss (measured, {snap.loss_steps} steps)"
        evals = snap.named.get("eval/loss")
        if evals:  # a second curve, at the steps evaluated: both against the step
            plot.title += f" + eval loss ({len(evals)} evals)"
            plot.x_label = "step"
            plot.points = [("loss", snap.loss_points), ("eval loss", evals)]
        else:
            plot.series = [("loss", snap.loss)]
        named = named_text(snap)
        self.set_class(bool(named.plain), "-has-named")  # no named metrics: no empty line
        self._update_static("#named", named)
        curves = self.query_one("#curves", Curves)
        curves.curves = [(name, snap.curves.get(name, []), fmt, style) for name, fmt, style in
                         (("lr", ".2e", "yellow"), ("grad norm", ".3g", "magenta"), ("tokens/s", ",.0f", "green"))]
        has_logs = bool(snap.log_tail)
        self.set_class(has_logs, "-has-logs")  # no output in the rank logs: no empty panel
        if has_logs:
            self._update_static("#logs", Text("\n".join(snap.log_tail), style="dim", no_wrap=True,
                                              overflow="ellipsis"))
        gpu_source = snap.devices[0].source if snap.devices and snap.devices[0].key.startswith("gpu") else "NVML"
        sources = {d.source for d in snap.devices}
        source = f" ({sources.pop()})" if len(sources) == 1 else ""
        all_ranks = bool(snap.devices) and all(d.key.startswith("rank") for d in snap.devices)
        gpus = any(d.key.startswith("gpu") for d in snap.devices)
        self._layout_tables(("CPU %/core" if all_ranks else "util") + source, gpu_source, gpus)
        devices = self.query_one("#devices", DataTable)
        ranks = self.query_one("#ranks", DataTable)
        rows_known = all(d.key in devices.rows for d in [*snap.devices, *([snap.host] if snap.host else [])]) and all(
            str(r.rank) in ranks.rows for r in snap.ranks)
        finished = run.status in TERMINAL
        if rows_known and not finished and self._skipped_tables + 1 < TABLES_EVERY:
            self._skipped_tables += 1
            return  # the device and rank tables redraw every TABLES_EVERY polls (the rest every poll)
        self._skipped_tables = 0
        bar_w, spark_w = (6, 8) if narrow else (BAR - 2, SPARK - 2) if gpus else (BAR, SPARK)
        rows = list(snap.devices) + ([snap.host] if snap.host is not None else [])
        for d in rows:
            _upsert(devices, d.key, *device_cells(d, narrow, gpus, bar_w, spark_w))
        for r in snap.ranks:
            # A finished run's ranks are gone: their RSS is the last one sampled while they ran, said so.
            rss = fmt_bytes(r.rss) + (" (last)" if finished and narrow and r.rss is not None else "")
            cells = [str(r.rank), str(r.pid or "-"), "-" if r.cpu_pct is None else f"{r.cpu_pct:.0f}",
                     rss, fmt_bytes(r.gpu_mem) if r.gpu_mem is not None else "- (no GPU)"]
            if not narrow:
                cells.append(r.source + (", last sample" if finished else "")
                             + (f" / {gpu_source}" if r.gpu_mem is not None else ""))
            _upsert(ranks, str(r.rank), *cells)

    def progress_text(self, snap: MonitorSnapshot) -> Text:
        """Name and status; a progress bar with step, elapsed and ETA; the latest figures (or the phase
        before the first step)."""
        run = snap.run
        assert run is not None
        frac = snap.step / snap.total if snap.total else None
        width = 16 if self.narrow else 30
        line = Text.assemble(
            (f"run {run.id} {run.name}  ", "bold"),
            (run.status, STATUS_STYLE.get(run.status, "")),
            f"  {run.strategy} × {run.nproc} · {run.method}",
            f" · {distributed_words(run.distributed_type)}" if run.distributed_type else "",
            "\n",
        )
        line.append_text(bar(frac, width, "green" if run.status != "failed" else "red"))
        pct = "" if frac is None else f" {100 * frac:.0f}%"
        line.append(f"{pct}  step {snap.step}/{snap.total or '?'}  elapsed {fmt_elapsed(snap.elapsed_s)}"
                    f"  ETA {fmt_seconds(snap.eta_s)}")
        line.append(" (recent step times)", style="dim")
        if snap.extra.get("nodes"):  # several machines: each node's status, from the store (host names as text)
            line.append(f"\n{snap.extra['nodes']}", style="dim")
        if snap.phase:
            line.append(f"\n{snap.phase}", style="yellow")
        else:
            line.append(
                f"\ntokens/s {'-' if snap.tokens_per_s is None else format(snap.tokens_per_s, ',.0f')}"
                f"  loss {'-' if snap.last_loss is None else format(snap.last_loss, '.4f')}"
                f"  lr {'-' if snap.lr is None else format(snap.lr, '.2e')}"
                f"  grad norm {'-' if snap.grad_norm is None else format(snap.grad_norm, '.3g')}")
            line.append("  (trainer)" if self.narrow else "  (measured by the trainer)", style="dim")
        if len(run.summary.ranks) > 1:  # the end event's bytes per rank: is the promised sharding in effect
            verdict = run_verdict(run.strategy, run.summary)
            style = "dim" if verdict.ok is None else "green" if verdict.ok else "red"
            line.append(f"\nsharding: {verdict.line()}", style=style)
        if run.summary.ended:  # a stop: the step it ended at, and its checkpoint or none
            line.append(f"\n{run.summary.ended}", style=STATUS_STYLE.get(run.status, ""))
        if run.error:
            line.append(f"\nerror: {run.error}", style="red")
        stacks = run.summary.stacks
        if stacks is not None and stacks["summary"] not in (run.error or ""):  # the watcher asked every rank
            line.append(f"\nstacks at the {stacks['cause']}: {stacks['summary']}", style="yellow")
        return line

    def _update_static(self, selector: str, content: Text) -> None:
        """Update a Static only when its text changed, and without a layout pass when its size cannot
        have changed: a layout pass repaints the whole screen, which was most of the Monitor's CPU (the
        progress line changes every second, its elapsed time if nothing else)."""
        before = self._shown.get(selector)
        if before == content.plain:
            return
        self._shown[selector] = content.plain
        widget = self.query_one(selector, Static)
        width = widget.content_size.width
        rows = None if before is None or width <= 0 else _rows(before, width)
        same_size = rows is not None and rows == _rows(content.plain, width)
        widget.update(content, layout=not same_size)

    # ------------------------------------------------------------------ stop and kill

    def watch_logs_toggled(self, toggled: bool) -> None:
        self.set_class(toggled, "-logs-toggled")

    def action_toggle_logs(self) -> None:
        self.logs_toggled = not self.logs_toggled
        snap = self.snapshot
        if snap is not None and snap.run is not None and not snap.log_tail:  # nothing to show: say where it would be
            self.notify(empty_logs_line(snap.run.id, snap.run.run_dir), severity="warning", markup=False)

    @work(thread=True, group="signal")
    def _signal(self, kill: bool, what: str) -> None:
        """Ask the run to stop (:func:`runner.service.stop.request_stop`) in a thread; report with a Notice.

        A watcher alive on this host (the background orchestrator, or an ``ftui run``) is signalled and
        records the status itself; without one, every process of the run is stopped and checked here."""
        # deferred: pydantic (the stop use case loads the recipe models: 0.26 s the monitor's opening need not wait)
        from runner.service.stop import StopRefused, request_stop

        try:
            result = request_stop(self.ftui.store, self.run_id, kill=kill, wait=False)
        except StopRefused as exc:
            self.post_message(Notice(str(exc), "warning"))
            return
        except Exception as exc:  # noqa: BLE001 (a locked database: say so)
            self.post_message(Notice(f"run {self.run_id}: {exc}", "error"))
            return
        self.post_message(Notice(f"{what}: run {result.run_id}: {result.how}"))

    def action_stop(self) -> None:
        """Ask first: ``s`` sorts one screen back, so a stray key must not end a run."""
        def done(yes: bool | None) -> None:
            if yes:
                self._signal(False, "stop (graceful)")

        self.app.push_screen(ConfirmScreen(f"Stop run {self.run_id}? (graceful: the ranks finish their step "
                                           "and save)"), done)

    def action_kill(self) -> None:
        def done(yes: bool | None) -> None:
            if yes:
                self._signal(True, "kill")

        self.app.push_screen(ConfirmScreen(f"Kill run {self.run_id} (SIGKILL every process)?"), done)


def device_cells(d: DeviceView, narrow: bool, gpus: bool, bar_w: int, spark_w: int) -> list[Any]:
    """One row of the device table: a GPU, a rank's process or the host, laid out for the width."""
    is_gpu = d.key.startswith("gpu")
    is_host = d.key == "host"
    util_top = 100.0 if is_gpu or is_host else max([100.0, *d.util_history])
    util = "-" if d.util is None else f"{d.util:.0f}%" + ("" if is_gpu or narrow else
                                                          " all" if is_host else "/core")
    frac = None if d.mem_used is None or not d.mem_total else d.mem_used / d.mem_total
    memory = fmt_pair(d.mem_used, d.mem_total) if narrow else f"{fmt_bytes(d.mem_used)}/{fmt_bytes(d.mem_total)}"
    # A rank's RSS is a sliver of the host's memory: its history is scaled to its own peak.
    mem_top = 100.0 if is_gpu or is_host else None
    label = ("host (all cores)" if narrow else f"{d.label} (psutil)") if is_host else (
        d.short_label if narrow else d.label)
    util_pct = None if d.util is None else 100 * d.util / util_top
    cells: list[Any] = [
        Text(label, style="bold" if is_host else ""),
        bar(None if d.util is None else d.util / util_top, bar_w, level_style(util_pct)) + Text(f" {util}"),
        Text(spark(d.util_history, spark_w, util_top), style="cyan"),
        bar(frac, bar_w, level_style(None if frac is None else 100 * frac)) + Text(f" {memory}"),
    ]
    temp = Text("-" if d.temp_c is None else f"{d.temp_c:.0f}", style=level_style(d.temp_c, 70, 85))
    power = "-" if d.power_w is None else f"{d.power_w:.0f}"
    if narrow and gpus:
        cells += [temp, power]
    else:
        # Coloured by the share of the limit now (green at 3%), whatever the scale of its shape.
        share = d.mem_history[-1] if d.mem_history else None
        cells.append(Text(spark(d.mem_history, spark_w, mem_top), style=level_style(share)))
    if not narrow and not gpus:
        cells.insert(1, "psutil" if is_host else d.source)
    if not narrow and gpus:
        cells += [Text("-" if d.temp_c is None else f"{d.temp_c:.0f}°C", style=level_style(d.temp_c, 70, 85)),
                  f"{power} W" if d.power_w else "-"]
    return cells


def empty_logs_line(run_id: int, run_dir: str) -> str:
    """What ``l`` says when the rank logs hold no line yet: which ranks' files it read, by path."""
    if not run_dir:
        return f"no log lines: run {run_id} has no run folder"
    logs = sorted((Path(run_dir) / "logs").glob("rank*.log"), key=lambda p: p.stem)
    if len(logs) > 1:
        ranks = [p.stem.removeprefix("rank") for p in logs]
        return f"no log lines yet for ranks {ranks[0]}-{ranks[-1]}, files {logs[0].parent}/rank*.log"
    log = logs[0] if logs else Path(run_dir) / "logs" / "rank0.log"
    return f"no log lines yet for rank {log.stem.removeprefix('rank')}, file {log}"


def named_text(snap: MonitorSnapshot) -> Text:
    """The last value of every named metric (measured by the trainer or reported by the run) and the
    last evaluation's samples; empty when the run has none. Names and generated text are never markup."""
    out = Text()
    if snap.named:
        out.append("metrics (last value, step): ", style="bold")
        out.append(" · ".join(f"{name} {points[-1][1]:.4g} ({points[-1][0]:.0f})"
                              for name, points in sorted(snap.named.items()) if points))
    if snap.samples:
        out.append(f"\nsamples at step {snap.samples_step}:", style="bold")
        for sample in snap.samples:
            out.append(f"\n  {sample['prompt']} ")
            out.append(f"-> {sample['completion']}", style="cyan")
    return out


def fmt_pair(used: int | None, total: int | None) -> str:
    """``20.0/80.0 GiB``: used and total in the unit of the total (the narrow memory cell)."""
    if used is None or not total:
        return fmt_bytes(used)
    unit, scale = next(((u, f) for u, f in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))
                        if total >= f), ("B", 1))
    return f"{used / scale:.1f}/{total / scale:.1f} {unit}" if scale > 1 else f"{used}/{total} B"


def _rows(plain: str, width: int) -> int | None:
    """The rows a text takes in a widget ``width`` cells wide, or None when a line may wrap (then only a
    layout pass knows)."""
    lines = plain.split("\n")
    return len(lines) if all(cell_len(line) <= width for line in lines) else None


def _upsert(table: DataTable[Any], key: str, *cells: Any) -> None:
    """Update a row's cells in place (a cheap repaint), or add the row the first time its key is seen.
    Clearing and re-adding every row forces a layout pass per update. Strings become ``Text``: a
    DataTable parses strings as markup, and these cells carry process and device names."""
    cells = tuple(Text(c) if isinstance(c, str) else c for c in cells)
    if key not in table.rows:
        table.add_row(*cells, key=key)
        return
    for column, value in zip(table.columns, cells, strict=False):
        table.update_cell(key, column, value)
