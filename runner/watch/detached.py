"""Background watchers: a run followed by a process of its own, in a session of its own, so that the
run and its recording outlive the caller (the TUI), or a run whose watcher died taken over
(:mod:`runner.service.recover`). ``python -m runner.watch.detached --db URL --run-id N`` is that process.
Stop it with :func:`runner.service.stop.request_stop` (SIGTERM: a graceful stop; SIGUSR1: a kill).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from runner.spec import watching
from runner.watch import procs
from runner.watch.follow import WatchOptions, attach, execute
from runner.watch.identity import record_watcher
from runner.watch.preflight import PreflightError
from runner.watch.prepare import Prepared, load_prepared
from store import Store

MODULE = "runner.watch.detached"
LOG = "orchestrator.log"
"""The background watcher's own output, in the run folder."""


def start_detached(db_url: str, prepared: Prepared, fake_gpus: int = 0,
                   options: WatchOptions | None = None) -> subprocess.Popen[bytes]:
    """Follow a prepared run from a background watcher; returns that watcher's process. ``options``: how it
    is watched (its telemetry interval, hang limit and stop grace; default: the defaults)."""
    assert prepared.run_id is not None
    watch = options or WatchOptions()
    argv = [sys.executable, "-m", MODULE, "--db", db_url, "--run-id", str(prepared.run_id),
            "--fake-gpus", str(fake_gpus), "--grace", repr(watch.grace_s), "--hang-after", repr(watch.hang_after_s),
            "--sample-interval", repr(watch.sample_interval_s)]
    child = procs.spawn(argv, {}, prepared.run_dir, prepared.run_dir / LOG)
    # The watcher is the child from now on (the caller may exit at once): recover must not take the
    # run for abandoned in the second before the child records itself.
    record_watcher(Store(db_url), prepared.run_id, child.pid)
    return child


def spawn_watcher(db_url: str, run_id: int, group: procs.Group, run_dir: Path, fake_gpus: int = 0,
                  lock_fd: int | None = None) -> subprocess.Popen[bytes]:
    """A background watcher that re-attaches to a running run (``--attach PGID``, with the launcher's
    start time when recorded); ``lock_fd``, the caller's hold on ``watcher.lock``, is handed to it."""
    argv = [sys.executable, "-m", MODULE, "--db", db_url, "--run-id", str(run_id),
            "--attach", str(group.pgid), "--fake-gpus", str(fake_gpus)]
    if group.started is not None:
        argv += ["--pgid-started", repr(group.started)]
    if lock_fd is not None:
        argv += ["--lock-fd", str(lock_fd)]
    log = open(run_dir / LOG, "ab")  # noqa: SIM115 (the child keeps it)
    try:
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                 cwd=run_dir, start_new_session=True,
                                 pass_fds=(lock_fd,) if lock_fd is not None else ())
    finally:
        log.close()
    record_watcher(Store(db_url), run_id, child.pid)
    return child


def main(argv: list[str] | None = None) -> int:
    """``python -m runner.watch.detached --db URL --run-id N``: follow a prepared run to its end."""
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}")
    parser.add_argument("--db", required=True)
    parser.add_argument("--run-id", type=int, required=True)
    parser.add_argument("--fake-gpus", type=int, default=0)
    parser.add_argument("--grace", type=float, default=watching.GRACE_S)
    parser.add_argument("--attach", type=int, metavar="PGID",
                        help="follow a run already started (process group PGID) whose watcher died")
    parser.add_argument("--pgid-started", type=float, metavar="TIME",
                        help="with --attach: the launcher's start time (psutil create_time), as recorded")
    parser.add_argument("--hang-after", type=float, default=watching.HANG_AFTER_S)
    parser.add_argument("--sample-interval", type=float, default=watching.SAMPLE_INTERVAL_S)
    parser.add_argument("--lock-fd", type=int, help="with --attach: the inherited hold on RUN/watcher.lock")
    args = parser.parse_args(argv)
    store = Store(args.db)
    run = store.get_run(args.run_id)
    if run is None:
        print(f"run {args.run_id}: no such run in {args.db}")
        return 2
    stop = procs.StopRequest()
    stop.install()  # SIGTERM/SIGINT/SIGHUP: graceful stop; again: kill now; SIGUSR1: kill (ftui stop --kill)
    prepared = load_prepared(run.id, Path(run.run_dir))
    options = WatchOptions(hang_after_s=args.hang_after, grace_s=args.grace, fake_gpus=args.fake_gpus,
                           sample_interval_s=args.sample_interval)
    try:
        if args.attach:
            group = procs.Group(args.attach, args.pgid_started)
            outcome = attach(store, prepared, group, options, stop=stop, lock_fd=args.lock_fd)
        else:
            outcome = execute(store, prepared, options, stop=stop)
    except PreflightError as exc:
        print(exc)
        return 2
    return 0 if outcome.status == "completed" else 1


if __name__ == "__main__":
    raise SystemExit(main())
