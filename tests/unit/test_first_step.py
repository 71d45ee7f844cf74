"""Time to first step, broken down (runner.spec.first_step): the stages from the moments, the watcher's
stream storing it from a real journal into a real store, and ``ftui show``, ``ftui compare`` (the row, its
footnote and the JSON) and ``ftui plan`` (its candidates' split) reading the stored record."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from runner.analysis.compare import build_comparison
from runner.analysis.ranking import rank
from runner.hardware.processes import started_wall
from runner.spec import events as ev
from runner.spec.first_step import STAGES, breakdown, words
from runner.spec.recipe import load_recipe
from runner.watch.prepare import prepare
from runner.watch.stream import RunStream
from store import Store
from tests.support import QUICKSTART, run_info
from tui.render.compare import columns, markdown, to_json
from tui.render.report import run_summary_table

T0 = 1_700_000_000.0
MARKS = {"launched": T0, "process_started": T0 + 2.0, "tokenizing": T0 + 9.5, "loading_model": T0 + 10.0,
         "preparing": T0 + 11.25, "start": T0 + 12.0, "first_step_end": T0 + 15.0}


def _record(**seconds: float) -> dict[str, Any]:
    return {"seconds": {**dict.fromkeys(STAGES), **seconds}, "total": sum(seconds.values())}


def test_each_stage_is_the_gap_between_its_two_moments() -> None:
    got = breakdown(MARKS)
    assert got["seconds"] == {"spawn": 2.0, "imports": 7.5, "data": 0.5, "model_load": 1.25, "prepare": 0.75,
                              "resume": None, "first_step": 3.0}
    assert got["total"] == 15.0


def test_a_resumed_run_splits_prepare_from_the_restore() -> None:
    got = breakdown({**MARKS, "resuming": T0 + 11.5})["seconds"]
    assert (got["prepare"], got["resume"]) == (0.25, 0.5)


def test_a_missing_moment_leaves_its_stages_unknown_never_merged() -> None:
    """No launch time (a recovered watcher): spawn unknown and the total from rank 0's start; no tokenizing
    event: imports and data unknown rather than one summed into the other."""
    no_launch = breakdown({k: v for k, v in MARKS.items() if k != "launched"})
    assert no_launch["seconds"]["spawn"] is None and no_launch["total"] == 13.0
    no_data = breakdown({k: v for k, v in MARKS.items() if k != "tokenizing"})["seconds"]
    assert (no_data["imports"], no_data["data"], no_data["model_load"]) == (None, None, 1.25)
    assert breakdown({k: v for k, v in MARKS.items() if k != "first_step_end"})["total"] is None


def test_words_leave_out_the_stages_that_did_not_happen() -> None:
    assert words(breakdown(MARKS)) == ("15.0 s: spawn 2.0, imports 7.5, data 0.5, model load 1.2, "
                                       "prepare/shard 0.8, first step 3.0")
    assert words(None) == "-"


def test_the_watcher_stores_it_at_the_first_step_from_the_journal(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'ftui.db'}")
    prepared = prepare(store, load_recipe(QUICKSTART), root=tmp_path / "runs")
    records: list[dict[str, Any]] = [
        {"type": "phase", "phase": "tokenizing", "detail": "d", "time": MARKS["tokenizing"]},
        {"type": "phase", "phase": "loading_model", "detail": "m", "time": MARKS["loading_model"]},
        {"type": "phase", "phase": "preparing", "detail": "p", "time": MARKS["preparing"]},
        {"type": "start", "distributed_type": "NO", "world_size": 1, "total_steps": 5,
         "process_started": MARKS["process_started"], "time": MARKS["start"]},
        {"type": "step", "step": 1, "loss": 1.0, "step_time": 2.5, "tokens_per_s": 10.0,
         "time": MARKS["first_step_end"]},
        {"type": "phase", "phase": "saving", "detail": "s", "time": T0 + 16.0},  # after step 1: not a stage
        {"type": "step", "step": 2, "loss": 1.0, "step_time": 1.0, "tokens_per_s": 10.0, "time": T0 + 17.0},
    ]
    (prepared.run_dir / ev.EVENTS_FILE).write_text("".join(json.dumps({"seq": i, **r}) + "\n"
                                                           for i, r in enumerate(records)))
    stream = RunStream(store, prepared, None)
    stream.launched = MARKS["launched"]
    stream.poll()
    stream.flush()
    run = store.get_run(stream.run_id)
    assert run is not None and run.summary.time_to_first_step == breakdown(MARKS)


def test_show_has_the_total_and_its_stages() -> None:
    run = run_info(1, "ddp", 2, 100.0, time_to_first_step=breakdown(MARKS))
    console = Console(width=200, record=True)
    console.print(run_summary_table(run))
    text = console.export_text()
    assert "time to first step" in text and "15.0s" in text and "imports 7.5" in text


def test_compare_has_one_row_its_stages_in_a_footnote_and_the_json() -> None:
    runs = [run_info(1, "single", 1, 100.0, time_to_first_step=breakdown(MARKS)), run_info(2, "ddp", 2, 180.0)]
    cmp = build_comparison(runs, {})
    md = markdown(cmp)
    cell = dict(columns(cmp))["time to first step"]
    assert cell(cmp.rows[0]).startswith("15.0 s [") and cell(cmp.rows[1]) == "-"
    assert "run 1 time to first step: 15.0 s: spawn 2.0, imports 7.5" in md
    data = json.loads(to_json(cmp))
    assert data["runs"][0]["first_step"]["seconds"]["imports"] == 7.5 and data["runs"][1]["first_step"] is None
    bare = markdown(build_comparison([run_info(3, "single", 1, 100.0)], {}))
    assert "time to first step" not in bare  # no run stored it: no row of dashes


def test_plan_gives_each_candidate_the_median_of_its_trials_stages() -> None:
    from tui.render.plan import _notes, candidate_entry  # deferred: the plan's service is heavy to import

    trials = [run_info(1, "ddp", 2, 100.0, time_to_first_step=_record(spawn=2.0, imports=6.0, first_step=3.0)),
              run_info(2, "ddp", 2, 110.0, time_to_first_step=_record(spawn=4.0, imports=8.0, first_step=5.0)),
              run_info(3, "ddp", 2, 105.0, time_to_first_step=_record(spawn=3.0, imports=7.0, first_step=4.0))]
    standing = rank(build_comparison(trials, {}).rows, None).standings[0]
    assert standing.first_step_split["imports"] == pytest.approx(7.0)
    assert standing.first_step_split["model_load"] is None
    assert standing.first_step_s is not None and standing.first_step_s.median == pytest.approx(14.0)
    from runner.service.plan import Candidate

    entry = candidate_entry(Candidate(strategy="ddp", nproc=2, note="micro-batch 2 x GA 1"), standing, 0)
    assert entry["time_to_first_step_split"]["spawn"] == pytest.approx(3.0)
    assert _notes(entry).endswith("to first step (s): spawn 3.0, imports 7.0, first step 4.0")


def test_a_process_start_is_on_the_clock_the_journal_uses() -> None:
    """A child's start lies between the moments before and after it was spawned (time.time(), to /proc's
    10 ms tick), where psutil's create_time can be a second off (its boot time is whole seconds)."""
    before = time.time()
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    after = time.time()
    try:
        started = started_wall(child.pid)
    finally:
        child.communicate(b"")
    assert started is not None and before - 0.02 <= started <= after + 0.02
    assert started_wall(child.pid) is None  # reaped: gone
