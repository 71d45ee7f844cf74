"""A hang declared on a real run: two scripted ranks (:mod:`tests.support.scripted_rank`, launched by the
real ``ftui run --script`` and ``accelerate launch``) stop stepping after step 2 and wait, idle, in
``hang_here``. The watcher flags the hang, asks every rank for its stacks (faulthandler on a signal),
reports where each one is (the journal, the run's summary, ``ftui show``, the progress line) and stops
the run with that in its reason. Only a rank that registered the handler is ever signalled. The hang rule itself is tested on a driven clock in
``tests/unit/test_watch_timing.py``."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from runner.spec import stacks
from runner.watch import journal
from runner.watch.stacks import StackReport
from store import Store
from tests.support import ROOT, Ftui
from tests.support.scripted_rank import SCRIPT


def test_a_hang_reports_every_ranks_stacks_then_stops_the_run(ftui: Ftui) -> None:
    result = ftui.run("run", "--script", str(SCRIPT), "--strategy", "ddp", "--nproc", "2", "--name", "hung-ddp",
                      "--hang-after", "1", "--sample-interval", "0.1", "--", "--hang-at", "2", "--step-s", "0.05",
                      timeout=240)
    out = result.stdout + result.stderr
    assert result.returncode == 1, out[-3000:]
    run = next(r for r in Store(ftui.db).list_runs() if r.name == "hung-ddp")
    where = "hang_here (tests/support/scripted_rank.py:"
    assert run.status == "failed" and run.error is not None, out[-3000:]
    assert run.error.startswith("hang: no progress for "), run.error
    assert f"ranks 0-1 in {where}" in run.error, run.error
    report = run.summary.stacks
    assert report is not None and report["cause"] == "hang"
    assert set(report["ranks"]) == {"0", "1"} and all(place and place.startswith(where)
                                                     for place in report["ranks"].values()), report
    run_dir = Path(run.run_dir or "")
    for rank in (0, 1):  # the full dump stays in the run folder: every thread of the rank
        dump = stacks.stacks_file(run_dir, rank).read_text()
        assert "in hang_here" in dump and "ftui-sampler" not in dump and "(most recent call first)" in dump
    types = [e["type"] for e in journal.read_jsonl(run_dir / journal.ORCHESTRATOR_FILE)]
    assert types.index("hang") < types.index("stacks") < types.index("hang_stop") < types.index("stop"), types
    assert f"stacks: ranks 0-1 in {where}" in out, out[-3000:]
    # A terminal wide enough that no cell of the summary wraps (a phrase is then on one line).
    show = subprocess.run([sys.executable, "-m", "tui.cli", "show", str(run.id)], env={**ftui.env, "COLUMNS": "240"},
                          cwd=ROOT, capture_output=True, text=True, timeout=300, check=True).stdout
    assert "stacks" in show and "hang_here" in show and "faulthandler at the hang" in show, show


WAITER = """
import os, sys, threading
from pathlib import Path
from runner.rank.rank_log import dump_stacks_on_signal
run_dir, rank, register = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "register"
if register:
    dump_stacks_on_signal(run_dir, rank)
(run_dir / "ranks").mkdir(exist_ok=True)
(run_dir / "ranks" / f"{rank}.pid").write_text(str(os.getpid()))

def blocked_in_a_collective():
    threading.Event().wait()

blocked_in_a_collective()
"""


def test_only_ranks_that_registered_are_asked_and_each_answer_is_read(tmp_path: Path) -> None:
    """Rank 0 registered the handler and answers; rank 1 (a process that never registered, whose default
    action for the signal is to end) is named as silent and never signalled: it lives on."""
    procs = [subprocess.Popen([sys.executable, "-c", WAITER, str(tmp_path), str(rank), mode], cwd=ROOT)
             for rank, mode in ((0, "register"), (1, "plain"))]
    try:
        deadline = time.monotonic() + 60
        while len(list((tmp_path / "ranks").glob("*.pid"))) < 2 or stacks.registered(
                stacks.stacks_file(tmp_path, 0)) is None:  # both started (a file each proves it)
            assert time.monotonic() < deadline, "the processes did not start"
            time.sleep(0.05)
        reports: list[dict[str, object]] = []
        report = StackReport(tmp_path, reports.append, wait_s=30.0)
        report.request("collective timeout")
        assert report.capture is not None and set(report.capture.asked) == {0}
        while not reports:
            assert time.monotonic() < deadline, "no answer"
            report.poll()
            time.sleep(0.05)
        where = "blocked_in_a_collective (<string>:"
        assert reports[0]["cause"] == "collective timeout"
        summary = str(reports[0]["summary"])
        assert summary.startswith(f"rank 0 in {where}") and summary.endswith("rank 1: no stacks (did not answer)")
        assert procs[1].poll() is None, "the process that never registered was not signalled"
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
