"""The run queue in the store and the rules of its runner, in-process: entries in line per host with their
run's status, a claim that takes a waiting entry once, a removal that never takes the running one, the end
of an entry recorded from its run, what ``enqueue`` records and refuses, the runner's round over an entry that
no longer starts (no process is started), which entries start when (devices held by live runs, entries ahead
keeping theirs), and the words ``ftui queue`` shows.

Every test that takes ``db_url`` runs on SQLite here and on PostgreSQL in
tests/system/test_store_on_postgresql.py. The runner's process and the runs it starts:
tests/integration/test_queue.py."""

from __future__ import annotations

import os
import socket
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from runner.service import queue
from runner.service.queue_runner import QueueRunner, entry_environment, serve, to_start
from runner.spec.devices import devices_taken, visible_ids
from runner.spec.recipe import RecipeError
from runner.spec.status import DONE, NOT_STARTED, QUEUED, STARTED
from store import Store
from store import queue as entries_store
from store.queue import QueueEntryInfo
from tests.support.scripted_rank import SCRIPT
from tui.render.queue import positions, queue_lines, state_words

SCRIPT_RECIPE = f'[launch]\nscript = "{SCRIPT}"\n'
"""A run of the scripted rank (tests/support/scripted_rank.py): its pre-flight reads no data or model."""


def _add(store: Store, name: str, host: str = "here", devices: tuple[str, ...] = ("cpu",)) -> int:
    return entries_store.add_entry(store, name=name, recipe_text="t", recipe_source=f"{name}.toml", host=host,
                                   workdir="/", visible_devices=None, devices=list(devices), options={})


def _run(store: Store, name: str, status: str | None = None) -> int:
    run_id = store.create_run(name=name, recipe_text="", recipe_hash="h", strategy="single", nproc=1,
                              method="lora", model="m", run_dir="")
    if status is not None:
        store.update_run(run_id, status=status, ended_at=datetime(2026, 1, 2, 3, 4, 5))
    return run_id


def test_entries_are_in_line_by_id_with_their_runs_status(db_url: str) -> None:
    store = Store(db_url)
    first, other, second = _add(store, "first"), _add(store, "elsewhere", host="there"), _add(store, "second")
    assert entries_store.claim(store, first)
    run_id = _run(store, "first")
    entries_store.attach_run(store, first, run_id)
    store.update_run(run_id, status="running")
    listed = entries_store.entries(store)
    assert [(e.id, e.status, e.run_id, e.run_status) for e in listed] == [
        (first, STARTED, run_id, "running"), (other, QUEUED, None, None), (second, QUEUED, None, None)]
    assert [e.id for e in entries_store.entries(store, host="here", statuses=(QUEUED,))] == [second]
    assert positions(listed) == {other: 1, second: 1}, "each host has its own line"
    got = entries_store.get_entry(store, first)
    assert got is not None and got.started_at is not None and got.devices == ["cpu"] and got.options == {}
    assert entries_store.get_entry(store, 999) is None


def test_a_claim_takes_a_waiting_entry_once_and_never_a_removed_one(db_url: str) -> None:
    store = Store(db_url)
    entry, removed = _add(store, "a"), _add(store, "b")
    assert entries_store.claim(store, entry) and not entries_store.claim(store, entry)
    assert queue.remove(store, removed).name == "b"
    assert not entries_store.claim(store, removed)


def test_the_running_entry_is_not_removed_until_its_run_ended(db_url: str) -> None:
    store = Store(db_url)
    entry = _add(store, "long")
    entries_store.claim(store, entry)
    run_id = _run(store, "long")
    entries_store.attach_run(store, entry, run_id)
    store.update_run(run_id, status="running")
    with pytest.raises(queue.QueueRefused) as refused:
        queue.remove(store, entry)
    assert str(refused.value) == (f"queue entry {entry}: running as run {run_id}; stop it with ftui stop {run_id} "
                                  "(the queue then starts the next), then remove it")
    store.update_run(run_id, status="stopped")
    assert state_words(entries_store.entries(store)[0]) == f"done (run {run_id}, stopped)", "read from its run"
    assert queue.remove(store, entry).status == DONE, "its end recorded first, then removed"
    with pytest.raises(queue.QueueRefused, match=f"queue entry {entry}: no such entry"):
        queue.remove(store, entry)


