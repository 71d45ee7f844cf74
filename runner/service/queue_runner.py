"""The queue runner: one process per host and store, ``python -m runner.service.queue_runner --db URL``,
started detached by :func:`runner.service.queue.ensure_runner` (a session of its own: it outlives the
terminal and the dashboard that queued the run), as pueue's daemon or task-spooler's server.

It holds the host's queue lock (:func:`runner.service.queue.runner_lock`) for its whole life, so two never
run, and goes round: runs of this host whose watcher died are settled or watched again
(:func:`runner.service.recover.recover_all`); entries whose run ended are recorded ``done``; then each
waiting entry, oldest first, starts when no live run of this host takes a device it takes and no entry
ahead of it waits for one of them (:func:`to_start`; on CPU the machine is one device, so runs take turns).
An entry starts as ``ftui run`` would start it, detached: the same pre-flight, recorded as a normal run
with a background watcher of its own (:func:`runner.watch.detached.start_detached`), which ``ftui stop``
stops; the runner then starts the next. It exits when nothing of this host is waiting or running.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime

from runner.service import launch
from runner.service.queue import CUDA_VISIBLE, QueueOptions, runner_lock, settle
from runner.service.recover import recover_all
from runner.spec import watching
from runner.spec.devices import conflicts
from runner.spec.recipe import RecipeError, one_line, parse_recipe
from runner.spec.status import LIVE, NOT_STARTED, PENDING, QUEUED, STARTED
from runner.watch.detached import start_detached
from runner.watch.identity import watcher_host
from runner.watch.journal import ProcessLock
from runner.watch.prepare import record_summary
from store import Store, StoreError
from store import queue as entries_store
from store.queue import QueueEntryInfo

MODULE = "runner.service.queue_runner"
FAILED_ROUNDS = 30
"""Rounds in a row that may fail (the store unreachable: each store call already retries a locked database
for up to its lock timeout) before the runner gives up and exits."""
POLL_ENV = "FTUI_QUEUE_POLL_S"
"""Sets :data:`runner.spec.watching.QUEUE_POLL_S` (tests set it small)."""


def to_start(waiting: Sequence[QueueEntryInfo], held: Sequence[Sequence[str] | None]) -> list[QueueEntryInfo]:
    """The waiting entries (in line order) that start now: each whose devices no live run takes (``held``)
    and no entry ahead of it waits for, so a later entry on other devices goes ahead but never takes a
    device from an earlier one."""
    taken: list[Sequence[str] | None] = list(held)
    out = []
    for entry in waiting:
        if not conflicts(entry.devices, taken):
            out.append(entry)
        taken.append(entry.devices)
    return out


@contextmanager
def entry_environment(entry: QueueEntryInfo) -> Iterator[None]:
    """``CUDA_VISIBLE_DEVICES`` and the working folder as they were where the entry was queued, for its
    pre-flight, its record and its watcher (which inherits them); this process's own again after.

    Raises:
        OSError: the folder it was queued from is gone (one line naming it).
    """
    saved_visible, saved_cwd = os.environ.get(CUDA_VISIBLE), os.getcwd()
    if entry.visible_devices is None:
        os.environ.pop(CUDA_VISIBLE, None)
    else:
        os.environ[CUDA_VISIBLE] = entry.visible_devices
    try:
        try:
            os.chdir(entry.workdir)
        except OSError as exc:
            raise OSError(f"{entry.workdir}: the folder it was queued from cannot be entered "
                          f"({exc.strerror or exc})") from None
        yield
    finally:
        if saved_visible is None:
            os.environ.pop(CUDA_VISIBLE, None)
        else:
            os.environ[CUDA_VISIBLE] = saved_visible
        os.chdir(saved_cwd)


class QueueRunner:
    """The rounds of one host's queue runner over the store (see the module's docstring)."""

    def __init__(self, store: Store, host: str, poll_s: float = watching.QUEUE_POLL_S,
                 say: Callable[[str], None] = print) -> None:
        self.store = store
        self.host = host
        self.poll_s = poll_s
        self.say = say
        self.watchers: list[subprocess.Popen[bytes]] = []
        """The background watchers of the runs this runner started, still to be waited for."""

    def pending(self) -> list[QueueEntryInfo]:
        """This host's entries that are waiting or running."""
        return entries_store.entries(self.store, self.host, PENDING)

    def held(self) -> list[list[str] | None]:
        """The devices the live runs of this host take (None: a run recorded before runs kept them)."""
        live = [run for status in LIVE for run in self.store.list_runs(status=status)]
        return [run.summary.devices for run in live if watcher_host(run) == self.host]

    def round(self) -> bool:
        """One look: settle, record the ends, start what can start. Whether anything is left to do."""
        recover_all(self.store)  # a run whose watcher died holds its devices no longer than it lives
        for entry in entries_store.entries(self.store, self.host, (STARTED,)):
            state = settle(self.store, entry)
            if state != STARTED:
                self.say(f"entry {entry.id}: {entry.name}: {state} (run {entry.run_id}, {entry.run_status})")
        waiting = entries_store.entries(self.store, self.host, (QUEUED,))
        for entry in to_start(waiting, self.held()):
            self.start(entry)
        return bool(self.pending())

    def start(self, entry: QueueEntryInfo) -> None:
        """Start one entry as ``ftui run`` would, detached; an entry that cannot start is ``failed`` with
        the one line that says why."""
        if not entries_store.claim(self.store, entry.id):
            return  # removed meanwhile
        options = QueueOptions.from_json(entry.options)
        try:
            with entry_environment(entry):
                recipe = parse_recipe(entry.recipe_text, source=f"queue entry {entry.id}")
                warnings = launch.check(recipe, options.fake_gpus, options.allow_data_change, force=options.force)
                request = launch.LaunchRequest(recipe, entry.recipe_source, resumed_from=options.resumed_from)
                prepared = launch.record(self.store, request)
                assert prepared.run_id is not None
                if options.summary:
                    record_summary(self.store, prepared.run_id, prepared.run_dir, options.summary)
                entries_store.attach_run(self.store, entry.id, prepared.run_id)
                self.watchers.append(start_detached(self.store.url, prepared, options.fake_gpus, options.watch()))
        except Exception as exc:  # noqa: BLE001 (a claimed entry that does not start must end, never stay running)
            why = one_line(str(exc)) if isinstance(exc, (RecipeError, StoreError, OSError)) else \
                one_line(f"{type(exc).__name__}: {exc}")
            entries_store.finish(self.store, entry.id, NOT_STARTED, why)
            self.say(f"entry {entry.id}: {entry.name}: not started: {why}")
            return
        for warning in warnings:
            self.say(f"entry {entry.id}: warning: {warning}")
        self.say(f"entry {entry.id}: {entry.name}: started as run {prepared.run_id} on {', '.join(entry.devices)}")

    def wait(self) -> None:
        """Until the next look: ``poll_s``, or less when a run this runner started ends (its watcher exits)."""
        self.watchers = [w for w in self.watchers if w.poll() is None]
        if not self.watchers:
            time.sleep(self.poll_s)
            return
        try:
            self.watchers[0].wait(timeout=self.poll_s)
        except subprocess.TimeoutExpired:
            pass


