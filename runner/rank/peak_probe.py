"""The CPU peak of a run, measured beside it: a short matmul probe in every rank between its steady steps,
in the run's dtype and with the rank's own torch threads.

On a shared CPU no peak holds for long: what a rank computes per second is its share of the cores times
what a core does, and the share moves with whatever else runs, from one second to the next (one run's
steps took 0.7 to 4.2 s under other agents' load; one machine's cached fp32 2-thread peak read 56.6 to
198.0 GFLOP/s, BENCHMARKS.md). So the probe follows the run: one window right before the first steady
step (the first after the memory-metered ones) and one after each steady step at least
:data:`PROBE_EVERY_S` after the last; the span between two probes is weighted by its seconds and rated at
the mean of its two ends. The run's FLOP/s over that time-weighted rate measures the run, not the load.

A window repeats one ``n x n`` matmul until :data:`PROBE_WINDOW_S` is full; its rate is its FLOPs over its
wall time (descheduled time included, as in a training step). The probes' time is left out of the run's
tokens/s. The watcher turns the probes into the run's peak (:func:`runner.analysis.cpu_peak.peak_from_probe`).
GPU runs are not probed: they keep the datasheet peak.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from runner.rank.measure import gather_list
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


def probe_rate(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, window_s: float = PROBE_WINDOW_S,
               clock: Callable[[], float] = time.perf_counter) -> float:
    """FLOP/s of ``a @ b`` (square) repeated into ``out`` until ``window_s`` seconds of ``clock`` are full."""
    n = int(a.shape[0])
    calls, t0 = 0, clock()
    with torch.inference_mode():
        while True:
            torch.mm(a, b, out=out)
            calls += 1
            elapsed = clock() - t0
            if elapsed >= window_s:
                return 2.0 * n**3 * calls / elapsed


class Probe:
    """One rank's probes through its steady steps (see the module's docstring).

    Args:
        on_cpu: Whether the rank trains on CPU (a GPU run is never probed).
        dtype: The run's matmul dtype (:func:`runner.spec.flops.run_dtype`).
        clock: Seconds (monotonic).
    """

    def __init__(self, on_cpu: bool, dtype: str, clock: Callable[[], float] = time.perf_counter) -> None:
        self.on = on_cpu
        self.dtype = dtype
        self.clock = clock
        self.size = probe_size(torch.get_num_threads())
        self.rates: list[float] = []
        self.seconds: list[float] = []
        self.spans: list[tuple[float, float]] = []
        """(start, end) of each probe: left out of the run's tokens/s."""
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
            rate = probe_rate(*self._tensors, clock=self.clock)
        except Exception as exc:  # noqa: BLE001 (a peak is informative only: it never fails a run)
            self.error, self._tensors = f"{type(exc).__name__}: {exc}"[:300], None
            return
        if self._last_end is not None:
            self.seconds.append(start - self._last_end)
        self.rates.append(rate)
        self._last_end = self.clock()
        self.spans.append((start, self._last_end))

    def record(self, setup: Setup) -> ev.PeakProbe | None:
        """The end event's ``peak_probe``: every rank's probes (a collective when the run has several
        processes: every rank calls it, and they agree whether to, from the run's status); None on GPU."""
        self._tensors = None
        if not self.on:
            return None
        acc = setup.accelerator
        mine: ev.ProbeRank = {"rank": int(acc.process_index), "rates": self.rates, "seconds": self.seconds}
        if self.error is not None:
            mine["error"] = self.error
        ranks = gather_list([mine]) if acc.num_processes > 1 else [mine]
        return ev.PeakProbe(dtype=self.dtype, threads=torch.get_num_threads(), size=self.size,
                            window_s=PROBE_WINDOW_S, ranks=ranks, omp_wait=openmp.wait_words(os.environ))
