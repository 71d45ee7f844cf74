"""Time to first step, broken down (runner.spec.first_step): the stages from the moments, the watcher's
stream storing it from a real journal into a real store, and ``ftui show``, ``ftui compare`` (the row, its
footnote and the JSON) and ``ftui plan`` (its candidates' split) reading the stored record."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from runner.analysis.compare import build_comparison
from runner.analysis.ranking import rank
from runner.hardware.processes import started_wall
from runner.spec import events as ev
from runner.spec.first_step import STAGES, Moments, breakdown, words
from runner.spec.recipe import load_recipe
from runner.watch.journal import ORCHESTRATOR_FILE
from runner.watch.prepare import prepare
from runner.watch.stream import RunStream
from store import Store
from tests.support import QUICKSTART, run_info
from tui.render.compare import columns, markdown, to_json
from tui.render.report import run_summary_table

T0 = 1_700_000_000.0
PHASES = [("tokenizing", T0 + 9.5), ("loading_model", T0 + 10.0), ("preparing", T0 + 11.25)]


def moments(**changes: Any) -> Moments:
    """A trainer run's moments: launched at T0, rank 0 started 2 s later, step 1 ended at T0 + 15."""
    base = Moments(launched=T0, process_started=T0 + 2.0, phases=list(PHASES), start=T0 + 12.0,
                   first_step_end=T0 + 15.0)
    return replace(base, **changes)


def _record(**seconds: float) -> dict[str, Any]:
    return {"seconds": {**dict.fromkeys(STAGES), **seconds}, "total": sum(seconds.values())}


def test_each_stage_is_the_gap_between_its_two_moments() -> None:
    got = breakdown(moments())
    assert got["seconds"] == {"spawn": 2.0, "imports": 7.5, "data": 0.5, "model_load": 1.25, "prepare": 0.75,
                              "first_step": 3.0}
    assert list(got["seconds"]) == list(STAGES) and got["total"] == 15.0


def test_a_resumed_run_splits_prepare_from_the_restore() -> None:
    got = breakdown(moments(phases=[*PHASES, ("resuming", T0 + 11.5)]))["seconds"]
    assert (got["prepare"], got["resume"]) == (0.25, 0.5)
    assert list(got)[-3:] == ["prepare", "resume", "first_step"]  # in the order they happened


def test_compiled_layers_make_step_1_a_compile_stage() -> None:
    """train.compile: the trainer journals ``compiling`` after its start event, as step 1 begins; step 1 with its
    compilation is the compile stage."""
    got = breakdown(moments(stepping=[("compiling", T0 + 12.0)], first_step_end=T0 + 60.0))
    assert got["seconds"]["compile"] == 48.0 and got["seconds"]["first_step"] == 0.0
    assert list(got["seconds"])[-2:] == ["first_step", "compile"] and got["total"] == 60.0


def test_any_other_phase_before_the_start_is_a_stage_of_its_own_where_it_came() -> None:
    """A compile phase (``train.compile``) after prepare, and one the breakdown has never heard of between
    the model load and prepare: each timed to the next moment, and the stages still tile the total."""
    phases = [*PHASES[:2], ("quantizing", T0 + 10.5), PHASES[2], ("compile", T0 + 11.5)]
    got = breakdown(moments(phases=phases))
    seconds = got["seconds"]
    assert list(seconds) == ["spawn", "imports", "data", "model_load", "quantizing", "prepare", "compile",
                             "first_step"]
    assert (seconds["model_load"], seconds["quantizing"], seconds["prepare"], seconds["compile"]) == (
        0.5, 0.75, 0.25, 0.5)
    assert sum(v for v in seconds.values() if v is not None) == got["total"] == 15.0
    assert words(got).endswith("prepare/shard 0.2, compile 0.5, first step 3.0")


def test_a_missing_moment_leaves_its_stages_unknown_never_merged() -> None:
    """No launch time (a run launched before it was journaled): spawn unknown and the total from rank 0's
    start; no tokenizing event: imports and data unknown rather than one summed into the other; no phase
    at all (a script run): only the first step known, its total from the launch."""
    no_launch = breakdown(moments(launched=None))
    assert no_launch["seconds"]["spawn"] is None and no_launch["total"] == 13.0
    no_data = breakdown(moments(phases=PHASES[1:]))["seconds"]
    assert (no_data["imports"], no_data["data"], no_data["model_load"]) == (None, None, 1.25)
    assert list(no_data) == list(STAGES)  # the unknown stage in its place
    script = breakdown(moments(process_started=None, phases=[]))
    assert script["seconds"] == {**dict.fromkeys(STAGES), "first_step": 3.0} and script["total"] == 15.0
    assert breakdown(moments(first_step_end=None))["total"] is None


def test_words_leave_out_the_stages_that_did_not_happen() -> None:
    assert words(breakdown(moments())) == ("15.0 s: spawn 2.0, imports 7.5, data 0.5, model load 1.2, "
                                       "prepare/shard 0.8, first step 3.0")
    assert words(None) == "-"


