"""Rebuilding the store from the run folders (``ftui db rebuild``): a lost or deleted database is recorded
again from what each run folder holds, and a store that lacks some runs gets them back.

The store is a projection of the folders (:mod:`runner.watch.journal`): each run folder has its row's
identity in ``run.json`` (:mod:`runner.spec.run_record`), its recipe and launch, the trainer's journal
(``events.jsonl``: start, steps, metrics, end), the watcher's (``orchestrator.jsonl``: launch, the
watcher, exit) and its telemetry (``samples.jsonl``). A folder is replayed the way the watcher recorded
it: the row, the journals ingested (:func:`runner.service.recover.reingest`), the start event's figures
(:class:`runner.watch.stream.RunStream`), the launch, and the end (:func:`runner.watch.finish.project_end`
at the exit event's time). A run the folders show unfinished is left ``running``; recover then settles it.

Runs are recorded oldest first (a resumed run after the run it continues, whose new id it points to). A
run already in the store (same uid) is left as it is, so rebuilding twice changes nothing the second time.
What lives in the store only is not in any folder: tags and notes, strategies a sweep refused before
they had a folder, and the parts of a multi-node run on other machines.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from runner.service.recover import reingest
from runner.spec import events as ev
from runner.spec.paths import runs_dir
from runner.spec.recipe import load_recipe
from runner.spec.run_record import from_epoch, read_record
from runner.spec.script import store_method, store_model
from runner.watch import journal
from runner.watch.finish import project_end
from runner.watch.prepare import load_prepared
from runner.watch.stream import RunStream
from store import Store

_ULID = re.compile(r"[0-9A-HJKMNP-TV-Z]{26}")
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_NOT_PAYLOAD = ("seq", "type", "time")


@dataclass(frozen=True)
class Rebuilt:
    """What the rebuild did with one run folder."""

    run_dir: Path
    run_id: int | None
    action: str
    """``added`` (recorded from the folder), ``present`` (the store has it), ``skipped`` (unreadable)."""
    detail: str = ""


def run_folders(root: Path) -> list[Path]:
    """The folders of ``root`` that hold a launched or prepared run (dry runs left out)."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir()
                  if p.is_dir() and not p.name.startswith("dry-run-") and (p / ev.LAUNCH_FILE).is_file())


def identity(run_dir: Path) -> dict[str, Any]:
    """The run's ``run.json``; for a folder written before it existed, what the folder name says (the uid
    and its time) with this host."""
    record = read_record(run_dir)
    if record.get("uid") and record.get("created_at"):
        return record
    match = _ULID.match(run_dir.name)
    uid = match.group(0) if match else run_dir.name
    created = _ulid_time(uid) if match else from_epoch(run_dir.stat().st_mtime)
    return {**record, "uid": uid, "created_at": created.isoformat()}


def _ulid_time(uid: str) -> datetime:
    """The creation time a ULID encodes (its first 10 characters: milliseconds since the epoch)."""
    value = 0
    for char in uid[:10]:
        value = value * 32 + _CROCKFORD.index(char)
    return from_epoch(value / 1000)


def rebuild(store: Store, root: Path | None = None) -> list[Rebuilt]:
    """Record every run folder of ``root`` (default the data folder's runs) that the store lacks."""
    entries = [(identity(folder), folder) for folder in run_folders(root or runs_dir())]
    entries.sort(key=lambda entry: str(entry[0]["created_at"]))
    ids: dict[str, int] = {}
    done = []
    for record, folder in entries:
        try:
            done.append(rebuild_run(store, folder, record, ids))
        except Exception as exc:  # noqa: BLE001 (one unreadable folder must not stop the others)
            done.append(Rebuilt(folder, None, "skipped", f"{type(exc).__name__}: {exc}"[:300]))
    return done


def rebuild_run(store: Store, run_dir: Path, record: dict[str, Any], ids: dict[str, int]) -> Rebuilt:
    """Record one run folder (see the module docstring); ``ids`` maps the uids recorded so far to their ids."""
    uid = str(record["uid"])
    present = store.get_run_by_uid(uid)
    if present is not None:
        ids[uid] = present.id
        return Rebuilt(run_dir, present.id, "present")
    recipe_file = run_dir / ev.RECIPE_FILE
    recipe = load_recipe(recipe_file)
    run_id = store.create_run(
        name=record.get("name") or recipe.name, recipe_text=recipe_file.read_text(encoding="utf-8"),
        recipe_hash=recipe.digest(), recipe_source=record.get("recipe_source"), strategy=recipe.launch.strategy,
        nproc=recipe.launch.nproc, method=store_method(recipe), model=store_model(recipe), run_dir=str(run_dir),
        sweep_id=record.get("sweep_id"), resumed_from=ids.get(str(record.get("resumed_from"))), uid=uid,
        created_at=datetime.fromisoformat(str(record["created_at"])), host=record.get("host"),
        summary=record.get("summary"))
    ids[uid] = run_id
    _replay(store, run_id, run_dir, record)
    run = store.get_run(run_id)
    return Rebuilt(run_dir, run_id, "added", run.status if run is not None else "")


def _replay(store: Store, run_id: int, run_dir: Path, record: dict[str, Any]) -> None:
    """The journals of the folder into the store, as the watcher wrote them."""
    reingest(store, run_id, run_dir)
    stream = RunStream(store, load_prepared(run_id, run_dir), None)
    stream.poll()  # the start event's figures, the precision and loss-scale notes
    stream.flush()
    events = journal.read_jsonl(run_dir / journal.ORCHESTRATOR_FILE)
    _replay_watch(store, run_id, events, str(record.get("host") or ""))
    found = [e for e in events if e["type"] == "batch_size_found"]
    if found:
        store.update_run(run_id, summary={"find_batch": _payload(found[-1])})
    exits = [e for e in events if e["type"] == "exit"]
    if exits:
        last = exits[-1]
        project_end(store, stream, last["status"], last.get("exit_code"), last.get("error"),
                    ended_at=from_epoch(last["time"]))


def _replay_watch(store: Store, run_id: int, events: list[dict[str, Any]], host: str) -> None:
    """The launch (status, start time, process group) and the last watcher of the orchestrator journal."""
    launches = [e for e in events if e["type"] == "launch"]
    watchers = [e for e in events if e["type"] in ("launch", "attach")]
    watcher = watchers[-1] if watchers else {}
    watcher_host = watcher.get("watcher_host") or host or None
    columns: dict[str, Any] = {"watcher_pid": watcher.get("watcher_pid"), "watcher_host": watcher_host}
    if launches:
        launch = launches[-1]
        columns |= {"status": "running", "started_at": from_epoch(launch["time"]), "pgid": launch.get("pgid"),
                    "pgid_started": launch.get("pgid_started")}
    summary = {"orchestrator_pid": watcher.get("watcher_pid"), "orchestrator_create_time": watcher.get("watcher_started"),
               "orchestrator_host": watcher_host}
    store.update_run(run_id, summary=summary, **columns)


def _payload(event: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in event.items() if k not in _NOT_PAYLOAD}
