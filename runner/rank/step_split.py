"""Where one training step's time goes, as the rank measures it: compute, communication (or waiting on another
rank), preparing the batch, and the rest.

One step of the run is recorded by torch's profiler (:class:`StepProfile`): the step and its batch preparation
are marked with ``record_function`` (``ftui.step``, ``ftui.data``), so every interval is on one clock. Then
(:func:`split`, pure):

* **data**: the batch preparation marks;
* **compute**: on CPU, the ops the step's own thread ran (less data, and less the collectives it waited in
  inside them); on a GPU, the device's kernels other than NCCL's;
* **communication or waiting**: the collectives' intervals (gloo's and c10d's ops on any thread, NCCL's
  kernels on a GPU) that nothing above overlaps. A collective's interval includes waiting for the slowest
  rank to join it, and a pipeline's receive includes waiting for the stage before it, so this is the time the
  rank was held up by the others, not the wire's speed;
* **other**: the rest of the step (Python between ops, kernel launches, what no op records).

The profiled step is the run's last, and only in runs with a steady step before it
(:func:`profiled_step`): its tokens and time are left out of the steady-state tokens/s (the profiler slows
ops down a little, so the split's compute share is an upper bound).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

Interval = tuple[float, float]

STEP_MARK = "ftui.step"
DATA_MARK = "ftui.data"
COMM_NAMES = ("gloo:", "nccl:", "c10d::", "record_param_comms")
"""How the profiler names a collective or point-to-point op (torch.distributed's backends)."""


@dataclass(frozen=True)
class StepSplit:
    """One step's seconds by kind (they add up to ``wall_s``)."""

    wall_s: float
    compute_s: float
    comm_s: float
    """Collective time that no compute overlapped: communication, or waiting on another rank."""
    data_s: float
    other_s: float
    source: str

    def json(self) -> dict[str, Any]:
        return {"wall_s": self.wall_s, "compute_s": self.compute_s, "comm_s": self.comm_s, "data_s": self.data_s,
                "other_s": self.other_s, "source": self.source}


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """The intervals merged where they overlap, in order."""
    out: list[Interval] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def subtract(intervals: Sequence[Interval], cut: Sequence[Interval]) -> list[Interval]:
    """What of the (merged) ``intervals`` lies outside every one of the (merged) ``cut``."""
    out: list[Interval] = []
    for start, end in intervals:
        at = start
        for c0, c1 in cut:
            if c1 <= at or c0 >= end:
                continue
            if c0 > at:
                out.append((at, c0))
            at = max(at, c1)
        if at < end:
            out.append((at, end))
    return out


def clip(intervals: Iterable[Interval], window: Interval) -> list[Interval]:
    return [(max(s, window[0]), min(e, window[1])) for s, e in intervals if e > window[0] and s < window[1]]


def length(intervals: Iterable[Interval]) -> float:
    return sum(e - s for s, e in intervals)


def split(window: Interval, compute: Iterable[Interval], comm: Iterable[Interval], data: Iterable[Interval],
          source: str, scale: float = 1.0, blocking: Iterable[Interval] = ()) -> StepSplit:
    """The step's time by kind, each interval counted once: data first, then the collectives the step's own
    thread waited in (``blocking``: inside an op, a blocking receive is waiting, not compute), then compute,
    then the other collectives' time outside all of them; ``scale`` turns the intervals' unit into seconds."""
    data_u = union(clip(data, window))
    blocking_u = subtract(union(clip(blocking, window)), data_u)
    compute_u = subtract(subtract(union(clip(compute, window)), data_u), blocking_u)
    comm_u = subtract(subtract(union([*clip(comm, window), *blocking_u]), data_u), compute_u)
    wall = window[1] - window[0]
    parts = [length(compute_u), length(comm_u), length(data_u)]
    other = max(0.0, wall - sum(parts))
    return StepSplit(wall * scale, parts[0] * scale, parts[1] * scale, parts[2] * scale, other * scale, source)


def is_comm(name: str) -> bool:
    return name.startswith(COMM_NAMES) or "nccl" in name.lower()


def split_of_events(events: Sequence[Any], on_gpu: bool) -> StepSplit | None:
    """The split of the profiled step from torch's ``FunctionEvent`` list (times in microseconds); None
    without the step's mark."""
    step = next((e for e in events if e.name == STEP_MARK), None)
    if step is None:
        return None
    window = (float(step.time_range.start), float(step.time_range.end))
    data = [(e.time_range.start, e.time_range.end) for e in events if e.name == DATA_MARK]
    comm = [(e.time_range.start, e.time_range.end) for e in events if is_comm(e.name)]
    if on_gpu:
        kernels = [e for e in events if str(getattr(e, "device_type", "")).endswith("CUDA")]
        compute = [(e.time_range.start, e.time_range.end) for e in kernels if not is_comm(e.name)]
        source = "torch profiler, one step: CUDA kernels (compute) and NCCL kernels (communication)"
    else:
        mine = [e for e in events if e.thread == step.thread and not e.name.startswith("ftui.")]
        compute = [(e.time_range.start, e.time_range.end) for e in mine if not is_comm(e.name)]
        blocking = [(e.time_range.start, e.time_range.end) for e in mine if is_comm(e.name)]
        source = "torch profiler, one step: the step thread's ops (compute) and gloo/c10d ops (communication)"
        return split(window, compute, comm, data, source, scale=1e-6, blocking=blocking)
    return split(window, compute, comm, data, source, scale=1e-6)


def profiled_step(start_step: int, total_steps: int, metered: int) -> int | None:
    """The step to profile: the run's last, when a steady step comes before it (after the ``metered``
    ones); None otherwise."""
    return total_steps - 1 if total_steps - start_step >= metered + 2 else None


class StepProfile:
    """torch's profiler over one step (``with profile: ...``), then :attr:`result`."""

    def __init__(self, on_gpu: bool) -> None:
        from torch.profiler import ProfilerActivity, profile

        self.on_gpu = on_gpu
        activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if on_gpu else [])]
        self._profile: Any = profile(activities=activities)  # torch.profiler is untyped
        self.result: StepSplit | None = None

    def __enter__(self) -> StepProfile:
        self._profile.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._profile.__exit__(*exc)
        if exc[0] is None:
            self.result = split_of_events(list(self._profile.events()), self.on_gpu)


def mark(name: str, on: bool) -> AbstractContextManager[Any]:
    """``record_function(name)`` while a step is profiled, else nothing (no cost on other steps)."""
    if not on:
        return nullcontext()
    from torch.autograd.profiler import record_function

    return record_function(name)
