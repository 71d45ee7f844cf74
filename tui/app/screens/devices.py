"""The Devices screen (``3``/F3), nvitop-like: every GPU with its processes, whether they belong to
an ftui run or not, live; on a machine without GPUs, the host and every rank process of the runs
still running plus the busiest other processes. NVML and psutil are read in a thread worker."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import psutil
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Static
from textual.worker import get_current_worker

from runner.hardware import SOURCE_LABELS, DeviceSample, Probe, ProcessGpuMemory
from runner.watch.host import probe_for
from store import Store
from tui.app.poll import rest
from tui.app.widgets.plot import bar, level_style
from tui.render.report import fmt_bytes

if TYPE_CHECKING:
    from tui.app.app import FtuiApp

OTHERS = 6
"""How many of the busiest processes outside ftui runs are listed on a CPU-only machine."""


@dataclass
class ProcRow:
    """One process on a device: a GPU's compute process, or a CPU process."""

    device: str
    pid: int
    owner: str
    """``run 3 quickstart · rank 0``, or ``not ftui``."""
    user: str
    command: str
    cpu_pct: float | None
    mem: int | None
    """GPU memory (GPU processes) or RSS (CPU processes), bytes."""
    mem_source: str


@dataclass
class DevicesSnapshot:
    host: DeviceSample | None
    gpus: list[DeviceSample]
    power_limits: dict[int, float | None]
    procs: list[ProcRow]
    nvml_note: str
    source: str = "psutil"
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class DevicesUpdate(Message, bubble=False):
    snapshot: DevicesSnapshot

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, DevicesUpdate)


def short_command(argv: list[str]) -> str:
    """``python -m runner.rank.trainer --run-dir …``: the program's base name and its first arguments."""
    if not argv:
        return ""
    return " ".join([os.path.basename(argv[0]), *argv[1:4]])


