"""tokens/s: the steady state over the unmetered steps, the whole window beside it (runner/rank/throughput.py),
and how ``ftui show`` prints them."""

from __future__ import annotations

import pytest

from runner.rank.throughput import Span, Steady, Window, throughput
from tests.support import run_info
from tui.render.report import tokens_per_s_rows


def test_steady_state_leaves_out_the_metered_steps() -> None:
    # Two metered steps of 3 s each, then three unmetered steps of 1 s each, 100 tokens per step.
    figures = throughput(Window(start=10.0, tokens_before=0), Window(start=16.0, tokens_before=200), 3,
                         end=19.0, tokens_done=500)
    assert figures.tokens_per_s == pytest.approx(100.0)
    assert figures.window_tokens_per_s == pytest.approx(500 / 9)
    assert figures.steady_steps == 3 and figures.train_seconds == pytest.approx(9.0)


def test_the_profiled_last_step_is_left_out_of_the_steady_state_only() -> None:
    # The steps of the test above, then a profiled fourth unmetered step of 2 s (the profiler's overhead).
    figures = throughput(Window(10.0, 0), Window(16.0, 200), 3, end=21.0, tokens_done=600,
                         steady_until=Window(19.0, 500))
    assert figures.tokens_per_s == pytest.approx(100.0) and figures.steady_steps == 3
    assert figures.window_tokens_per_s == pytest.approx(600 / 11)


def test_evaluations_are_left_out_of_both_windows() -> None:
    # A 4 s evaluation after the third step, inside both windows.
    figures = throughput(Window(10.0, 0), Window(16.0, 200), 3, end=23.0, tokens_done=500,
                         evals=[Span(17.0, 21.0)])
    assert figures.tokens_per_s == pytest.approx(100.0)
    assert figures.window_tokens_per_s == pytest.approx(500 / 9)


def test_the_steady_cpu_seconds_cover_the_same_steps_and_leave_the_same_spans_out() -> None:
    # The steps of the test above on the CPU clock: the steady window opens at 7.0 CPU-seconds, an evaluation
    # (4 s wall, 1.5 CPU-seconds) runs inside it, the last step ends at 10.5: 10.5 - 7.0 - 1.5 = 2.0.
    steady = Steady()
    steady.begin(16.0, 200, metered=False, cpu=7.0)
    figures = throughput(Window(10.0, 0, cpu=4.0), steady.window, 3, end=23.0, tokens_done=500,
                         evals=[Span(17.0, 21.0, 1.5), Span(9.0, 9.5, 0.4)], end_cpu=10.5)
    assert figures.steady_seconds == pytest.approx(3.0) and figures.steady_cpu_seconds == pytest.approx(2.0)
    assert figures.tokens_per_s == pytest.approx(100.0)  # tokens/s stays wall-clock
    # the profiled step after the steady ones: both clocks stop at its start
    until = throughput(Window(10.0, 0), Window(16.0, 200, cpu=7.0), 3, end=21.0, tokens_done=600,
                       steady_until=Window(19.0, 500, cpu=8.25), end_cpu=99.0)
    assert until.steady_seconds == pytest.approx(3.0) and until.steady_cpu_seconds == pytest.approx(1.25)
    # no CPU clock read (a caller that does not count): None, never a guess
    assert throughput(Window(10.0, 0), Window(16.0, 200), 3, end=19.0, tokens_done=500).steady_cpu_seconds is None
    assert throughput(Window(10.0, 0), None, 0, end=16.0, tokens_done=200, end_cpu=3.0).steady_seconds is None


def test_a_resumed_run_counts_only_its_own_tokens() -> None:
    figures = throughput(Window(0.0, 1000), Window(4.0, 1200), 1, end=5.0, tokens_done=1300)
    assert figures.tokens_per_s == pytest.approx(100.0)
    assert figures.window_tokens_per_s == pytest.approx(60.0)


def test_no_unmetered_step_gives_no_steady_state_figure() -> None:
    figures = throughput(Window(10.0, 0), None, 0, end=16.0, tokens_done=200)
    assert figures.tokens_per_s is None and figures.steady_steps == 0
    assert figures.window_tokens_per_s == pytest.approx(200 / 6)


def test_show_prints_both_figures_and_says_what_each_counts() -> None:
    rows = tokens_per_s_rows(run_info(1, "single", 1, 1234.0, window_tokens_per_s=1000.0, steady_steps=3))
    assert rows[0][:2] == ("tokens/s", "1,234") and "steady state, the 3 steps after the memory-metered" in rows[0][2]
    assert rows[1][:2] == ("tokens/s whole window", "1,000") and "memory-metered ones included" in rows[1][2]


def test_show_says_when_there_is_no_steady_state_figure() -> None:
    rows = tokens_per_s_rows(run_info(1, "single", 1, None, window_tokens_per_s=800.0, steady_steps=0))
    assert rows[0] == ("tokens/s", "-", "no steady-state figure: every step was memory-metered")
    assert rows[1][1] == "800"
