"""``python -m runner.rank.script_run --run-dir RUN --cwd DIR -- SCRIPT ARGS...``: one rank of a script run.

What ``accelerate launch`` runs on every rank of a run whose recipe names ``launch.script`` (your own
accelerate, Hugging Face Trainer or TRL script). It does for the script what :mod:`runner.rank.trainer` does
for itself, and nothing else:

* the rank's stdout and stderr go to ``RUN/logs/rank{N}.log``, and its pid to ``RUN/ranks/{N}.pid``
  (so telemetry samples each rank, and a stop finds it);
* its Python stacks go to ``RUN/stacks/rank{N}.txt`` on request (``runner.spec.stacks``: a hang);
* ``FTUI_RUN_DIR`` names the run folder (:mod:`runner.track` journals there; a hand-run dry-run argv
  works without ftui's environment);
* the script runs as ``__main__`` with ``sys.argv = [SCRIPT, *ARGS]`` from ``DIR`` (the folder
  ``ftui run`` was typed in), its own folder first on ``sys.path``, as ``python SCRIPT ARGS`` would.

Rank 0 journals how the script ended: an ``error`` event (the exception, one line) when it raised, and an
``end`` event with the status (exit code 0: ``completed``) and whatever :mod:`runner.track` measured. A
script that reports nothing still gets its status, logs, samples and duration.
"""

from __future__ import annotations

import atexit
import faulthandler
import os
import runpy
import sys
import traceback
from pathlib import Path

from runner import track
from runner.rank.rank_log import caused_by_full_disk, dump_stacks_on_signal, flush_quietly, redirect_output
from runner.spec import events as ev


def parse(argv: list[str]) -> tuple[Path, Path, str, list[str]]:
    """``--run-dir RUN --cwd DIR [--] SCRIPT ARGS...`` -> (run folder, working folder, script, args)."""
    run_dir = cwd = None
    rest = list(argv)
    while rest and rest[0] in ("--run-dir", "--cwd"):
        if len(rest) < 2:
            break
        flag, value, rest = rest[0], rest[1], rest[2:]
        if flag == "--run-dir":
            run_dir = Path(value)
        else:
            cwd = Path(value)
    if rest and rest[0] == "--":
        rest = rest[1:]
    if run_dir is None or not rest:
        raise SystemExit("usage: python -m runner.rank.script_run --run-dir RUN [--cwd DIR] -- SCRIPT [ARGS...]")
    return run_dir.resolve(), (cwd or Path.cwd()).resolve(), rest[0], rest[1:]


def main(argv: list[str] | None = None) -> None:
    """Run one rank of a script run; exits with the script's exit code."""
    run_dir, cwd, script, args = parse(sys.argv[1:] if argv is None else argv)
    rank = int(os.environ.get("RANK", "0"))
    os.environ[track.RUN_ENV] = str(run_dir)
    redirect_output(ev.rank_log(run_dir, rank))
    faulthandler.enable()  # a segfault in a native library leaves its Python stack in the rank log
    dump_stacks_on_signal(run_dir, rank)  # before the pid file: a rank the watcher finds can answer for its stacks
    pid_file = ev.rank_pid_file(run_dir, rank)
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    pid_file.write_text(str(os.getpid()))

    path = (cwd / script).resolve()
    os.chdir(cwd)
    sys.argv = [str(path), *args]
    sys.path.insert(0, str(path.parent))
    code = 0
    try:
        runpy.run_path(str(path), run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except BaseException as exc:  # noqa: BLE001 (report every failure, then exit non-zero)
        try:
            traceback.print_exc()
        except OSError:
            pass  # the log's disk is full: the exit code says it
        track.error(f"{type(exc).__name__}: {exc}".strip())
        code = ev.EXIT_NO_SPACE if caused_by_full_disk(exc) else 1
    track.finish("completed" if code == 0 else "failed")
    atexit._run_exitfuncs()  # the script's own exit handlers (loggers, trackers) still run
    flush_quietly(None)
    # As the trainer: two-rank gloo runs abort at interpreter teardown now and then (docs/cpu-facts.md).
    os._exit(code)


if __name__ == "__main__":
    main()
