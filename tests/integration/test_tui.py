"""Pilot tests of the Textual app over a real store: Runs, Compose, Compare, the store opening late or not at all."""

from __future__ import annotations

from pathlib import Path

from textual.widgets import DataTable, Input

from store import Store
from tests.support.dashboard import add_finished_run, assert_compare, wait_for
from tui.app import make_app
from tui.app.messages import RunsLoaded
from tui.app.screens.compare import CompareScreen
from tui.app.screens.compose import ComposeScreen, field_id
from tui.app.screens.modals import PromptScreen
from tui.app.screens.monitor import MonitorScreen
from tui.app.screens.runs import RunsScreen


async def test_runs_screen_filter_sort_tags_note_compare_delete(store: Store) -> None:
    a = add_finished_run(store, "alpha", 1e-3)
    b = add_finished_run(store, "beta", 2e-3)
    seen: list = []
    app = make_app(store, refresh_s=0.2)
    async with app.run_test(size=(120, 40), message_hook=seen.append) as pilot:
        await wait_for(pilot, lambda: any(isinstance(m, RunsLoaded) for m in seen), what="runs loaded")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, RunsScreen)
        table = screen.query_one(DataTable)
        assert table.row_count == 2
        # filter
        await pilot.press("slash", *"beta", "enter")
        await pilot.pause()
        assert table.row_count == 1 and screen.current_id() == b
        screen.query_one("#filter", Input).value = ""
        await pilot.pause()
        assert table.row_count == 2
        # s reverses the sort, then moves to the next
        await pilot.press("s")
        assert (screen.sort_column, screen.sort_descending) == ("id", False)
        # tags and note through the prompts
        await pilot.press("t", *"lr,sweep", "enter")
        await pilot.press("n", *"first try", "enter")

        def edited() -> bool:  # written by a thread worker
            run = store.get_run(screen.current_id() or 0)
            return run is not None and run.tags == ["lr", "sweep"] and run.note == "first try"

        await wait_for(pilot, edited, what="tags and note saved")
        tags = list(table.columns).index("tags · note")  # type: ignore[arg-type]
        await wait_for(pilot, lambda: "lr,sweep · first try" in [str(table.get_row_at(i)[tags])
                                                          for i in range(table.row_count)],
                       what="tags shown")
        # the palette lists the runs the screen loaded (no store read per keystroke)
        assert {r.id for r in app.runs} == {a, b}
        # select both, compare
        await pilot.press("space", "up", "space")
        await pilot.pause()
        assert screen.selected == {a, b}, (screen.selected, app.focused)
        await pilot.press("c")
        await wait_for(pilot, lambda: isinstance(app.screen, CompareScreen), what="compare screen")
        await wait_for(pilot, lambda: app.screen.query_one("#diff", DataTable).row_count > 0, what="diff")
        assert_compare(app.screen, [a, b], ["name", "train.lr"])
        await pilot.press("escape")
        # delete with confirmation (n keeps it, y deletes)
        await pilot.press("d", "n")
        await pilot.pause()
        assert len(store.list_runs()) == 2
        await pilot.press("d", "y")
        await wait_for(pilot, lambda: len(store.list_runs()) == 1, what="delete")
        assert {r.id for r in store.list_runs()} <= {a, b}


async def test_compose_validates_as_you_type(store: Store) -> None:
    app = make_app(store)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("2")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, ComposeScreen)
        assert screen.valid
        batch = screen.query_one("#" + field_id("train.batch_size"), Input)
        err = screen.query_one("#err-" + field_id("train.batch_size"))
        batch.value = "0"
        await pilot.pause()
        assert not screen.valid and "greater than 0" in str(err.render())
        batch.value = "abc"
        await pilot.pause()
        assert "valid integer" in str(err.render())
        batch.value = "4"
        await pilot.pause()
        assert screen.valid and str(err.render()) == ""
        # a cross-field problem (ddp with one process) is attributed to launch.nproc
        screen.query_one("#" + field_id("launch.strategy")).value = "ddp"
        await pilot.pause()
        assert not screen.valid
        assert "at least 2" in str(screen.query_one("#err-" + field_id("launch.nproc")).render())
        screen.query_one("#" + field_id("launch.strategy")).value = "single"
        await pilot.pause()
        assert screen.valid
        # the launch command is built in a thread worker (typing never waits on it)
        await wait_for(pilot, lambda: "runner.rank.solo_launch" in str(screen.query_one("#preview").render()),
                       what="launch preview")
        # the estimate comes from a thread worker (debounced): runner.planner via the model's config
        await wait_for(pilot, lambda: "recommended" in str(screen.query_one("#estimate").render()), what="estimate")
        assert "builtin config" in str(screen.query_one("#estimate").render())
        # an invalid form does not keep showing the last valid command
        batch.value = "0"
        await pilot.pause()
        preview = str(screen.query_one("#preview").render())
        assert "accelerate" not in preview and "waiting for the fields in red" in preview
        assert str(screen.query_one("#estimate").render()) == ""
        batch.value = "4"
        await wait_for(pilot, lambda: "runner.rank.solo_launch" in str(screen.query_one("#preview").render()),
                       what="launch preview")
        # device and gradient checkpointing are fields too (a TOML boolean, not the string "true")
        screen.query_one("#" + field_id("launch.device")).value = "cpu"
        screen.query_one("#" + field_id("train.gradient_checkpointing")).value = "true"
        await pilot.pause()
        assert screen.valid and screen.recipe is not None
        assert screen.recipe.launch.device == "cpu" and screen.recipe.train.gradient_checkpointing is True


