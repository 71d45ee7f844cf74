"""The CPU peak of a run, measured beside it: a short matmul probe in every rank between its steady steps,
in the run's dtype and with the rank's own torch threads.

On a shared CPU no peak holds for long: what a rank computes per second is its share of the cores times
what a core does, and the share moves with whatever else runs, from one second to the next (one run's
steps took 0.7 to 4.2 s under other agents' load; one machine's cached fp32 2-thread peak read 56.6 to
198.0 GFLOP/s, BENCHMARKS.md). So the probe follows the run: one window right before the first steady
step (the first after the memory-metered ones) and one after each steady step at least
:data:`PROBE_EVERY_S` after the last; the span between two probes is weighted by its seconds and rated at
the mean of its two ends. Even so the wall-clock rate of a 20 ms window does not share the training's
schedule (the same run's MFU against it moved 1.1-1.5x with two CPU hogs beside it), while what a
CPU-second of the process does held within 1.03x (BENCHMARKS.md "CPU MFU under two loads").

A window repeats one ``n x n`` matmul until :data:`PROBE_WINDOW_S` is full and measures two rates: its FLOPs
over its wall time (descheduled time included, as in a training step), and its FLOPs over the CPU-seconds
the process ran in it (``time.process_time()``: every thread of the process). The second is what a CPU
run's MFU divides by: what a CPU-second of this process turns into at best, against the CPU-seconds the
rank ran over its steady steps (:mod:`runner.rank.throughput`), so the CPU the neighbours left the run
drops out of the figure. The probes' time (wall and CPU) is left out of the run's tokens/s and CPU-seconds.
The watcher turns the probes into the run's peak (:func:`runner.analysis.cpu_peak.peak_from_probe`). GPU
runs are not probed: they keep the datasheet peak.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from runner.rank.measure import gather_list
from runner.rank.throughput import Span
from runner.spec import events as ev
from runner.spec import openmp

if TYPE_CHECKING:
    from runner.rank.context import Setup

PROBE_BASE_SIZE = 512
"""Square matmul size of a one-thread probe: a core's rate per CPU-second stops growing from 256-384 on
(2-core Xeon VM, one thread: fp32 118-126 GFLOP/s at 256-1536, bf16 64-72; BENCHMARKS.md "CPU MFU under
two loads"), and one matmul costs 2-4 ms of a core."""
PROBE_MAX_SIZE = 2048
PROBE_WINDOW_S = 0.02
"""Seconds of one probe: several of the scheduler's time slices, so it reads the rank's share of the cores,
not one slice's luck."""
PROBE_EVERY_S = 1.0
"""Least seconds between two probes: probing costs at most a fiftieth of the training's wall time (and
nothing of its tokens/s, which leaves the probes out)."""

_TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def probe_size(threads: int) -> int:
    """The probe's matrix size for ``threads`` threads: :data:`PROBE_BASE_SIZE` grown with the cube root of
    the threads (the same work per thread), a multiple of 64, at most :data:`PROBE_MAX_SIZE`."""
    grown = PROBE_BASE_SIZE * max(1, threads) ** (1 / 3)
    return int(min(PROBE_MAX_SIZE, max(PROBE_BASE_SIZE, round(grown / 64) * 64)))


@dataclass(frozen=True)
class Rates:
    """One probe window's rates: FLOPs over its wall seconds, and over the CPU-seconds the process ran in it."""

    per_s: float
    per_cpu_s: float | None
    """None when the process's CPU clock did not move (a clock too coarse for the window)."""
    cpu_seconds: float
    """CPU-seconds the process ran during the window."""


def probe_rate(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, window_s: float = PROBE_WINDOW_S,
               clock: Callable[[], float] = time.perf_counter,
               cpu_clock: Callable[[], float] = time.process_time) -> Rates:
    """The rates of ``a @ b`` (square) repeated into ``out`` until ``window_s`` seconds of ``clock`` are full;
    ``cpu_clock`` is the process's CPU-seconds (every thread)."""
    n = int(a.shape[0])
    calls, t0, c0 = 0, clock(), cpu_clock()
    with torch.inference_mode():
        while True:
            torch.mm(a, b, out=out)
            calls += 1
            elapsed = clock() - t0
            if elapsed >= window_s:
                cpu = cpu_clock() - c0
                flops = 2.0 * n**3 * calls
                return Rates(per_s=flops / elapsed, per_cpu_s=flops / cpu if cpu > 0 else None, cpu_seconds=cpu)


class Probe:
    """One rank's probes through its steady steps (see the module's docstring).

    Args:
        on_cpu: Whether the rank trains on CPU (a GPU run is never probed).
        dtype: The run's matmul dtype (:func:`runner.spec.flops.run_dtype`).
        clock: Seconds (monotonic).
        cpu_clock: The process's CPU-seconds (every thread).
    """

    def __init__(self, on_cpu: bool, dtype: str, clock: Callable[[], float] = time.perf_counter,
                 cpu_clock: Callable[[], float] = time.process_time) -> None:
        self.on = on_cpu
        self.dtype = dtype
        self.clock = clock
        self.cpu_clock = cpu_clock
        self.size = probe_size(torch.get_num_threads())
        self.rates: list[float] = []
        self.cpu_rates: list[float] = []
        """FLOP per CPU-second of each probe (those whose CPU clock moved)."""
        self.seconds: list[float] = []
        self.spans: list[Span] = []
        """Each probe's wall start and end and its CPU-seconds: left out of the run's tokens/s and CPU-seconds."""
        self.error: str | None = None
        self._last_end: float | None = None
        self._tensors: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def due(self, last: bool) -> bool:
        """Whether to probe now: on CPU, at the first call, at the last step, else :data:`PROBE_EVERY_S` on."""
        if not self.on or self.error is not None:
            return False
        return last or self._last_end is None or self.clock() - self._last_end >= PROBE_EVERY_S

    def take(self) -> None:
        """Probe once now (the first time, build the matrices and warm the kernels up first)."""
        try:
            if self._tensors is None:
                dt = _TORCH_DTYPES[self.dtype]
                self._tensors = (torch.randn(self.size, self.size).to(dt), torch.randn(self.size, self.size).to(dt),
                                 torch.empty(self.size, self.size, dtype=dt))
                torch.mm(self._tensors[0], self._tensors[1], out=self._tensors[2])  # the warm-up
            start = self.clock()
            rate = probe_rate(*self._tensors, clock=self.clock, cpu_clock=self.cpu_clock)
        except Exception as exc:  # noqa: BLE001 (a peak is informative only: it never fails a run)
            self.error, self._tensors = f"{type(exc).__name__}: {exc}"[:300], None
            return
        if self._last_end is not None:
            self.seconds.append(start - self._last_end)
        self.rates.append(rate.per_s)
        if rate.per_cpu_s is not None:
            self.cpu_rates.append(rate.per_cpu_s)
        self._last_end = self.clock()
        self.spans.append(Span(start, self._last_end, rate.cpu_seconds))

    def record(self, setup: Setup, steady_seconds: float | None, steady_cpu_seconds: float | None) -> ev.PeakProbe | None:
        """The end event's ``peak_probe``: every rank's probes and its own steady wall and CPU-seconds
        (:class:`runner.rank.throughput.Throughput`; a collective when the run has several processes: every
        rank calls it, and they agree whether to, from the run's status); None on GPU."""
        self._tensors = None
        if not self.on:
            return None
        acc = setup.accelerator
        mine: ev.ProbeRank = {"rank": int(acc.process_index), "rates": self.rates, "seconds": self.seconds,
                              "cpu_rates": self.cpu_rates}
        if steady_seconds is not None and steady_cpu_seconds is not None:
            mine["steady_seconds"], mine["steady_cpu_seconds"] = steady_seconds, steady_cpu_seconds
        if self.error is not None:
            mine["error"] = self.error
        ranks = gather_list([mine]) if acc.num_processes > 1 else [mine]
        return ev.PeakProbe(dtype=self.dtype, threads=torch.get_num_threads(), size=self.size,
                            window_s=PROBE_WINDOW_S, ranks=ranks, omp_wait=openmp.wait_words(os.environ))


def ranks_cpu_seconds(probe: ev.PeakProbe) -> float | None:
    """The CPU-seconds every rank's process ran over its steady steps, summed over the ranks; None unless
    every rank measured them."""
    values = [r.get("steady_cpu_seconds") for r in probe["ranks"]]
    return sum(float(v) for v in values if v is not None) if values and None not in values else None
