"""The dashboard launches a real CPU run from Compose, watches it on the Monitor, stops it, finds it in
Runs and compares it with an earlier run: the app and a real training run together."""

from __future__ import annotations

import asyncio

from textual.widgets import DataTable, Input

from store import Store
from tests.support.dashboard import add_finished_run, assert_compare, wait_for
from tui.app import make_app
from tui.app.messages import MonitorUpdate
from tui.app.screens.compare import CompareScreen
from tui.app.screens.compose import field_id
from tui.app.screens.modals import ConfirmScreen
from tui.app.screens.monitor import MonitorScreen
from tui.app.screens.runs import RunsScreen


async def test_launch_monitor_stop_compare(store: Store) -> None:
    """Compose quickstart, launch a real CPU run, watch it, stop it, find it in Runs, compare."""
    other = add_finished_run(store, "earlier", 1e-3)
    seen: list = []
    app = make_app(store, refresh_s=0.3, monitor_s=0.3)
    async with app.run_test(size=(120, 40), message_hook=seen.append) as pilot:
        await pilot.press("2")
        await pilot.pause()
        screen = app.screen
        screen.query_one("#" + field_id("train.max_steps"), Input).value = "200"
        screen.query_one("#" + field_id("name"), Input).value = "pilot-run"
        await pilot.pause()
        assert screen.valid
        await pilot.press("ctrl+l")
        await wait_for(pilot, lambda: isinstance(app.screen, MonitorScreen), timeout=60, what="monitor")
        monitor = app.screen
        assert isinstance(monitor, MonitorScreen)

        def snap():  # type: ignore[no-untyped-def]
            return monitor.snapshot

        await wait_for(pilot, lambda: snap() is not None and snap().loss_steps >= 2 and snap().devices,
                       timeout=180, what="loss and device rows")
        assert snap().devices[0].label.startswith("rank 0 (CPU process)")
        assert snap().devices[0].source == "psutil"
        assert monitor.query_one("#devices", DataTable).row_count >= 1
        assert any(isinstance(m, MonitorUpdate) for m in seen)
        await pilot.press("s")  # asks first
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="stop question")
        await pilot.press("y")
        await wait_for(pilot, lambda: snap().run.status in ("stopped", "completed", "failed"), timeout=90,
                       what="run to stop")
        assert snap().run.status == "stopped", snap().run.error
        launched = snap().run.id
        await pilot.press("escape", "1")
        await pilot.pause(1.0)
        runs = app.screen
        assert isinstance(runs, RunsScreen)
        await wait_for(pilot, lambda: any(r.id == launched and r.status == "stopped" for r in runs.runs),
                       what="stopped run in Runs")
        # select both by keys (newest first: the launched run is the top row)
        runs.query_one("#runs-table", DataTable).focus()
        await pilot.pause()
        await pilot.press("up", "up", "space", "down", "space")  # to the top row, then mark two rows
        await pilot.pause()
        assert runs.selected == {launched, other}, runs.selected
        await pilot.press("c")
        await wait_for(pilot, lambda: isinstance(app.screen, CompareScreen), what="compare")
        await wait_for(pilot, lambda: app.screen.query_one("#compare-table", DataTable).row_count > 0,
                       what="compare rows")
        assert_compare(app.screen, [other, launched], ["name", "train.lr", "train.max_steps"])
    await asyncio.sleep(0)
