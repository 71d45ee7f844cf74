"""Compose under Textual's pilot over a real store and the repository's recipes: ctrl+o's file picker, the
pre-flight's file and process-count checks behind "valid recipe", and Save writing only the changed fields into the loaded
file's text (its comments kept)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from textual.widgets import Checkbox, Input, OptionList

from runner.hardware.hostfacts import current
from runner.spec.recipe import load_recipe
from store import Store
from tests.support import ROOT
from tests.support.dashboard import wait_for
from tui.app import make_app
from tui.app.screens.compose import ComposeScreen, field_id
from tui.app.screens.modals import PickFileScreen, PromptScreen


async def open_compose(pilot: Any) -> ComposeScreen:
    await pilot.press("f2")
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, ComposeScreen) and pilot.app.screen.recipe is not None,
                   what="compose")
    return pilot.app.screen


async def pick(pilot: Any, path: str) -> None:
    """ctrl+o, then the picker's line for ``path`` and enter."""
    await pilot.press("ctrl+o")
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, PickFileScreen), what="the file picker")
    picker = pilot.app.screen
    assert path in picker.paths, picker.paths
    picker.query_one(OptionList).highlighted = picker.paths.index(path)
    await pilot.press("enter")
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, ComposeScreen), what="back on compose")


async def test_ctrl_o_picks_a_recipe_leaves_a_field_focused_and_save_writes_only_the_changes(store: Store,
                                                                                              tmp_path: Path) -> None:
    app = make_app(store)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await open_compose(pilot)
        await pick(pilot, "recipes/chat-lora.toml")
        assert screen.recipe_path == "recipes/chat-lora.toml"
        assert screen.query_one("#" + field_id("train.batch_size"), Input).value == "8"
        name = screen.query_one("#" + field_id("name"), Input)
        assert app.focused is name
        await pilot.press("end", "2", "q")  # typed into the field, not the app's keys (q quits)
        await pilot.pause()
        assert app.screen is screen and name.value == "chat-lora2q"
        # At 80x24 the compact form shows more than 4 fields, each input wide enough to read.
        shown = [w for w in screen.query("#form Input, #form Select")
                 if w.id != "recipe-path" and w.region.height and screen.query_one("#form").region.contains_region(w.region)]
        assert len(shown) >= 10 and min(w.region.width for w in shown) >= 24
        name.value = "chat-lora"  # back as loaded
        # Save writes the loaded file's text with only the changed fields set: its comments kept.
        screen.query_one("#" + field_id("train.max_steps"), Input).value = "7"
        screen.query_one("#" + field_id("launch.device")).value = "cpu"
        await pilot.pause()
        path = tmp_path / "mine.toml"
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: isinstance(app.screen, PromptScreen), what="save prompt")
        app.screen.query_one("#prompt", Input).value = str(path)
        await pilot.press("enter")
        await wait_for(pilot, lambda: path.exists(), what="saved")
    shipped = (ROOT / "recipes" / "chat-lora.toml").read_text()
    chat = ROOT / "recipes" / "data" / "chat.jsonl"
    # The shipped text line for line (its comments too), but for the two fields changed and the data file,
    # which is relative to recipes/: written into another folder, it is made absolute. No default is added.
    expected = (shipped.replace('source = "data/chat.jsonl"', f'source = "{chat}"')
                .replace("max_steps = 60", "max_steps = 7").rstrip("\n") + '\ndevice = "cpu"\n')
    assert path.read_text() == expected
    recipe = load_recipe(path)
    assert recipe.train.max_steps == 7 and recipe.launch.device == "cpu" and recipe.data.source == str(chat)


async def test_valid_recipe_means_the_preflight_would_pass_its_files_and_process_count(store: Store) -> None:
    app = make_app(store)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await open_compose(pilot)
        data = screen.query_one("#" + field_id("data.source"), Input)
        data.value = "/no/such/rows.jsonl"
        await pilot.pause()
        assert not screen.valid
        assert "file not found: /no/such/rows.jsonl" in str(screen.query_one("#err-" + field_id("data.source")).render())
        assert "valid recipe" not in str(screen.query_one("#form-status").render())
        data.value = "builtin:pydoc-topics"
        model = screen.query_one("#" + field_id("model.name"), Input)
        model.value = "./no-such-model"
        await pilot.pause()
        assert not screen.valid
        assert "not a model folder" in str(screen.query_one("#err-" + field_id("model.name")).render())
        model.value = "builtin:tiny-llama"
        await pilot.pause()
        assert screen.valid and "valid recipe" in str(screen.query_one("#form-status").render())
        # More processes than this host takes (on CPU: cores x 2) are refused naming the field and the
        # host's count, unless the force toggle is on.
        cores = current().cpu_cores
        screen.query_one("#" + field_id("launch.device")).value = "cpu"
        screen.query_one("#" + field_id("launch.strategy")).value = "ddp"
        screen.query_one("#" + field_id("launch.nproc"), Input).value = str(2 * cores + 1)
        await pilot.pause()
        error = str(screen.query_one("#err-" + field_id("launch.nproc")).render())
        assert not screen.valid and f"{2 * cores + 1} processes" in error and f"{cores} core" in error
        assert "force" in error and "launch.nproc" in str(screen.query_one("#form-status").render())
        screen.query_one("#force", Checkbox).value = True
        await pilot.pause()
        assert screen.valid and screen.force
