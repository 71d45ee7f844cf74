"""The CPU matmul peak that MFU divides by, per dtype and thread count, with its repeat spread.

    python bench/bench_cpu_peak.py [--dtypes fp32,bf16] [--threads 1,2] [--repeats 5] [--rounds 3]

For each dtype and thread count it runs :func:`runner.analysis.cpu_peak.measure_cpu_peak` (warm-up, sizes grown until
the rate stops rising, repeats, best of them) ``--rounds`` times and prints, per round, the size that
reached the peak, the best and the (min, median) of its repeats; then how far the rounds' peaks lie
apart. Nothing is cached (this does not touch ``runner.spec.paths.cache_dir()``). The host's load average
is printed with each round: on a shared machine the peak comes out low when others compute.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runner.analysis import cpu_peak  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", default="fp32,bf16")
    parser.add_argument("--threads", default=",".join(str(t) for t in sorted({1, os.cpu_count() or 1})))
    parser.add_argument("--repeats", type=int, default=cpu_peak.PEAK_REPEATS)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    fp = cpu_peak.machine_fingerprint()
    print(f"machine: {fp.describe()} [{fp.key}]")
    print("| dtype | threads | round | size | peak GFLOP/s | min / median of repeats | seconds | load 1m |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    summary = []
    for dtype in args.dtypes.split(","):
        for threads in (int(t) for t in args.threads.split(",")):
            peaks = []
            for k in range(args.rounds):
                t0 = time.perf_counter()
                m = cpu_peak.measure_cpu_peak(threads, dtype, repeats=args.repeats)
                lo, mid, _ = m.spread
                peaks.append(m.flops)
                print(f"| {dtype} | {threads} | {k + 1} | {m.size} | {m.flops / 1e9:.1f} | {lo / 1e9:.1f} / {mid / 1e9:.1f} | "
                      f"{time.perf_counter() - t0:.1f} | {os.getloadavg()[0]:.1f} |", flush=True)
            spread = (max(peaks) - min(peaks)) / max(peaks) * 100
            summary.append(f"{dtype} x{threads}: best {max(peaks) / 1e9:.1f} GFLOP/s, rounds "
                           f"{', '.join(f'{p / 1e9:.1f}' for p in peaks)} (spread {spread:.0f}%)")
    print()
    print("\n".join(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
