"""Drive ``ftui`` in tmux as a person would, at 80x24: open it, compose quickstart, launch, watch the
monitor, quit while the run is still running, reopen, open the run while it still runs and see its
step count advance (a live re-attach = reading the store again), stop it from the monitor (confirmed);
then compose again with strategy ddp on 2 processes, launch, stop it (confirmed), resume it from Runs
(``R``: a new run from its stop's checkpoint, on from the step it stopped at), stop that too, compare the
runs, and write their report with ``ftui report``.

    python tests/support/tmux_drive.py [--home DIR] [--steps 60]

The drive goes by WHAT THE SCREEN SHOWS, never by time: after typing into a field it waits for the
field to echo the text (typing again when the keys were lost to a field that did not yet take them),
and every step waits for its screen with a generous timeout (the machine may be heavily loaded).
Prints what it saw and the first-paint time; exits non-zero when a step fails.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXITED = "[the command exited with status"
"""What the pane prints when the driven command ends (a crash prints its traceback above it)."""


class Tmux:
    def __init__(self, name: str, env: dict[str, str], width: int = 80, height: int = 24) -> None:
        self.name, self.env, self.width, self.height = name, env, width, height

    def start(self, command: list[str]) -> float:
        """Start ``command`` in a detached session; return the monotonic start time."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        started = time.monotonic()
        subprocess.run(["tmux", "new-session", "-d", "-s", self.name, "-x", str(self.width), "-y", str(self.height),
                        # COLUMNS/LINES inherited from a parent (pytest's set them) would override the pane's
                        # real size in shutil.get_terminal_size, which Textual reads.
                        # After the command, its exit status stays on the pane for a failing wait to show
                        # (the drive kills the session when it is done).
                        f"cd {shlex.quote(str(ROOT))} && env -u COLUMNS -u LINES {env} {shlex.join(command)}; "
                        f'echo "{EXITED} $?]"; sleep 900'], check=True)
        return started

    def keys(self, *keys: str) -> None:
        """Send keys, one ``send-keys`` each. No pause between them: a caller that needs the app to have
        taken a key before the next waits for what the screen shows (``wait``/``wait_gone``)."""
        for key in keys:
            subprocess.run(["tmux", "send-keys", "-t", self.name, key], check=True)

    def text(self, *chars: str) -> None:
        subprocess.run(["tmux", "send-keys", "-t", self.name, "-l", "".join(chars)], check=True)

    def screen(self) -> str:
        shown = subprocess.run(["tmux", "capture-pane", "-p", "-t", self.name], capture_output=True, text=True)
        if shown.returncode != 0:  # the session (or the server) is gone: say so in what a failing wait prints
            return f"[no screen: tmux capture-pane: {shown.stderr.strip()}]"
        return shown.stdout

    def wait(self, pattern: str, timeout: float = 60.0) -> str:
        return self.wait_until(lambda screen: re.search(pattern, screen) is not None, pattern, timeout)

    def wait_until(self, shown: Callable[[str], bool], what: str, timeout: float = 60.0) -> str:
        """Poll the screen until ``shown(screen)``; the screen. (The poll is the only pause: every wait
        in the drive is on what the screen shows, never a fixed sleep.)"""
        deadline = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < deadline:
            screen = self.screen()
            if shown(screen):
                return screen
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}; screen:\n{screen}{self.ended()}")

    def ended(self) -> str:
        """When the command has ended (a crash prints its traceback above the status line): the pane's last
        200 lines, scrollback included; else nothing."""
        history = subprocess.run(["tmux", "capture-pane", "-p", "-S", "-200", "-t", self.name], capture_output=True,
                                 text=True).stdout
        return f"\n--- the command ended; the pane with its scrollback:\n{history}" if EXITED in history else ""

    def wait_gone(self, pattern: str, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < deadline:
            screen = self.screen()
            if not re.search(pattern, screen):
                return screen
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {pattern!r} to go; screen:\n{screen}")

    def set_field(self, label: str, value: str, attempts: int = 4, timeout: float = 20.0) -> str:
        """Focus a Compose field through the palette ("Go to field: <label>"), replace its text and
        wait until the screen shows it beside the label (or one line above it, when the form scrolled
        the field into view). Keys typed before the field takes them are lost on a loaded machine: if
        the echo does not come, do it again."""
        def beside(shown: str) -> str:  # the field's text on its label's line (one row per field)
            return rf"(?m)^{re.escape(label)} +{shown}"

        echo = beside(rf"{re.escape(value)}(?:\s|$)")
        screen = ""
        for _ in range(attempts):
            self.focus_field(label)
            self.keys("C-e", "C-u")
            try:
                # the field cleared shows its placeholder: the keys went to THIS field, not to the one
                # focused before the palette's "Go to field" took effect
                self.wait(beside("empty:"), timeout=timeout)
                self.text(value)
                return self.wait(echo, timeout=timeout)
            except AssertionError as exc:
                screen = str(exc)
        raise AssertionError(f"field {label!r} never showed {value!r}; last screen:\n{screen}")

    def focus_field(self, label: str) -> None:
        """The palette's "Go to field" (counting Tabs would race the form's mount)."""
        self.keys("C-p")
        self.wait(r"Search for commands", timeout=60)
        self.text(f"go to field: {label}")
        self.wait(rf"Go to field: {re.escape(label)}", timeout=60)
        self.keys("Enter")
        # The palette closed. Not its placeholder ("Search for commands" goes as soon as text is typed): the
        # typed text, or the hit it becomes. A key sent while it is still closing reaches the palette, and a
        # second Enter there makes Textual's palette dismiss itself twice: ScreenStackError ends the app.
        self.wait_gone(r"(?i)go to field: ", timeout=60)

    def choose(self, label: str, option: str, listed: tuple[str, str], attempts: int = 4,
               timeout: float = 20.0) -> str:
        """Pick ``option`` in a Compose select: focus it, open it (Enter) and wait until the dropdown
        shows (``listed``: two options it shows on consecutive lines), type to search, Enter; wait
        until the select shows the option beside its label."""
        shown = rf"(?m)^{re.escape(label)} +{re.escape(option)} +▼"
        opened = rf"\b{re.escape(listed[0])}\b[^\n]*\n[^\n]*\b{re.escape(listed[1])}\b"
        screen = ""
        for _ in range(attempts):
            self.focus_field(label)
            self.keys("Enter")
            try:
                self.wait(opened, timeout=timeout)
                self.text(option)
                self.keys("Enter")
                return self.wait(shown, timeout=timeout)
            except AssertionError as exc:
                screen = str(exc)
                self.keys("Escape")  # a dropdown left open: wait until it closed (a key right after
                self.wait_gone(opened, timeout=timeout)  # an escape reads as alt+key)
        raise AssertionError(f"select {label!r} never showed {option!r}; last screen:\n{screen}")

    def kill(self) -> None:
        subprocess.run(["tmux", "kill-session", "-t", self.name], capture_output=True)


def drive(home: Path, steps: int = 60, log=print) -> dict[str, float]:  # type: ignore[no-untyped-def]
    home.mkdir(parents=True, exist_ok=True)
    env = {"FTUI_HOME": str(home), "FTUI_DB": f"sqlite:///{home / 'ftui.db'}", "PYTHONPATH": str(ROOT),
           "TERM": "xterm-256color", "PATH": os.environ.get("PATH", "")}
    command = [sys.executable, "-m", "tui.cli"]
    tmux = Tmux(f"ftui-drive-{os.getpid()}", env)
    # Killing a server's last session shuts the server down; a new-session racing that shutdown fails
    # ("lost server"). A keeper session holds the server up between ftui's two sessions.
    keeper = f"ftui-keeper-{os.getpid()}"
    subprocess.run(["tmux", "new-session", "-d", "-s", keeper, "sleep 3600"], check=True)
    timings: dict[str, float] = {}
    try:
        started = tmux.start(command)
        tmux.wait(r"filter: name", timeout=120)
        timings["first_paint_s"] = time.monotonic() - started
        log(f"1. ftui opened on Runs (first paint {timings['first_paint_s']:.2f}s)")

        tmux.keys("2")
        tmux.wait(r"launch command", timeout=120)
        screen = tmux.set_field("max steps", str(steps))
        # The value and the verdict on one screen, right before launching.
        screen = tmux.wait(rf"(?m)^max steps +{steps}\b[\s\S]*✓ valid recipe", timeout=60)
        log(f"2. Compose: quickstart with max steps {steps}, valid; launch preview shown")

        tmux.keys("C-l")
        screen = tmux.wait(r"run \d+ quickstart", timeout=120)
        run_id = re.search(r"run (\d+) quickstart", screen).group(1)  # type: ignore[union-attr]
        # Wide: "rank 0 (CPU process)" in the device column; under 100 columns: "rank 0" under a
        # psutil-labelled header.
        screen = tmux.wait(r"rank 0 \(CPU process\)|\(psutil\)[\s\S]*\brank 0\b", timeout=300)
        log(f"3. Monitor of run {run_id}: device rows from psutil")
        progress = rf"run {run_id} quickstart\s+(\w+)\s[\s\S]*?step (\d+)/{steps}"
        screen = tmux.wait(rf"run {run_id} quickstart\s+running\s[\s\S]*?step [1-9]\d*/{steps}", timeout=300)
        status, step = re.search(progress, screen).groups()  # type: ignore[union-attr]
        assert status == "running", screen
        tmux.keys("q")
        tmux.wait_gone(r"filter: name|run \d+ quickstart", timeout=60)  # ftui is gone (the pane sleeps)
        tmux.kill()
        log(f"4. quit ftui while run {run_id} was running (step {step}/{steps}); it is detached and goes on")

        tmux = Tmux(f"ftui-drive2-{os.getpid()}", env)
        started = tmux.start(command)
        screen = tmux.wait(rf"\b{run_id}\s+quickstart", timeout=120)
        timings["reopen_paint_s"] = time.monotonic() - started
        screen = tmux.wait(rf"\b{run_id}\s+quickstart\s+\w+", timeout=60)
        assert re.search(rf"\b{run_id}\s+quickstart\s+running", screen), screen
        log(f"5. reopened: run {run_id} is in Runs, still running (read back from the store)")
        tmux.keys("Enter")
        screen = tmux.wait(progress, timeout=120)
        first = int(re.search(progress, screen).group(2))  # type: ignore[union-attr]

        def moved_on(screen: str) -> bool:
            match = re.search(progress, screen)
            return match is not None and int(match.group(2)) > first

        screen = tmux.wait_until(moved_on, f"a step after {first}", timeout=300)
        now = int(re.search(progress, screen).group(2))  # type: ignore[union-attr]
        log(f"6. its monitor follows it live: step {first} -> {now} of {steps}")
        stop_confirmed(tmux, run_id)
        tmux.wait(rf"run {run_id} quickstart\s+(stopped|completed)", timeout=300)
        log(f"7. stopped run {run_id} from the monitor (s, then y to the question)")

        tmux.keys("Escape")
        tmux.wait(r"filter: name", timeout=60)
        tmux.keys("2")
        tmux.wait(r"launch command|✓ valid recipe", timeout=120)
        # On a loaded machine the form's verdict lags the keys by seconds: wait for the verdict that
        # only the new values give (single with 2 processes is refused; then fsdp with 2 is valid).
        for attempt in range(3):
            tmux.set_field("processes", "2")
            try:
                tmux.wait(r"✗ launch\.nproc: strategy 'single' runs one process", timeout=60)
                break
            except AssertionError:
                if attempt == 2:
                    raise
        tmux.choose("strategy", "ddp", listed=("single", "mp"))
        screen = tmux.wait(r"(?m)^strategy +ddp +▼[\s\S]*^processes +2\b[\s\S]*✓ valid recipe", timeout=60)
        log("8. Compose: strategy ddp with 2 processes, valid (the form is validated as one recipe)")
        tmux.keys("C-l")
        screen = tmux.wait(rf"run (?!{run_id}\b)\d+ quickstart", timeout=120)
        ddp_id = re.search(rf"run (?!{run_id}\b)(\d+) quickstart", screen).group(1)  # type: ignore[union-attr]
        screen = tmux.wait(rf"run {ddp_id} quickstart\s+\w+\s+ddp × 2", timeout=120)
        screen = tmux.wait(rf"run {ddp_id} quickstart\s+(running|completed|failed)\s[\s\S]*?step [1-9]\d*/",
                           timeout=600)
        assert re.search(rf"run {ddp_id} quickstart\s+running", screen), screen
        seen = int(re.search(rf"run {ddp_id} quickstart[\s\S]*?step (\d+)/", screen).group(1))  # type: ignore[union-attr]
        log(f"9. launched run {ddp_id} (ddp × 2) from Compose; its monitor shows step {seen}")
        stop_confirmed(tmux, ddp_id)
        tmux.wait(rf"run {ddp_id} quickstart\s+(stopped|completed)", timeout=300)
        log(f"10. stopped run {ddp_id} (confirmed): it saved a checkpoint at the step it stopped at")

        # Back to Compose (the monitor was opened over it), then Runs: F1, since a digit types into the
        # focused field. Wait between the two: an escape followed at once by a key reads as alt+key.
        tmux.keys("Escape")
        tmux.wait(r"launch command|✓ valid recipe", timeout=60)
        tmux.keys("F1")
        tmux.wait(r"filter: name", timeout=60)
        tmux.wait(rf"\b{ddp_id}\s+quickstart\s+(stopped|completed)", timeout=60)
        # The newest run is on top, under the cursor: resume it.
        tmux.keys("Up", "Up", "R")
        screen = tmux.wait(rf"run (?!{run_id}\b|{ddp_id}\b)\d+ quickstart\s+running[\s\S]*?step [1-9]\d*/",
                           timeout=600)
        resumed_id, first = re.search(r"run (\d+) quickstart\s+running[\s\S]*?step (\d+)/",  # type: ignore[union-attr]
                                      screen).groups()
        assert int(first) > seen, screen  # on from the stop's checkpoint, not from step 1
        log(f"11. resumed run {ddp_id} from Runs (R): run {resumed_id} goes on at step {first}")
        stop_confirmed(tmux, resumed_id)
        tmux.wait(rf"run {resumed_id} quickstart\s+(stopped|completed)", timeout=300)
        tmux.keys("Escape")
        tmux.wait(r"filter: name", timeout=60)
        tmux.wait(rf"\b{resumed_id}\s+quickstart\s+(stopped|completed)", timeout=60)
        # The resumed run is on top: select it and the run it resumed, compare.
        tmux.keys("Up", "Up", "space")
        tmux.wait(r"selected: \d+\b", timeout=60)  # one selected: the cursor was on the newest run
        tmux.keys("Down", "space")
        tmux.wait(r"selected: \d+, \d+", timeout=60)
        tmux.keys("c")
        screen = tmux.wait(rf"run {ddp_id}\s+\**\s*run {resumed_id}", timeout=120)
        tmux.wait(r"tokens/s", timeout=60)
        log(f"12. compared runs {ddp_id} and {resumed_id}")
        tmux.keys("Escape")
        tmux.wait(r"filter: name", timeout=60)
        tmux.keys("q")
        tmux.wait_gone(r"filter: name", timeout=60)
        report = home / "report.html"
        made = subprocess.run([*command, "report", run_id, ddp_id, resumed_id, "-o", str(report)],
                              env={**os.environ, **env}, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert made.returncode == 0 and report.is_file(), made.stdout + made.stderr
        page = report.read_text()
        assert all(f"run {i}" in page for i in (run_id, ddp_id, resumed_id)), page[:2000]
        log(f"13. ftui report of runs {run_id}, {ddp_id}, {resumed_id}: {report}")
    finally:
        tmux.kill()
        subprocess.run(["tmux", "kill-session", "-t", keeper], capture_output=True)
    return timings


def stop_confirmed(tmux: Tmux, run_id: str) -> None:
    """``s`` asks before stopping; answer yes."""
    tmux.keys("s")
    tmux.wait(rf"Stop run {run_id}\?", timeout=60)
    tmux.keys("y")
    tmux.wait_gone(rf"Stop run {run_id}\?", timeout=60)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", type=Path)
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    home = args.home or Path(tempfile.mkdtemp(prefix="ftui-tmux-"))
    try:
        timings = drive(home, args.steps)
    except AssertionError as exc:
        print(f"FAILED: {exc}")
        return 1
    print(timings)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
