"""The ftui Textual app: wiring only (modes, bindings, startup). Screens live in tui/screens/."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from datetime import datetime
from functools import lru_cache
from typing import Any

from rich.text import Text
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.screen import Screen

from store import Store
from store.store import utcnow
from tui.messages import CompareRuns, LaunchFailed, OpenRun, RunLaunched
from tui.screens.compare import CompareScreen
from tui.screens.compose import FIELDS, ComposeScreen
from tui.screens.monitor import MonitorScreen
from tui.screens.runs import RunsScreen


class FtuiApp(App[int]):
    """Runs, Compose, Monitor, Compare. Keyboard first; the mouse works; ctrl+p opens the palette."""

    CSS_PATH = "app.tcss"
    TITLE = "ftui"
    MODES = {"runs": RunsScreen, "compose": ComposeScreen}
    DEFAULT_MODE = "runs"
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (100, "-wide")]
    BINDINGS = [
        Binding("f1,1", "switch_mode('runs')", "Runs"),
        Binding("f2,2", "switch_mode('compose')", "Compose"),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(self, store: Store, probe: Any = None, fake_gpus: int = 0, now: Callable[[], datetime] = utcnow,
                 refresh_s: float = 1.0, monitor_s: float = 1.0, python: str = sys.executable) -> None:
        super().__init__()
        self.store = store
        self.probe = probe
        self.fake_gpus = fake_gpus
        self.now = now
        """The clock for durations of running runs (frozen in snapshot tests)."""
        self.refresh_s = refresh_s
        self.monitor_s = monitor_s
        self.python = python
        """The interpreter runs are launched with (shown in the Compose preview)."""

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield SystemCommand("Runs", "Every run in the store", lambda: self.switch_mode("runs"))
        yield SystemCommand("Compose", "Build, validate and launch a recipe", lambda: self.switch_mode("compose"))
        if isinstance(screen, ComposeScreen):
            for field in FIELDS:
                yield SystemCommand(f"Go to field: {field.label}", field.path,
                                    lambda path=field.path: screen.focus_field(path))
        for run in self.store.list_runs()[:20]:
            yield SystemCommand(f"Open run {run.id} {run.name}", f"{run.status} · {run.strategy}",
                                lambda run_id=run.id: self.open_run(run_id))

    # ------------------------------------------------------------------ messages from screens

    def open_run(self, run_id: int) -> None:
        self.push_screen(MonitorScreen(run_id))

    def on_open_run(self, message: OpenRun) -> None:
        self.open_run(message.run_id)

    def on_run_launched(self, message: RunLaunched) -> None:
        self.notify(f"run {message.run_id} started; it keeps running if you quit")
        self.open_run(message.run_id)

    def on_launch_failed(self, message: LaunchFailed) -> None:
        self.notify(message.error, severity="error", timeout=8)

    def on_compare_runs(self, message: CompareRuns) -> None:
        self.push_screen(CompareScreen(message.run_ids))

    # ------------------------------------------------------------------ helpers the screens use

    def cpu_threads(self, recipe: Any) -> int | None:
        return _cpu_threads(recipe.launch.nproc, recipe.launch.device)

    def estimate_text(self, recipe: Any) -> Text:
        return estimate_text(recipe, self.probe)


@lru_cache(maxsize=32)
def _cpu_threads(nproc: int, device: str) -> int | None:
    from runner import orchestrator
    from runner.recipe import Recipe

    strategy = "single" if nproc == 1 else "fsdp"
    return orchestrator.cpu_threads(Recipe.model_validate({"launch": {"nproc": nproc, "device": device,
                                                                     "strategy": strategy}}))


@lru_cache(maxsize=1)
def _tiny_shape() -> Any:
    from runner.builtin import tiny_llama_config
    from runner.estimate import shape_from_config

    return shape_from_config(tiny_llama_config())


def estimate_text(recipe: Any, probe: Any) -> Text:
    """Memory per device for the recipe (builtin model only) and the recommended strategy."""
    from tui.report import fmt_bytes

    if not recipe.model.name.startswith("builtin:"):
        return Text("memory estimate: only for the builtin model here (the planner needs the model config)",
                    style="dim")
    from runner.estimate import EstimateInput, estimate_report

    gpus = probe.nvml.gpu_infos() if probe is not None else []
    gpu_mem = next((g.mem_total for g in gpus if getattr(g, "mem_total", None)), None)
    n = max(1, len(gpus))
    inp = EstimateInput(shape=_tiny_shape(), method=recipe.method.type, precision=recipe.train.precision,
                        micro_batch=recipe.train.batch_size, seq_len=recipe.data.context_length,
                        gradient_checkpointing=recipe.train.gradient_checkpointing, lora_r=recipe.method.lora.r,
                        lora_targets=tuple(recipe.method.lora.target_modules))
    report = estimate_report(inp, gpu_mem or 80 * 2**30, n if gpus else max(n, recipe.launch.nproc),
                             strategies=("single", "ddp", "fsdp"))
    where = f"{n} GPU(s) of {fmt_bytes(gpu_mem)}" if gpu_mem else "no GPU here: a nominal 80 GiB GPU"
    out = Text.assemble(("memory per device (estimate, runner.estimate)", "bold"), f" for {where}\n")
    for name, entry in report["strategies"].items():
        mark = "✓" if entry["fits"] else "✗"
        out.append(f"  {mark} {name:<6} {fmt_bytes(entry['per_device_bytes']['total'])}\n")
    rec = report["recommendation"]
    out.append(f"recommended: {rec['strategy'] or 'none'}: {rec['reason']}")
    return out


def make_app(store: Store, probe: Any = None, fake_gpus: int = 0, **kwargs: Any) -> FtuiApp:
    """The app over a store and a hardware probe (the CLI and the tests both build it here)."""
    return FtuiApp(store, probe=probe, fake_gpus=fake_gpus, **kwargs)


def run_app(db_url: str | None = None, fake_gpus: int = 0) -> int:
    """``ftui`` with no command: open the dashboard; returns the exit code."""
    from runner.orchestrator import probe_for
    from runner.paths import default_db_url
    from store import StoreError

    try:
        store = Store(db_url or default_db_url())
    except StoreError as exc:
        print(f"ftui: {exc}")
        return 2
    app = make_app(store, probe=probe_for(fake_gpus), fake_gpus=fake_gpus)
    result = app.run()
    return int(result or app.return_code or 0)
