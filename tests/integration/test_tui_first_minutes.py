"""A newcomer's first minutes in the Textual app: Pilot tests over a real store."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from textual.widgets import Input

from store import Store
from tests.support.dashboard import NO_WATCHER_CHECK, wait_for
from tui.app import make_app
from tui.app.screens.compose import ComposeScreen, field_id
from tui.app.screens.modals import ConfirmScreen, PromptScreen

ROOT = Path(__file__).resolve().parents[2]


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


def error_of(screen, path: str) -> str:  # type: ignore[no-untyped-def]
    return str(screen.query_one("#err-" + field_id(path)).render())


async def test_compose_switches_quickstart_to_fsdp_on_two_processes(store: Store) -> None:
    """The whole form is one recipe: strategy fsdp + processes 2 is valid, whichever is set first."""
    app = make_app(store, watcher_check_s=NO_WATCHER_CHECK)
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


async def test_save_proposes_a_new_file_and_asks_before_overwriting(store: Store) -> None:
    shipped = Path("recipes/quickstart.toml")
    original = shipped.read_text()
    app = make_app(store, watcher_check_s=NO_WATCHER_CHECK)
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


async def test_launch_refused_by_the_preflight_shows_why_and_records_nothing(store: Store) -> None:
    app = make_app(store, watcher_check_s=NO_WATCHER_CHECK)
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
    from runner.spec.recipe import load_recipe
    from runner.watch.preflight import launch_checks

    recipe = load_recipe(ROOT / "recipes" / "quickstart.toml", ["launch.device=auto"])
    warnings = launch_checks(recipe, fake_gpus=8)
    assert any(w.startswith("GPUs (CUDA index -> physical): cuda:0 -> GPU 0") for w in warnings), warnings
    assert launch_checks(load_recipe(ROOT / "recipes" / "quickstart.toml", ["launch.device=cpu"])) == []


class _FixedHost:
    """The host's psutil reading, scripted (the hardware boundary), so that load on this machine
    does not enter the test."""

    def sample(self, pids_by_rank, owners=None):  # type: ignore[no-untyped-def]
        from runner.hardware import DeviceSample

        return [DeviceSample(0.0, "box", "host", -1, "host CPU (2 cores)", 37.0, 6 * 2**30, 16 * 2**30,
                             None, None, None, "psutil", None)]


async def test_devices_screen_shows_gpu_processes_and_which_run_owns_them(store: Store) -> None:
    """Key 3: every GPU, its processes, and the ftui run whose process group holds each one (a real
    process in its own session stands in for a rank; the GPUs are scripted NVML)."""
    import subprocess
    import sys

    from textual.widgets import DataTable

    from runner.hardware import FakeNvml, NvmlBackend, Probe
    from tui.app.screens.devices import DevicesScreen

    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    try:
        run_id = store.create_run(name="owner", recipe_text="", recipe_hash="x", strategy="single", nproc=1,
                                  method="lora", model="m", run_dir="")
        store.update_run(run_id, status="running", pgid=rank.pid)
        lib = FakeNvml.demo(2, pids=[rank.pid, 4_000_000], tick_s=None)
        lib.advance(30)
        probe = Probe(nvml=NvmlBackend(lib=lib), processes=_FixedHost())  # type: ignore[arg-type]
        app = make_app(store, probe=probe, fake_gpus=2, monitor_s=0.2, watcher_check_s=NO_WATCHER_CHECK)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("3")
            await wait_for(pilot, lambda: isinstance(app.screen, DevicesScreen) and app.screen.snapshot is not None,
                           what="devices read")
            screen = app.screen
            assert screen.query_one("#gpu-table", DataTable).row_count == 2
            procs = screen.query_one("#proc-table", DataTable)
            rows = {str(procs.get_row_at(i)[1]): [str(c) for c in procs.get_row_at(i)] for i in range(procs.row_count)}
            assert rows[str(rank.pid)][0] == "GPU 0" and rows[str(rank.pid)][2] == f"run {run_id} owner"
            assert rows["4000000"][0] == "GPU 1" and rows["4000000"][2] == "not ftui"
            assert "37%" in str(screen.query_one("#host-line").render())
            await pilot.press("escape")
            assert not isinstance(app.screen, DevicesScreen)
    finally:
        rank.kill()
        rank.wait()


async def test_stop_asks_first(store: Store) -> None:
    """s in the Monitor asks; n leaves the run alone (nothing is requested)."""
    from tui.app.screens.monitor import MonitorScreen

    run_id = store.create_run(name="r", recipe_text="", recipe_hash="x", strategy="single", nproc=1,
                              method="lora", model="m", run_dir="")
    store.update_run(run_id, status="running")
    app = make_app(store, monitor_s=0.2, watcher_check_s=NO_WATCHER_CHECK)
    async with app.run_test(size=(120, 40)) as pilot:
        app.open_run(run_id)
        await wait_for(pilot, lambda: isinstance(app.screen, MonitorScreen) and app.screen.snapshot is not None,
                       what="monitor")
        await pilot.press("s")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="stop question")
        assert "Stop run" in str(app.screen.query_one("Label").render())
        await pilot.press("n")
        await wait_for(pilot, lambda: not isinstance(app.screen, ConfirmScreen), what="the question answered")
        await pilot.pause()
        assert isinstance(app.screen, MonitorScreen)
        run = store.get_run(run_id)
        assert run is not None and run.status == "running" and run.stop_requested_at is None
        # Before the first step the monitor says so, from the run's start and the journal.
        assert "starting: no step yet" in str(app.screen.query_one("#progress").render())


async def test_runs_screen_hint_keys_help_and_live_step(store: Store) -> None:
    from textual.widgets import DataTable

    from tui.app.screens.modals import KeysScreen
    from tui.app.screens.runs import RunsScreen

    app = make_app(store, refresh_s=0.2, watcher_check_s=NO_WATCHER_CHECK)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.screen.loaded, what="the store read")
        await pilot.pause()
        hint = app.screen.query_one("#runs-empty")
        assert hint.display and "ftui run recipes/quickstart.toml" in str(hint.render())
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(app.screen, KeysScreen), what="keys")
        keys = str(app.screen.query_one("#keys-body").render())
        assert "Compare" in keys and "Devices" in keys and "3" in keys
        await pilot.press("escape")
        assert isinstance(app.screen, RunsScreen)
        # A running run shows its latest step, loss and tokens/s; the note is visible; the mode in words.
        run_id = store.create_run(name="live", recipe_text="", recipe_hash="x", strategy="ddp", nproc=2,
                                  method="lora", model="m", run_dir="", total_steps=30)
        store.update_run(run_id, status="running", distributed_type="MULTI_CPU", note="try 2")
        store.ingest(run_id, [{"seq": s, "type": "step", "time": 1.0 + s, "step": s, "loss": 5.0 - s / 10,
                               "tokens_per_s": 1000.0 + s} for s in (1, 2, 3)])
        table = app.screen.query_one(DataTable)

        def row() -> dict[str, str]:
            return {str(c.label): str(v) for c, v in zip(table.columns.values(), table.get_row_at(0), strict=True)}

        # the poll may list the run between its writes (no step yet, "-" or "0/30"): wait for its latest step
        await wait_for(pilot, lambda: table.row_count == 1 and row()["step"] == "3/30", what="the run's step 3 listed")
        shown = row()
        assert (shown["loss"], shown["tokens/s"], shown["mode"]) == ("4.7000", "1,003", "DDP (CPU)")
        assert "try 2" in shown["tags · note"]
        assert not app.screen.query_one("#runs-empty").display
