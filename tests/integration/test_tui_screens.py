"""Pilot tests of the Runs, Monitor, Compare and Devices screens' layout and keys over a real store:
Compare fits three runs at 120 columns and two at 80 and moves between runs with Left/Right at once;
the Runs cursor follows its run, not its row; sort direction; the queue under the Runs table; the Monitor's
empty logs and memory."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from rich.text import Text
from textual.widgets import DataTable, Static

from runner.hardware import DeviceSample
from runner.spec.recipe import load_recipe
from runner.spec.status import NOT_STARTED
from store import Store
from store import queue as entries_store
from tests.support import QUICKSTART
from tests.support.dashboard import NO_WATCHER_CHECK, wait_for
from tui.app import make_app
from tui.app.screens.compare import CompareScreen
from tui.app.screens.monitor import MonitorScreen

DIMS = {"layers": 6, "heads": 6, "head_dim": 64, "seq_len": 256, "embedding_params": 1572864}
PEAK = {"flops": 250e9, "source": "measured matmul peak (CPU), fp32", "kind": "measured", "dtype": "fp32",
        "threads": 1, "measured_at": 1795447228.6, "fingerprint": "x", "machine": "test", "size": 512, "load": 0.5}
LONG_PATH = "/data/checkpoints/" + "a-very-long-folder-name/" * 6 + "step-000120"
LONG_METHOD = "lora (rank 16, alpha 32, dropout 0.05, targets q_proj, k_proj, v_proj, o_proj)"


def add_run(store: Store, name: str, lr: float, *overrides: str, tokens_per_s: float = 1000.0,
            nproc: int = 1, strategy: str = "single", steps: int = 5, method: str = "lora") -> int:
    """A completed quickstart run with ``steps`` logged steps, written straight into the store."""
    recipe = load_recipe(QUICKSTART, [f"name={name}", f"train.lr={lr}", *overrides])
    run_id = store.create_run(name=name, recipe_text=recipe.to_toml(), recipe_hash=recipe.digest(),
                              strategy=strategy, nproc=nproc, method=method, model=recipe.model.name, run_dir="")
    store.ingest(run_id, [{"seq": i, "type": "step", "time": 1000.0 + i, "step": i, "loss": 5.0 - 0.1 * i,
                           "tokens_per_s": tokens_per_s, "step_time": 0.5} for i in range(1, steps + 1)])
    # The figures the trainer stores (model dimensions, the estimate, the CPU peak): the comparison reads
    # them rather than building the model's config through transformers (10 s of imports).
    store.update_run(run_id, status="completed", final_loss=4.0, tokens_per_s=tokens_per_s, train_seconds=2.5,
                     summary={"model_dims": DIMS, "estimate": {"per_device_bytes": {"total": 125820416}},
                              "mfu_peak": PEAK, "params": 12587904, "trainable_params": 122880})
    return run_id


def visible_columns(table: DataTable[Any]) -> list[str]:
    """The labels of the columns wholly inside the table's visible width (after its sideways scroll)."""
    left, shown = int(table.scroll_x), []
    x = 0
    for column in table.columns.values():
        width = column.get_render_width(table)
        fixed = column is next(iter(table.columns.values()))
        start = x if fixed else x - left
        if start >= 0 and start + width <= table.scrollable_content_region.width:
            shown.append(str(column.label).rstrip(" *"))
        x += width
    return shown


async def open_compare(app: Any, pilot: Any, ids: list[int]) -> CompareScreen:
    app.push_screen(CompareScreen(ids))
    await wait_for(pilot, lambda: isinstance(app.screen, CompareScreen) and app.screen.comparison is not None,
                   what="the comparison")
    await pilot.pause()
    return app.screen  # type: ignore[return-value]


