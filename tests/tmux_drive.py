"""Drive ``ftui`` in tmux as a person would: open it, compose quickstart, launch, watch the monitor,
quit while the run is still running, reopen, open the run while it still runs and see its step count
advance (a live re-attach = reading the store again), then stop it from the monitor.

    python tests/tmux_drive.py [--home DIR] [--steps 60]

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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class Tmux:
    def __init__(self, name: str, env: dict[str, str], width: int = 120, height: int = 40) -> None:
        self.name, self.env, self.width, self.height = name, env, width, height

    def start(self, command: list[str]) -> float:
        """Start ``command`` in a detached session; return the monotonic start time."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        started = time.monotonic()
        subprocess.run(["tmux", "new-session", "-d", "-s", self.name, "-x", str(self.width), "-y", str(self.height),
                        # COLUMNS/LINES inherited from a parent (pytest's set them) would override the pane's
                        # real size in shutil.get_terminal_size, which Textual reads.
                        f"cd {shlex.quote(str(ROOT))} && env -u COLUMNS -u LINES {env} {shlex.join(command)}; "
                        "sleep 30"], check=True)
        return started

    def keys(self, *keys: str) -> None:
        for key in keys:
            subprocess.run(["tmux", "send-keys", "-t", self.name, key], check=True)
            time.sleep(0.05)

    def text(self, *chars: str) -> None:
        subprocess.run(["tmux", "send-keys", "-t", self.name, "-l", "".join(chars)], check=True)

    def screen(self) -> str:
        return subprocess.run(["tmux", "capture-pane", "-p", "-t", self.name], capture_output=True, text=True).stdout

    def wait(self, pattern: str, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < deadline:
            screen = self.screen()
            if re.search(pattern, screen):
                return screen
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {pattern!r}; screen:\n{screen}")

    def wait_gone(self, pattern: str, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < deadline:
            screen = self.screen()
            if not re.search(pattern, screen):
                return screen
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {pattern!r} to go; screen:\n{screen}")

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
    subprocess.run(["tmux", "new-session", "-d", "-s", keeper, "sleep 600"], check=True)
    timings: dict[str, float] = {}
    try:
        started = tmux.start(command)
        tmux.wait(r"filter: name", timeout=30)
        timings["first_paint_s"] = time.monotonic() - started
        log(f"1. ftui opened on Runs (first paint {timings['first_paint_s']:.2f}s)")

        tmux.keys("2")
        tmux.wait(r"launch command", timeout=30)
        # The palette's "Go to field" focuses a field by name (counting Tabs raced the form's mount).
        tmux.keys("C-p")
        tmux.wait(r"Search for commands", timeout=10)
        tmux.text("go to field: max steps")
        tmux.wait(r"Go to field: max steps", timeout=10)
        tmux.keys("Enter")
        tmux.wait_gone(r"Search for commands", timeout=10)  # the palette closed
        time.sleep(0.2)
        tmux.keys("C-e", "C-u")
        tmux.text(str(steps))
        # The value's line is beside the label, or one above it when the form scrolled the field into view.
        screen = tmux.wait(rf"max steps\W+{steps}\b|▊\s+{steps}\s+▎[^\n]*\nmax steps", timeout=10)
        assert "✓ valid recipe" in screen, screen
        log(f"2. Compose: quickstart with max steps {steps}, valid; launch preview shown")

        tmux.keys("C-l")
        screen = tmux.wait(r"run \d+ quickstart", timeout=60)
        run_id = re.search(r"run (\d+) quickstart", screen).group(1)  # type: ignore[union-attr]
        # Wide: "rank 0 (CPU process)" in the device column; under 100 columns: "rank 0" under a
        # psutil-labelled header.
        screen = tmux.wait(r"rank 0 \(CPU process\)|\(psutil\)[\s\S]*\brank 0\b", timeout=120)
        log(f"3. Monitor of run {run_id}: device rows from psutil")
        progress = rf"run {run_id} quickstart\s+(\w+)\s.*?step (\d+)/{steps}"
        screen = tmux.wait(rf"run {run_id} quickstart\s+running\s.*?step [1-9]\d*/{steps}", timeout=120)
        status, step = re.search(progress, screen).groups()  # type: ignore[union-attr]
        assert status == "running", screen
        tmux.keys("q")
        time.sleep(1.0)
        tmux.kill()
        log(f"4. quit ftui while run {run_id} was running (step {step}/{steps}); it is detached and goes on")

        tmux = Tmux(f"ftui-drive2-{os.getpid()}", env)
        started = tmux.start(command)
        screen = tmux.wait(rf"\b{run_id}\s+quickstart", timeout=30)
        timings["reopen_paint_s"] = time.monotonic() - started
        screen = tmux.wait(rf"\b{run_id}\s+quickstart\s+single\s+lora\s+\w+", timeout=10)
        assert re.search(rf"\b{run_id}\s+quickstart\s+single\s+lora\s+running", screen), screen
        log(f"5. reopened: run {run_id} is in Runs, still running (read back from the store)")
        tmux.keys("Enter")
        screen = tmux.wait(progress, timeout=30)
        first = int(re.search(progress, screen).group(2))  # type: ignore[union-attr]
        deadline = time.monotonic() + 60
        now = first
        while now <= first and time.monotonic() < deadline:
            time.sleep(0.3)
            match = re.search(progress, tmux.screen())
            now = int(match.group(2)) if match else now
        assert now > first, f"the step count stayed at {first}; screen:\n{tmux.screen()}"
        log(f"6. its monitor follows it live: step {first} -> {now} of {steps}")
        tmux.keys("s")
        tmux.wait(rf"run {run_id} quickstart\s+(stopped|completed)", timeout=60)
        log(f"7. stopped run {run_id} from the monitor (s)")
        tmux.keys("Escape", "q")
    finally:
        tmux.kill()
        subprocess.run(["tmux", "kill-session", "-t", keeper], capture_output=True)
    return timings


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
