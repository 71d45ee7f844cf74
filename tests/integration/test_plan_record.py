"""``ftui plan`` keeps its plan's record (what the dashboard's Plan view reads beside the store), run in this
process on a plan whose trials are all stored by hand, so that it races nothing and trains nothing: the
command as parsed, this process as the racer, how the race ended, why ``--commit`` started no run; the
record's own words run again are the same plan."""

from __future__ import annotations

import os
from typing import Any

from runner.service import plan, plan_record
from store import Store
from tests.support import QUICKSTART, run_in_process
from tests.support.plans import add_trial, quickstart_plan


def test_ftui_plan_records_its_plan_and_why_commit_started_nothing(store: Store, capsys: Any) -> None:
    setup = quickstart_plan().setup()
    add_trial(store, setup, "single", 1000.0)
    add_trial(store, setup, "ddp x2", 1500.0)  # one trial each, no spread measured: no winner
    assert plan.next_trial(setup.candidates, plan.stored(store, setup.pid), 1) is None  # nothing to race here

    out = run_in_process(capsys, "plan", str(QUICKSTART), "--strategies", "single,ddp", "--nproc", "2", "--steps",
                         "3", "--set", "data.context_length=64", "--commit")
    assert out.returncode == 1 and "--commit: the plan names no winner" in " ".join(out.stdout.split())
    found = plan_record.read(setup.pid)
    assert found is not None and found.command == quickstart_plan()
    assert [c.label for c in found.setup.candidates] == ["single", "ddp x2"]
    assert found.process is not None and found.process.pid == os.getpid()
    assert found.ended == plan_record.Ended(False, ()) and found.commit_run is None
    assert found.commit_refused is not None and found.commit_refused.startswith(
        "--commit: the plan names no winner, so nothing is launched (Cannot tell")

    again = run_in_process(capsys, *found.command.argv())
    assert again.returncode == 0 and "nothing left to race" in " ".join(again.stdout.split())
    later = plan_record.read(setup.pid)
    assert later is not None and later.command == found.command and later.commit_refused is None
    assert len(store.list_runs()) == 2
