"""Every rank's Python stacks, on request: the file each rank keeps, the signal that asks for a dump, and
the one line that says where each rank is.

Each rank registers :mod:`faulthandler` on :data:`DUMP_SIGNAL` as it starts (``runner.rank.rank_log``), so
a signal makes the interpreter write the stacks of all its threads into ``RUN/stacks/rank{N}.txt`` from a
C-level handler: it answers even inside a blocking gloo or NCCL call, where no Python code runs. The file
begins with a header naming the rank's pid and its main thread (:func:`header`), so that only a process
that registered the handler is ever sent the signal (its default action ends a process), and its main
thread is known in every dump; each dump is appended after it.

The watcher reads a dump back (:func:`parse_dump`) and names, per rank, the innermost frame of the main
thread that is in ftui's or the user's code or in ``torch.distributed`` (:func:`where`):
``rank 1 in all_reduce (runner/rank/loop.py:412); rank 0 in tokenize (runner/data/blocks.py:80)``.
"""

from __future__ import annotations

import re
import signal
import sysconfig
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

STACKS_DIR = "stacks"
"""The folder of the run that holds one stacks file per rank."""

DUMP_SIGNAL = signal.SIGUSR2
"""What asks a rank for its stacks (SIGUSR1 is the watcher's own kill request: never the same signal)."""

_HEADER = re.compile(r"^ftui stacks: rank (?P<rank>\d+), pid (?P<pid>\d+), main thread (?P<main>0x[0-9a-f]+)")
_THREAD = re.compile(r"^(?P<current>Current thread|Thread) (?P<ident>0x[0-9a-f]+) \(most recent call first\):")
_FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+|\?\?\?) in (?P<function>.*)$')

PROJECT_ROOT = Path(__file__).resolve().parents[2]
"""The folder that holds the ``runner`` package: paths under it are shown relative to it."""
_RUNNER = PROJECT_ROOT / "runner"
_LIBRARIES = tuple(str(Path(p)) for p in {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"],
                                          sysconfig.get_paths()["platlib"]})


def stacks_file(run_dir: Path, rank: int) -> Path:
    """The stacks file of one rank."""
    return run_dir / STACKS_DIR / f"rank{rank}.txt"


def thread_ident(ident: int) -> str:
    """A thread's identifier as faulthandler writes it (``0x00007f...``: 16 hex digits)."""
    return f"0x{ident:016x}"


def header(rank: int, pid: int, main_thread: int) -> str:
    """The first line of a rank's stacks file: which process answers :data:`DUMP_SIGNAL`, and which of its
    threads is the main one (``threading.main_thread().ident``)."""
    return (f"ftui stacks: rank {rank}, pid {pid}, main thread {thread_ident(main_thread)} "
            f"(faulthandler on {DUMP_SIGNAL.name}; each dump follows)\n")


def registered(path: Path) -> tuple[int, str] | None:
    """The pid and main thread named in a stacks file's header (the process that registered the
    handler), or None."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            first = fh.readline()
    except OSError:
        return None
    match = _HEADER.match(first)
    return (int(match["pid"]), match["main"]) if match else None


@dataclass(frozen=True)
class Frame:
    """One frame of a faulthandler dump."""

    file: str
    line: int | None
    function: str


@dataclass(frozen=True)
class Thread:
    """One thread of a dump: its frames, innermost first."""

    ident: str
    current: bool
    frames: tuple[Frame, ...]

    @property
    def is_main(self) -> bool:
        """A thread that ``threading`` did not start: its outermost frame is not ``threading``'s bootstrap."""
        if not self.frames:
            return False
        outer = self.frames[-1]
        return not (outer.function.startswith("_bootstrap") and outer.file.endswith("threading.py"))


def parse_dump(text: str) -> list[Thread]:
    """The threads of one faulthandler dump (``all_threads=True``), in the order written."""
    threads: list[Thread] = []
    ident: str | None = None
    current = False
    frames: list[Frame] = []
    for line in text.splitlines():
        head = _THREAD.match(line)
        if head:
            if ident is not None:
                threads.append(Thread(ident, current, tuple(frames)))
            ident, current, frames = head["ident"], head["current"] == "Current thread", []
            continue
        frame = _FRAME.match(line)
        if frame and ident is not None:
            number = frame["line"]
            frames.append(Frame(frame["file"], int(number) if number.isdigit() else None, frame["function"]))
    if ident is not None:
        threads.append(Thread(ident, current, tuple(frames)))
    return threads


def main_thread(threads: list[Thread], ident: str | None = None) -> Thread | None:
    """The main thread of a dump: the thread ``ident`` names (the header's), else the one not started by
    ``threading`` (a dump cut short: the last one)."""
    named = next((t for t in threads if t.ident == ident), None)
    return named or next((t for t in threads if t.is_main), threads[-1] if threads else None)


def is_ours(file: str) -> bool:
    """A frame of ftui's code or of the user's (a script, a notebook): not the standard library nor an
    installed package, unless it is ftui's own ``runner`` package."""
    if file.startswith(f"{_RUNNER}/"):
        return True
    if file.startswith("<frozen") or "site-packages" in file or "dist-packages" in file:
        return False
    return not file.startswith(_LIBRARIES)


def is_distributed(file: str) -> bool:
    """A frame of ``torch.distributed`` (a collective, a barrier, a rendezvous)."""
    return "/torch/distributed/" in file


def short_path(file: str) -> str:
    """A path under the project relative to it; any other as its last two parts."""
    path = Path(file)
    try:
        return str(path.relative_to(PROJECT_ROOT))
    except ValueError:
        return str(Path(*path.parts[-2:])) if len(path.parts) > 1 else file


def where(thread: Thread) -> str:
    """``all_reduce (runner/rank/loop.py:412)``: the innermost frame in our code or ``torch.distributed``
    (its function), at the innermost line of our code; a thread with neither: its innermost frame."""
    named = next((f for f in thread.frames if is_ours(f.file) or is_distributed(f.file)), None)
    place = next((f for f in thread.frames if is_ours(f.file)), None)
    named = named or (thread.frames[0] if thread.frames else None)
    if named is None:
        return "no Python frame"
    at = place or named
    return f"{named.function} ({short_path(at.file)}:{at.line if at.line is not None else '?'})"


def rank_where(text: str, main: str | None = None) -> str | None:
    """Where the main thread (``main``: its identifier) of one dump is (:func:`where`), or None when the
    text holds no thread."""
    thread = main_thread(parse_dump(text), main)
    return where(thread) if thread is not None else None


def _ranks(ranks: list[int]) -> str:
    """``rank 3`` or ``ranks 0-2, 5``."""
    spans: list[list[int]] = []
    for rank in sorted(ranks):
        if spans and rank == spans[-1][1] + 1:
            spans[-1][1] = rank
        else:
            spans.append([rank, rank])
    words = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
    return f"rank {words}" if len(ranks) == 1 else f"ranks {words}"


def summary(by_rank: Mapping[int, str | None]) -> str:
    """``rank 1 in all_reduce (...); rank 0 in tokenize (...)``: ranks at the same place share a part (``ranks
    0-6 in ...``), the part of the lowest rank first; a rank without a dump says so."""
    places: dict[str | None, list[int]] = {}
    for rank, place in by_rank.items():
        places.setdefault(place, []).append(rank)
    parts = sorted(places.items(), key=lambda item: min(item[1]))
    return "; ".join(f"{_ranks(ranks)} in {place}" if place else f"{_ranks(ranks)}: no stacks (did not answer)"
                     for place, ranks in parts)
