"""Issue 16, "the first ten minutes", in the Textual app: Pilot tests over a real store."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from textual.widgets import Input

from store import Store
from tui.app import make_app
from tui.app.screens.compose import ComposeScreen, field_id
from tui.app.screens.modals import ConfirmScreen, PromptScreen

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A data folder, and a working folder holding a copy of the shipped recipes (Save writes there)."""
    monkeypatch.setenv("FTUI_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("FTUI_DB", raising=False)
    work = tmp_path / "work"
    shutil.copytree(ROOT / "recipes", work / "recipes")
    monkeypatch.chdir(work)
    return tmp_path


@pytest.fixture
def store(home: Path) -> Store:
    return Store(f"sqlite:///{home}/ftui.db")


async def wait_for(pilot, predicate, timeout: float = 60.0, what: str = "condition") -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        await pilot.pause(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def error_of(screen, path: str) -> str:  # type: ignore[no-untyped-def]
    return str(screen.query_one("#err-" + field_id(path)).render())


@pytest.mark.slow
async def test_compose_switches_quickstart_to_fsdp_on_two_processes(store: Store) -> None:
    """The whole form is one recipe: strategy fsdp + processes 2 is valid, whichever is set first."""
    app = make_app(store)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("2")
        await wait_for(pilot, lambda: isinstance(app.screen, ComposeScreen), what="compose")
        screen = app.screen
        assert screen.valid
        nproc = screen.query_one("#" + field_id("launch.nproc"), Input)
        nproc.value = "2"  # processes first: single with 2 processes is wrong, next to the field
        await pilot.pause()
        assert not screen.valid and "nproc = 2" in error_of(screen, "launch.nproc")
        screen.query_one("#" + field_id("launch.strategy")).value = "fsdp"
        await pilot.pause()
        assert screen.valid, screen.errors
        assert error_of(screen, "launch.nproc") == "" and screen.recipe is not None
        assert (screen.recipe.launch.strategy, screen.recipe.launch.nproc) == ("fsdp", 2)
        # Two fields wrong at once: each gets its own message.
        screen.query_one("#" + field_id("train.batch_size"), Input).value = "0"
        screen.query_one("#" + field_id("launch.strategy")).value = "ddp"
        nproc.value = "1"
        await pilot.pause()
        assert "greater than 0" in error_of(screen, "train.batch_size")
        assert "at least 2" in error_of(screen, "launch.nproc")


@pytest.mark.slow
async def test_save_proposes_a_new_file_and_asks_before_overwriting(store: Store) -> None:
    shipped = Path("recipes/quickstart.toml")
    original = shipped.read_text()
    app = make_app(store)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("2")
        await wait_for(pilot, lambda: isinstance(app.screen, ComposeScreen), what="compose")
        app.screen.query_one("#" + field_id("train.max_steps"), Input).value = "7"
        await pilot.pause()
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: isinstance(app.screen, PromptScreen), what="save prompt")
        assert app.screen.query_one("#prompt", Input).value == "recipes/quickstart-2.toml"
        await pilot.press("enter")
        await wait_for(pilot, lambda: Path("recipes/quickstart-2.toml").exists(), what="saved")
        assert "max_steps = 7" in Path("recipes/quickstart-2.toml").read_text()
        assert shipped.read_text() == original
        # Typing the loaded file's name asks first; "n" keeps the file with its comments.
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: isinstance(app.screen, PromptScreen), what="save prompt")
        app.screen.query_one("#prompt", Input).value = str(shipped)
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="overwrite question")
        assert "comments" in str(app.screen.query_one("Label").render())
        await pilot.press("n")
        await pilot.pause()
        assert shipped.read_text() == original


@pytest.mark.slow
async def test_launch_refused_by_the_preflight_shows_why_and_records_nothing(store: Store) -> None:
    app = make_app(store)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("2")
        await wait_for(pilot, lambda: isinstance(app.screen, ComposeScreen), what="compose")
        screen = app.screen
        screen.query_one("#" + field_id("train.precision")).value = "fp16"  # valid recipe, not on a CPU
        screen.query_one("#" + field_id("launch.device")).value = "cpu"
        await pilot.pause()
        assert screen.valid
        await pilot.press("ctrl+l")
        status = screen.query_one("#form-status")
        await wait_for(pilot, lambda: "not launched" in str(status.render()), what="refusal shown")
        assert "train.precision: fp16 needs a GPU" in str(status.render())
        assert store.list_runs() == []


def test_launch_checks_are_the_cli_preflight_with_gpu_warnings() -> None:
    """One pre-flight for ftui run and the TUI: the scripted GPUs get the CUDA mapping note."""
    from runner.preflight import launch_checks
    from runner.recipe import load_recipe

    recipe = load_recipe(ROOT / "recipes" / "quickstart.toml", ["launch.device=auto"])
    warnings = launch_checks(recipe, fake_gpus=8)
    assert any(w.startswith("GPUs (CUDA index -> physical): cuda:0 -> GPU 0") for w in warnings), warnings
    assert launch_checks(load_recipe(ROOT / "recipes" / "quickstart.toml", ["launch.device=cpu"])) == []
