"""Snapshot tests of every screen at 120x40 and 80x24, over a store filled by hand (no training)
with every time-dependent figure frozen (the app's clock, the interpreter path, CPU threads). One app per
screen takes both sizes, resized between them (``snap_sizes``: the files are those of a test parametrized by
size); Textual's start costs about a second of CPU per app."""

from __future__ import annotations

import shutil
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from runner.hardware import DeviceSample, ProcessGpuMemory
from runner.spec.recipe import load_recipe
from store import Store
from tests.support.dashboard import (
    NO_WATCHER_CHECK,
    ONE_READ_S,
    repaint_whole,
    snap_sizes,
    trainer_summary,
    wait_for,
    wait_painted,
)
from tui.app import app as app_module
from tui.app import make_app

ROOT = Path(__file__).resolve().parents[2]
T0 = datetime(2026, 1, 2, 3, 4, 5)
NOW = T0 + timedelta(minutes=7)
SIZES = [(120, 40), (80, 24)]
"""The sizes of every screen's snapshots, in the order one app is resized through them (tests/support/dashboard.py
``snap_sizes``)."""
MONITOR_SIZES = SIZES[::-1]
"""The Monitor's order: narrow first. Widened from 80x24 it draws what an app started at 120x40 draws; narrowed
from 120x40, the processes table of a finished run sits one row lower than in an app started at 80x24."""


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A home filled once for the module (the runs, their metrics, samples and logs): each test copies it."""
    home = tmp_path_factory.mktemp("snapshots")
    store = Store(f"sqlite:///{home}/ftui.db")
    fill(store, home)
    store.close()
    return home


@pytest.fixture
def store(filled: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    """The filled home, copied to ``tmp_path`` (the run folders' paths are kept: they are read only)."""
    monkeypatch.setenv("FTUI_HOME", str(tmp_path))
    monkeypatch.delenv("FTUI_DB", raising=False)
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(app_module, "_cpu_threads", lambda nproc, device: 2)
    for name in ("ftui.db", "ftui.db-wal"):
        if (filled / name).exists():
            shutil.copyfile(filled / name, tmp_path / name)
    return Store(f"sqlite:///{tmp_path}/ftui.db")


def fill(store: Store, tmp: Path) -> None:
    # The last figure: the per-device estimate the trainer stores (the planner's, what
    # runner.analysis.run_figures.estimated_memory computes from each recipe), with the model's dimensions.
    plans = [
        ("quickstart", "single", 1, "completed", 2e-3, 1.0, 232254976),
        ("ddp-2", "ddp", 2, "completed", 2e-3, 0.9, 232746496),
        ("fsdp-2", "fsdp", 2, "stopped", 1e-3, 1.1, 206341888),
        ("demo-8gpu", "ddp", 8, "running", 1e-3, 1.2, 232746496),
    ]
    for i, (name, strategy, nproc, status, lr, scale, estimate) in enumerate(plans):
        over = [f"name={name}", f"train.lr={lr}", f"launch.strategy={strategy}", f"launch.nproc={nproc}"]
        recipe = load_recipe(ROOT / "recipes" / "quickstart.toml", over)
        run_dir = tmp / f"run{i}"
        (run_dir / "logs").mkdir(parents=True)
        (run_dir / "logs" / "rank0.log").write_text("".join(f"step {s} loss {5 - s * 0.1:.3f}\n" for s in range(1, 9)))
        run_id = store.create_run(name=name, recipe_text=recipe.to_toml(), recipe_hash=recipe.digest(),
                                  strategy=strategy, nproc=nproc, method="lora", model=recipe.model.name,
                                  run_dir=str(run_dir), total_steps=30)
        steps = 30 if status == "completed" else 12
        t = 1_767_000_000.0 + 1000 * i
        store.ingest(run_id, [{"seq": s, "type": "step", "time": t + s, "step": s,
                               "loss": scale * (6.0 - 3.0 * (1 - 0.9 ** s)), "lr": lr, "tokens_per_s": 2000.0 + 10 * s,
                               "grad_norm": 2.0 / s ** 0.5,
                               "step_time": 0.5} for s in range(1, steps + 1)])
        done = status != "running"
        store.update_run(run_id, status=status, started_at=T0 + timedelta(minutes=i),
                         ended_at=T0 + timedelta(minutes=i + 1) if done else None, pgid=None,
                         train_seconds=15.0 if done else None, tokens_per_s=2100.0 / scale if done else None,
                         final_loss=scale * 3.3 if done else None, peak_mem_bytes=(300 + 10 * i) * 2**20,
                         mean_util=70.0 + i if done else None, tags=["demo"] if i == 0 else [],
                         note="baseline" if i == 0 else "", summary=trainer_summary(estimate))
        samples, procs = [], []
        for k in range(20):
            ts = t + k * 0.5
            if strategy == "ddp" and nproc == 8:
                for g in range(8):
                    samples.append(DeviceSample(ts, "host", "gpu", g, "NVIDIA H100 80GB HBM3", 50.0 + (g * 7 + k * 5) % 50,
                                                (20 + g) * 2**30, 80 * 2**30, 300.0, 60.0, 1800, "fake-nvml", None))
                    procs.append(ProcessGpuMemory(ts, "host", g, 1000 + g, g, (18 + g) * 2**30, "fake-nvml"))
            samples.append(DeviceSample(ts, "host", "host", -1, "host CPU (2 cores)", 40.0 + (k * 17) % 60,
                                        (6 + k % 3) * 2**30, 16 * 2**30, None, None, None, "psutil", None))
            for r in range(min(nproc, 8)):
                samples.append(DeviceSample(ts, "host", "rank", r, f"rank {r}", 90.0 + (k * 13 + r * 29) % 110,
                                            (400 + 5 * k) * 2**20, 16 * 2**30, None, None, None, "psutil", 1000 + r))
        store.add_samples(run_id, samples, procs)


def app_for(store: Store):  # type: ignore[no-untyped-def]
    return make_app(store, now=lambda: NOW, python="python", refresh_s=0.2, monitor_s=ONE_READ_S, watcher_check_s=NO_WATCHER_CHECK)


async def settle(pilot) -> None:  # type: ignore[no-untyped-def]
    """Wait until the store reads (thread workers) have filled every table on screen and Compose's launch
    preview is built, then until the app is idle with no animation pending (the tables' deferred column
    sizing and a repaint), so that load on the machine cannot change what the snapshot sees."""
    await wait_for(pilot, lambda: _filled(pilot.app.screen), what="the screen's reads")
    await repaint_whole(pilot)


def _filled(screen) -> bool:  # type: ignore[no-untyped-def]
    """The screen shows its reads: the Runs screen's first, every table's rows (the recipe diff may be
    empty), Compose's launch command when the form is valid."""
    from textual.widgets import DataTable

    if not getattr(screen, "loaded", True):
        return False
    if not all(t.row_count > 0 for t in screen.query(DataTable) if t.id != "diff"):
        return False
    previews = list(screen.query("#preview"))
    return not previews or not getattr(screen, "valid", False) or "launch command" in str(previews[0].render())


async def test_runs(snapshot, request, store: Store) -> None:  # type: ignore[no-untyped-def]
    await snap_sizes(snapshot, request, app_for(store), SIZES, settle)


async def test_compose(snapshot, request, store: Store) -> None:  # type: ignore[no-untyped-def]
    async def show(pilot) -> None:  # type: ignore[no-untyped-def]
        await pilot.press("2")
        await pilot.pause()
        pilot.app.screen.query_one("#f-train-batch_size").value = "0"
        await settle(pilot)

    await snap_sizes(snapshot, request, app_for(store), SIZES, show, again=settle)


async def test_compose_valid(snapshot, request, store: Store) -> None:  # type: ignore[no-untyped-def]
    """A valid form: the launch command, and the estimate from its thread worker (scrollable at 80x24)."""
    async def show(pilot) -> None:  # type: ignore[no-untyped-def]
        await pilot.press("2")
        await wait_for(pilot, lambda: "recommended" in str(pilot.app.screen.query_one("#estimate").render()),
                       what="the estimate")
        await settle(pilot)

    await snap_sizes(snapshot, request, app_for(store), SIZES, show, again=settle)


async def test_monitor(snapshot, request, store: Store) -> None:  # type: ignore[no-untyped-def]
    """A finished run on the CPU (run 1) and a running one on 8 GPUs (run 4)."""
    for run_id, prefix in ((1, "cpu-"), (4, "8gpu-")):
        await snap_sizes(snapshot, request, app_for(store), MONITOR_SIZES,
                         lambda pilot, run_id=run_id: _open_monitor(pilot, run_id), again=settle, prefix=prefix)


async def test_compare(snapshot, request, store: Store) -> None:  # type: ignore[no-untyped-def]
    async def show(pilot) -> None:  # type: ignore[no-untyped-def]
        await settle(pilot)
        await pilot.press("space", "down", "space", "down", "space", "c")
        # the comparison lands from a thread worker (seconds on a loaded machine: it reads the model's config)
        await wait_for(pilot, lambda: getattr(pilot.app.screen, "comparison", None) is not None,
                       what="the comparison")
        await settle(pilot)

    await snap_sizes(snapshot, request, app_for(store), SIZES, show, again=settle)


async def test_plan(snapshot, request, store: Store) -> None:  # type: ignore[no-untyped-def]
    """A finished plan: the decision on top, the leader first, a failed candidate and one the budget left out."""
    from tests.support.plans import add_trial, fixed_setup, record
    from tui.app.screens.plan import PlanScreen

    setup, command = fixed_setup(repeat=2)
    for n in range(2):
        add_trial(store, setup, "single", 1000.0 + 10 * n, n=n)
        add_trial(store, setup, "ddp x2", 2000.0 + 100 * n, n=n)
    add_trial(store, setup, "zero1 x2", None, status="failed")
    record(setup, command, over_budget=["zero1 x2 [launch.engine=torch]"])

    async def show(pilot) -> None:  # type: ignore[no-untyped-def]
        await settle(pilot)
        pilot.app.push_screen(PlanScreen(setup.pid))
        await wait_for(pilot, lambda: getattr(pilot.app.screen, "view", None) is not None, what="the plan")
        await settle(pilot)

    await snap_sizes(snapshot, request, app_for(store), SIZES, show, again=settle)


async def test_monitor_relayouts_on_resize(store: Store) -> None:
    """Wide and narrowed to 80 columns: no column is lost off-screen; widened again: back as it was,
    rows kept."""
    from textual.widgets import DataTable

    app = app_for(store)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        app.open_run(4)
        await wait_for(pilot, lambda: getattr(app.screen, "snapshot", None) is not None, what="the monitor")
        await settle(pilot)
        devices = app.screen.query_one("#devices", DataTable)

        def labels() -> list[str]:
            return [str(c.label) for c in devices.columns.values()]

        # 8 GPUs and the host; the source in the util header, temperature and power beside memory.
        assert labels()[:2] == ["device", "util (fake NVML)"] and "temp" in labels() and devices.row_count == 9
        await pilot.resize_terminal(80, 24)
        await settle(pilot)
        assert labels()[:2] == ["device", "util (fake NVML)"] and devices.row_count == 9
        assert sum(c.get_render_width(devices) for c in devices.columns.values()) <= 78
        await pilot.resize_terminal(120, 40)
        await settle(pilot)
        assert "mem history" in labels() and devices.row_count == 9
        assert sum(c.get_render_width(devices) for c in devices.columns.values()) <= 118
    for run_id in (1, 4):  # a finished CPU run and a running one on 8 GPUs, each narrowed from 120 columns
        async with app_for(store).run_test(size=(120, 40)) as pilot:
            await _open_monitor(pilot, run_id)
            await pilot.resize_terminal(80, 24)
            await settle(pilot)
            # the narrow columns fit: no table keeps the scrollbar (a line) the wide ones needed for a moment
            assert not any(t.show_horizontal_scrollbar for t in pilot.app.screen.query(DataTable)), run_id


class _FixedHost:
    """The host's psutil reading, scripted (the hardware boundary): load on this machine stays out."""

    def sample(self, pids_by_rank, owners=None):  # type: ignore[no-untyped-def]
        return [DeviceSample(0.0, "box", "host", -1, "host CPU (2 cores)", 37.0, 6 * 2**30, 16 * 2**30,
                             None, None, None, "psutil", None)]


async def test_devices(snapshot, request, store: Store) -> None:  # type: ignore[no-untyped-def]
    """Key 3: 8 scripted GPUs at a fixed tick, with processes nobody in the store owns."""
    from runner.hardware import FakeNvml, NvmlBackend, Probe

    lib = FakeNvml.demo(8, pids=[4_000_001, 4_000_002, 4_000_003], tick_s=None)
    lib.advance(30)
    probe = Probe(nvml=NvmlBackend(lib=lib, host="box"), processes=_FixedHost())  # type: ignore[arg-type]
    app = make_app(store, probe=probe, fake_gpus=8, now=lambda: NOW, python="python", refresh_s=0.2, monitor_s=ONE_READ_S, watcher_check_s=NO_WATCHER_CHECK)

    async def show(pilot) -> None:  # type: ignore[no-untyped-def]
        await settle(pilot)
        await pilot.press("3")
        await wait_for(pilot, lambda: getattr(pilot.app.screen, "snapshot", None) is not None, what="the devices")
        await settle(pilot)

    await snap_sizes(snapshot, request, app, SIZES, show, again=settle)


def test_runs_empty(snap_compare, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """The first screen of a new user: what to press, or the one command to run."""
    monkeypatch.setenv("FTUI_HOME", str(tmp_path))
    monkeypatch.chdir(ROOT)
    app = make_app(Store(f"sqlite:///{tmp_path}/ftui.db"), now=lambda: NOW, python="python", refresh_s=0.2, watcher_check_s=NO_WATCHER_CHECK)

    async def before(pilot) -> None:  # type: ignore[no-untyped-def]
        await wait_for(pilot, lambda: pilot.app.screen.loaded, what="the store read")
        await pilot.pause()

    assert snap_compare(app, terminal_size=(80, 24), run_before=before)


async def _open_monitor(pilot, run_id: int) -> None:  # type: ignore[no-untyped-def]
    await settle(pilot)
    pilot.app.open_run(run_id)
    # the monitor's first read lands from a worker thread
    await wait_for(pilot, lambda: getattr(pilot.app.screen, "snapshot", None) is not None, what="the monitor")
    await settle(pilot)


async def _modal(pilot, key: str) -> None:  # type: ignore[no-untyped-def]
    """Press ``key`` and wait for the modal it opens to be on screen and painted."""
    from textual.screen import ModalScreen

    # The modal shows the screen under it as last painted, and a screen under a modal paints nothing more:
    # everything pending on it (a table's column sizing, its header's repaint) is done first, then it is
    # painted whole once more.
    await repaint_whole(pilot)
    await pilot.press(key)
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, ModalScreen), what=f"the modal of {key}")
    await wait_painted(pilot)


