"""What the dashboard's tests share: a store in a home of the test's own, a wait on what the app shows
(never on time alone), a finished run written by hand, and the checks of the Compare screen.

Registered in tests/conftest.py (``pytest_plugins``) for the ``store`` fixture; a test module that needs
another store (pre-filled, in another folder) defines its own ``store``, which takes precedence.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import DataTable

from store import Store
from tests.support import QUICKSTART, ROOT

NO_WATCHER_CHECK = float("inf")
"""``make_app(watcher_check_s=)`` for a store whose ``running`` runs are written by hand: the dashboard's
check for dead watchers (which would settle them as failed, at a time that depends on the machine's load)
never runs; tests/integration/test_dashboard_watcher_gone.py tests the check itself."""
ONE_READ_S = 3600.0
"""``make_app(monitor_s=)`` for a screenshot of a running run: the Monitor and Devices feeds read once. Each read
of a running run adds a sample to the devices' history, so a second read (due whenever the machine is slow)
would draw one more point."""


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    """An empty store in ``tmp_path``, which is also ``FTUI_HOME``; the working folder is the repository."""
    monkeypatch.setenv("FTUI_HOME", str(tmp_path))
    monkeypatch.delenv("FTUI_DB", raising=False)
    monkeypatch.chdir(ROOT)
    return Store(f"sqlite:///{tmp_path}/ftui.db")


async def wait_for(pilot: Any, predicate: Callable[[], object], timeout: float = 60.0,
                   what: str = "condition") -> None:
    """Let the app run until ``predicate()`` holds; fail naming ``what`` after ``timeout`` seconds (a bound
    for a loaded machine, not a wait)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        await pilot.pause(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def painted(app: Any) -> bool:
    """Nothing left to lay out or paint on the app's screen: no layout, scroll, repaint or recompose pending, no
    dirty widget, and no table with cells or rows whose column widths are still to be computed (a table sizes
    its columns when idle, then asks for a layout). Read from Textual's own flags (textual 8:
    ``Screen._on_idle`` and ``DataTable._on_idle`` test the same ones)."""
    screen = app.screen
    if (screen._layout_required or screen._scroll_required or screen._repaint_required
            or screen._recompose_required or screen._dirty_widgets):
        return False
    return not any(t._updated_cells or t._new_rows or t._require_update_dimensions for t in screen.query(DataTable))


async def repaint_whole(pilot: Any) -> None:
    """Paint the screen whole from what its tables hold now, then wait until it is painted: each table's
    rendered lines are cached per update (``DataTable._clear_caches`` drops them), and a line rendered
    before the last column sizing could otherwise stay on screen (a header or first row of the narrower
    columns, seen under load)."""
    await wait_painted(pilot)
    for table in pilot.app.screen.query(DataTable):
        table._clear_caches()
        table.refresh()
    pilot.app.screen.refresh(layout=True, repaint=True)
    await wait_painted(pilot)


async def wait_painted(pilot: Any) -> None:
    """Let the app run until :func:`painted` holds twice in a row with a turn of its loop between, so that a
    repaint the last one scheduled is done too."""
    await pilot.wait_for_scheduled_animations()
    for _ in range(2):
        await pilot.pause()
        await wait_for(pilot, lambda: painted(pilot.app), what="the screen painted")


async def screenshot(pilot: Any) -> str:
    """The SVG of the screen as pytest-textual-snapshot's ``snap_compare`` takes it (textual's
    ``take_svg_screenshot``: the same pauses and animation waits, then ``export_screenshot`` simplified)."""
    await pilot.pause()
    await pilot.wait_for_scheduled_animations()
    await pilot.pause()
    await pilot.pause()
    await pilot.wait_for_scheduled_animations()
    return str(pilot.app.export_screenshot(title=pilot.app.title, simplify=True))


async def snap_sizes(snapshot: Any, request: pytest.FixtureRequest, app: Any, sizes: Sequence[tuple[int, int]],
                     show: Callable[[Any], Awaitable[None]], again: Callable[[Any], Awaitable[None]] | None = None,
                     leave: Callable[[Any], Awaitable[None]] | None = None, prefix: str = "") -> None:
    """Snapshots of one app at each of ``sizes``, in the files ``snap_compare`` writes for a test parametrized
    by size (``test_x[120x40].svg``, ``test_x[8gpu-80x24].svg`` with ``prefix="8gpu-"``): the app starts at the
    first size; ``show(pilot)`` brings up what is pictured; before each next size ``leave(pilot)`` (if given)
    undoes what must be opened at that size (a modal), the terminal is resized, and ``again(pilot)`` (``show``
    when not given) waits for the screen to settle at the new size and opens it again. One
    app for all sizes: Textual's start and the store's first reads are paid once. Every size is compared (and
    written under ``--snapshot-update``) before the test fails on the ones that differ; each one's comparison
    goes to pytest-textual-snapshot's report as ``snap_compare``'s does."""
    from pytest_textual_snapshot import SVGImageExtension

    assertion = snapshot.use_extension(SVGImageExtension)
    differ = []
    async with app.run_test(size=sizes[0], notifications=True, tooltips=True) as pilot:
        for n, (width, height) in enumerate(sizes):
            if n:
                if leave is not None:
                    await leave(pilot)
                await pilot.resize_terminal(width, height)
            await (show if n == 0 or again is None else again)(pilot)
            name = f"{prefix}{width}x{height}"
            svg = await screenshot(pilot)
            if not _compared(assertion, request, name, svg):
                differ.append(name)
    assert not differ, f"snapshots that differ: {differ} (see snapshot_report.html)"


def _compared(assertion: Any, request: pytest.FixtureRequest, name: str, svg: str) -> bool:
    """``svg`` against the snapshot ``name`` of this test; the outcome written where pytest-textual-snapshot's
    report reads it (a pickle per comparison in its session folder), as its ``snap_compare`` writes it."""
    from pytest_textual_snapshot import PseudoApp, PseudoConsole, node_to_report_path
    from rich.console import Console

    same = bool(assertion(name=name) == svg)
    console = Console(legacy_windows=False, force_terminal=True)
    node = request.node
    path, line, test_name = node.reportinfo()
    index = assertion._execution_name_index.get(name, assertion.num_executions - 1)
    result = assertion.executions.get(index)
    exists = bool(result is not None and result.final_data is not None)
    data = (same, str(assertion), svg, PseudoApp(PseudoConsole(console.legacy_windows, console.size)), path, line,
            f"{test_name}[{name}]", node.function.__doc__ or "", "", exists)
    report = node_to_report_path(node)
    report.with_name(f"{report.name}_{name}").write_bytes(pickle.dumps(data))
    return same


QUICKSTART_DIMS = {"layers": 6, "heads": 6, "head_dim": 64, "seq_len": 256, "embedding_params": 1572864}
"""What the trainer stores as ``summary.model_dims`` for quickstart's ``builtin:tiny-llama`` at context 256
(``runner.analysis.run_figures.model_dims`` of the recipe gives the same)."""
QUICKSTART_ESTIMATE_BYTES = 232254976
"""The planner's per-device estimate the trainer stores for quickstart (single, LoRA): what
``runner.analysis.run_figures.estimated_memory`` computes from the recipe."""


def trainer_summary(estimate_bytes: int = QUICKSTART_ESTIMATE_BYTES) -> dict[str, Any]:
    """The figures a run's trainer stores in its summary (model dimensions, the planner's estimate), so that
    comparing it reads them rather than building the model's config through transformers and torch (about
    7 s of CPU to import; a run stored without them is compared in tests/integration/test_store_scale.py)."""
    return {"model_dims": QUICKSTART_DIMS, "estimate": {"per_device_bytes": {"total": estimate_bytes}}}


def add_finished_run(store: Store, name: str, lr: float) -> int:
    """A completed quickstart run with five logged steps and its trainer's summary, written straight into
    the store."""
    from runner.spec.recipe import load_recipe

    recipe = load_recipe(QUICKSTART, [f"name={name}", f"train.lr={lr}"])
    run_id = store.create_run(name=name, recipe_text=recipe.to_toml(), recipe_hash=recipe.digest(),
                              strategy="single", nproc=1, method="lora", model=recipe.model.name, run_dir="")
    store.ingest(run_id, [{"seq": i, "type": "step", "time": 1000.0 + i, "step": i, "loss": 5.0 - 0.1 * i * lr * 1000,
                           "tokens_per_s": 1000.0, "step_time": 0.5} for i in range(1, 6)])
    store.update_run(run_id, status="completed", final_loss=4.0, tokens_per_s=1000.0, train_seconds=2.5,
                     summary=trainer_summary())
    return run_id


def assert_compare(screen: Any, run_ids: list[int], diff_fields: list[str]) -> None:
    """The compare screen shows the figures of ``ftui compare`` (one column per run), where each
    comes from, only the recipe fields that differ, and the loss against the step."""
    table = screen.query_one("#compare-table", DataTable)
    assert [str(c.label).rstrip(" *") for c in table.columns.values()] == ["figure"] + [f"run {i}" for i in run_ids]
    figures = [str(table.get_row_at(i)[0]) for i in range(table.row_count)]
    assert {"tokens/s", "MFU", "final loss", "status"} <= set(figures), figures
    sources = str(screen.query_one("#compare-sources").render())
    assert "measured by the trainer" in sources and "sources:" in sources, sources
    diff = screen.query_one("#diff", DataTable)
    assert [diff.get_row_at(i)[0] for i in range(diff.row_count)] == diff_fields
    plot = screen.query_one("#compare-loss")
    assert plot.x_label == "step" and len(plot.points) == len(run_ids)
    steps = [x for _name, pts in plot.points for x, _y in pts]
    assert steps and min(steps) >= 1  # steps as logged, not list positions
