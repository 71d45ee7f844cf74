"""The ftui Textual app: wiring only (modes, bindings, startup). Screens live in tui/screens/."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterable
from datetime import datetime
from functools import lru_cache
from typing import Any

from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.markup import escape
from textual.screen import Screen

from runner.spec import watching
from runner.spec.paths import default_db_url
from store import RunInfo, Store, StoreError
from store.store import utcnow
from tui.app.keys import help_sections
from tui.app.messages import CompareRuns, LaunchFailed, Notice, OpenPlan, OpenRun, RunLaunched
from tui.app.screens.modals import KeysScreen
from tui.app.screens.runs import RunsScreen
from tui.notify import ENDED, desktop

# The Runs screen is the first paint: the other screens (and what they import: pydantic recipes, plots,
# the comparison) are imported when first opened (BENCHMARKS.md, "Store at scale").


def _compose_screen() -> Screen[Any]:
    from tui.app.screens.compose import ComposeScreen  # deferred: pydantic (the recipe models, 0.45 s)

    return ComposeScreen()


class FtuiApp(App[int]):
    """Runs, Compose, Monitor, Compare, Plans. Keyboard first; the mouse works; ctrl+p opens the palette."""

    CSS_PATH = "app.tcss"
    TITLE = "ftui"
    MODES = {"runs": RunsScreen, "compose": _compose_screen}
    DEFAULT_MODE = "runs"
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (100, "-wide")]
    # The key rule: F-keys, ctrl+ keys and esc act on every screen, in a text field too; letters, digits,
    # ? and / act only when no text field has focus (in a field they type: Textual drops a binding whose
    # key the focused Input consumes). So each screen key has an F-key, and the footer shows the key that
    # works at that moment (F4 for the keys once ? types).
    # The footer lists the screen's keys, then these in this order: Keys first, so that at 80 columns the
    # way to every other key is on screen.
    BINDINGS = [
        Binding("question_mark,f4", "keys", "Keys", tooltip="the keys of this screen, then the app's"),
        Binding("f1,1", "goto('runs')", "Runs", tooltip="the Runs screen, from any screen"),
        Binding("f2,2", "goto('compose')", "Compose", tooltip="the Compose screen, from any screen"),
        Binding("f3,3", "goto('devices')", "Devices", tooltip="the Devices screen, from any screen"),
        Binding("b", "toggle_notify", "Bell on run end", show=False),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(self, store: Store | Callable[[], Store], probe: Any = None, fake_gpus: int = 0,
                 now: Callable[[], datetime] = utcnow, refresh_s: float = 1.0, monitor_s: float = 1.0,
                 python: str = sys.executable, notify_on_end: bool = False,
                 make_probe: Callable[[], Any] | None = None,
                 watcher_check_s: float = watching.WATCHER_CHECK_S) -> None:
        super().__init__()
        self.notify_on_end = notify_on_end
        """The setting ``b`` toggles (``ftui --notify`` starts with it on): when a run ends or fails, ring
        the bell and send a desktop notification (``tui.notify``)."""
        self._statuses: dict[int, str] = {}
        self._store: Store | None = store if isinstance(store, Store) else None
        self._open_store: Callable[[], Store] | None = None if isinstance(store, Store) else store
        self._probe: Any = probe
        self._make_probe = make_probe
        self._opening = threading.Lock()
        self.store_error: StoreError | None = None
        """Why the store could not be opened (the app is then exiting with code 2)."""
        self.fake_gpus = fake_gpus
        self.now = now
        """The clock for durations of running runs (frozen in snapshot tests)."""
        self.refresh_s = refresh_s
        self.monitor_s = monitor_s
        self.watcher_check_s = watcher_check_s
        """Seconds between the checks that every running run on this host still has a watcher (a run whose
        watcher died gets a new one, or its true status: ``tui.app.poll.settle_abandoned``)."""
        self.python = python
        """The interpreter runs are launched with (shown in the Compose preview)."""
        self.runs: list[RunInfo] = []
        """The latest list the Runs screen loaded (the palette's "Open run" commands; no DB read per key)."""

    @property
    def store(self) -> Store:
        """The store. ``ftui`` gives an opener, called here on first use, by the Runs screen's worker:
        the screen paints while the database driver is imported and the connection made. A store that
        cannot be opened ends the app with its one line and exit code 2, as any other command does."""
        with self._opening:
            if self.store_error is not None:
                raise self.store_error
            if self._store is None:
                assert self._open_store is not None
                try:
                    self._store = self._open_store()
                except StoreError as exc:
                    self.store_error = exc
                    self._fail()
                    raise
            return self._store

    @property
    def probe(self) -> Any:
        """The hardware probe (NVML, psutil); ``make_probe`` is called on first use, from a worker (NVML's
        initialisation can take a GPU box a noticeable part of a second, never before the first paint)."""
        with self._opening:
            if self._probe is None and self._make_probe is not None:
                self._probe = self._make_probe()
            return self._probe

    def _fail(self) -> None:
        """Exit with code 2 (``run_app`` prints ``store_error`` on the restored terminal); any thread. After
        the next refresh: an exit while the first screen is still mounting fails inside Textual."""
        def leave() -> None:
            self.call_after_refresh(self.exit, None, 2)

        if threading.get_ident() == self._thread_id:
            leave()
        else:
            self.call_from_thread(leave)

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        # Textual's "Keys" shows the focused widget's keys (an Input's editing keys on Compose): ours
        # lists the screen's keys first, as ? does.
        yield from (c for c in super().get_system_commands(screen) if c.title != "Keys")
        yield SystemCommand("Keys", "The keys of this screen, then the app's (? or F4)", self.action_keys)
        yield SystemCommand("Runs", "Every run in the store (F1)", lambda: self.action_goto("runs"))
        yield SystemCommand("Compose", "Build, validate and launch a recipe (F2)", lambda: self.action_goto("compose"))
        yield SystemCommand("Devices", "Every GPU, or the host, and what runs on it (F3)",
                            lambda: self.action_goto("devices"))
        yield SystemCommand("Compare", "Compare the runs selected on the Runs screen (space selects)",
                            self.compare_selected)
        yield SystemCommand("Plans", "Every plan (ftui plan): in progress or finished; open one to see its "
                            "decision or commit it", self.show_plans)
        from tui.app.screens.compose import FIELDS, ComposeScreen  # deferred: pydantic

        if isinstance(screen, ComposeScreen):
            for field in FIELDS:
                yield SystemCommand(f"Go to field: {field.label}", field.path,
                                    lambda path=field.path: screen.focus_field(path))
        for run in self.runs[:20]:
            # The palette parses command titles as markup: the run's name is escaped.
            yield SystemCommand(f"Open run {run.id} {escape(run.name)}", f"{run.status} · {run.strategy}",
                                lambda run_id=run.id: self.open_run(run_id))

    def action_keys(self) -> None:
        """``?`` or F4: the keys of the screen in front first, then the app's (``tui.app.keys``)."""
        if isinstance(self.screen, KeysScreen):
            return
        self.push_screen(KeysScreen(help_sections(type(self.screen), type(self))))

    def action_goto(self, name: str) -> None:
        """F1-F3 (1-3 outside a text field): the named screen itself, from any screen. Runs and Compose
        are modes: their screen comes back with what was opened over it (a Monitor, Devices) closed.
        Devices opens over the screen in front (esc goes back there)."""
        if name == "devices":
            self._show_devices()
            return
        self.switch_mode(name)
        while len(self.screen_stack) > 1:
            self.pop_screen()

    def _show_devices(self) -> None:
        # deferred: plotext (the bars' library), and pydantic through the probe
        from tui.app.screens.devices import DevicesScreen

        if not isinstance(self.screen, DevicesScreen):
            self.push_screen(DevicesScreen())

    def compare_selected(self) -> None:
        """The palette's Compare: the runs selected on the Runs screen, side by side."""
        self.action_goto("runs")
        runs = self.screen
        if isinstance(runs, RunsScreen):
            runs.action_compare()

    def action_toggle_notify(self) -> None:
        self.notify_on_end = not self.notify_on_end
        self.notify(f"bell and desktop notification when a run ends: {'on' if self.notify_on_end else 'off'}")

    def runs_polled(self, runs: list[RunInfo]) -> list[RunInfo]:
        """Called with every poll of the store: the runs seen running before that have ended since are
        announced (when the setting is on). Returns them."""
        ended = [r for r in runs if r.status in ENDED and self._statuses.get(r.id) in ("created", "running")]
        self._statuses = {r.id: r.status for r in runs}
        if not self.notify_on_end:
            return ended
        for run in ended:
            self.bell()
            self.notify(f"run {run.id} {run.status}", markup=False,
                        severity="error" if run.status == "failed" else "information")
            # notify-send may block up to its timeout (no D-Bus session): never on the UI thread
            self.run_worker(lambda r=run: desktop(r.id, r.name, r.status, r.error), thread=True, group="notify")
        return ended

    # ------------------------------------------------------------------ messages from screens

    def open_run(self, run_id: int) -> None:
        from tui.app.screens.monitor import MonitorScreen  # deferred: plotext (the curves, 0.08 s)

        self.push_screen(MonitorScreen(run_id))

    def on_open_run(self, message: OpenRun) -> None:
        self.open_run(message.run_id)

    def show_plans(self) -> None:
        """The palette's Plans: every plan the store or this host knows."""
        from tui.app.screens.plan import PlansScreen  # deferred: pydantic (the plan service)

        if not isinstance(self.screen, PlansScreen):
            self.push_screen(PlansScreen())

    def on_open_plan(self, message: OpenPlan) -> None:
        from tui.app.screens.plan import PlanScreen  # deferred: pydantic (the plan service)

        self.push_screen(PlanScreen(message.pid, message.started))

    def on_run_launched(self, message: RunLaunched) -> None:
        self.notify(f"run {message.run_id} started; it keeps running if you quit")
        for warning in message.warnings:  # the pre-flight's, as ftui run prints them
            self.notify(f"warning: {warning}", severity="warning", timeout=12, markup=False)
        self.open_run(message.run_id)

    def on_launch_failed(self, message: LaunchFailed) -> None:
        self.notify(message.error, severity="error", timeout=8, markup=False)

    def on_notice(self, message: Notice) -> None:
        self.notify(message.text, severity=message.severity, markup=False)  # type: ignore[arg-type]

    def on_compare_runs(self, message: CompareRuns) -> None:
        from tui.app.screens.compare import CompareScreen  # deferred: pydantic (and plotext)

        self.push_screen(CompareScreen(message.run_ids))

    # ------------------------------------------------------------------ helpers the screens use

    def cpu_threads(self, recipe: Any) -> int | None:
        return _cpu_threads(recipe.launch.nproc, recipe.launch.device)


@lru_cache(maxsize=32)
def _cpu_threads(nproc: int, device: str) -> int | None:
    from runner.spec.recipe import Recipe  # deferred: pydantic (Compose asks, after the first paint)
    from runner.watch.host import cpu_threads  # deferred: pydantic

    strategy = "single" if nproc == 1 else "fsdp"
    return cpu_threads(Recipe.model_validate({"launch": {"nproc": nproc, "device": device,
                                                                     "strategy": strategy}}))


def make_app(store: Store | Callable[[], Store], probe: Any = None, fake_gpus: int = 0, **kwargs: Any) -> FtuiApp:
    """The app over a store (or what opens it) and a hardware probe (the CLI and the tests build it here)."""
    return FtuiApp(store, probe=probe, fake_gpus=fake_gpus, **kwargs)


def dashboard(db_url: str | None = None, fake_gpus: int = 0, notify_on_end: bool = False) -> FtuiApp:
    """What ``ftui`` runs: nothing is opened, probed or imported beyond the Runs screen's needs before the
    first paint (the store and the probe open on first use, from workers; bench/bench_tui.py times this)."""
    def probe() -> Any:
        from runner.watch.host import probe_for  # deferred: pydantic (the probe opens on first use)

        return probe_for(fake_gpus)

    url = db_url or default_db_url()
    return make_app(lambda: Store(url), fake_gpus=fake_gpus, notify_on_end=notify_on_end,
                    make_probe=probe)


def run_app(db_url: str | None = None, fake_gpus: int = 0, notify_on_end: bool = False) -> int:
    """``ftui`` with no command: open the dashboard; returns the exit code (2: the store cannot be opened)."""
    app = dashboard(db_url, fake_gpus, notify_on_end)
    result = app.run()
    if app.store_error is not None:
        print(f"ftui: {app.store_error}", file=sys.stderr)
        return 2
    return int(result or app.return_code or 0)
