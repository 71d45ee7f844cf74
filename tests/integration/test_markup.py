"""Text from a run or a user is shown as text, never parsed as markup.

A run named ``[/]`` must not crash ``ftui runs``, ``ftui compare`` or the dashboard (rich's
``MarkupError``), and ``ablation [v2]`` is listed whole, brackets included.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from textual.command import CommandList, CommandPalette
from textual.widgets import DataTable, Static

from store import Store
from tests.support import CliResult, run_in_process
from tests.support.dashboard import trainer_summary, wait_for
from tui.app import make_app
from tui.app.messages import RunsLoaded
from tui.app.screens.monitor import MonitorScreen
from tui.app.screens.runs import RunsScreen

ROOT = Path(__file__).resolve().parents[2]
NAMES = ["[/]", "ablation [v2]", "[bold red]loud[/] [link=x]y"]
ERROR = "boom [/] at [red]step[/] 3"


def add_run(store: Store, name: str, status: str = "completed") -> int:
    """A run recorded through the real store API, with metrics, an error and tags that look like markup, and
    its trainer's summary (compared without importing transformers)."""
    from runner.spec.recipe import load_recipe

    recipe = load_recipe(ROOT / "recipes" / "quickstart.toml", [f"name={json.dumps(name)}"])
    run_id = store.create_run(name=name, recipe_text=recipe.to_toml(), recipe_hash=recipe.digest(),
                              strategy="single", nproc=1, method="lora", model=recipe.model.name, run_dir="")
    store.ingest(run_id, [{"seq": i, "type": "step", "time": 1000.0 + i, "step": i, "loss": 5.0 - 0.1 * i,
                           "tokens_per_s": 1000.0, "step_time": 0.5} for i in range(1, 4)])
    store.update_run(run_id, status=status, final_loss=4.7, tokens_per_s=1000.0, train_seconds=1.5,
                     error=ERROR if status == "failed" else None, summary=trainer_summary())
    return run_id


def test_runs_show_compare_print_markup_like_names_verbatim(store: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The commands' own output, through ``main`` in this process (the same handlers and printing)."""
    ids = [add_run(store, name, status="failed" if i == 0 else "completed") for i, name in enumerate(NAMES)]
    monkeypatch.setenv("FTUI_DB", store.url)
    monkeypatch.setenv("COLUMNS", "250")

    def ftui(*args: str) -> CliResult:
        return run_in_process(capsys, *args)

    runs = ftui("runs")
    assert runs.returncode == 0, runs.stderr
    for name in NAMES:
        assert name in runs.stdout, (name, runs.stdout)
    show = ftui("show", str(ids[0]))
    assert show.returncode == 0, show.stderr
    assert ERROR in show.stdout, show.stdout
    cmp = ftui("compare", *map(str, ids))
    assert cmp.returncode == 0, cmp.stderr
    for name in NAMES:  # the recipe diff lists the names as they are
        assert name in cmp.stdout, (name, cmp.stdout)
    assert "Traceback" not in runs.stderr + show.stderr + cmp.stderr


def test_rich_renderings_keep_brackets(store: Store) -> None:
    """In process too: the rendered text of every table contains the names."""
    from rich.console import Console

    from runner.analysis.compare import load_comparison
    from tui.render.compare import rich_table
    from tui.render.report import run_detail, runs_table

    ids = [add_run(store, name, status="failed") for name in NAMES]
    console = Console(width=250, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    console.print(runs_table(store.list_runs()))
    console.print(run_detail(store.get_run(ids[0]), store.metrics(ids[0])))  # type: ignore[arg-type]
    console.print(rich_table(load_comparison(store, ids)))
    text = console.export_text()
    for name in NAMES:
        assert name in text
    assert ERROR in text


async def test_runs_screen_and_monitor_show_markup_like_names(store: Store) -> None:
    ids = [add_run(store, name, status="failed") for name in NAMES]
    store.update_run(ids[1], tags=["[v2]", "[/]"], note="see [/] and [b]this[/b]")
    seen: list = []
    app = make_app(store, refresh_s=0.2)
    async with app.run_test(size=(160, 40), message_hook=seen.append) as pilot:
        await wait_for(pilot, lambda: any(isinstance(m, RunsLoaded) for m in seen))
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, RunsScreen)
        table = screen.query_one(DataTable)
        cells = {str(c) for i in range(table.row_count) for c in table.get_row_at(i)}
        for name in NAMES:  # cells are plain Text: what is shown is the name as written
            assert name in cells, cells
        assert any(c.startswith("[v2],[/]") for c in cells), cells  # the tags (then " · " and the note)
        await pilot.press("slash", *"[v2]", "enter")  # the filter matches the literal brackets
        await wait_for(pilot, lambda: table.row_count == 1, what="the filter to leave one row")
        assert str(table.get_row_at(0)[2]) == "ablation [v2]"
        await pilot.press("slash", "end", *["backspace"] * len("[v2]"), "enter")
        await wait_for(pilot, lambda: table.row_count == len(NAMES), what="the cleared filter")
        for run_id, name in zip(ids, NAMES, strict=True):
            app.open_run(run_id)
            await wait_for(pilot, lambda: isinstance(app.screen, MonitorScreen) and app.screen.snapshot is not None)
            monitor = app.screen
            progress = str(monitor.query_one("#progress", Static).render())
            assert name in progress and ERROR in progress, progress
            assert name in str(monitor.sub_title)
            await pilot.press("escape")
            await wait_for(pilot, lambda: isinstance(app.screen, RunsScreen))
        # The palette lists "Open run N <name>" (its titles are markup: the name is escaped).
        await pilot.press("ctrl+p")
        await wait_for(pilot, lambda: isinstance(app.screen, CommandPalette), what="the palette")
        await pilot.press(*"ablation")
        hits = app.screen.query_one(CommandList)

        def prompts() -> list[str]:
            return [str(getattr(hits.get_option_at_index(i).prompt, "plain", "")) for i in range(hits.option_count)]
        await wait_for(pilot, lambda: any("ablation [v2]" in p for p in prompts()), what="the palette's hit")
        await pilot.press("escape")