async def test_monitor_logs_toggle_at_80_columns(store: Store) -> None:
    """Under 100 columns the rank logs are hidden; l shows them, l again hides them."""
    run_id = add_finished_run(store, "alpha", 1e-3)
    run_dir = Path(store.url.removeprefix("sqlite:///")).parent / "run-alpha"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "logs" / "rank0.log").write_text("rank 0 says hello\n")
    store.update_run(run_id, run_dir=str(run_dir))
    app = make_app(store, refresh_s=0.2, monitor_s=0.2)
    async with app.run_test(size=(80, 24)) as pilot:
        app.open_run(run_id)
        await wait_for(pilot, lambda: isinstance(app.screen, MonitorScreen) and app.screen.snapshot is not None,
                       what="monitor")
        logs = app.screen.query_one("#logs")
        assert not logs.display
        await pilot.press("l")
        await pilot.pause()
        assert logs.display and logs.region.width > 0
        await pilot.press("l")
        await pilot.pause()
        assert not logs.display


async def test_compose_palette_goes_to_a_field(store: Store) -> None:
    """ctrl+p "max steps" Enter focuses the field; keys typed then edit it and the form revalidates."""
    app = make_app(store)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("2")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, ComposeScreen)
        await pilot.press("ctrl+p")
        await pilot.pause()
        await pilot.press(*"go to field: max steps")
        await wait_for(pilot, lambda: "Go to field: max steps" in str(app.screen.query("CommandList").first()
                                                                        .get_option_at_index(0).prompt),
                       what="the palette's first hit")
        await pilot.press("enter")
        await pilot.pause()
        field = screen.query_one("#" + field_id("train.max_steps"), Input)
        assert app.screen is screen and screen.focused is field
        await pilot.press("ctrl+u", "1", "2")
        await pilot.pause()
        assert field.value == "12" and screen.valid
        assert screen.recipe is not None and screen.recipe.train.max_steps == 12


async def test_compose_save_and_load(store: Store, tmp_path: Path) -> None:
    app = make_app(store)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("2")
        await pilot.pause()
        screen = app.screen
        screen.query_one("#" + field_id("train.max_steps"), Input).value = "7"
        path = tmp_path / "mine.toml"
        await pilot.press("ctrl+s")  # asks where, a new file by default
        await wait_for(pilot, lambda: isinstance(app.screen, PromptScreen), what="save prompt")
        app.screen.query_one("#prompt", Input).value = str(path)
        await pilot.press("enter")
        await wait_for(pilot, lambda: path.exists(), what="saved")
        screen.query_one("#recipe-path", Input).value = str(path)
        from runner.spec.recipe import load_recipe

        assert load_recipe(path).train.max_steps == 7
        screen.query_one("#" + field_id("train.max_steps"), Input).value = "9"
        await pilot.press("ctrl+o")
        await pilot.pause()
        assert screen.query_one("#" + field_id("train.max_steps"), Input).value == "7"


async def test_dashboard_paints_before_the_store_opens_and_fills_from_it(store: Store, tmp_path: Path) -> None:
    """``ftui``'s app: the Runs screen is on screen while the store is still being opened (by its worker),
    says so instead of "No runs yet", then shows the store's runs; the probe is not made before it is used."""
    from tui.app.app import dashboard

    add_finished_run(store, "alpha", 1e-3)
    store.close()
    app = dashboard(f"sqlite:///{tmp_path}/ftui.db")
    assert app._store is None and app._probe is None
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen
        assert isinstance(screen, RunsScreen)
        if not screen.loaded:  # the first frame came before the store answered
            assert not screen.has_class("-empty")
            assert "reading the store" in str(screen.query_one("#runs-status").render())
        await wait_for(pilot, lambda: screen.loaded, what="runs loaded")
        await pilot.pause()
        table = screen.query_one("#runs-table", DataTable)
        assert table.row_count == 1 and str(table.get_row_at(0)[2]) == "alpha"
        assert app._store is not None and app._probe is None
    app.store.close()


async def test_dashboard_over_a_store_that_cannot_open_exits_2_with_one_line(tmp_path: Path) -> None:
    """A --db that is a folder: the app ends with exit code 2 and the store's one line, as ``ftui runs``
    does (tests/integration/test_cli_db.py), instead of polling a store that is not there."""
    from tui.app.app import dashboard

    app = dashboard(f"sqlite:///{tmp_path}")
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.return_code is not None or app._exit_renderables, timeout=30,
                       what="the app to exit")
    assert app.return_code == 2
    assert app.store_error is not None
    assert str(app.store_error) == f"--db sqlite:///{tmp_path}: {tmp_path} is a folder, not a database file"


async def test_monitor_shows_where_each_rank_was_as_text(store: Store) -> None:
    """A run whose watcher asked its ranks for their stacks: the Monitor says where each was, as text."""
    run_id = add_finished_run(store, "alpha", 1e-3)
    where = "rank 0 in tokenize (runner/data/[bold]blocks.py:80); rank 1 in all_reduce (runner/rank/loop.py:412)"
    store.update_run(run_id, summary={"stacks": {"cause": "hang", "ranks": {}, "summary": where, "folder": "x"}})
    app = make_app(store, refresh_s=0.2, monitor_s=0.2)
    async with app.run_test(size=(120, 30)) as pilot:
        app.open_run(run_id)
        await wait_for(pilot, lambda: isinstance(app.screen, MonitorScreen) and app.screen.snapshot is not None,
                       what="monitor")
        screen = app.screen
        assert isinstance(screen, MonitorScreen) and screen.snapshot is not None
        assert f"stacks at the hang: {where}" in screen.progress_text(screen.snapshot).plain
