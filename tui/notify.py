"""Tell the user a run ended (or hung: where each rank is): the terminal bell and, where ``notify-send`` exists, a desktop notification.

Used by ``ftui run --notify`` and the dashboard's notify setting (``b`` on the Runs screen). No rich, no
Textual: both front ends call it. ``notify-send`` is run with an argv list (never a shell), so a run's
name or error is passed as text, whatever it holds.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from typing import TextIO

from runner.spec.status import TERMINAL

ENDED = frozenset(TERMINAL)


def message(run_id: int, name: str, status: str, error: str | None = None) -> tuple[str, str]:
    """The title and body of the notification for a run that ended."""
    title = f"ftui: run {run_id} {status}"
    body = name if not error else f"{name}: {error}"
    return title, body[:300]


def desktop_argv(run_id: int, name: str, status: str, error: str | None = None,
                 program: str = "notify-send") -> list[str]:
    """The ``notify-send`` command line (a failed run is urgent)."""
    title, body = message(run_id, name, status, error)
    urgency = "critical" if status == "failed" else "normal"
    return [program, "--app-name=ftui", f"--urgency={urgency}", "--", title, body]


def ring_bell(stream: TextIO | None = None) -> None:
    """BEL to the terminal (stderr: the run's output on stdout stays clean for scripts)."""
    out = stream or sys.stderr
    try:
        out.write("\a")
        out.flush()
    except (OSError, ValueError):
        pass  # a closed terminal is no reason to fail a run that ended


def desktop(run_id: int, name: str, status: str, error: str | None = None) -> list[str] | None:
    """Send the desktop notification when ``notify-send`` is on PATH; the argv run, or None.

    A notifier that fails or hangs (no D-Bus session, e.g. over ssh) is ignored after 5 s.
    """
    program = shutil.which("notify-send")
    if program is None:
        return None
    argv = desktop_argv(run_id, name, status, error, program=program)
    try:
        subprocess.run(argv, check=False, timeout=5, stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return argv


def run_ended(run_id: int, name: str, status: str, error: str | None = None, *, bell: bool = True,
              stream: TextIO | None = None) -> list[str] | None:
    """Ring the bell (unless ``bell`` is False: the dashboard rings its own) and notify the desktop."""
    if bell:
        ring_bell(stream)
    return desktop(run_id, name, status, error)


def run_hung(run_id: int, name: str, stacks: str, *, bell: bool = True, stream: TextIO | None = None) -> list[str] | None:
    """A hang was declared and every rank's stacks read (``stacks``: the one line of where each rank is):
    ring the bell and notify the desktop, before the run is stopped."""
    return run_ended(run_id, name, "hung", stacks, bell=bell, stream=stream)
