"""The run queue (``ftui queue``; docs/running.md, "Queue"): runs put in line in the store, each started as a
normal run when the devices it takes are free, by one queue runner per host and store
(:mod:`runner.service.queue_runner`), which this module starts when none is alive.

:func:`enqueue` is the entry point of any command that queues a run (``ftui queue add``, a plan's winner): the
recipe gets the pre-flight of ``ftui run`` now, so bad input is refused before anything is recorded, and
again when the run starts (the host may have changed meanwhile). As SLURM copies a batch script when it is
submitted, the entry keeps the recipe as checked, its flags applied: editing the file later changes nothing
queued.
"""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from runner.service import launch
from runner.spec import watching
from runner.spec.paths import home, make_private_dir, slug
from runner.spec.recipe import Recipe, RecipeError, parse_recipe
from runner.spec.status import DONE, NOT_STARTED, PENDING, QUEUED, STARTED, entry_state
from runner.watch.follow import WatchOptions
from runner.watch.host import run_devices
from runner.watch.journal import ProcessLock
from store import Store
from store import queue as entries_store
from store.queue import QueueEntryInfo

RUNNER_MODULE = "runner.service.queue_runner"
"""``python -m`` of the queue runner."""
CUDA_VISIBLE = "CUDA_VISIBLE_DEVICES"


class QueueRefused(Exception):
    """What cannot be done to the queue (no such entry, an entry that is running): one line."""


@dataclass(frozen=True)
class QueueOptions:
    """How a queued run is started and watched: the flags of ``ftui run`` that are not recipe fields, and what
    its record holds besides (a plan's commit: the plan, and the trial it continues)."""

    fake_gpus: int = 0
    """Scripted GPUs of the demo mode (``--fake-gpus``)."""
    force: bool = False
    """Start more processes than this host has devices for (``--force``)."""
    allow_data_change: bool = False
    """A checkpoint to resume from may have been taken on other data (``--allow-data-change``)."""
    sample_interval_s: float = watching.SAMPLE_INTERVAL_S
    hang_after_s: float = watching.HANG_AFTER_S
    grace_s: float = watching.GRACE_S
    summary: dict[str, Any] = field(default_factory=dict)
    """Keys the run's summary records when it starts (``ftui plan --commit``: ``committed_by_plan``...)."""
    resumed_from: int | None = None
    """The run it continues, as its record names it (a commit from its trial's checkpoint); None: none."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> QueueOptions:
        """The options stored with an entry (a key this version does not know is left out)."""
        names = {f.name for f in fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in names})

    def watch(self) -> WatchOptions:
        """How the run's watcher follows it."""
        return WatchOptions(sample_interval_s=self.sample_interval_s, hang_after_s=self.hang_after_s,
                            grace_s=self.grace_s, fake_gpus=self.fake_gpus)


@dataclass(frozen=True)
class Enqueued:
    """A run put in the queue."""

    entry_id: int
    position: int
    """Its place in its host's line when it was added (1: it starts next)."""
    devices: list[str]
    """The devices it takes (it starts when no live run of this host takes any of them)."""
    warnings: list[str]
    """The pre-flight's warnings, one line each."""
    runner_pid: int | None
    """The queue runner started for it; None when one was alive already (or none was asked for)."""


def enqueue(recipe_text: str, overrides: Sequence[str] = (), *, store: Store, source: str | None = None,
            base_dir: str | Path | None = None, options: QueueOptions | None = None,
            start_runner: bool = True) -> Enqueued:
    """Put a run of ``recipe_text`` (with ``--set`` style ``overrides``) at the end of this host's queue, and
    start the host's queue runner if none is alive.

    Args:
        recipe_text: a recipe's TOML.
        overrides: ``FIELD=VALUE`` each, as ``--set`` takes them.
        store: where the queue lives.
        source: where the recipe came from (a file), as the run records it.
        base_dir: the folder the recipe's relative paths are taken from (default: the current one).
        options: how it is started and watched.
        start_runner: start the queue runner when none is alive (False: the caller does, or a test).

    Raises:
        runner.spec.recipe.RecipeError: the recipe cannot run here (one line naming the field); nothing
            was recorded.
    """
    recipe = parse_recipe(recipe_text, source=source or "<recipe>", overrides=overrides, base_dir=base_dir)
    chosen = options or QueueOptions()
    warnings = admit(recipe, chosen)
    return add(store, recipe, source, chosen, warnings, start_runner=start_runner)


def admit(recipe: Recipe, options: QueueOptions) -> list[str]:
    """The pre-flight of a queued run: ``ftui run``'s own (:func:`runner.service.launch.check`); a run
    over several machines is not queued (each machine starts its part). Its warnings.

    Raises:
        runner.spec.recipe.RecipeError: one line naming the field.
    """
    if (recipe.launch.nnodes or 1) > 1 or recipe.launch.rdzv_endpoint is not None:
        raise RecipeError("launch.nnodes: a run over several machines is not queued; start it with ftui run on "
                          "each machine (docs/multi-node.md)", field="launch.nnodes")
    return launch.check(recipe, options.fake_gpus, options.allow_data_change, force=options.force)


