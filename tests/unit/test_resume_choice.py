"""What `ftui resume ID` resumes from, and what it refuses: a damaged newest checkpoint is passed over
naming the file, a run still running is not trained twice, a resumed run that died before its first save
goes on from its parent's checkpoint, and a data file changed since the checkpoint is refused unless
allowed. Real SQLite, real run folders and checkpoint folders; nothing is started."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from runner.data.cache import source_digest
from runner.service import launch
from runner.spec import checkpoint as ck
from runner.spec import events as ev
from runner.spec.recipe import load_recipe
from runner.watch.journal import WatcherLock
from runner.watch.preflight import PreflightError
from store import Store
from tests.support import run_in_process

ROWS = [{"text": f"row {i}: the quick brown fox jumps over the lazy dog " * 4} for i in range(24)]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FTUI_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def store(home: Path) -> Any:
    home.mkdir(parents=True)
    s = Store(f"sqlite:///{home / 'ftui.db'}")
    yield s
    s.close()


@pytest.fixture
def data(tmp_path: Path) -> Path:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


def _old_run(store: Store, home: Path, data: Path, name: str, steps: tuple[int, ...],
             parent: int | None = None, status: str = "stopped") -> tuple[int, Path]:
    """A finished run of a small recipe on ``data``, with a checkpoint (as a save writes it) at ``steps``."""
    run_dir = home / "runs" / name
    run_dir.mkdir(parents=True)
    (run_dir / ev.RECIPE_FILE).write_text(
        f'name = "{name}"\n[data]\nsource = "{data}"\ncontext_length = 32\n[train]\nmax_steps = 20\n')
    recipe = load_recipe(run_dir / ev.RECIPE_FILE)
    rid = store.create_run(name=name, recipe_text=recipe.to_toml(), recipe_hash=recipe.digest(), strategy="single",
                           nproc=1, method="lora", model="builtin:tiny-llama", run_dir=str(run_dir),
                           resumed_from=parent)
    store.update_run(rid, status=status)
    for step in steps:
        folder = ck.checkpoint_dir(run_dir, step)
        folder.mkdir(parents=True)
        for part in ("model.safetensors", "optimizer.bin", "custom_checkpoint_0.pkl", "random_states_0.pkl"):
            (folder / part).write_bytes(os.urandom(96))
        manifest = {"format": ck.FORMAT, "step": step, "epoch": 0, "tokens_done": 0, "world_size": 1,
                    "strategy": "single", "data": {"fingerprint": source_digest(str(data))}}
        ck.write_manifest(folder, ck.seal(folder, manifest))
    return rid, run_dir


def test_a_damaged_newest_checkpoint_is_passed_over_naming_the_file(store: Store, home: Path, data: Path) -> None:
    rid, run_dir = _old_run(store, home, data, "old", (2, 4))
    newest = ck.checkpoint_dir(run_dir, 4) / "model.safetensors"
    newest.write_bytes(bytes(newest.stat().st_size))  # zeroed at its size
    prepared = launch.resume(store, rid)
    assert prepared.recipe.train.resume_from == str(ck.checkpoint_dir(run_dir, 2))
    assert prepared.warnings == ("checkpoint step-00000004 skipped: damaged checkpoint (model.safetensors's content "
                                 "is not what was written: its hash differs)",)
    new = store.get_run(prepared.run_id or 0)
    assert new is not None and new.summary.resumed_from == {
        "run_id": rid, "checkpoint": str(ck.checkpoint_dir(run_dir, 2)), "step": 2}


def test_a_run_still_running_is_refused_in_one_line(store: Store, home: Path, data: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    rid, run_dir = _old_run(store, home, data, "live", (2,), status="running")
    watcher = WatcherLock(run_dir)
    assert watcher.acquire()  # its watcher is alive: recovery leaves it alone
    try:
        result = run_in_process(capsys, "resume", str(rid), "--db", store.url)
    finally:
        watcher.release()
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.strip() == (f"ftui: run {rid}: still running; resuming it would train it twice (stop it "
                                  f"first: `ftui stop {rid}`)")
    assert [r.id for r in store.list_runs()] == [rid]  # nothing recorded
    store.update_run(rid, status="created")
    with pytest.raises(PreflightError, match="still created"):
        launch.resume(store, rid)


def test_a_resumed_run_that_died_before_its_first_save_goes_on_from_its_parents(store: Store, home: Path,
                                                                                data: Path) -> None:
    parent, parent_dir = _old_run(store, home, data, "parent", (3,))
    child, _ = _old_run(store, home, data, "child", (), parent=parent, status="failed")
    start = ck.checkpoint_dir(parent_dir, 3)
    store.update_run(child, summary={"resumed_from": {"run_id": parent, "checkpoint": str(start), "step": 3}})
    prepared = launch.resume(store, child)
    assert prepared.recipe.train.resume_from == str(start)
    assert prepared.warnings == (f"run {child} wrote no checkpoint; resuming from the one it started from, {start}",)
    # A completed child trained every step: its parent's checkpoint is not offered (it would train them again).
    store.update_run(child, status="completed")
    with pytest.raises(PreflightError, match="no complete checkpoint"):
        launch.resume(store, child)
    store.update_run(child, status="failed")
    # The parent's checkpoint damaged too: nothing to resume from, and the line says why.
    (start / "optimizer.bin").write_bytes(b"x")
    with pytest.raises(PreflightError, match=r"no complete checkpoint .*its parent's checkpoint skipped: .*"
                                             r"optimizer\.bin has 1 bytes"):
        launch.resume(store, child)


def test_a_changed_data_file_is_refused_unless_allowed(store: Store, home: Path, data: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    rid, run_dir = _old_run(store, home, data, "data", (2,))
    data.write_text(data.read_text().replace("lazy", "sleepy"))  # same rows, other content
    result = run_in_process(capsys, "resume", str(rid), "--db", store.url)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.strip() == (f"ftui: train.resume_from: data.source {data} changed since the checkpoint was "
                                  "taken (its content differs); resume with --allow-data-change to go on with the "
                                  "new data")
    assert [r.id for r in store.list_runs()] == [rid]
    prepared = launch.resume(store, rid, allow_data_change=True)
    assert prepared.recipe.train.resume_from == str(ck.checkpoint_dir(run_dir, 2))
