"""CPU cost of the telemetry Sampler: 8 fake GPUs through NvmlBackend plus psutil on the rank processes.

Run from the repository root:

    python bench/bench_sampler.py            # 2 Hz, 8 fake GPUs, 2 ranks, 20 s

It starts ``--ranks`` real processes (each with one child, as a dataloader worker would be), runs a
``Sampler`` at ``--interval`` seconds over ``Probe(NvmlBackend(FakeNvml.demo(8)), ProcessProbe)``
and reports the CPU time of the sampling thread itself (``time.thread_time()`` inside the thread)
as a percent of one core. The batches go, as in a run, through a queue to the writer (here the main
thread, polling at 4 Hz like the orchestrator), which stores them in a real SQLite store (a temporary
file); its CPU time is measured around the writes and reported beside, and with the sampler as the
total. The target is <= 1%. FakeNvml answers in microseconds where a real driver
takes tens to hundreds, so on a GPU box the NVML share will be larger; the psutil share is real.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from queue import SimpleQueue

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# The repository root first: the checkout being measured, not an installed copy.
from runner.hardware import (  # noqa: E402
    DeviceSample,
    FakeNvml,
    NvmlBackend,
    Probe,
    ProcessGpuMemory,
    ProcessTree,
)
from runner.watch.telemetry import Sampler  # noqa: E402
from store import Store  # noqa: E402

RANK = (
    "import subprocess, sys, time\n"
    "w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(3600)'])\n"
    "t = time.time()\n"
    "while True:\n"
    "    s = time.time()\n"
    "    while time.time() - s < 0.05: pass\n"  # a little work, then a wait, like a step
    "    time.sleep(0.05)\n"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--ranks", type=int, default=2)
    args = parser.parse_args()

    ranks = [subprocess.Popen([sys.executable, "-c", RANK]) for _ in range(args.ranks)]
    try:
        time.sleep(0.5)  # let the workers start
        pids = {r: p.pid for r, p in enumerate(ranks)}
        probe = Probe(nvml=NvmlBackend(lib=FakeNvml.demo(args.gpus, pids=list(pids.values()))))
        got = {"samples": 0, "procs": 0, "batches": 0}
        queue: SimpleQueue[tuple[list[DeviceSample], list[ProcessGpuMemory]]] = SimpleQueue()
        store = Store(f"sqlite:///{tempfile.mkdtemp(prefix='ftui-bench-')}/ftui.db")
        run_id = store.create_run(name="bench", recipe_text="", recipe_hash="", strategy="ddp", nproc=args.ranks,
                                  method="lora", model="fake", run_dir="")
        writer_cpu = 0.0

        def sink(samples: list[DeviceSample], procs: list[ProcessGpuMemory]) -> None:
            got["samples"] += len(samples)
            got["procs"] += len(procs)
            got["batches"] += 1
            queue.put((samples, procs))

        def write() -> None:
            nonlocal writer_cpu
            c0 = time.thread_time()
            while not queue.empty():
                samples, procs = queue.get()
                store.add_samples(run_id, samples, procs)
            writer_cpu += time.thread_time() - c0

        sampler = Sampler(probe, lambda: pids, sink, interval_s=args.interval, flush_every_s=1.0)
        t0 = time.monotonic()
        sampler.start()
        while time.monotonic() - t0 < args.seconds:
            time.sleep(0.25)
            write()
        sampler.stop()
        write()
        wall = time.monotonic() - t0
        stored = len(store.samples(run_id)), len(store.process_samples(run_id))

        scan_t = time.perf_counter()
        ProcessTree(refresh_s=0).owners(pids)
        scan_ms = (time.perf_counter() - scan_t) * 1e3
    finally:
        for p in ranks:
            for child in psutil.Process(p.pid).children(recursive=True):
                child.kill()
            p.kill()
            p.wait()

    pct = 100.0 * sampler.thread_cpu_s / wall
    write_pct = 100.0 * writer_cpu / wall
    print(
        f"sampler: {sampler.readings} readings in {wall:.1f} s ({sampler.readings / wall:.2f} Hz), "
        f"{got['samples']} samples + {got['procs']} GPU process records in {got['batches']} batches, "
        f"{sampler.errors} errors, {sampler.skipped} skipped slots"
    )
    print(
        f"sampler thread CPU: {sampler.thread_cpu_s * 1e3:.0f} ms = "
        f"{1e3 * sampler.thread_cpu_s / max(1, sampler.readings):.2f} ms per reading; "
        f"process-table scan {scan_ms:.1f} ms over {len(psutil.pids())} processes (every 5 s)"
    )
    print(f"store writes (SQLite, main thread): {writer_cpu * 1e3:.0f} ms; stored {stored[0]} samples + "
          f"{stored[1]} GPU process records")
    print(f"runner from {Path(sys.modules['runner'].__file__ or '').parent}")
    print(f"CPU cost: sampler {pct:.2f}% + writes {write_pct:.2f}% = {pct + write_pct:.2f}% of one core "
          "(target <= 1%)")


if __name__ == "__main__":
    main()