async def test_compare_fits_three_runs_at_120_columns_and_cuts_long_values(store: Store) -> None:
    """Three runs side by side at 120x40, one with a long resume path and a long method: each cell ends
    in an ellipsis, its full text is listed under the table, and the recipe table stays clear of the loss
    chart."""
    ids = [add_run(store, "alpha", 1e-3), add_run(store, "beta", 2e-3, f"train.resume_from={LONG_PATH}"),
           add_run(store, "gamma", 3e-3, method=LONG_METHOD)]
    app = make_app(store, refresh_s=0.2)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await open_compare(app, pilot, ids)
        table = screen.query_one("#compare-table", DataTable)
        await wait_for(pilot, lambda: visible_columns(table) == ["figure", *(f"run {i}" for i in ids)],
                       what=f"three runs side by side, not {visible_columns(table)}")
        diff = screen.query_one("#diff", DataTable)
        row = [str(c) for c in diff.get_row("train.resume_from")]
        assert row[2].endswith("…") and LONG_PATH.startswith(row[2][:-1]), row
        method = [str(c) for c in table.get_row("method")]  # a long figure: cut, with its footnote's number
        cut = re.sub(r" \[\d+\]$", "", method[3])
        assert cut.endswith("…") and LONG_METHOD.startswith(cut[:-1]) and cut != method[3], method
        full = str(screen.query_one("#compare-full", Static).render())
        assert LONG_PATH in full, full
        notes = " ".join(str(w.render()) for w in screen.query(Static))  # the figure's footnote, in full
        assert LONG_METHOD in notes, notes
        plot = screen.query_one("#compare-loss")
        assert diff.virtual_size.width <= diff.scrollable_content_region.width
        assert diff.region.right < plot.region.x


async def test_compare_moves_between_runs_with_right_at_once(store: Store) -> None:
    """Eight runs at 80x24, more than fit: the table has the focus, so Right (no Tab first) moves a run at
    a time and scrolls the last run into view, the figure names staying on the left."""
    ids = [add_run(store, f"run-{i}", 1e-3 * (i + 1)) for i in range(8)]
    app = make_app(store, refresh_s=0.2)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await open_compare(app, pilot, ids)
        table = screen.query_one("#compare-table", DataTable)
        assert app.focused is table
        await wait_for(pilot, lambda: visible_columns(table)[:3] == ["figure", f"run {ids[0]}", f"run {ids[1]}"],
                       what="the first two runs")
        assert f"run {ids[-1]}" not in visible_columns(table)
        await pilot.press(*["right"] * 7)
        await wait_for(pilot, lambda: f"run {ids[-1]}" in visible_columns(table),
                       what=f"the last run in view, not {visible_columns(table)}")
        assert table.cursor_column == 8 and visible_columns(table)[0] == "figure"
        assert isinstance(table.get_cell_at(table.cursor_coordinate), Text)
        # Down still scrolls the screen to the sources and the recipe table below (the table passes it on).
        await pilot.press("down", "down", "down")
        await wait_for(pilot, lambda: screen.query_one("#compare").scroll_y > 0, what="the screen scrolled down")
        assert app.focused is table


async def runs_screen(app: Any, pilot: Any, rows: int) -> Any:
    from tui.app.screens.runs import RunsScreen

    await wait_for(pilot, lambda: isinstance(app.screen, RunsScreen)
                   and app.screen.query_one(DataTable).row_count == rows, what=f"{rows} runs listed")
    return app.screen


async def test_runs_cursor_stays_on_its_run_when_a_run_is_added(store: Store) -> None:
    """The cursor is on run 2 (the second row, newest first); a new run lands on top from the poll: the
    cursor is still on run 2, a row lower, so that R or enter act on the run the user chose."""
    ids = [add_run(store, f"run-{i}", 1e-3) for i in range(3)]
    app = make_app(store, refresh_s=0.2)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await runs_screen(app, pilot, 3)
        await pilot.press("down")
        assert screen.current_id() == ids[1]
        new = add_run(store, "newest", 2e-3)
        await runs_screen(app, pilot, 4)
        table = screen.query_one(DataTable)
        assert screen.current_id() == ids[1] and table.cursor_row == 2, (screen.current_id(), table.cursor_row)
        assert screen.current_run().id != new