def serve(runner: QueueRunner, lock: ProcessLock) -> None:
    """Go round until nothing of this host is waiting or running. Before leaving, the lock is given up and
    the queue read once more: an entry added meanwhile (whose ``queue add`` found this runner alive) is
    served after all, by this runner or by the one that ``queue add`` started once the lock was free."""
    failed = 0
    while True:
        try:
            busy = runner.round()
            failed = 0
        except Exception as exc:  # noqa: BLE001 (a database gone away for a while: say so, look again)
            failed += 1
            runner.say(f"round failed ({failed} in a row): {one_line(f'{type(exc).__name__}: {exc}')}")
            if failed >= FAILED_ROUNDS:
                runner.say("giving up: ftui recover starts the queue runner again")
                return
            busy = True
        if busy:
            runner.wait()
            continue
        lock.release()
        if not runner.pending() or not lock.acquire():
            return


def poll_seconds() -> float:
    """:data:`runner.spec.watching.QUEUE_POLL_S`, or ``FTUI_QUEUE_POLL_S`` where set to a positive number."""
    try:
        value = float(os.environ.get(POLL_ENV, ""))
    except ValueError:
        return watching.QUEUE_POLL_S
    return value if 0 < value < float("inf") else watching.QUEUE_POLL_S


def main(argv: list[str] | None = None) -> int:
    """``python -m runner.service.queue_runner --db URL [--lock-fd FD]``: serve this host's queue until it is
    empty; exit at once when another runner of this host and store is alive."""
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}")
    parser.add_argument("--db", required=True)
    parser.add_argument("--lock-fd", type=int, help="the queue lock, taken and handed over by the starting process")
    args = parser.parse_args(argv)
    lock = runner_lock(args.db)
    if args.lock_fd is not None:
        lock.take_over(args.lock_fd)
    elif not lock.acquire():
        return 0
    try:
        store = Store(args.db)
        host = socket.gethostname()  # what this host's runs record as their watcher's
        runner = QueueRunner(store, host, poll_seconds(), say=_say)
        runner.say(f"queue runner pid {os.getpid()} for {host}")
        serve(runner, lock)
        runner.say("queue empty: exiting")
    finally:
        lock.release()
    return 0


def _say(line: str) -> None:
    print(f"{datetime.now():%Y-%m-%d %H:%M:%S} {line}", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