class DevicesFeed:
    """Reads the probe and the store's running runs (one worker thread at a time)."""

    def __init__(self, store: Store, probe: Probe, own_pid: int | None = None) -> None:
        self.store = store
        self.probe = probe
        self.own_pid = own_pid if own_pid is not None else os.getpid()
        self._procs: dict[int, psutil.Process] = {}

    def owners(self) -> dict[int, str]:
        """pid -> ``run N name · rank R`` for the processes of running runs (their process groups)."""
        groups: dict[int, str] = {}
        for run in self.store.list_runs(status="running"):
            if run.pgid:
                groups[run.pgid] = f"run {run.id} {run.name}"
        owners: dict[int, str] = {}
        if not groups:
            return owners
        for proc in psutil.process_iter(["pid"]):
            try:
                pgid = os.getpgid(proc.pid)
            except OSError:
                continue
            if pgid in groups:
                owners[proc.pid] = groups[pgid]
        return owners

    def describe(self, pid: int) -> tuple[str, str]:
        try:
            proc = psutil.Process(pid)
            with proc.oneshot():
                return proc.username(), short_command(proc.cmdline()) or proc.name()
        except (psutil.Error, OSError):
            return "-", "(not visible here)"

    def cpu_of(self, pid: int) -> float | None:
        """CPU % of one core of a GPU process since the last poll (psutil); None at its first sight (the
        baseline) or when it is not visible from here."""
        try:
            known = self._procs.get(pid)
            if known is None:
                self._procs[pid] = psutil.Process(pid)
                self._procs[pid].cpu_percent(None)
                return None
            return float(known.cpu_percent(None))
        except psutil.Error:
            self._procs.pop(pid, None)
            return None

    def cpu_processes(self, owners: dict[int, str]) -> list[ProcRow]:
        """Every process of a running run and the busiest others, CPU % of one core (psutil)."""
        rows: list[tuple[float, ProcRow]] = []
        seen = set()
        for proc in psutil.process_iter(["pid", "name", "username", "cmdline", "memory_info"]):
            pid = proc.info["pid"]
            seen.add(pid)
            known = self._procs.setdefault(pid, proc)
            try:
                cpu = known.cpu_percent(None)
            except psutil.Error:
                continue
            if pid == self.own_pid:
                continue
            cmd = short_command(proc.info.get("cmdline") or []) or proc.info.get("name") or "?"
            mem = proc.info.get("memory_info")
            rows.append((cpu, ProcRow("CPU", pid, owners.get(pid, "not ftui"), proc.info.get("username") or "-",
                                      cmd, cpu, None if mem is None else int(mem.rss), "psutil")))
        for pid in set(self._procs) - seen:
            del self._procs[pid]
        ours = [r for _, r in rows if r.owner != "not ftui"]
        others = [r for c, r in sorted(rows, key=lambda x: -x[0]) if r.owner == "not ftui" and c > 0][:OTHERS]
        return ours + others

    def poll(self) -> DevicesSnapshot:
        samples, procs = self.probe.sample({})
        host = next((s for s in samples if s.kind == "host"), None)
        gpus = [s for s in samples if s.kind == "gpu"]
        owners = self.owners()
        rows: list[ProcRow] = []
        if gpus:
            gpu_procs: list[ProcessGpuMemory] = procs or self.probe.nvml.process_memory({}, owners={})
            for p in gpu_procs:
                user, cmd = self.describe(p.pid)
                rows.append(ProcRow(f"GPU {p.gpu_index}", p.pid, owners.get(p.pid, "not ftui"), user, cmd,
                                    self.cpu_of(p.pid), p.used_bytes, SOURCE_LABELS.get(p.source, p.source)))
            for pid in set(self._procs) - {p.pid for p in gpu_procs}:  # processes gone from the GPUs
                del self._procs[pid]
        else:
            rows = self.cpu_processes(owners)
        limits = {i.index: i.power_limit_w for i in self.probe.nvml.gpu_infos()} if gpus else {}
        note = "" if gpus else (self.probe.nvml.unavailable_detail or "NVML sees no GPU")
        source = SOURCE_LABELS.get(gpus[0].source, gpus[0].source) if gpus else "psutil"
        return DevicesSnapshot(host, gpus, limits, rows, note, source)


