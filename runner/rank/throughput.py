"""A run's tokens per second: the steady state and the whole window (pure: times and counts in, figures out).

The first :data:`runner.rank.memtrack.MEASURED_STEPS` steps of a run train under the memory meter (a
``TorchDispatchMode`` that follows every storage), which makes them slower than the steps after them. So
the run's tokens/s is the **steady state**: the tokens of the unmetered steps over the time from the start
of the first unmetered step to the end of the last step. The **whole window** is every step of this run,
from the start of its first step to the end of its last, metered steps included. Both leave out the time
spent evaluating between steps. A run with no unmetered step has no steady-state figure (None), never a
metered one in its place. A step during which torch.compile compiled (``train.compile``: the first step; a
recompilation later) is left out too: the steady state starts after the last such step (:class:`Steady`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Window:
    """A span of steps: when its first step started and the run's token count then.

    Attributes:
        start: ``time.perf_counter()`` at the start of the span's first step.
        tokens_before: Tokens trained (``tokens_done``) before that step.
    """

    start: float
    tokens_before: int


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

    def begin(self, start: float, tokens_before: int, metered: bool, profiled: bool = False) -> None:
        """A step starts at ``start`` with ``tokens_before`` tokens trained; ``metered``: under the memory meter;
        ``profiled``: the step whose time is split, after the steady ones."""
        if profiled:
            self.until = Window(start=start, tokens_before=tokens_before)
        elif not metered:
            if self.window is None:
                self.window = Window(start=start, tokens_before=tokens_before)
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
    """

    tokens_per_s: float | None
    window_tokens_per_s: float | None
    steady_steps: int
    train_seconds: float


def _seconds(window: Window, end: float, evals: Sequence[tuple[float, float]]) -> float:
    """Seconds from the window's start to ``end``, less the spans left out that ran inside it (evaluations,
    the CPU peak's probes)."""
    return end - window.start - sum(e - b for b, e in evals if b >= window.start and e <= end)


def _rate(tokens: int, seconds: float) -> float | None:
    return tokens / seconds if seconds > 0 and tokens > 0 else None


def throughput(whole: Window, steady: Window | None, steady_steps: int, end: float, tokens_done: int,
               evals: Sequence[tuple[float, float]] = (), steady_until: Window | None = None) -> Throughput:
    """Steady-state and whole-window tokens/s of a run whose last step ended at ``end`` with
    ``tokens_done`` tokens trained; ``steady`` is the window of the first unmetered step (None: no such
    step ran); ``evals`` the (start, end) of what ran between steps and is not training (evaluations, the
    CPU peak's probes: runner/rank/peak_probe.py); ``steady_until`` the start of a step after the steady ones
    that the steady state leaves out (the profiled step, runner/rank/step_split.py), with the tokens before it."""
    seconds = _seconds(whole, end, evals)
    window_rate = _rate(tokens_done - whole.tokens_before, seconds)
    steady_rate = None
    if steady is not None and steady_steps > 0:
        stop, tokens = (steady_until.start, steady_until.tokens_before) if steady_until else (end, tokens_done)
        steady_rate = _rate(tokens - steady.tokens_before, _seconds(steady, stop, evals))
    return Throughput(tokens_per_s=steady_rate, window_tokens_per_s=window_rate,
                      steady_steps=steady_steps if steady_rate is not None else 0, train_seconds=seconds)
