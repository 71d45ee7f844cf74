"""Full disks, made for real (a small tmpfs, filled): every journal write is whole or absent and what a full
disk did not take goes out once there is room; a full disk is named "no space left on DEVICE (PATH)" by the
store, the crash reasons and the pre-flight; a journal cut short under its reader is read on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.spec import events as ev
from runner.spec.recipe import load_recipe
from runner.watch.crash import describe
from runner.watch.journal import ORCHESTRATOR_FILE, read_jsonl
from runner.watch.preflight import InputError, check_room
from runner.watch.prepare import prepare
from runner.watch.stream import Recorder
from store import Store, StoreError
from tests.support import QUICKSTART, run_in_process
from tests.support.disks import fill, small_filesystem
from tui.cli.exits import ExitCode


def _lines(path: Path) -> list[dict[str, object]]:
    raw = path.read_bytes()
    assert raw == b"" or raw.endswith(b"\n"), "no torn last line"
    return [json.loads(line) for line in raw.splitlines()]


def test_the_trainer_journal_on_a_full_disk_keeps_its_events_and_writes_them_whole_once_there_is_room(
        tmp_path: Path) -> None:
    with small_filesystem(tmp_path / "disk", "1m") as disk:
        writer = ev.JournalWriter(disk / ev.EVENTS_FILE)
        writer.emit("start", total_steps=5)
        filler = fill(disk)
        for step in range(1, 4):
            writer.emit("step", step=step, loss="x" * 5000)  # more than a page: the disk refuses it
        assert writer.failed is not None and len(writer.unwritten) == 3
        assert [e["type"] for e in _lines(disk / ev.EVENTS_FILE)] == ["start"], "nothing of a refused write stays"
        filler.unlink()
        writer.emit("end", status="completed")
        writer.close()
        events = _lines(disk / ev.EVENTS_FILE)
    assert [e["seq"] for e in events] == [0, 1, 2, 3, 4]
    assert [e.get("step") for e in events if e["type"] == "step"] == [1, 2, 3]


def test_the_watchers_journal_on_a_full_disk_never_raises_and_names_the_disk(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'ftui.db'}")
    run_id = store.create_run(name="r", recipe_text="", recipe_hash="h", recipe_source=None, strategy="single",
                              nproc=1, method="lora", model="m", run_dir="")
    with small_filesystem(tmp_path / "disk", "1m") as disk:
        recorder = Recorder(store, run_id, disk)
        recorder.emit("launch", argv=["x"])
        filler = fill(disk)
        recorder.emit("hang", note="y" * 5000)
        assert recorder.journal_error == f"no space left on tmpfs at {disk} ({disk / ORCHESTRATOR_FILE})"
        assert [e.type for e in store.events(run_id)] == ["launch", "hang"], "the store has it meanwhile"
        filler.unlink()
        recorder.emit("exit", status="completed")
        recorder.close()
        assert recorder.journal_error is None
        assert [(e["seq"], e["type"]) for e in read_jsonl(disk / ORCHESTRATOR_FILE)] == [
            (0, "launch"), (1, "hang"), (2, "exit")]


def test_a_journal_cut_short_under_its_reader_is_read_on_from_its_start(tmp_path: Path) -> None:
    path = tmp_path / ev.EVENTS_FILE
    writer = ev.JournalWriter(path)
    reader = ev.JournalReader(path)
    for step in range(1, 21):
        writer.emit("step", step=step)
    assert len(reader.read_new()) == 20
    with open(path, "r+b") as fh:  # what logrotate's copytruncate does
        fh.truncate(0)
    for step in range(21, 24):
        writer.emit("step", step=step)
    assert [e["step"] for e in reader.read_new()] == [21, 22, 23]


def test_a_full_disk_under_sqlite_is_one_line_naming_the_device_and_the_file(tmp_path: Path) -> None:
    with small_filesystem(tmp_path / "disk", "2m") as disk:
        store = Store(f"sqlite:///{disk / 'ftui.db'}")
        fill(disk)
        with pytest.raises(StoreError) as caught:
            store.create_run(name="r", recipe_text="", recipe_hash="h", recipe_source=None, strategy="single",
                             nproc=1, method="lora", model="m", run_dir="")
        store.close()
    assert str(caught.value) == (f"--db sqlite:///{disk / 'ftui.db'}: no space left on tmpfs at {disk} "
                                 f"({disk / 'ftui.db'})")


@pytest.mark.parametrize("where", ["launcher", "rank log", "trainer error"])
def test_a_rank_that_met_a_full_disk_is_said_to_have(tmp_path: Path, where: str) -> None:
    with small_filesystem(tmp_path / "disk", "1m") as run_dir:
        (run_dir / "logs").mkdir()
        trainer_error = None
        if where == "launcher":  # torch elastic's report of a rank that exited 28 (runner.rank.rank_log)
            (run_dir / ev.LAUNCHER_LOG).write_text(
                "Root Cause (first observed failure):\n[0]:\n  time : x\n  host : h\n"
                f"  rank : 1 (local_rank: 1)\n  exitcode : {ev.EXIT_NO_SPACE} (pid: 4242)\n")
        elif where == "rank log":
            ev.rank_log(run_dir, 0).write_text(
                "Traceback (most recent call last):\nOSError: [Errno 28] No space left on device: "
                f"'{run_dir}/checkpoints/step-00000002/model.safetensors'\n")
        else:
            trainer_error = "SafetensorError: Error while serializing: I/O error: No space left on device (os error 28)"
        reason = describe(run_dir, [(0, 4242)], None, trainer_error)
    assert reason is not None and f"no space left on tmpfs at {run_dir} (" in reason, reason
    if where == "rank log":
        assert reason.endswith(f"({run_dir}/checkpoints/step-00000002/model.safetensors)")


def test_the_preflight_refuses_run_folders_without_room_for_a_checkpoint(tmp_path: Path) -> None:
    recipe = load_recipe(QUICKSTART)
    with small_filesystem(tmp_path / "small", "512k") as small:
        with pytest.raises(InputError) as caught:
            check_room(recipe, small)
    assert str(caught.value).startswith(f"run folders: no room for a checkpoint on tmpfs at {small} ({small}): ")
    with small_filesystem(tmp_path / "big", "64m") as big:
        check_room(recipe, big)


def test_recording_a_run_on_a_full_disk_is_refused_in_one_line_before_anything_is_recorded(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'ftui.db'}")
    with small_filesystem(tmp_path / "runs", "4m") as runs:
        fill(runs)
        with pytest.raises(InputError) as caught:
            prepare(store, load_recipe(QUICKSTART), root=runs)
        assert list(runs.iterdir()) == [runs / "filler"], "no run folder"
    assert str(caught.value).startswith(f"run folders: no room for a checkpoint on tmpfs at {runs} ({runs}): ")
    assert store.list_runs() == [], "no row left `created`"


@pytest.mark.parametrize("full", ["run folders", "database"])
def test_ftui_run_starting_on_a_full_disk_is_one_line_exit_2_and_leaves_no_run_behind(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, full: str) -> None:
    home, db_folder = tmp_path / "home", tmp_path / "db"
    with small_filesystem(home if full == "run folders" else db_folder, "1m") as disk:
        db = f"sqlite:///{db_folder / 'ftui.db'}"
        Store(db).close()
        monkeypatch.setenv("FTUI_HOME", str(home))
        monkeypatch.setenv("FTUI_DB", db)
        filler = fill(disk)
        ran = run_in_process(capsys, "run", str(QUICKSTART))
        assert ran.returncode == ExitCode.USAGE and ran.stdout == "", ran
        (line,) = ran.stderr.splitlines()
        if full == "run folders":
            assert line.startswith(f"ftui: run folders: no room for a checkpoint on tmpfs at {disk} ({disk / 'runs'}): ")
        else:
            assert line == f"ftui: --db {db}: no space left on tmpfs at {disk} ({disk / 'ftui.db'})"
        filler.unlink()
        assert Store(db).list_runs() == []