async def _close_modal(pilot) -> None:  # type: ignore[no-untyped-def]
    """Escape out of the modal in front (a question answered no, the keys closed)."""
    from textual.screen import ModalScreen

    await pilot.press("escape")
    await wait_for(pilot, lambda: not isinstance(pilot.app.screen, ModalScreen), what="the modal closed")


async def test_keys(snapshot, request, store: Store) -> None:  # type: ignore[no-untyped-def]
    """? lists the screen's own keys first, then the app's, inside the terminal (it scrolls at 80x24): on the
    Runs screen and on the Monitor."""
    async def again(pilot) -> None:  # type: ignore[no-untyped-def]
        await settle(pilot)
        await _modal(pilot, "question_mark")

    for where in ("runs", "monitor"):
        async def show(pilot, where: str = where) -> None:  # type: ignore[no-untyped-def]
            await (_open_monitor(pilot, 1) if where == "monitor" else settle(pilot))
            await _modal(pilot, "question_mark")

        await snap_sizes(snapshot, request, app_for(store), SIZES if where == "runs" else MONITOR_SIZES, show,
                         again=again, leave=_close_modal, prefix=f"{where}-")


async def test_stop_confirmation(snapshot, request, store: Store) -> None:  # type: ignore[no-untyped-def]
    """s on the Monitor of a running run asks first; the question wraps inside 80 columns."""
    async def show(pilot) -> None:  # type: ignore[no-untyped-def]
        await _open_monitor(pilot, 4)
        await _modal(pilot, "s")

    async def again(pilot) -> None:  # type: ignore[no-untyped-def]
        await settle(pilot)
        await _modal(pilot, "s")

    await snap_sizes(snapshot, request, app_for(store), SIZES, show, again=again, leave=_close_modal)


async def test_delete_confirmation(snapshot, request, store: Store) -> None:  # type: ignore[no-untyped-def]
    async def show(pilot) -> None:  # type: ignore[no-untyped-def]
        await settle(pilot)
        await pilot.press("down")  # run 3: the newest (run 4) is running, which d refuses
        await _modal(pilot, "d")

    async def again(pilot) -> None:  # type: ignore[no-untyped-def]
        await settle(pilot)
        await _modal(pilot, "d")

    await snap_sizes(snapshot, request, app_for(store), SIZES, show, again=again, leave=_close_modal)
