"""A hang declared on a real run: two scripted ranks (:mod:`tests.support.scripted_rank`, launched by the
real ``ftui run --script`` and ``accelerate launch``) stop stepping after step 2 and wait, idle, in
``hang_here``. The watcher flags the hang, asks every rank for its stacks (faulthandler on a signal),
reports where each one is (the journal, the run's summary, ``ftui show``, the progress line) and stops
the run with that in its reason. The hang rule itself is tested on a driven clock in
``tests/unit/test_watch_timing.py``."""

from __future__ import annotations

from pathlib import Path

from runner.spec import stacks
from runner.watch import journal
from store import Store
from tests.support import Ftui
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
    show = ftui.run("show", str(run.id), check=True).stdout
    assert "stacks" in show and "hang_here" in show and "faulthandler at the hang" in show, show
