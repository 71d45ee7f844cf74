"""Asking every rank of a run for its Python stacks (a hang, a collective that timed out) and reporting
where each one is (:mod:`runner.spec.stacks` holds the file format and the parsing).

A rank is asked only when the header of its stacks file names the live rank process the run folder
proves (:func:`runner.watch.procs.rank_pids`): that process registered the handler, so the signal
cannot end it. What each rank writes is read from where its file ended at the request; a rank stopped
(SIGSTOP) answers once it is continued, which the hang stop does first.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runner.spec import stacks
from runner.watch import procs

STACKS_WAIT_S = 5.0
"""Seconds the ranks get to answer before the stacks are reported without the ranks that did not."""


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


class StackCapture:
    """One request for the stacks of every rank of a run, and what came back.

    Args:
        run_dir: the run folder.
        cause: why the stacks were asked for (``"hang"``, ``"collective timeout"``).
        clock: the wall clock of :data:`STACKS_WAIT_S`.
        wait_s: seconds to wait for every rank's answer.
    """

    def __init__(self, run_dir: Path, cause: str, clock: Callable[[], float] = time.time,
                 wait_s: float = STACKS_WAIT_S) -> None:
        self.run_dir = run_dir
        self.cause = cause
        self.clock = clock
        self.wait_s = wait_s
        self.known: set[int] = set()
        """Every rank alive when asked (those that could not be asked too)."""
        self.asked: dict[int, int] = {}
        """Rank -> the size of its stacks file when it was asked: its answer is what follows."""
        self.main: dict[int, str] = {}
        """Rank -> its main thread's identifier (the header's)."""
        self.seen: dict[int, int] = {}
        self.asked_at = clock()

    def request(self, only: set[int] | None = None) -> None:
        """Signal every rank that can take it (``only``: those ranks), noting where its file ends now."""
        for rank, pid in procs.rank_pids(self.run_dir).items():
            if only is not None and rank not in only:
                continue
            self.known.add(rank)
            path = stacks.stacks_file(self.run_dir, rank)
            header = stacks.registered(path)
            if header is None or header[0] != pid:
                continue  # not registered (yet, or a script launched without ftui's rank start-up)
            offset = _size(path)
            if procs.signal_pids([pid], stacks.DUMP_SIGNAL):
                self.asked[rank], self.main[rank] = offset, header[1]
                self.seen.pop(rank, None)
        self.asked_at = self.clock()

    def answer(self, rank: int) -> str:
        """What a rank wrote since it was asked."""
        path = stacks.stacks_file(self.run_dir, rank)
        try:
            with open(path, "rb") as fh:
                fh.seek(self.asked[rank])
                return fh.read().decode("utf-8", errors="replace")
        except OSError:
            return ""

    def done(self) -> bool:
        """Every rank asked answered (its file grew, and did not grow since the last look), or the wait ran out."""
        complete = True
        for rank, offset in self.asked.items():
            size = _size(stacks.stacks_file(self.run_dir, rank))
            if size <= offset or self.seen.get(rank) != size:
                complete = False
            self.seen[rank] = size
        return complete or self.clock() - self.asked_at >= self.wait_s

    def missing(self) -> set[int]:
        """The ranks asked that have not answered."""
        return {rank for rank in self.asked if not self.answer(rank).strip()}

    def result(self) -> dict[str, Any]:
        """The payload of the ``stacks`` event: ``cause``, ``ranks`` (rank -> where, None: no answer),
        ``summary`` (one line) and ``folder`` (where the full dumps stay)."""
        where = {rank: stacks.rank_where(self.answer(rank), self.main.get(rank)) if rank in self.asked else None
                 for rank in sorted(self.known)}
        return {"cause": self.cause, "ranks": {str(rank): place for rank, place in where.items()},
                "summary": stacks.summary(where), "folder": str(self.run_dir / stacks.STACKS_DIR)}


class StackReport:
    """The watcher's requests for stacks and their reports: one capture at a time, each reported once
    through ``report`` (the watcher journals it, stores it in the run's summary and shows it).

    Args:
        run_dir: the run folder.
        report: called with :meth:`StackCapture.result` when a capture is complete.
        clock: the wall clock.
        wait_s: seconds the ranks get to answer.
    """

    def __init__(self, run_dir: Path, report: Callable[[dict[str, Any]], None], clock: Callable[[], float] = time.time,
                 wait_s: float = STACKS_WAIT_S) -> None:
        self.run_dir = run_dir
        self.report = report
        self.clock = clock
        self.wait_s = wait_s
        self.capture: StackCapture | None = None
        self.pending = False
        self.summary: str | None = None
        """The summary line of the last capture reported."""

    def request(self, cause: str) -> None:
        """Ask every rank for its stacks, unless a capture is under way already."""
        if self.pending:
            return
        self.capture = StackCapture(self.run_dir, cause, clock=self.clock, wait_s=self.wait_s)
        self.capture.request()
        self.pending = bool(self.capture.asked)

    def reopen(self) -> None:
        """Wait again for the ranks that have not answered (a stopped rank answers once continued)."""
        capture = self.capture
        if capture is not None and capture.missing():
            capture.asked_at = self.clock()
            self.pending = True

    def poll(self) -> None:
        """Report the capture under way once it is complete."""
        if self.pending and self.capture is not None and self.capture.done():
            self._report()

    def finish(self) -> str | None:
        """Report what came of a capture still under way; the last summary line reported."""
        if self.pending:
            self._report()
        return self.summary

    def _report(self) -> None:
        assert self.capture is not None
        self.pending = False
        result = self.capture.result()
        self.summary = result["summary"]
        self.report(result)
