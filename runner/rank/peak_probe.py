"""The CPU peak of a run, measured beside it: a short matmul probe in every rank, right before the first
step and after the last, in the run's dtype and with the rank's own torch threads.

On a shared CPU no peak holds for long: what a rank computes per second is its share of the cores times
what a core does, and the share moves with whatever else runs (one machine's cached fp32 2-thread peak
read 56.6 to 198.0 GFLOP/s with the load, BENCHMARKS.md). The steps in between get the same share, so the
run's FLOP/s over this probe's measures the run, not the load. Every rank probes at once (after a
barrier), as every rank computes at once when it trains.

A probe is a warm-up matmul (the maths library's kernels and thread pool) and :data:`PROBE_WINDOWS`
windows of at least :data:`PROBE_WINDOW_S` each, the matmul repeated until the window is full; a window's
rate is its FLOPs over its wall time (descheduled time included, as in a training step). The watcher turns
the probes into the run's peak (:func:`runner.analysis.cpu_peak.peak_from_probe`). GPU runs are not
probed: they keep the datasheet peak.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from runner.rank.measure import gather_list
from runner.spec import events as ev
from runner.spec.flops import run_dtype

if TYPE_CHECKING:
    from runner.rank.context import Setup

PROBE_BASE_SIZE = 512
"""Square matmul size of a one-thread probe: a core's fp32 and bf16 rates stop growing from 256-384 on
(per CPU-second, BENCHMARKS.md "The CPU peak probe"), and one matmul costs 2-4 ms of a core."""
PROBE_MAX_SIZE = 2048
PROBE_WINDOWS = 4
PROBE_WINDOW_S = 0.02
"""Seconds of one window: several of the scheduler's time slices, so a window is the rank's share of the
cores, not one slice's luck. Four windows per probe, two probes per rank: at most 0.16 s of each of the
rank's threads per run."""

_TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def probe_size(threads: int) -> int:
    """The probe's matrix size for ``threads`` threads: :data:`PROBE_BASE_SIZE` grown with the cube root of
    the threads (the same work per thread), a multiple of 64, at most :data:`PROBE_MAX_SIZE`."""
    grown = PROBE_BASE_SIZE * max(1, threads) ** (1 / 3)
    return int(min(PROBE_MAX_SIZE, max(PROBE_BASE_SIZE, round(grown / 64) * 64)))


def probe_rates(dtype: str, size: int, windows: int = PROBE_WINDOWS, window_s: float = PROBE_WINDOW_S,
                clock: Callable[[], float] = time.perf_counter) -> list[float]:
    """FLOP/s of ``size x size`` matmuls in ``dtype`` with this process's torch threads, one rate per window.

    Args:
        dtype: ``fp32``, ``bf16`` or ``fp16``.
        size: The square matrix size.
        windows: How many windows to time.
        window_s: The least seconds of one window.
        clock: Seconds (monotonic).
    """
    torch_dtype = _TORCH_DTYPES[dtype]
    flops = 2.0 * size**3
    with torch.inference_mode():
        a = torch.randn(size, size).to(torch_dtype)
        b = torch.randn(size, size).to(torch_dtype)
        out = torch.empty(size, size, dtype=torch_dtype)
        torch.mm(a, b, out=out)  # the warm-up: the library's kernels and its thread pool
        rates = []
        for _ in range(max(1, windows)):
            calls, t0 = 0, clock()
            while True:
                torch.mm(a, b, out=out)
                calls += 1
                elapsed = clock() - t0
                if elapsed >= window_s:
                    break
            rates.append(flops * calls / elapsed)
    return rates


def probe(setup: Setup) -> list[ev.ProbeRank] | None:
    """Probe every rank at once (a collective: every rank calls it); each rank's windows in rank order, or
    None on GPU. A rank whose probe fails says why instead of failing the run."""
    if not setup.on_cpu:
        return None
    acc = setup.accelerator
    world = acc.num_processes
    if world > 1:
        acc.wait_for_everyone()  # the ranks probe together, as they train together
    dtype = run_dtype(setup.recipe.train.precision)
    mine: ev.ProbeRank = {"rank": int(acc.process_index), "rates": []}
    try:
        mine["rates"] = probe_rates(dtype, probe_size(torch.get_num_threads()))
    except Exception as exc:  # noqa: BLE001 (a peak is informative only: it never fails a run)
        mine["error"] = f"{type(exc).__name__}: {exc}"[:300]
    return gather_list([mine]) if world > 1 else [mine]


def probe_record(setup: Setup, before: list[ev.ProbeRank] | None,
                 after: list[ev.ProbeRank] | None) -> ev.PeakProbe | None:
    """The end event's ``peak_probe``: both probes with what they were taken with; None without both."""
    if before is None or after is None:
        return None
    threads = torch.get_num_threads()
    return ev.PeakProbe(dtype=run_dtype(setup.recipe.train.precision), threads=threads, size=probe_size(threads),
                        window_s=PROBE_WINDOW_S, before=before, after=after)
