"""``ftui plan``'s decisions without training: the batch split that keeps the global batch, the planner's
fit verdict with its error band, the search space and its pruning (the real recipe loader, an estimate
given by the test), which trial comes next on a resume, the budget, and the ranking of trials written by
hand (the verdict's rule: a winner only beyond the spread, else the ties named)."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from runner.analysis import time_split
from runner.analysis.compare import build_comparison
from runner.analysis.ranking import rank
from runner.analysis.track_record import track_record
from runner.planner.error_band import band_for, widest_band
from runner.planner.recommend import fit_band, fit_verdict
from runner.service import plan, plan_commit
from runner.spec import strategies
from runner.spec.layout import keep_global_batch
from runner.spec.recipe import Recipe, load_recipe
from tests.support import run_info

QUICKSTART = Path(__file__).resolve().parents[2] / "recipes" / "quickstart.toml"
MIB = 2**20
ROOMY = plan.Memory(64 * 1024 * MIB, True, "test")
BAND = 0.12


def need(mib: int | None) -> plan.Need | None:
    """An estimate of ``mib`` MiB per device with a 12% band (None: no estimate)."""
    return None if mib is None else plan.Need(mib * MIB, BAND, "test")


# ---------------------------------------------------------------------- the batch split


@pytest.mark.parametrize("name", strategies.names(launchable=True))
def test_every_split_the_rule_calls_kept_trains_the_recipes_global_batch(name: str) -> None:
    row = strategies.get(name)
    for micro, accum, n in itertools.product(range(1, 9), range(1, 5), range(1, 5)):
        n = row.procs(n, n)
        split = keep_global_batch(name, n, micro, accum)
        if split.kept:
            assert strategies.global_batch(name, split.micro_batch, split.grad_accum, n) == micro * accum, (micro, accum, n)
            assert split.micro_batch <= micro and f"global batch {micro * accum} kept" in split.note or n == 1
        else:
            assert (micro * accum) % n and "not divisible" in split.note


def test_a_micro_batch_the_processes_do_not_divide_moves_rows_into_accumulation() -> None:
    even = keep_global_batch("ddp", 2, 4, 1)
    assert (even.micro_batch, even.grad_accum, even.kept) == (2, 1, True)
    assert even.note == "micro-batch 4/2 = 2 x 2 processes (global batch 4 kept)"  # the sweep's words, kept
    odd = keep_global_batch("ddp", 2, 3, 2)  # 6 rows a step: 3 per process
    assert (odd.micro_batch, odd.grad_accum, odd.kept) == (3, 1, True)
    four = keep_global_batch("zero2", 4, 2, 2)  # 4 rows a step: 1 per process
    assert (four.micro_batch, four.grad_accum) == (1, 1)
    assert four.overrides(2, 2) == ["train.batch_size=1", "train.grad_accum=1"]
    lost = keep_global_batch("ddp", 2, 3, 1)
    assert not lost.kept and "global batch 6" in lost.note
    shared = keep_global_batch("pp", 2, 3, 1)
    assert (shared.micro_batch, shared.kept) == (3, True) and shared.overrides(3, 1) == []


# ---------------------------------------------------------------------- the fit verdict


def test_the_fit_verdict_judges_within_the_estimates_error_band() -> None:
    assert fit_verdict(100, 112, 0.12) == "fits"
    assert fit_verdict(100, 100, 0.12) == "might not fit"
    assert fit_verdict(100, 88, 0.12) == "might not fit"
    assert fit_verdict(100, 87, 0.12) == "does not fit"
    assert fit_verdict(100, 100, 0.0) == "fits"


def test_the_band_is_the_measured_one_else_the_widest_measured_stands_in() -> None:
    measured = band_for("llama", "ddp")
    wide = widest_band()
    assert measured is not None and wide is not None
    assert fit_band("llama/ddp", measured) == (abs(measured.worst_pct) / 100, measured.sentence())
    band, source = fit_band("llama/pp", None)
    assert band == abs(wide.worst_pct) / 100 and band >= abs(measured.worst_pct) / 100
    assert source.startswith("llama/pp: never measured; the widest band measured stands in (") and wide.key in source


# ---------------------------------------------------------------------- the search space


def _loader(sets: Sequence[str] = ("data.context_length=64",)) -> plan.Loader:
    def load(more: Sequence[str]) -> Recipe:
        return load_recipe(QUICKSTART, [*sets, *more])
    return load


def _space(estimator: plan.Estimator, names: Sequence[str] | None = None, nproc: int = 2,
           memory: plan.Memory = ROOMY, host: Any = lambda n: None, on_cpu: bool = True) -> list[plan.Candidate]:
    base = _loader()([])
    return plan.search_space(base, list(names or strategies.names(launchable=True)), nproc, _loader(), estimator,
                             memory, host, on_cpu)


def _by_label(found: Sequence[plan.Candidate]) -> dict[str, plan.Candidate]:
    return {c.label: c for c in found}


def test_every_launchable_strategy_and_engine_races_at_the_recipes_global_batch_when_all_fit() -> None:
    found = _by_label(_space(lambda r: need(50)))
    assert sorted(found) == sorted(["single", "mp x2", "pp x2", "ddp x2", "fsdp x2", "hsdp 2x2", "tp x2", "zero1 x2",
                                    "zero1 x2 [launch.engine=torch]", "zero2 x2", "zero2 x2 [launch.engine=torch]",
                                    "zero3 x2", "zero3 x2 [launch.engine=torch]"])
    # hybrid sharding needs two replicas of two shards: its candidate runs 4 processes, 1 row each
    assert found["hsdp 2x2"].nproc == 4 and "launch.nproc=4" in found["hsdp 2x2"].overrides
    assert all(c.skip is None and c.fit == "fits" and not c.checkpointing and c.offload == "none"
               for c in found.values())
    for c in found.values():  # every candidate trains quickstart's 4 rows per step
        recipe = _loader()(c.overrides)
        assert recipe.launch.strategy == c.strategy and recipe.launch.nproc == c.nproc
        assert strategies.global_batch(c.strategy, recipe.train.batch_size, recipe.train.grad_accum, c.nproc) == 4
    assert found["ddp x2"].split is not None and found["ddp x2"].split.micro_batch == 2
    assert "launch.engine=torch" in found["zero2 x2 [launch.engine=torch]"].overrides


def test_checkpointing_is_added_only_where_the_estimate_says_it_is_needed() -> None:
    def est(r: Recipe) -> plan.Need | None:  # ddp needs 120 MiB, 60 with checkpointing; the rest 50
        if r.launch.strategy != "ddp":
            return need(50)
        return need(60 if r.train.gradient_checkpointing else 120)

    found = _by_label(_space(est, names=["single", "ddp"], memory=plan.Memory(200 * MIB, True, "test")))
    assert set(found) == {"single", "ddp x2", "ddp x2 [train.gradient_checkpointing=true]"}
    assert found["ddp x2"].skip is not None and found["ddp x2"].skip.startswith("does not fit: estimated 0.12 GiB per device ± 12.0% against 0.10 GiB")
    ckpt = found["ddp x2 [train.gradient_checkpointing=true]"]
    assert ckpt.skip is None and ckpt.checkpointing and ckpt.budget == 100 * MIB  # 200 MiB shared by 2 ranks


def test_a_candidate_that_might_not_fit_races_only_when_nothing_surely_fits() -> None:
    memory = plan.Memory(100 * MIB, False, "test")  # per device, not shared
    def est(r: Recipe) -> plan.Need | None:
        return need(95 if r.launch.strategy == "ddp" else 50)

    found = _by_label(_space(est, names=["single", "ddp"], memory=memory))
    skip = found["ddp x2"].skip or ""
    assert "might not fit" in skip and "other candidates surely fit" in skip and found["single"].skip is None
    alone = _by_label(_space(lambda r: need(95), names=["ddp"], memory=memory))
    assert alone["ddp x2"].skip is None and "raced because nothing surely fits" in alone["ddp x2"].note


def test_offload_is_tried_only_when_nothing_else_fits() -> None:
    def est(r: Recipe) -> plan.Need | None:
        return need(50 if r.launch.offload != "none" else 500)

    memory = plan.Memory(100 * MIB, False, "test")
    found = _by_label(_space(est, names=["ddp", "zero2"], memory=memory))
    raced = sorted(label for label, c in found.items() if c.skip is None)
    assert raced == ["zero2 x2 [launch.engine=torch train.gradient_checkpointing=true launch.offload=optimizer+params]",
                     "zero2 x2 [train.gradient_checkpointing=true launch.offload=optimizer]"]
    assert all("does not fit" in (c.skip or "") for label, c in found.items() if "offload" not in label)
    fitting = _by_label(_space(lambda r: need(50), names=["ddp", "zero2"], memory=memory))
    assert not any(c.offload != "none" for c in fitting.values())


def test_what_this_host_cannot_launch_is_listed_with_its_reason() -> None:
    found = _by_label(_space(lambda r: need(50), names=["single", "ddp", "fsdp"], nproc=1))
    assert found["single"].skip is None
    assert found["fsdp"].skip == "fsdp on CPU needs at least 2 processes to shard over"
    assert found["ddp x2"].skip is None  # ddp's own floor is 2 processes
    over = _by_label(_space(lambda r: need(50), names=["single", "ddp"],
                            host=lambda n: f"launch.nproc (--nproc): {n} processes" if n > 1 else None))
    assert over["ddp x2"].skip == "launch.nproc (--nproc): 2 processes" and over["single"].skip is None


def test_no_estimate_is_no_reason_not_to_race() -> None:
    found = _space(lambda r: need(None), names=["single"])
    assert found[0].skip is None and found[0].fit is None


def test_the_plan_id_is_the_same_for_the_same_plan_only() -> None:
    base = _loader()([])
    same = plan.plan_id(base, ["ddp", "single"], 2, 8, "h")
    assert same == plan.plan_id(base, ["single", "ddp"], 2, 8, "h") and same.startswith("plan-quickstart-")
    assert same != plan.plan_id(base, ["single", "ddp"], 2, 3, "h")
    assert same != plan.plan_id(_loader(["data.context_length=32"])([]), ["single", "ddp"], 2, 8, "h")


# ---------------------------------------------------------------------- resuming and the budget


def _trial(id_: int, c: plan.Candidate, status: str = "completed", seconds: float = 30.0) -> Any:
    r = run_info(id_, c.strategy, c.nproc, 100.0, status=status, sweep_grid=c.grid)
    return dataclasses.replace(r, ended_at=r.created_at + timedelta(seconds=seconds))


def test_a_resumed_plan_races_only_what_it_lacks() -> None:
    single, ddp, fsdp = plan.Candidate("single", 1), plan.Candidate("ddp", 2), plan.Candidate("fsdp", 2)
    cands = [single, ddp, fsdp]
    progress = plan.Progress()
    assert plan.next_trial(cands, progress, 2) == plan.Trial(single, 1)
    progress.runs[single.key()] = [_trial(1, single)]
    progress.runs[ddp.key()] = [_trial(2, ddp, status="failed")]
    progress.runs[fsdp.key()] = [_trial(3, fsdp, status="stopped")]
    assert plan.next_trial(cands, progress, 2) == plan.Trial(fsdp, 1)  # a stopped trial is raced again
    progress.runs[fsdp.key()].append(_trial(4, fsdp))
    assert plan.next_trial(cands, progress, 2) == plan.Trial(single, 2)  # the failed ddp is not repeated
    progress.runs[single.key()].append(_trial(5, single))
    progress.runs[fsdp.key()].append(_trial(6, fsdp))
    assert plan.next_trial(cands, progress, 2) is None
    assert plan.next_trial([dataclasses.replace(single, skip="pruned")], plan.Progress(), 1) is None


def test_the_budget_is_judged_against_the_trials_measured() -> None:
    single, ddp = plan.Candidate("single", 1), plan.Candidate("ddp", 2)
    progress = plan.Progress(runs={single.key(): [_trial(1, single, seconds=20)],
                                   ddp.key(): [_trial(2, ddp, seconds=45)]})
    assert plan.trial_guess(single, progress) == (20.0, "single's longest trial")
    assert plan.trial_guess(plan.Candidate("fsdp", 2), progress) == (45.0, "the plan's longest trial (run 2)")
    assert plan.trial_guess(single, plan.Progress()) is None
    plan.check_budget(None, (45.0, "x"))
    plan.check_budget(1.0, None)  # nothing measured: the first trial sets the pace
    with pytest.raises(plan.PlanError, match=r"^--budget: 0.5 minutes is less than one trial \(45 s"):
        plan.check_budget(30.0, (45.0, "the plan's longest trial (run 2)"))


# ---------------------------------------------------------------------- the ranking


def _row(id_: int, strategy: str, nproc: int, tps: float | None, grid: str = "", status: str = "completed") -> Any:
    r = run_info(id_, strategy, nproc, tps, status=status, sweep_grid=grid)
    micro = 4 // nproc if strategies.get(strategy).data_parallel else 4
    text = r.recipe_text + f'[train]\nbatch_size = {micro}\ngrad_accum = 1\nprecision = "fp32"\n'
    return dataclasses.replace(r, recipe_text=text)


def test_the_leader_is_named_only_beyond_the_spread_of_the_repeats() -> None:
    runs = [_row(1, "single", 1, 1000.0), _row(2, "ddp", 2, 2000.0), _row(3, "zero2", 2, 1050.0),
            _row(4, "single", 1, 1010.0), _row(5, "ddp", 2, 2100.0), _row(6, "zero2", 2, 990.0)]
    ranking = rank(build_comparison(runs, {}).rows, None, {1: 5.0, 4: 7.0})
    assert ranking.decision.kind == "use" and ranking.decision.run_id == 5 and ranking.ties == []
    assert [s.label for s in ranking.standings] == ["ddp x2", "zero2 x2", "single"]
    assert [s.standing for s in ranking.standings] == ["leader", "slower", "slower"]
    ddp = ranking.standings[0]
    assert ddp.tokens_per_s is not None and (ddp.tokens_per_s.median, ddp.tokens_per_s.n) == (2050.0, 2)
    assert ranking.standings[2].first_step_s is not None and ranking.standings[2].first_step_s.median == 6.0


def test_candidates_within_the_spread_tie_and_are_named() -> None:
    runs = [_row(1, "single", 1, 1000.0), _row(2, "ddp", 2, 1100.0), _row(3, "zero1", 2, 1050.0),
            _row(4, "single", 1, 1200.0), _row(5, "ddp", 2, 900.0), _row(6, "zero1", 2, 1150.0),
            _row(7, "fsdp", 2, None, status="failed")]
    ranking = rank(build_comparison(runs, {}).rows, None)
    assert ranking.decision.kind == "tie" and ranking.decision.run_id is None
    assert ranking.ties == ["single", "zero1 x2", "ddp x2"]
    assert "tied with the leader: zero1 x2, ddp x2" in ranking.text and "Use " not in ranking.text
    failed = ranking.standings[-1]
    assert (failed.label, failed.status, failed.reason, failed.tokens_per_s) == ("fsdp x2", "failed", "boom", None)


def test_one_trial_each_and_no_measured_spread_cannot_tell() -> None:
    ranking = rank(build_comparison([_row(1, "single", 1, 100.0), _row(2, "ddp", 2, 500.0, grid="")], {}).rows, None)
    assert ranking.decision.kind == "unknown" and ranking.ties == ["ddp x2", "single"]
    assert {s.standing for s in ranking.standings} == {"cannot tell"}


# ---------------------------------------------------------------------- commit


def _setup(found: Sequence[plan.Candidate]) -> plan.Setup:
    return plan.Setup(_loader()([]), "plan-x", list(found), ROOMY, 8, 2)


def test_commit_runs_the_winner_with_its_own_values_to_the_recipes_steps() -> None:
    found = _space(lambda r: need(50), ["single", "ddp", "zero2"])
    runs = [_row(1, "single", 1, 1000.0), _row(2, "ddp", 2, 2000.0), _row(3, "zero2", 2, 1050.0),
            _row(4, "single", 1, 1010.0), _row(5, "ddp", 2, 2100.0), _row(6, "zero2", 2, 990.0)]
    ranking = rank(build_comparison(runs, {}).rows, None)
    assert plan.winner(found, ranking) is _by_label(found)["ddp x2"]
    chosen = plan_commit.chosen(_setup(found), ranking)
    assert chosen is _by_label(found)["ddp x2"]
    over = plan_commit.Continuation(why="the trial's checkpoint is missing (run 2)")
    item = plan_commit.commit_item(_setup(found), chosen, ["data.context_length=64"], over)
    assert (item.strategy, item.nproc) == ("ddp", 2)
    assert item.note == "the winner of plan plan-x; starts at step 0: the trial's checkpoint is missing (run 2)"
    recipe = _loader()(item.overrides)
    assert (recipe.launch.strategy, recipe.launch.nproc, recipe.train.batch_size) == ("ddp", 2, 2)
    assert recipe.train.max_steps == _loader()([]).train.max_steps  # the recipe's own, not a trial's
    assert recipe.train.stop_after == 0 and recipe.train.resume_from is None
    assert recipe.train.save and not any(s in item.overrides for s in plan.TRIAL_SETS)
    go = plan_commit.Continuation(Path("/runs/r/checkpoints/step-00000008"), 2, 8)
    resumed = _loader()(plan_commit.commit_item(_setup(found), chosen, [], go).overrides)
    assert resumed.train.resume_from == "/runs/r/checkpoints/step-00000008" and resumed.train.stop_after == 0
    assert go.summary() == {"continued_from_trial": 2, "resumed_from": {
        "run_id": 2, "checkpoint": "/runs/r/checkpoints/step-00000008", "step": 8}}
    assert over.summary() == {"started_over": "the trial's checkpoint is missing (run 2)"}


def test_a_trial_trains_the_first_steps_of_the_runs_own_schedule_and_checkpoints_the_last() -> None:
    found = _by_label(_space(lambda r: need(50), ["single", "ddp", "pp"]))
    single = _loader()([*found["single"].overrides, *plan.trial_sets(found["single"], 8, 30)])
    assert (single.train.max_steps, single.train.stop_after, single.train.save_every) == (30, 8, 8)
    assert not single.train.save and single.train.eval_every == 0
    pipeline = _loader()([*found["pp x2"].overrides, *plan.trial_sets(found["pp x2"], 8, 30)])
    assert (pipeline.train.stop_after, pipeline.train.save_every) == (8, 0)  # pp writes no checkpoint
    short = _loader()([*found["single"].overrides, *plan.trial_sets(found["single"], 8, 5)])
    assert (short.train.max_steps, short.train.stop_after, short.train.save_every) == (8, 0, 0)  # its own schedule


def test_commit_without_a_winner_launches_nothing_and_says_why() -> None:
    found = _space(lambda r: need(50), ["single", "ddp"])
    tie = rank(build_comparison([_row(1, "single", 1, 100.0), _row(2, "ddp", 2, 500.0)], {}).rows, None)
    assert plan.winner(found, tie) is None
    with pytest.raises(plan.PlanError, match=r"^--commit: the plan names no winner, so nothing is launched \(") as err:
        plan_commit.chosen(_setup(found), tie)
    assert "\n" not in str(err.value)
    with pytest.raises(plan.PlanError, match="no trial completed"):
        plan_commit.chosen(_setup(found), None)

# ---------------------------------------------------------------------- the report


def test_the_report_lists_every_candidate_and_prints_labels_as_text() -> None:
    from rich.console import Console

    from tui.render.plan import plan_markdown, plan_report, plan_table

    base = _loader()([])
    cands = [dataclasses.replace(c, skip="does not fit: estimated 9 GiB") if c.strategy == "fsdp" else c
             for c in _space(lambda r: need(50), names=["single", "zero1", "fsdp"], nproc=2)]
    torch_zero = next(c for c in cands if c.grid == "launch.engine=torch")
    single = next(c for c in cands if c.strategy == "single")
    runs = [_row(1, "single", 1, 1000.0), _row(2, "zero1", 2, 1500.0, grid="launch.engine=torch")]
    progress = plan.Progress(runs={single.key(): [runs[0]], torch_zero.key(): [runs[1]]},
                             over_budget=[plan.Trial(c, 1) for c in cands if c.label == "zero1 x2"])
    cands = [dataclasses.replace(c, band_key="llama/zero1@torch") if c is torch_zero else c for c in cands]
    setup = plan.Setup(base, "plan-test", cands, ROOMY, 8, 1)
    # this host's record of the planner: one earlier zero1@torch run estimated 10% over its measured peak
    earlier = run_info(9, "zero1", 2, 900.0, estimate={"band_key": "llama/zero1@torch",
                                                       "per_device_bytes": {"total": 110 * MIB}},
                       ranks=[{"peak_tensor_bytes": 100 * MIB}, {"peak_tensor_bytes": 90 * MIB}])
    split = time_split.of_run(run_info(2, "zero1", 2, 1.0, ranks=[
        {"rank": r, "step_split": {"wall_s": 1.0, "compute_s": 0.5, "comm_s": c, "data_s": 0.0, "other_s": 0.5 - c,
                                   "source": "torch profiler"}} for r, c in ((0, 0.2), (1, 0.4))]).summary)
    assert split is not None
    report = plan_report(setup, progress, rank(build_comparison(runs, {}).rows, None, {1: 4.0, 2: 6.5}, {2: split}),
                         track_record([earlier], "h"))
    entries = {e["label"]: e for e in report["candidates"]}
    assert [e["label"] for e in report["candidates"]][:2] == ["zero1 x2 [launch.engine=torch]", "single"]
    assert (entries["zero1 x2"]["status"], entries["zero1 x2"]["reason"]) == ("not raced", "over the --budget")
    assert (entries["fsdp x2"]["status"], entries["fsdp x2"]["reason"]) == ("not raced", "does not fit: estimated 9 GiB")
    raced = entries["zero1 x2 [launch.engine=torch]"]
    assert raced["tokens_per_s"] == {"median": 1500.0, "low": 1500.0, "high": 1500.0, "n": 1}
    assert raced["time_to_first_step_s"]["median"] == 6.5 and raced["peak_memory"]["estimated_bytes"] == 50 * MIB
    assert raced["peak_memory"]["error_band_pct"] == 12.0 and raced["micro_batch"] == 2 and raced["run_ids"] == [2]
    assert report["decision"]["kind"] == "unknown" and report["decision"]["winner_run_id"] is None
    mine = raced["peak_memory"]["error_this_host"]
    assert (mine["runs"], mine["worst_pct"], mine["run_ids"]) == (1, 10.0, [9])
    assert entries["single"]["peak_memory"]["error_this_host"] is None  # no run of its key here yet
    console = Console(width=200, record=True)
    console.print(plan_table(report))
    text = console.export_text()
    assert "zero1 x2 [launch.engine=torch]" in text and "over the --budget" in text  # brackets kept: not markup
    assert "| zero1 x2 [launch.engine=torch] | cannot tell | 1,500 |" in plan_markdown(report)
    assert "estimate error this host, llama/zero1@torch: +10.0% median, +10.0% worst over 1 run(s) (runs 9" in text
    # where a step went: in the JSON, and under the table for the candidate that measured it
    assert raced["time_split"]["comm_share"] == pytest.approx(0.3) and raced["time_split"]["worst_rank"] == 1
    assert entries["single"]["time_split"] is None
    assert ("a step: compute 50%, communication or waiting on another rank 30% (rank 1: 40%), preparing the batch "
            "0%, other (Python between ops, launches) 20%") in " ".join(text.split())