async def test_runs_sort_reverses_on_a_second_press_and_shows_its_direction(store: Store) -> None:
    """s moves to the next sort in its first direction, s again reverses it; the sorted column's header
    ends with the arrow; runs without the figure stay last; the strategy shows its process count."""
    slow = add_run(store, "slow", 1e-3, tokens_per_s=500.0, nproc=2, strategy="ddp")
    fast = add_run(store, "fast", 1e-3, tokens_per_s=4000.0)
    mid = add_run(store, "mid", 1e-3, tokens_per_s=1500.0)
    app = make_app(store, refresh_s=0.2)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await runs_screen(app, pilot, 3)
        table = screen.query_one(DataTable)

        def order() -> list[int]:
            return [int(str(table.get_row_at(i)[1])) for i in range(table.row_count)]

        def header(key: str) -> str:
            return str(table.columns[key].label)  # type: ignore[index]

        assert order() == [mid, fast, slow] and header("id") == "id ↓"
        strategy = list(table.columns).index("strategy")  # type: ignore[arg-type]
        assert str(table.get_row(str(slow))[strategy]) == "ddp x2"
        await pilot.press("s")
        assert (screen.sort_column, screen.sort_descending) == ("id", False) and order() == [slow, fast, mid]
        assert header("id") == "id ↑"
        for _ in range(6):  # name ↑, name ↓, status ↑, status ↓, wall time ↓, wall time ↑
            await pilot.press("s")
        await pilot.press("s")
        await pilot.pause()
        assert screen.sort_column == "tokens/s" and order() == [fast, mid, slow], order()
        assert header("tokens/s") == "tokens/s ↓" and header("id") == "id"
        await pilot.press("s")
        await pilot.pause()
        assert order() == [slow, mid, fast] and header("tokens/s") == "tokens/s ↑"


async def test_monitor_of_a_finished_cpu_run(store: Store, tmp_path: Path) -> None:
    """A finished run on CPU whose last rank sample read RSS 0 (its rank had exited) and whose log is
    empty: the rank table shows the last real RSS, marked as the last sample; the memory history is
    green at 3% of the host; the step axis has whole ticks; the rank table sits right under the device
    table (no band of empty rows at 120x40); l says there is no log line yet, and where it looked. Its two
    ranks held the whole parameters under FSDP: the sharding verdict says so, in red."""
    run_id = add_run(store, "finished", 1e-3, steps=30, strategy="fsdp", nproc=2)
    held = {"param_bytes": 40 * 2**20, "param_whole_bytes": 40 * 2**20, "grad_bytes": 2**20,
            "grad_whole_bytes": 2 * 2**20, "optimizer_bytes": 2 * 2**20, "optimizer_whole_bytes": 4 * 2**20}
    store.update_run(run_id, summary={"ranks": [{"rank": i, **held} for i in range(2)]})
    run_dir = tmp_path / "run-finished"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "logs" / "rank0.log").write_text("")
    store.update_run(run_id, run_dir=str(run_dir))
    total = 16 * 2**30
    samples = [DeviceSample(1000.0 + k, "box", "rank", 0, "rank 0", 90.0, rss, total, None, None, None, "psutil", 4242)
               for k, rss in enumerate([480 * 2**20, 500 * 2**20, 0])]
    samples += [DeviceSample(1000.0 + k, "box", "host", -1, "host CPU (2 cores)", 40.0, 6 * 2**30, total, None,
                             None, None, "psutil", None) for k in range(3)]
    store.add_samples(run_id, samples, [])
    app = make_app(store, refresh_s=0.2, monitor_s=0.2)
    async with app.run_test(size=(120, 40)) as pilot:
        app.open_run(run_id)
        await wait_for(pilot, lambda: isinstance(app.screen, MonitorScreen) and app.screen.snapshot is not None
                       and app.screen.query_one("#ranks", DataTable).row_count == 1, what="the monitor's tables")
        await pilot.pause()
        screen = app.screen
        ranks = screen.query_one("#ranks", DataTable)
        row = [str(c) for c in ranks.get_row("0")]
        assert row[3] == "500.0 MiB" and "last sample" in row[5], row
        devices = screen.query_one("#devices", DataTable)
        history = devices.get_row("rank:0")[list(devices.columns).index("mem history")]  # type: ignore[arg-type]
        assert isinstance(history, Text) and history.style == "green", history
        assert ranks.region.y == devices.region.bottom, (devices.region, ranks.region)
        verdict = screen.progress_text(screen.snapshot)
        shown = verdict.plain.splitlines()[-1]
        assert shown == ("sharding: optimizer sharded 1/2: yes; grads sharded 1/2: yes; params: NOT sharded (fsdp "
                         "promises 1/2; each rank holds 100%)"), shown
        assert verdict.spans[-1].style == "red"
        assert devices.region.height == devices.row_count + 1, devices.region  # its header and rows, no more
        plot = screen.query_one("#loss").render().plain.splitlines()
        axis = plot[next(i for i, line in enumerate(plot) if "└" in line) + 1].split()
        assert axis[0] == "1" and axis[-1] == "30" and all(tick.isdigit() for tick in axis), axis
        await pilot.press("l")
        await wait_for(pilot, lambda: any("no log lines yet for rank 0" in str(n.message) for n in app._notifications),
                       what="the empty-log notice")
        notice = next(str(n.message) for n in app._notifications if "no log lines" in str(n.message))
        assert notice.endswith(f"file {run_dir / 'logs' / 'rank0.log'}"), notice


