"""A run's tokens per second: the steady state and the whole window (pure: times and counts in, figures out).

The first :data:`runner.rank.memtrack.MEASURED_STEPS` steps of a run train under the memory meter (a
``TorchDispatchMode`` that follows every storage), which makes them slower than the steps after them. So
the run's tokens/s is the **steady state**: the tokens of the unmetered steps over the time from the start
of the first unmetered step to the end of the last step. The **whole window** is every step of this run,
from the start of its first step to the end of its last, metered steps included. Both leave out the time
spent evaluating between steps. A run with no unmetered step has no steady-state figure (None), never a
metered one in its place. A step during which torch.compile compiled (``train.compile``: the first step; a
recompilation later) is left out too: the steady state starts after the last such step (:class:`Steady`).

Beside the steady wall seconds the rank counts the CPU-seconds its process ran over the same steps
(``time.process_time()``: every thread of the process, torch's intra-op threads included), leaving out the
same spans (evaluations, the CPU peak's probes): a CPU run's MFU divides by them
(:func:`runner.analysis.run_peak.mfu_divisor`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple


@dataclass(frozen=True)
class Window:
    """A span of steps: when its first step started and the run's token count then.

    Attributes:
        start: ``time.perf_counter()`` at the start of the span's first step.
        tokens_before: Tokens trained (``tokens_done``) before that step.
        cpu: ``time.process_time()`` then (None: not taken).
    """

    start: float
    tokens_before: int
    cpu: float | None = None


class Span(NamedTuple):
    """What ran between steps and is not training (an evaluation, a CPU peak probe): its wall start and end
    (``time.perf_counter()``) and the CPU-seconds the process ran during it (``time.process_time()``)."""

    start: float
    end: float
    cpu: float = 0.0


@dataclass
class Steady:
    """The steps the steady state is measured over: from the first step that is neither memory-metered nor
    compiling, to the profiled step (the run's last: runner/rank/step_split.py) or the end. A step that
    compiles once the window is open (a recompilation) closes it, and the next unmetered step opens it again,
    so no compiling step is ever counted.

    Attributes:
        window: The open window's first step (None: none open yet).
        steps: The steps in the open window.
        until: The profiled step's start and the tokens before it: where the window ends (None: at the end).
    """

    window: Window | None = None
    steps: int = 0
    until: Window | None = None

    def begin(self, start: float, tokens_before: int, metered: bool, profiled: bool = False,
              cpu: float | None = None) -> None:
        """A step starts at ``start`` (``cpu``: the process's CPU-seconds then) with ``tokens_before`` tokens
        trained; ``metered``: under the memory meter; ``profiled``: the step whose time is split, after the
        steady ones."""
        if profiled:
            self.until = Window(start=start, tokens_before=tokens_before, cpu=cpu)
        elif not metered:
            if self.window is None:
                self.window = Window(start=start, tokens_before=tokens_before, cpu=cpu)
            self.steps += 1

    def end(self, compiled: bool) -> None:
        """The step ended; ``compiled``: torch.compile compiled during it (the profiled step ends the window
        either way)."""
        if compiled and self.until is None:
            self.window, self.steps = None, 0


@dataclass(frozen=True)
class Throughput:
    """The end event's throughput figures.

    Attributes:
        tokens_per_s: Steady state: over the unmetered steps; None when the run had none.
        window_tokens_per_s: Over every step of the run (metered ones included).
        steady_steps: How many unmetered steps the steady state is measured over.
        train_seconds: Seconds of the whole window, evaluations excluded.
        steady_seconds: Wall seconds the steady state's tokens/s covers; None when there is none.
        steady_cpu_seconds: CPU-seconds the process ran over those same steps (the left-out spans' own
            CPU-seconds taken away); None when there is no steady state or no CPU clock was read.
    """

    tokens_per_s: float | None
    window_tokens_per_s: float | None
    steady_steps: int
    train_seconds: float
    steady_seconds: float | None = None
    steady_cpu_seconds: float | None = None


def _inside(window: Window, end: float, spans: Sequence[Span]) -> list[Span]:
    """The spans left out (evaluations, the CPU peak's probes) that ran between the window's start and ``end``."""
    return [s for s in spans if s.start >= window.start and s.end <= end]


def _seconds(window: Window, end: float, spans: Sequence[Span]) -> float:
    """Seconds from the window's start to ``end``, less the spans left out that ran inside it."""
    return end - window.start - sum(s.end - s.start for s in _inside(window, end, spans))


def _cpu_seconds(window: Window, end: float, end_cpu: float | None, spans: Sequence[Span]) -> float | None:
    """CPU-seconds the process ran from the window's start to ``end`` (``end_cpu``: its CPU clock then), less
    the CPU-seconds of the spans left out inside it; None when a CPU clock was not read."""
    if window.cpu is None or end_cpu is None:
        return None
    return end_cpu - window.cpu - sum(s.cpu for s in _inside(window, end, spans))


def _rate(tokens: int, seconds: float) -> float | None:
    return tokens / seconds if seconds > 0 and tokens > 0 else None


def throughput(whole: Window, steady: Window | None, steady_steps: int, end: float, tokens_done: int,
               evals: Sequence[Span] = (), steady_until: Window | None = None,
               end_cpu: float | None = None) -> Throughput:
    """Steady-state and whole-window tokens/s of a run whose last step ended at ``end`` (``end_cpu``: the
    process's CPU clock then) with ``tokens_done`` tokens trained; ``steady`` is the window of the first
    unmetered step (None: no such step ran); ``evals`` what ran between steps and is not training
    (evaluations, the CPU peak's probes: runner/rank/peak_probe.py); ``steady_until`` the start of a step
    after the steady ones that the steady state leaves out (the profiled step, runner/rank/step_split.py),
    with the tokens before it."""
    seconds = _seconds(whole, end, evals)
    window_rate = _rate(tokens_done - whole.tokens_before, seconds)
    steady_rate: float | None = None
    steady_seconds: float | None = None
    steady_cpu: float | None = None
    if steady is not None and steady_steps > 0:
        stop, stop_cpu, tokens = ((steady_until.start, steady_until.cpu, steady_until.tokens_before)
                                  if steady_until else (end, end_cpu, tokens_done))
        steady_seconds = _seconds(steady, stop, evals)
        steady_rate = _rate(tokens - steady.tokens_before, steady_seconds)
        steady_cpu = _cpu_seconds(steady, stop, stop_cpu, evals)
    if steady_rate is None:
        steady_seconds = steady_cpu = None
    return Throughput(tokens_per_s=steady_rate, window_tokens_per_s=window_rate,
                      steady_steps=steady_steps if steady_rate is not None else 0, train_seconds=seconds,
                      steady_seconds=steady_seconds, steady_cpu_seconds=steady_cpu)
