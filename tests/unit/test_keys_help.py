"""What ? lists on each screen, from the bindings themselves: the screen's own keys first (in the order
bound, with what each does), then the app's screen keys, then the text-field rule; no widget's generic keys."""

from __future__ import annotations

from tui.app.app import FtuiApp
from tui.app.keys import binding_rows, help_sections
from tui.app.screens.compare import CompareScreen
from tui.app.screens.compose import ComposeScreen
from tui.app.screens.devices import DevicesScreen
from tui.app.screens.monitor import MonitorScreen
from tui.app.screens.runs import RunsScreen


def keys_of(screen: type) -> list[list[str]]:
    return [[key for key, _ in rows] for _, rows in help_sections(screen, FtuiApp)]


def test_each_screen_lists_its_own_keys_first_then_the_apps() -> None:
    app_keys = ["? / F4", "F1 / 1", "F2 / 2", "F3 / 3", "b", "q", "ctrl+p"]
    assert keys_of(RunsScreen)[:2] == [["enter", "space", "c", "s", "/", "t", "n", "r", "R", "d", "A"], app_keys]
    assert keys_of(MonitorScreen)[:2] == [["esc", "s", "k", "l"], app_keys]
    assert keys_of(ComposeScreen)[0] == ["ctrl+l", "ctrl+s", "ctrl+o", "ctrl+r", "enter (file name)"]
    for screen in (RunsScreen, MonitorScreen, ComposeScreen, DevicesScreen, CompareScreen):
        headings = [heading for heading, _ in help_sections(screen, FtuiApp)]
        assert headings == [f"{screen.__name__.removesuffix('Screen')} keys", "Screens and the app", "Text fields"]


def test_rows_say_what_each_key_does_and_pair_r_with_R() -> None:
    what = dict(help_sections(RunsScreen, FtuiApp)[0][1])
    assert "same recipe" in what["r"] and "checkpoint" in what["R"]
    assert "Monitor" in what["r"] and "Monitor" in what["R"]
    monitor = dict(help_sections(MonitorScreen, FtuiApp)[0][1])
    assert "gracefully" in monitor["s"] and "SIGKILL" in monitor["k"]
    # A binding without a description (Textual's plumbing) is left out; keys of one action are joined.
    from textual.binding import Binding

    assert binding_rows([Binding("a", "x", ""), Binding("f5,5", "y", "Why", tooltip="why so")]) == [("F5 / 5", "why so")]
