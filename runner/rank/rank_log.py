"""Each rank's output goes to its own log, ``RUN/logs/rank{N}.log`` (:func:`runner.spec.events.rank_log`),
a rank that fails says why there and in the journal, as far as the disk lets it (:func:`report_failure`),
and its Python stacks go, on request, to ``RUN/stacks/rank{N}.txt`` (:mod:`runner.spec.stacks`)."""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path

from runner.hardware.disks import is_no_space
from runner.spec import events as ev
from runner.spec import stacks


def redirect_output(log: Path) -> None:
    """Send this process's stdout and stderr (file descriptors 1 and 2 too) to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115


def dump_stacks_on_signal(run_dir: Path, rank: int) -> None:
    """Write every thread's Python stack to ``RUN/stacks/rank{N}.txt`` whenever this process gets
    :data:`runner.spec.stacks.DUMP_SIGNAL` (faulthandler's C-level handler: it answers inside a blocking
    collective too). The header naming this process is written once the handler is registered: the
    watcher signals only the process a header names, so never one that cannot take the signal yet. A
    disk that takes no file leaves the rank without it (no header: it is never asked), never failed."""
    path = stacks.stacks_file(run_dir, rank)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        out = open(path, "w", encoding="utf-8")  # noqa: SIM115 (kept open for the process's life: faulthandler writes to it)
        faulthandler.register(stacks.DUMP_SIGNAL, file=out, all_threads=True, chain=False)
        out.write(stacks.header(rank, os.getpid(), threading.main_thread().ident or 0))
        out.flush()
    except OSError:
        return


def caused_by_full_disk(exc: BaseException) -> bool:
    """Whether ``exc`` or an exception it came from says the disk is full (:func:`runner.hardware.disks.is_no_space`:
    ENOSPC, a quota, or the words torch's C++ writers put in a RuntimeError)."""
    return is_no_space(exc)


def report_failure(exc: BaseException, journal: ev.JournalWriter | None, rank: int) -> int:
    """Write why this rank failed to its log (the traceback) and to the journal (rank 0: an ``error``
    event), each as far as its disk lets it; the exit code: :data:`runner.spec.events.EXIT_NO_SPACE` when
    a disk was full (the word that reaches the watcher even when nothing can be written), else 1."""
    try:
        traceback.print_exception(exc)
        sys.stderr.flush()
    except OSError:
        pass  # the log's disk is full too: the exit code says it
    if journal is not None:
        try:
            journal.write(ev.ErrorEvent(type="error", message=f"{type(exc).__name__}: {exc}".strip(), rank=rank))
        except OSError:
            pass
    return ev.EXIT_NO_SPACE if caused_by_full_disk(exc) else 1


def flush_quietly(journal: ev.JournalWriter | None) -> None:
    """Flush the rank's output and close its journal; a disk that takes nothing more changes no exit code."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except OSError:
            pass
    if journal is not None:
        try:
            journal.close()
        except OSError:
            pass


def run_reporting(train: Callable[[ev.JournalWriter | None], str], run_dir: Path, rank: int) -> int:
    """Run ``train`` (given rank 0 the run's journal; it returns the run's status) and return the rank's exit
    code: 0, 1 when it failed, :data:`runner.spec.events.EXIT_NO_SPACE` when a disk was full. Every
    failure is reported (:func:`report_failure`); no write that fails on the way out changes the code, but
    a journal whose last events never reached the disk (full to the end) makes a run that trained fail with
    :data:`runner.spec.events.EXIT_NO_SPACE`: its record is not whole, and the watcher names the disk."""
    journal = ev.JournalWriter(run_dir / ev.EVENTS_FILE) if rank == 0 else None
    try:
        code = 1 if train(journal) == "failed" else 0
    except BaseException as exc:  # noqa: BLE001 (report every failure, then exit non-zero)
        code = report_failure(exc, journal, rank)
    finally:
        flush_quietly(journal)
    if code == 0 and journal is not None and journal.unwritten:
        code = ev.EXIT_NO_SPACE if journal.failed is not None and caused_by_full_disk(journal.failed) else 1
    return code