class DevicesScreen(Screen[None]):
    """Every GPU and its processes (or the host and its processes), refreshed every second."""

    BINDINGS = [Binding("escape", "app.pop_screen", "Back")]

    def __init__(self) -> None:
        super().__init__()
        self.snapshot: DevicesSnapshot | None = None

    @property
    def ftui(self) -> FtuiApp:
        return self.app  # type: ignore[return-value]

    def compose(self) -> ComposeResult:
        yield Header()
        with Vertical(id="devices-screen"):
            yield Static("reading the devices…", id="host-line")
            yield DataTable(id="gpu-table", cursor_type="none", zebra_stripes=True)
            yield Static("", id="procs-title")
            yield DataTable(id="proc-table", cursor_type="row")
        yield Footer()

    def on_mount(self) -> None:
        self.title = "devices"
        procs = self.query_one("#proc-table", DataTable)
        for col in ("device", "pid", "owner", "user", "CPU %", "memory", "command"):
            procs.add_column(col, key=col)
        self.follow()

    @work(thread=True, exclusive=True, group="devices")
    def follow(self) -> None:
        worker = get_current_worker()
        probe = self.ftui.probe
        if probe is None:
            probe = probe_for(self.ftui.fake_gpus)
        feed = DevicesFeed(self.ftui.store, probe)
        while not worker.is_cancelled:
            try:
                self.post_message(DevicesUpdate(feed.poll()))
            except Exception as exc:  # noqa: BLE001 (NVML or the store in trouble: keep trying)
                self.log.warning(f"devices poll: {exc}")
            if rest(lambda: worker.is_cancelled, self.ftui.monitor_s):
                return

    def on_devices_update(self, message: DevicesUpdate) -> None:
        self.show(message.snapshot)

    def show(self, snap: DevicesSnapshot) -> None:
        self.snapshot = snap
        narrow = self.app.size.width < 100
        bar_w = 6 if narrow else 12
        host = snap.host
        line = Text()
        if host is not None:
            cpu = host.util_pct
            line.append(f"{host.host}: " + (host.name.removeprefix("host ") if narrow else host.name) + " ")
            line.append_text(bar(None if cpu is None else cpu / 100, bar_w, level_style(cpu)))
            line.append(f" {'-' if cpu is None else f'{cpu:.0f}%'}{'' if narrow else ' (all cores)'}  mem ")
            frac = None if host.mem_used is None or not host.mem_total else host.mem_used / host.mem_total
            line.append_text(bar(frac, bar_w, level_style(None if frac is None else 100 * frac)))
            line.append(f" {fmt_bytes(host.mem_used)}/{fmt_bytes(host.mem_total)}")
            line.append("  (psutil)", style="dim")
        if snap.nvml_note:
            line.append(f"\nno GPU: {snap.nvml_note}", style="yellow")
        self.query_one("#host-line", Static).update(line)
        table = self.query_one("#gpu-table", DataTable)
        table.display = bool(snap.gpus)
        # 80 columns: the source in the memory header, as wide as its cells (the util column is narrow).
        columns = (("GPU", "name", "util", f"memory ({snap.source})", "temp", "power") if narrow else
                   ("GPU", "name", f"util ({snap.source})", "memory", "temp", "power", "SM MHz"))
        if tuple(str(c.label) for c in table.columns.values()) != columns:
            table.clear(columns=True)
            for col in columns:
                table.add_column(col, key=col)
        table.clear()
        for g in snap.gpus:
            frac = None if g.mem_used is None or not g.mem_total else g.mem_used / g.mem_total
            limit = snap.power_limits.get(g.index)
            power = "-" if g.power_w is None else f"{g.power_w:.0f}" + ("" if limit is None else f"/{limit:.0f}") + " W"
            table.add_row(*[
                Text(str(g.index)), Text(g.name.removeprefix("NVIDIA ")),
                bar(None if g.util_pct is None else g.util_pct / 100, bar_w, level_style(g.util_pct))
                + Text(" -" if g.util_pct is None else f" {g.util_pct:.0f}%"),
                bar(frac, bar_w, level_style(None if frac is None else 100 * frac))
                + Text(f" {fmt_bytes(g.mem_used)}/{fmt_bytes(g.mem_total)}"),
                Text("-" if g.temp_c is None else f"{g.temp_c:.0f}°C", style=level_style(g.temp_c, 70, 85)),
                Text(power), Text("-" if g.sm_clock_mhz is None else str(g.sm_clock_mhz)),
            ][: len(columns)])
        what = "GPU compute processes" if snap.gpus else "processes of ftui runs, then the busiest others"
        # One line at 120 columns (the sources of memory and CPU %), the count alone at 80.
        self.query_one("#procs-title", Static).update(Text.assemble(
            (what, "bold"), f" ({len(snap.procs)})" + ("" if narrow else
            f" · owner: the ftui run (by process group) · memory: "
            f"{'GPU, ' + snap.source if snap.gpus else 'RSS, psutil'} · CPU %: of a core, psutil")))
        procs = self.query_one("#proc-table", DataTable)
        procs.clear()
        if not snap.procs:
            procs.add_row(Text("-"), Text(""), Text("no process" if snap.gpus else "no busy process"), *[Text("")] * 4)
        for p in snap.procs:
            procs.add_row(Text(p.device), Text(str(p.pid)),
                          Text(p.owner, style="bold green" if p.owner != "not ftui" else "dim"),
                          Text(p.user), Text("-" if p.cpu_pct is None else f"{p.cpu_pct:.0f}"),
                          Text(fmt_bytes(p.mem)), Text(p.command, no_wrap=True, overflow="ellipsis"))

    def on_resize(self) -> None:
        if self.snapshot is not None:
            self.show(self.snapshot)
