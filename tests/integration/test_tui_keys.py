"""The dashboard's keys under Textual's pilot, over a real store: help per screen (its own keys first,
scrollable, inside 80x24), screen keys that go to the named screen from every screen, and the key rule
(letters, digits and ? type in a text field; F-keys and ctrl+ keys act everywhere)."""

from __future__ import annotations

from typing import Any

from textual.widgets import Footer, Input
from textual.widgets._footer import FooterKey

from store import Store
from tests.support.dashboard import add_finished_run, wait_for
from tui.app import make_app
from tui.app.screens.compose import ComposeScreen, field_id
from tui.app.screens.devices import DevicesScreen
from tui.app.screens.modals import KeysScreen
from tui.app.screens.monitor import MonitorScreen
from tui.app.screens.runs import RunsScreen


class _FixedHost:
    """The host's psutil reading, scripted (the hardware boundary): no scan of this machine's processes."""

    def sample(self, pids_by_rank, owners=None):  # type: ignore[no-untyped-def]
        return []


def scripted_probe() -> Any:
    """One scripted GPU at a fixed tick and a scripted host: the Devices screen reads nothing real."""
    from runner.hardware import FakeNvml, NvmlBackend, Probe

    return Probe(nvml=NvmlBackend(lib=FakeNvml.demo(1, pids=[], tick_s=None), host="box"),
                 processes=_FixedHost())  # type: ignore[arg-type]


def help_lines(app: Any) -> list[str]:
    return str(app.screen.query_one("#keys-body").render()).splitlines()


def footer_keys(app: Any) -> set[str]:
    return {key.key for key in app.screen.query_one(Footer).query(FooterKey)}


async def open_help(pilot: Any, key: str = "question_mark") -> list[str]:
    await pilot.press(key)
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, KeysScreen), what="the keys")
    await pilot.pause()
    return help_lines(pilot.app)


async def test_help_lists_the_screens_keys_first_fits_80x24_and_scrolls(store: Store) -> None:
    """On the screen itself (the order of every screen's keys: tests/unit/test_keys_help.py)."""
    add_finished_run(store, "alpha", 1e-3)
    app = make_app(store)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.screen.query_one("DataTable").row_count == 1, what="the run listed")
        lines = await open_help(pilot)
        assert lines[0] == "Runs keys" and lines[1].split()[0] == "enter"
        assert [heading for heading, _ in app.screen.sections] == ["Runs keys", "Screens and the app", "Text fields"]
        # No generic widget key (the table's cursor keys), and every line inside the box.
        assert not any(line.split()[0] in ("pagedown", "ctrl+home", "shift+left") for line in lines if line.strip())
        assert max(len(line) for line in lines) <= 76 - 6
        box = app.screen.query_one("#keys").region
        assert box.x >= 0 and box.y >= 0 and box.right <= 80 and box.bottom <= 24
        scroll = app.screen.query_one("#keys-scroll")
        assert scroll.max_scroll_y > 0  # at 24 rows the list is longer than the box: it scrolls
        await pilot.press("end")
        await pilot.pause()
        assert scroll.scroll_y == scroll.max_scroll_y
        await pilot.press("home", "pagedown")
        await pilot.pause()
        assert 0 < scroll.scroll_y


async def test_in_a_compose_field_digits_and_question_mark_type_and_f4_shows_composes_keys(store: Store) -> None:
    app = make_app(store)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("2")
        await wait_for(pilot, lambda: isinstance(app.screen, ComposeScreen) and app.screen.recipe is not None,
                       what="compose")
        screen = app.screen
        nproc = screen.query_one("#" + field_id("launch.nproc"), Input)
        screen.focus_field("launch.nproc")
        # The palette's "Go to field" leaves the cursor at the end, nothing selected: typing adds to the value.
        await wait_for(pilot, lambda: nproc.has_focus and nproc.selection.is_empty
                       and nproc.cursor_position == len(nproc.value), what="the field focused, cursor at its end")
        await pilot.press("2", "1", "question_mark", "3")
        await pilot.pause()
        assert app.screen is screen and nproc.value == "121?3"
        # The footer shows the keys that act in the field: the F-keys, not the digits, ? or q.
        await wait_for(pilot, lambda: {"f1", "f2", "f3", "f4"} <= footer_keys(app), what="the F-keys in the footer")
        assert not {"1", "2", "question_mark", "q"} & footer_keys(app)
        lines = await open_help(pilot, "f4")
        assert lines[0] == "Compose keys" and lines[1].split()[0] == "ctrl+l"
        await pilot.press("escape")
        await pilot.pause()
        # The palette's "Keys" is this list too, not the Input widget's editing keys.
        keys = next(c for c in app.get_system_commands(screen) if c.title == "Keys")
        keys.callback()
        await wait_for(pilot, lambda: isinstance(app.screen, KeysScreen), what="the keys")
        await pilot.pause()
        assert help_lines(app)[0] == "Compose keys"
        await pilot.press("escape")
        screen.query_one("#form").focus()  # out of the field: ? is the key for the keys again
        # The footer recomposes its keys after the focus moves (an empty footer in between)
        await wait_for(pilot, lambda: "question_mark" in footer_keys(app), what="? among the footer's keys")
        assert "f4" not in footer_keys(app)


async def test_screen_keys_and_the_palette_go_to_the_named_screen_from_every_screen(store: Store) -> None:
    run_id = add_finished_run(store, "alpha", 1e-3)
    app = make_app(store, probe=scripted_probe(), fake_gpus=1)
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        await wait_for(pilot, lambda: app.screen.query_one("DataTable").row_count == 1, what="the run listed")

        def showing(screen: type) -> bool:
            """``screen`` is in front with its first read on it (a Monitor's or Devices' from a worker)."""
            return isinstance(app.screen, screen) and getattr(app.screen, "snapshot", True) is not None

        async def press(key: str, screen: type) -> None:
            await pilot.press(key)
            await wait_for(pilot, lambda: showing(screen), what=f"{key}: {screen.__name__}")

        app.open_run(run_id)
        await wait_for(pilot, lambda: showing(MonitorScreen), what="the monitor")
        await press("f1", RunsScreen)
        app.open_run(run_id)
        await wait_for(pilot, lambda: showing(MonitorScreen), what="the monitor")
        await press("f3", DevicesScreen)
        await press("f1", RunsScreen)  # Runs itself, not the Monitor under Devices
        assert len(app.screen_stack) == 1
        await press("f2", ComposeScreen)
        await press("f3", DevicesScreen)
        await press("f2", ComposeScreen)  # Compose itself, Devices over it closed
        assert len(app.screen_stack) == 1
        app.screen.focus_field("train.max_steps")
        await press("f1", RunsScreen)  # from a field, too
        # The palette has the Devices screen and Compare (of the runs selected on Runs) too.
        commands = {c.title: c for c in app.get_system_commands(app.screen)}
        commands["Devices"].callback()
        await wait_for(pilot, lambda: showing(DevicesScreen), what="devices")
        commands["Compare"].callback()  # from Devices: back to Runs, which says what Compare needs
        await wait_for(pilot, lambda: isinstance(app.screen, RunsScreen), what="runs")
        await wait_for(pilot, lambda: any("select two runs" in str(t.render()) for t in app.screen.query("Toast")),
                       what="the compare hint")
