"""Where a step's time goes (runner/rank/step_split.py, runner/analysis/time_split.py): intervals counted once
by kind, from torch's profiler events; a run's split over its ranks and a candidate's over its trials."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from runner.analysis import time_split
from runner.rank import step_split
from runner.rank.step_split import profiled_step, split, split_of_events, subtract, union
from tests.support import run_info


def test_intervals_merge_and_subtract() -> None:
    assert union([(5, 6), (0, 2), (1, 3), (4, 4)]) == [(0, 3), (5, 6)]
    assert subtract([(0, 10)], [(2, 3), (5, 7), (9, 12)]) == [(0, 2), (3, 5), (7, 9)]
    assert subtract([(0, 2), (4, 6)], []) == [(0, 2), (4, 6)]


def test_each_moment_of_the_step_is_counted_once_data_then_compute_then_communication() -> None:
    got = split((0, 100), compute=[(0, 30), (40, 60), (95, 120)], comm=[(25, 50), (60, 90), (-10, 2)],
                data=[(0, 5)], source="s", scale=0.5)
    # data 0-5; compute 5-30, 40-60, 95-100; communication outside both 30-40, 60-90; the rest 90-95.
    assert (got.compute_s, got.comm_s, got.data_s, got.other_s, got.wall_s) == (25.0, 20.0, 2.5, 2.5, 50.0)


@dataclass
class Span:
    start: float
    end: float


@dataclass
class Event:
    name: str
    start: float
    end: float
    thread: int = 1
    device_type: str = "DeviceType.CPU"

    @property
    def time_range(self) -> Any:
        return Span(self.start, self.end)


def test_the_profilers_events_split_by_thread_and_name() -> None:
    events = [Event("ftui.step", 0, 100), Event("ftui.data", 0, 4), Event("aten::index", 1, 3),
              Event("DistributedDataParallel.forward", 4, 40), Event("aten::addmm", 10, 20),
              Event("gloo:all_reduce", 30, 70, thread=7), Event("Optimizer.step#AdamW.step", 80, 98),
              Event("aten::mul", 50, 60, thread=9)]  # another thread's op is not the step's compute
    got = split_of_events(events, on_gpu=False)
    assert got is not None
    assert got.data_s == pytest.approx(4e-6) and got.compute_s == pytest.approx(54e-6)
    assert got.comm_s == pytest.approx(30e-6) and got.other_s == pytest.approx(12e-6)
    assert split_of_events([Event("aten::mm", 0, 1)], on_gpu=False) is None
    # A receive the step's own thread waits in, inside an autograd op (a pipeline stage's backward): waiting.
    stage = [Event("ftui.step", 0, 100), Event("autograd::engine::evaluate_function: RecvBackward", 0, 100),
             Event("c10d::recv_", 10, 70), Event("gloo:recv", 12, 70, thread=5)]
    got = split_of_events(stage, on_gpu=False)
    assert got is not None and (got.compute_s, got.comm_s) == (pytest.approx(40e-6), pytest.approx(60e-6))


def test_on_a_gpu_the_kernels_decide_and_nccls_are_communication() -> None:
    cuda = "DeviceType.CUDA"
    events = [Event("ftui.step", 0, 100), Event("aten::mm", 0, 90),
              Event("ampere_sgemm", 10, 50, 2, cuda), Event("ncclDevKernel_AllReduce", 40, 80, 3, cuda)]
    got = split_of_events(events, on_gpu=True)
    assert got is not None and (got.compute_s, got.comm_s) == (pytest.approx(40e-6), pytest.approx(30e-6))


def test_the_last_step_is_profiled_only_after_a_steady_step() -> None:
    assert profiled_step(0, 8, 2) == 7 and profiled_step(0, 4, 2) == 3
    assert profiled_step(0, 3, 2) is None and profiled_step(5, 8, 2) is None and profiled_step(4, 8, 2) == 7


def _split(wall: float, comm: float, rank: int) -> dict[str, Any]:
    return {"rank": rank, "step_split": {"wall_s": wall, "compute_s": wall - comm - 0.1, "comm_s": comm,
                                         "data_s": 0.0, "other_s": 0.1, "source": "t"}}


def test_a_runs_split_is_the_mean_over_ranks_with_the_most_held_up_rank_named() -> None:
    run = run_info(1, "pp", 2, 100.0, ranks=[_split(1.0, 0.1, 0), _split(1.0, 0.5, 1)])
    got = time_split.of_run(run.summary)
    assert got is not None
    assert got.shares["comm"] == pytest.approx(0.3) and got.shares["other"] == pytest.approx(0.1)
    assert (got.worst_rank, got.worst_comm, got.ranks) == (1, 0.5, 2)
    assert got.sentence().startswith("compute 60%, communication or waiting on another rank 30% (rank 1: 50%)")
    assert time_split.of_run(run_info(2, "single", 1, 100.0, ranks=[{"rank": 0}]).summary) is None


def test_a_candidates_split_is_the_median_over_its_trials() -> None:
    runs = [time_split.of_run(run_info(i, "ddp", 2, 1.0, ranks=[_split(1.0, c, 0), _split(1.0, c, 1)]).summary)
            for i, c in ((1, 0.1), (2, 0.2), (3, 0.6))]
    got = time_split.merge([*runs, None])
    assert got is not None and got.shares["comm"] == pytest.approx(0.2) and got.runs == 3
    assert got.worst_comm == pytest.approx(0.6) and time_split.merge([None]) is None


def test_marks_cost_nothing_outside_the_profiled_step() -> None:
    with step_split.mark(step_split.STEP_MARK, False) as nothing:
        assert nothing is None