def add(store: Store, recipe: Recipe, source: str | None, options: QueueOptions, warnings: Sequence[str] = (),
        start_runner: bool = True) -> Enqueued:
    """Record a checked recipe (:func:`admit`) at the end of this host's queue, with this process's
    ``CUDA_VISIBLE_DEVICES`` and working folder; start the queue runner when none is alive."""
    host = socket.gethostname()
    devices = run_devices(recipe)
    entry_id = entries_store.add_entry(
        store, name=recipe.name, recipe_text=recipe.to_toml(), recipe_source=source, host=host, workdir=os.getcwd(),
        visible_devices=os.environ.get(CUDA_VISIBLE), devices=devices, options=options.to_json())
    ahead = [e for e in entries_store.entries(store, host, (QUEUED,)) if e.id < entry_id]
    pid = ensure_runner(store.url) if start_runner else None
    return Enqueued(entry_id, len(ahead) + 1, devices, list(warnings), pid)


def settle(store: Store, entry: QueueEntryInfo) -> str:
    """Record the end of a ``running`` entry whose run ended (``done``), or that has no run (the runner
    stopped while starting it, or the run was deleted: ``failed``); its state afterwards."""
    if entry.status != STARTED:
        return entry.status
    if entry.run_id is None:
        entries_store.finish(store, entry.id, NOT_STARTED, "no run recorded: the queue runner stopped while "
                                                            "starting it, or its run was deleted")
        return NOT_STARTED
    if entry_state(entry.status, entry.run_status) == DONE:
        run = store.get_run(entry.run_id)
        entries_store.finish(store, entry.id, DONE, ended_at=run.ended_at if run is not None else None)
        return DONE
    return STARTED


def remove(store: Store, entry_id: int) -> QueueEntryInfo:
    """Take an entry out of the queue (one waiting, or one that ended, from the list); the entry removed.

    Raises:
        QueueRefused: no such entry, or it is running (its run is stopped with ``ftui stop``; the queue then
            starts the next).
    """
    entry = entries_store.get_entry(store, entry_id)
    if entry is not None:
        settle(store, entry)  # a run that ended meanwhile: the entry is done, and can go
    before, removed = entries_store.remove_entry(store, entry_id)
    if before is None:
        raise QueueRefused(f"queue entry {entry_id}: no such entry (ftui queue lists them)")
    if not removed:
        run = f"run {before.run_id}" if before.run_id is not None else "its run"
        how = f"ftui stop {before.run_id}" if before.run_id is not None else "ftui stop ID"
        raise QueueRefused(f"queue entry {entry_id}: running as {run}; stop it with {how} (the queue then starts "
                           "the next), then remove it")
    return before


# ---------------------------------------------------------------------- the runner of this host


def canonical_url(db_url: str) -> str:
    """The store's URL as every process names it: a SQLite file by its absolute path (a relative one is
    relative to the folder of the command that gave it)."""
    prefix = "sqlite:///"
    if db_url.startswith(prefix) and not db_url.startswith(prefix + "/") and db_url != prefix:
        return prefix + os.path.abspath(db_url.removeprefix(prefix))
    return db_url


def runner_lock(db_url: str) -> ProcessLock:
    """The lock the queue runner of this host and store holds for its whole life: one runner per host and
    store. In the data folder's ``queue/`` (its log beside it), named by host and by a digest of the URL."""
    digest = hashlib.sha256(canonical_url(db_url).encode()).hexdigest()[:16]
    folder = make_private_dir(home() / "queue")
    return ProcessLock(folder / f"{slug(socket.gethostname())}-{digest}.lock")


def runner_pid(db_url: str) -> int | None:
    """The pid of this host's live queue runner of the store at ``db_url``; None when none is alive."""
    return runner_lock(db_url).holder()


def ensure_runner(db_url: str) -> int | None:
    """Start this host's queue runner of the store at ``db_url`` when none is alive: a process in a session
    of its own (it outlives the terminal and the dashboard); its pid, or None when one was alive. This
    process takes the queue lock and hands it to the runner (``--lock-fd``), so there is no moment in which
    a second caller finds neither holding it and starts a second runner."""
    lock = runner_lock(db_url)
    if not lock.acquire():
        return None
    fd = lock.fileno()
    assert fd is not None
    argv = [sys.executable, "-m", RUNNER_MODULE, "--db", canonical_url(db_url), "--lock-fd", str(fd)]
    log = open(lock.path.with_suffix(".log"), "ab")  # noqa: SIM115 (the runner keeps its own descriptor)
    try:
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                 cwd=lock.path.parent, start_new_session=True, pass_fds=(fd,))
        lock.name_holder(child.pid)
    finally:
        log.close()
        lock.release()  # the runner holds the same open file, and with it the lock
    return child.pid


def restart_runner(store: Store) -> int | None:
    """Start this host's queue runner when entries of this host wait or run and none is alive (after a
    reboot, or a runner that was killed): ``ftui recover`` calls it. Its pid, or None when none was started."""
    if not entries_store.entries(store, socket.gethostname(), PENDING):
        return None
    return ensure_runner(store.url)
