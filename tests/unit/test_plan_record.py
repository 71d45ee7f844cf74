"""A plan's record (``runner.service.plan_record``): what ``ftui plan`` writes of a plan is read back whole (its
command, candidates, memory, process, how the race ended, the commit); a broken file is no record; a plan with
no record is shown from its trials; the plans listed are the store's plan ids and the records with no trial
yet; Compose's plan command leaves out what each candidate sets."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from runner.service import plan, plan_record
from runner.service.plan_record import Ended, PlanCommand, Process
from runner.spec.recipe import load_recipe
from store import Store
from tests.support import QUICKSTART, run_info
from tests.support.plans import GONE, add_trial, fixed_setup, record
from tui.app.plans import command_of


def test_the_record_reads_back_what_the_plan_wrote(store: Store) -> None:
    setup, command = fixed_setup()
    assert plan_record.read(setup.pid) is None
    assert plan_record.begin(setup, command) is None  # by this process
    found = plan_record.read(setup.pid)
    assert found is not None and found.command == command and found.ended is None
    assert found.setup.candidates == setup.candidates and found.setup.memory == setup.memory
    assert (found.setup.pid, found.setup.steps, found.setup.repeat, found.setup.base.digest()) == (
        setup.pid, 3, 1, setup.base.digest())
    assert found.process is not None and found.process.pid == os.getpid() and found.process.alive()
    torch = next(c for c in setup.candidates if c.grid == "launch.engine=torch")
    plan_record.end(setup.pid, plan.Progress(over_budget=[plan.Trial(torch, 1)], stopped=True))
    plan_record.committed(setup.pid, refused="--commit: the plan names no winner, so nothing is launched (x)")
    ended = plan_record.read(setup.pid)
    assert ended is not None and ended.ended == Ended(True, ((torch.label, 1),))
    assert ended.commit_refused is not None and ended.commit_run is None
    progress = plan_record.progress_of(store, setup.pid, ended)
    assert progress.over_budget == [plan.Trial(torch, 1)] and progress.stopped
    assert plan_record.begin(setup, command, GONE) is None  # a new process of the plan: a fresh record
    again = plan_record.read(setup.pid)
    assert again is not None and again.ended is None and again.commit_refused is None
    assert again.process == GONE and not GONE.alive()


def test_a_broken_or_foreign_record_is_no_record(store: Store) -> None:
    setup, command = fixed_setup(strategies=("single",))
    record(setup, command)
    path = plan_record.path(setup.pid)
    path.write_text(path.read_text()[:-20])
    assert plan_record.read(setup.pid) is None
    path.write_text('{"version": 999}')
    assert plan_record.read(setup.pid) is None


def test_a_plan_id_is_one_safe_file_name(store: Store) -> None:
    setup, command = fixed_setup(strategies=("single",), pid="plan-../x y/z-0123")
    record(setup, command)
    assert plan_record.path(setup.pid).parent == plan_record.path("plan-a").parent
    assert plan_record.read(setup.pid) is not None and plan_record.read("plan-..-x-y-z-0123") is None


def test_a_plan_with_no_record_here_is_its_trials() -> None:
    trials = [dataclasses.replace(run_info(i, s, n, 1000.0, sweep_grid=g, sweep_note=f"note {s}",
                                           estimate={"per_device_bytes": {"total": 5 * i}}), total_steps=3)
              for i, (s, n, g) in enumerate([("single", 1, ""), ("zero1", 2, "launch.engine=torch"), ("single", 1, "")], 1)]
    setup = plan_record.setup_from_trials("plan-x", trials)
    assert setup is not None and [c.label for c in setup.candidates] == ["single", "zero1 x2 [launch.engine=torch]"]
    assert (setup.steps, setup.repeat, setup.candidates[1].estimated, setup.candidates[1].note) == (3, 2, 10, "note zero1")
    assert setup.memory.source.startswith("not known here") and plan_record.setup_from_trials("plan-x", []) is None


def test_the_plans_are_the_stores_plan_ids_and_the_records_with_no_trial_yet(store: Store) -> None:
    setup, command = fixed_setup(strategies=("single", "ddp"))
    add_trial(store, setup, "single", 1000.0)
    add_trial(store, setup, "ddp x2", 1200.0)
    sweep = store.create_run(name="s", recipe_text="", recipe_hash="", strategy="ddp", nproc=2, method="lora",
                             model="m", run_dir="", sweep_id="sweep-1")  # a sweep is no plan
    fresh, fresh_command = fixed_setup(strategies=("single",), pid="plan-fresh")
    record(fresh, fresh_command, ended=False)
    assert store.sweeps("plan-") == [(setup.pid, 2, sweep - 1)]
    listed = plan_record.list_plans(store)
    assert [(p.pid, p.trials, p.record is not None) for p in listed] == [("plan-fresh", 0, True), (setup.pid, 2, False)]


def test_a_commands_words_are_its_arguments() -> None:
    command = PlanCommand("/r/q.toml", ("a=-1", "b=2"), ("single", "ddp"), 2, None, 3)
    assert command.argv() == ["plan", "/r/q.toml", "--set=a=-1", "--set=b=2", "--strategies", "single,ddp",
                              "--nproc", "2", "--repeat", "3"]
    assert PlanCommand("/r/q.toml").argv() == ["plan", "/r/q.toml", "--repeat", "1"]


def test_composes_plan_leaves_what_each_candidate_sets_to_the_plan() -> None:
    recipe = load_recipe(QUICKSTART, ["launch.strategy=ddp", "launch.nproc=4"])
    changed = ['launch.strategy="ddp"', "launch.nproc=4", "train.lr=0.01"]
    command = command_of("recipes/quickstart.toml", changed, recipe)
    assert command == PlanCommand(str(Path("recipes/quickstart.toml").absolute()), ("train.lr=0.01",), nproc=4)
    assert command_of("recipes/quickstart.toml", [], load_recipe(QUICKSTART)).nproc is None  # 1 process: the default
    assert Process.of(os.getpid()).alive()


def test_the_plan_views_state_lines(store: Store) -> None:
    """Where a plan stands, in the view's words, from its record and running runs."""
    from tui.app.plans import PlanView
    from tui.app.screens.plan import commit_line, race_line

    setup, command = fixed_setup(strategies=("single",))
    record(setup, command, ended=False)
    found = plan_record.read(setup.pid)
    assert found is not None
    assert race_line(PlanView(setup.pid, None, None, found, False)).startswith("its process ended before the race did")
    assert race_line(PlanView(setup.pid, None, None, None, False)).startswith("no record of this plan on this host")
    plan_record.end(setup.pid, plan.Progress(stopped=True))
    plan_record.committed(setup.pid, run_id=7)
    found = plan_record.read(setup.pid)
    assert found is not None
    assert race_line(PlanView(setup.pid, None, None, found, False)).startswith("ended: a trial was stopped")
    run = run_info(7, "single", 1, None, status="running")
    view = PlanView(setup.pid, None, None, found, True, GONE, [run], run)
    assert race_line(view) == "committing (process 1): run 7 (single x 1) running"
    started = Process(2, 5.0, GONE.host)  # a new process of the plan, before it writes the record
    assert race_line(dataclasses.replace(view, process=started)).startswith("starting (process 2): it checks")
    assert commit_line(view) == "committed: run 7 (running; in Runs)"
    assert commit_line(PlanView(setup.pid, None, None, None, False)) == ""