class _FixedHost:
    """The host's psutil reading, scripted (the hardware boundary): load on this machine stays out."""

    def sample(self, pids_by_rank: Any, owners: Any = None) -> list[DeviceSample]:
        return [DeviceSample(0.0, "box", "host", -1, "host CPU (2 cores)", 37.0, 6 * 2**30, 16 * 2**30,
                             None, None, None, "psutil", None)]


async def test_devices_at_120_and_80_columns_cut_nothing_and_name_the_source(store: Store) -> None:
    """8 scripted GPUs, one process on them this one (psutil sees it): its CPU % is filled in from the
    second poll; at 120x40 the processes' title is one line; at 80x24 the GPU table fits and still names
    where its figures come from."""
    from runner.hardware import FakeNvml, NvmlBackend, Probe

    lib = FakeNvml.demo(8, pids=[os.getpid()], tick_s=None)
    probe = Probe(nvml=NvmlBackend(lib=lib, host="box"), processes=_FixedHost())  # type: ignore[arg-type]
    app = make_app(store, probe=probe, fake_gpus=8, refresh_s=0.2, monitor_s=0.2)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("3")
        await wait_for(pilot, lambda: getattr(app.screen, "snapshot", None) is not None, what="the devices")
        await pilot.pause()
        assert app.screen.query_one("#procs-title").region.height == 1
        procs = app.screen.query_one("#proc-table", DataTable)
        await wait_for(pilot, lambda: str(procs.get_row_at(0)[4]).isdigit(), what="the GPU process's CPU %")
        await pilot.resize_terminal(80, 24)
        await wait_for(pilot, lambda: app.screen.query_one("#gpu-table", DataTable).columns.get("temp") is not None
                       and "SM MHz" not in app.screen.query_one("#gpu-table", DataTable).columns, what="80 columns")
        await pilot.pause()
        gpus = app.screen.query_one("#gpu-table", DataTable)
        assert sum(c.get_render_width(gpus) for c in gpus.columns.values()) <= 78
        assert any("fake NVML" in str(c.label) for c in gpus.columns.values())


async def test_the_runs_screen_shows_the_queue_while_entries_wait_run_or_failed_to_start(store: Store) -> None:
    """Under the table, the queue's entries still to see to (running, waiting with their place in line, not
    started with the reason), read live from the store; hidden when there are none. Names stay text."""
    def add(name: str) -> int:
        return entries_store.add_entry(store, name=name, recipe_text="", recipe_source=f"{name}.toml",
                                       host="here", workdir="/", visible_devices=None, devices=["cpu"], options={})

    ended, running, waiting, failed = add("ended"), add("long"), add("[b]next[/b]"), add("vanished")
    for entry in (ended, running):
        entries_store.claim(store, entry)
    run_ids = [add_run(store, "ended", 1e-3), add_run(store, "long", 1e-3)]
    store.update_run(run_ids[1], status="running")
    entries_store.attach_run(store, ended, run_ids[0])
    entries_store.attach_run(store, running, run_ids[1])
    entries_store.finish(store, failed, NOT_STARTED, "launch.script: /x/train.py: no such file")
    app = make_app(store, refresh_s=0.2, watcher_check_s=NO_WATCHER_CHECK)
    async with app.run_test(size=(100, 30)) as pilot:
        section = app.screen.query_one("#runs-queue", Static)
        await wait_for(pilot, lambda: section.display, what="the queue section")
        lines = str(section.render()).splitlines()
        assert lines == ["queue (ftui queue)", f"  · #{running} long  long.toml  running (run {run_ids[1]})",
                         f" 1. #{waiting} [b]next[/b]  [b]next[/b].toml  queued",
                         f"  · #{failed} vanished  vanished.toml  failed to start (launch.script: /x/train.py: no "
                         "such file)"], lines
        store.update_run(run_ids[1], status="completed")
        for entry in (waiting, failed):
            entries_store.remove_entry(store, entry)
        await wait_for(pilot, lambda: not section.display, what="the section hidden: nothing left to see to")