def test_an_entry_ends_as_its_run_or_without_one(db_url: str) -> None:
    store = Store(db_url)
    ended, orphan, live = _add(store, "ended"), _add(store, "orphan"), _add(store, "live")
    for entry in (ended, orphan, live):
        entries_store.claim(store, entry)
    done_run, live_run = _run(store, "ended", "completed"), _run(store, "live")
    entries_store.attach_run(store, ended, done_run)
    entries_store.attach_run(store, live, live_run)
    states = {e.id: queue.settle(store, e) for e in entries_store.entries(store)}
    assert states == {ended: DONE, orphan: NOT_STARTED, live: STARTED}
    by_id = {e.id: e for e in entries_store.entries(store)}
    assert by_id[ended].ended_at == datetime(2026, 1, 2, 3, 4, 5), "the run's end"
    assert by_id[orphan].error is not None and "no run recorded" in by_id[orphan].error
    store.delete_run(done_run)
    gone = entries_store.get_entry(store, ended)
    assert gone is not None and gone.run_id is None and state_words(gone) == "done (its run was deleted)"
    with pytest.raises(ValueError, match="an entry ends done or failed"):
        entries_store.finish(store, live, QUEUED)


def test_enqueue_records_the_checked_recipe_and_refuses_bad_input_recording_nothing(
        db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FTUI_HOME", str(tmp_path))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.chdir(tmp_path)
    store = Store(db_url)
    options = queue.QueueOptions(grace_s=5.0, sample_interval_s=0.0)
    added = queue.enqueue(SCRIPT_RECIPE, ["name=mine", "launch.script_args=['--steps', '3']"], store=store,
                          source="mine.toml", options=options, start_runner=False)
    assert (added.position, added.devices, added.runner_pid) == (1, ["cpu"], None)
    entry = entries_store.get_entry(store, added.entry_id)
    assert entry is not None and (entry.name, entry.status, entry.recipe_source) == ("mine", QUEUED, "mine.toml")
    assert (entry.workdir, entry.visible_devices) == (str(tmp_path), "")
    assert 'script_args = ["--steps", "3"]' in entry.recipe_text, "the recipe as checked, its flags applied"
    assert queue.QueueOptions.from_json({**entry.options, "newer": 1}) == options
    second = queue.enqueue(SCRIPT_RECIPE, ["name=next"], store=store, start_runner=False)
    assert second.position == 2
    with pytest.raises(RecipeError, match="train.batchsize: unknown field"):
        queue.enqueue(SCRIPT_RECIPE, ["train.batchsize=2"], store=store, start_runner=False)
    with pytest.raises(RecipeError, match="^launch.nnodes: a run over several machines is not queued"):
        queue.enqueue(SCRIPT_RECIPE, ["launch.strategy=ddp", "launch.nproc=2", "launch.nnodes=2",
                                      "launch.main_addr=10.0.0.1", "launch.node_rank=0"],
                      store=store, start_runner=False)
    assert [e.name for e in entries_store.entries(store)] == ["mine", "next"]


def test_the_runner_ends_an_entry_that_no_longer_starts_and_leaves_with_the_queue_empty(
        db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The script of a queued run is deleted before its turn: the pre-flight refuses it then, the entry is
    ``failed to start`` with the line that says why, no run is recorded, and the runner gives its lock up."""
    monkeypatch.setenv("FTUI_HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "train.py"
    script.write_text("print('trains nothing')\n")
    store = Store(db_url)
    added = queue.enqueue(f'[launch]\nscript = "{script}"\n', ["name=vanishing"], store=store, start_runner=False)
    script.unlink()
    lock = queue.runner_lock(db_url)
    assert lock.acquire() and queue.runner_pid(db_url) == os.getpid()
    said: list[str] = []
    serve(QueueRunner(store, socket.gethostname(), poll_s=0.01, say=said.append), lock)
    entry = entries_store.get_entry(store, added.entry_id)
    assert entry is not None and entry.status == NOT_STARTED and entry.run_id is None and store.list_runs() == []
    assert entry.error is not None and entry.error.startswith("launch.script:") and str(script) in entry.error
    assert said == [f"entry {entry.id}: vanishing: not started: {entry.error}"]
    assert lock.fileno() is None and queue.runner_pid(db_url) is None, "the lock given up"


def _waiting(entry_id: int, *devices: str) -> QueueEntryInfo:
    now = datetime(2026, 1, 1)
    return QueueEntryInfo(id=entry_id, name=f"e{entry_id}", recipe_text="", recipe_source=None, host="h",
                          workdir="/", visible_devices=None, devices=list(devices), options={}, status=QUEUED,
                          run_id=None, error=None, created_at=now, started_at=None, ended_at=None)


def test_an_entry_starts_when_no_live_run_takes_its_devices_and_none_ahead_waits_for_them() -> None:
    cpu = [_waiting(1, "cpu"), _waiting(2, "cpu")]
    assert [e.id for e in to_start(cpu, [])] == [1], "on CPU: one at a time"
    assert to_start(cpu, [["cpu"]]) == [], "a live run (the 30-hour one) holds the machine"
    gpus = [_waiting(1, "gpu:0", "gpu:1"), _waiting(2, "gpu:2"), _waiting(3, "gpu:1", "gpu:2"), _waiting(4, "gpu:3")]
    assert [e.id for e in to_start(gpus, [["gpu:0"]])] == [2, 4], "3 waits for 1's gpu:1 and 2's gpu:2"
    assert [e.id for e in to_start(gpus, [])] == [1, 2, 4]
    assert to_start(gpus, [None]) == [], "a run whose devices are unknown holds every device"


def test_the_devices_a_run_takes() -> None:
    assert devices_taken(4, True, ["0", "1"]) == ["cpu"]
    assert devices_taken(2, False, []) == ["cpu"], "no GPU visible: it trains on CPU"
    assert devices_taken(2, False, visible_ids(None, None, 8)) == ["gpu:0", "gpu:1"]
    assert devices_taken(2, False, visible_ids(None, "4, 5,6", 8)) == ["gpu:4", "gpu:5"]
    assert devices_taken(2, False, visible_ids([7, 3], "4,5", 8)) == ["gpu:7", "gpu:3"], "launch.gpus wins"


def test_an_entry_starts_under_the_devices_and_folder_it_was_queued_with(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    here = Path.cwd()
    entry = _waiting(1, "gpu:2")
    queued = QueueEntryInfo(**{**entry.__dict__, "workdir": str(tmp_path), "visible_devices": "2"})
    with entry_environment(queued):
        assert (os.environ["CUDA_VISIBLE_DEVICES"], Path.cwd()) == ("2", tmp_path)
    assert (os.environ["CUDA_VISIBLE_DEVICES"], Path.cwd()) == ("0,1", here)
    unset = QueueEntryInfo(**{**entry.__dict__, "workdir": str(tmp_path / "gone")})
    with pytest.raises(OSError, match="gone: the folder it was queued from cannot be entered"), \
            entry_environment(unset):
        pass
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1" and Path.cwd() == here


def test_the_words_of_each_state() -> None:
    base: dict[str, Any] = _waiting(3, "cpu").__dict__
    words = [state_words(QueueEntryInfo(**{**base, **change})) for change in (
        {}, {"status": STARTED, "run_id": 14, "run_status": "running"}, {"status": STARTED},
        {"status": STARTED, "run_id": 14, "run_status": "completed"},
        {"status": NOT_STARTED, "error": "launch.script: no such file"})]
    assert words == ["queued", "running (run 14)", "starting", "done (run 14, completed)",
                     "failed to start (launch.script: no such file)"]
    entries = [QueueEntryInfo(**{**base, "id": i, "name": f"[b]e{i}[/b]"}) for i in range(1, 8)]
    lines = [str(line) for line in queue_lines(entries, most=5)]
    assert lines[0] == " 1. #1 [b]e1[/b]  -  queued" and lines[-1] == "    and 2 more: ftui queue lists them"