def test_the_stream_stores_it_at_the_first_step_from_the_journals_alone(tmp_path: Path) -> None:
    """The launch moment is read from the watcher's journal, the rest from the trainer's: a stream over the
    same journals into a fresh store (what ``ftui db rebuild`` and a re-attached watcher run) stores the same."""
    m = moments()
    records: list[dict[str, Any]] = [
        *({"type": "phase", "phase": phase, "detail": "d", "time": at} for phase, at in m.phases),
        {"type": "start", "distributed_type": "NO", "world_size": 1, "total_steps": 5,
         "process_started": m.process_started, "time": m.start},
        {"type": "step", "step": 1, "loss": 1.0, "step_time": 2.5, "tokens_per_s": 10.0, "time": m.first_step_end},
        {"type": "phase", "phase": "saving", "detail": "s", "time": T0 + 16.0},  # after step 1: not a stage
        {"type": "step", "step": 2, "loss": 1.0, "step_time": 1.0, "tokens_per_s": 10.0, "time": T0 + 17.0},
    ]
    launch = {"seq": 0, "type": "launch", "time": T0 + 0.01, "pgid": 1, "launcher_started": T0}
    stored = []
    for db in ("first", "rebuilt"):
        store = Store(f"sqlite:///{tmp_path / db}.db")
        prepared = prepare(store, load_recipe(QUICKSTART), root=tmp_path / db)
        (prepared.run_dir / ev.EVENTS_FILE).write_text("".join(json.dumps({"seq": i, **r}) + "\n"
                                                               for i, r in enumerate(records)))
        (prepared.run_dir / ORCHESTRATOR_FILE).write_text(json.dumps(launch) + "\n")
        stream = RunStream(store, prepared, None)
        stream.poll()
        stream.flush()
        run = store.get_run(stream.run_id)
        assert run is not None
        stored.append(run.summary.time_to_first_step)
        store.close()
    assert stored[0] == stored[1] == breakdown(m)


def test_show_has_the_total_and_its_stages() -> None:
    run = run_info(1, "ddp", 2, 100.0, time_to_first_step=breakdown(moments()))
    console = Console(width=200, record=True)
    console.print(run_summary_table(run))
    text = console.export_text()
    assert "time to first step" in text and "15.0s" in text and "imports 7.5" in text


def test_compare_has_one_row_its_stages_in_a_footnote_and_the_json() -> None:
    runs = [run_info(1, "single", 1, 100.0, time_to_first_step=breakdown(moments())), run_info(2, "ddp", 2, 180.0)]
    cmp = build_comparison(runs, {})
    md = markdown(cmp)
    cell = dict(columns(cmp))["time to first step"]
    assert cell(cmp.rows[0]).startswith("15.0s [") and cell(cmp.rows[1]) == "-"  # the train time column's format
    assert "run 1 time to first step: 15.0 s: spawn 2.0, imports 7.5" in md
    data = json.loads(to_json(cmp))
    assert data["runs"][0]["first_step"]["seconds"]["imports"] == 7.5 and data["runs"][1]["first_step"] is None
    bare = markdown(build_comparison([run_info(3, "single", 1, 100.0)], {}))
    assert "time to first step" not in bare  # no run stored it: no row of dashes


def test_plan_gives_each_candidate_the_median_of_its_trials_stages() -> None:
    from tui.render.plan import candidate_entry, note_line  # deferred: the plan's service is heavy to import

    trials = [run_info(1, "ddp", 2, 100.0, time_to_first_step=_record(spawn=2.0, imports=6.0, first_step=3.0)),
              run_info(2, "ddp", 2, 110.0, time_to_first_step=_record(spawn=4.0, imports=8.0, first_step=5.0)),
              run_info(3, "ddp", 2, 105.0, time_to_first_step=_record(spawn=3.0, imports=7.0, first_step=4.0))]
    compiled = trials[2].summary.time_to_first_step
    assert compiled is not None  # one trial compiled: its stage where it came, the others' stages around it
    compiled["seconds"] = {**{k: v for k, v in compiled["seconds"].items() if k != "first_step"}, "compile": 1.0,
                           "first_step": 3.0}
    standing = rank(build_comparison(trials, {}).rows, None).standings[0]
    assert standing.first_step_split["imports"] == pytest.approx(7.0)
    assert standing.first_step_split["model_load"] is None
    assert standing.first_step_s is not None and standing.first_step_s.median == pytest.approx(14.0)
    from runner.service.plan import Candidate

    entry = candidate_entry(Candidate(strategy="ddp", nproc=2, note="micro-batch 2 x GA 1"), standing, 0)
    assert entry["time_to_first_step_split"]["spawn"] == pytest.approx(3.0)
    assert note_line(entry).endswith("to first step (s): spawn 3.0, imports 7.0, compile 1.0, first step 3.0")


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
