"""Two runs writing and four viewers polling one store at once: no "database is locked", no lost row.

Run from the repository root:

    python bench/bench_store_concurrency.py                 # SQLite file, 60 s
    python bench/bench_store_concurrency.py --db URL        # any store (e.g. postgresql+psycopg://...)

Every worker is a real process with its own ``Store``, calling the same API the orchestrator and the views
call. A writer is one run as the orchestrator records it: every ``--flush`` seconds it ingests the journal
events of the steps done since (``--steps-per-s`` per second, each a ``step`` event and a metrics row) and
adds one telemetry batch (``--gpus`` GPU samples plus one GPU-memory row per GPU), every 5 s it merges a
summary into the run (``update_run``), and at the end it marks the run completed. A reader is a viewer (the
TUI, ``ftui runs``): every ``--poll`` seconds it lists the runs and reads each run's new metrics and samples
(``after_step`` / ``after_id``, as the live screens do), timing each whole poll.

At the end the bench counts what the store holds against what the writers were told was written
(events, metrics, samples, process rows per run), checks that each reader saw every run's steps with no
gap, and prints rows written per second, the readers' poll latency (p50/p99/max) and the writers' call
latency, and every error. ``--json`` prints the same as one JSON object (the test reads it). Exit 1 on any
error or lost row.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# The repository root first: the checkout being measured, not an installed copy.
from runner.hardware import DeviceSample, ProcessGpuMemory  # noqa: E402
from store import Store  # noqa: E402

GiB = 1 << 30


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def writer(url: str, run_id: int, seconds: float, flush: float, steps_per_s: float, gpus: int) -> dict[str, Any]:
    store = Store(url)
    host = socket.gethostname()
    seq = step = 0
    counts = {"events": 0, "metrics": 0, "samples": 0, "processes": 0}
    latencies: list[float] = []
    errors: list[str] = []
    store.update_run(run_id, status="running", watcher_pid=os.getpid(), watcher_host=host)
    began = time.monotonic()
    next_summary = began + 5
    carry = 0.0
    while (now := time.monotonic()) - began < seconds:
        carry += steps_per_s * flush
        batch = []
        while carry >= 1:
            carry -= 1
            step += 1
            batch.append({"seq": seq, "type": "step", "time": time.time(), "step": step, "loss": 3.0 / step,
                          "lr": 1e-4, "tokens": step * 4096, "step_time": 1 / steps_per_s, "tokens_per_s": 4096.0})
            seq += 1
        t = time.time()
        samples = [DeviceSample(time=t, host=host, kind="gpu", index=i, name="bench GPU", util_pct=90.0,
                                mem_used=70 * GiB, mem_total=80 * GiB, power_w=600.0, temp_c=70.0,
                                sm_clock_mhz=1980, pid=None, source="fake-nvml") for i in range(gpus)]
        procs = [ProcessGpuMemory(time=t, host=host, gpu_index=i, pid=1000 + i, rank=i, used_bytes=60 * GiB,
                                  source="fake-nvml") for i in range(gpus)]
        try:
            start = time.perf_counter()
            stored = store.ingest(run_id, batch)
            store.add_samples(run_id, samples, procs)
            if now >= next_summary:
                store.update_run(run_id, summary={"bench": {"step": step}}, steps_done=step)
                next_summary += 5
            latencies.append(time.perf_counter() - start)
            counts["events"] += stored
            counts["metrics"] += sum(1 for e in batch if e["type"] == "step")
            counts["samples"] += len(samples)
            counts["processes"] += len(procs)
        except Exception as exc:  # noqa: BLE001 (counted and reported: the point of the bench)
            errors.append(f"writer {run_id}: {type(exc).__name__}: {str(exc).splitlines()[0]}")
        time.sleep(max(0.0, flush - (time.monotonic() - now)))
    store.update_run(run_id, status="completed")
    return {"run_id": run_id, "counts": counts, "latencies": latencies, "errors": errors,
            "seconds": time.monotonic() - began}


def reader(url: str, seconds: float, poll: float) -> dict[str, Any]:
    store = Store(url, create=False)
    last_step: dict[int, int] = {}
    last_sample: dict[int, int] = {}
    gaps: list[str] = []
    latencies: list[float] = []
    errors: list[str] = []
    began = time.monotonic()
    while (now := time.monotonic()) - began < seconds:
        try:
            start = time.perf_counter()
            for run in store.list_runs():
                metrics = store.metrics(run.id, after_step=last_step.get(run.id, 0))
                expected = last_step.get(run.id, 0) + 1
                if metrics and [m.step for m in metrics] != list(range(expected, expected + len(metrics))):
                    gaps.append(f"run {run.id}: steps {metrics[0].step}..{metrics[-1].step} after {expected - 1}")
                if metrics:
                    last_step[run.id] = metrics[-1].step
                samples = store.samples(run.id, after_id=last_sample.get(run.id, 0))
                if samples:
                    last_sample[run.id] = samples[-1].id
            latencies.append(time.perf_counter() - start)
        except Exception as exc:  # noqa: BLE001
            errors.append(f"reader: {type(exc).__name__}: {str(exc).splitlines()[0]}")
        time.sleep(max(0.0, poll - (time.monotonic() - now)))
    return {"latencies": latencies, "errors": errors + gaps, "seen_steps": last_step}


def _worker_main(args: argparse.Namespace) -> int:
    try:
        if args.role == "writer":
            result = writer(args.db, args.run_id, args.seconds, args.flush, args.steps_per_s, args.gpus)
        else:
            result = reader(args.db, args.seconds, args.poll)
    except Exception:  # noqa: BLE001
        result = {"errors": [traceback.format_exc()], "latencies": []}
    print(json.dumps(result))
    return 0


def run(args: argparse.Namespace) -> dict[str, Any]:
    url = args.db or f"sqlite:///{tempfile.mkdtemp(prefix='ftui-bench-')}/ftui.db"
    store = Store(url)
    run_ids = [store.create_run(name=f"bench-writer-{i}", recipe_text="", recipe_hash="", strategy="ddp",
                                nproc=args.gpus, method="lora", model="bench", run_dir="/tmp")
               for i in range(args.writers)]
    common = [sys.executable, __file__, "--db", url, "--seconds", str(args.seconds), "--flush", str(args.flush),
              "--steps-per-s", str(args.steps_per_s), "--gpus", str(args.gpus), "--poll", str(args.poll)]
    procs = [subprocess.Popen([*common, "--role", "writer", "--run-id", str(r)], stdout=subprocess.PIPE, text=True)
             for r in run_ids]
    procs += [subprocess.Popen([*common, "--role", "reader"], stdout=subprocess.PIPE, text=True)
              for _ in range(args.readers)]
    results = []
    for proc in procs:
        out, _ = proc.communicate(timeout=args.seconds + 300)
        results.append(json.loads(out.strip().splitlines()[-1]) if out.strip() else
                       {"errors": [f"worker exited {proc.returncode} with no report"], "latencies": []})
    writers, readers = results[: args.writers], results[args.writers:]
    errors = [e for r in results for e in r["errors"]]
    lost = []
    total = 0
    for w in writers:
        if "counts" not in w:
            continue
        rid, counts = w["run_id"], w["counts"]
        held = {"events": len(store.events(rid)), "metrics": len(store.metrics(rid)),
                "samples": len(store.samples(rid)), "processes": len(store.process_samples(rid))}
        total += sum(counts.values())
        if held != counts:
            lost.append(f"run {rid}: written {counts}, stored {held}")
        run_info = store.get_run(rid)
        if run_info is None or run_info.status != "completed":
            lost.append(f"run {rid}: status not completed")
    store.close()
    seconds = max((w.get("seconds", args.seconds) for w in writers), default=args.seconds)
    read_lat = [x for r in readers for x in r["latencies"]]
    write_lat = [x for w in writers for x in w["latencies"]]
    return {
        "db": url.split("://")[0],
        "seconds": round(seconds, 1),
        "writers": args.writers,
        "readers": args.readers,
        "rows_written": total,
        "rows_per_s": round(total / seconds, 1),
        "reader_polls": len(read_lat),
        "reader_p50_ms": round(_pct(read_lat, 0.50) * 1000, 1),
        "reader_p99_ms": round(_pct(read_lat, 0.99) * 1000, 1),
        "reader_max_ms": round(max(read_lat, default=float("nan")) * 1000, 1),
        "writer_calls": len(write_lat),
        "writer_p50_ms": round(_pct(write_lat, 0.50) * 1000, 1),
        "writer_p99_ms": round(_pct(write_lat, 0.99) * 1000, 1),
        "writer_max_ms": round(max(write_lat, default=float("nan")) * 1000, 1),
        "errors": errors,
        "lost": lost,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", help="store URL (default: a new SQLite file in a temp folder)")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--writers", type=int, default=2)
    parser.add_argument("--readers", type=int, default=4)
    parser.add_argument("--poll", type=float, default=0.2, help="readers poll every SECONDS")
    parser.add_argument("--flush", type=float, default=0.5, help="writers write every SECONDS (orchestrator: 0.5)")
    parser.add_argument("--steps-per-s", type=float, default=20.0)
    parser.add_argument("--gpus", type=int, default=8, help="GPU samples (and GPU-memory rows) per batch")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--role", choices=["writer", "reader"], help=argparse.SUPPRESS)
    parser.add_argument("--run-id", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role:
        return _worker_main(args)
    report = run(args)
    if args.json:
        print(json.dumps(report))
    else:
        print(f"{report['writers']} writers + {report['readers']} readers polling every {args.poll:g} s, "
              f"{report['seconds']:g} s, {report['db']} (measured)")
        print(f"  rows written: {report['rows_written']} ({report['rows_per_s']:g}/s: events, metrics, GPU samples, "
              "GPU-memory rows)")
        print(f"  reader poll (list_runs + metrics + samples of every run): p50 {report['reader_p50_ms']:g} ms, "
              f"p99 {report['reader_p99_ms']:g} ms, max {report['reader_max_ms']:g} ms over {report['reader_polls']} polls")
        print(f"  writer flush (ingest + add_samples [+ update_run]): p50 {report['writer_p50_ms']:g} ms, "
              f"p99 {report['writer_p99_ms']:g} ms, max {report['writer_max_ms']:g} ms over {report['writer_calls']} flushes")
        print(f"  errors: {len(report['errors'])}; lost rows: {len(report['lost'])}")
        for line in report["errors"][:20] + report["lost"]:
            print(f"    {line}")
    return 1 if report["errors"] or report["lost"] else 0


if __name__ == "__main__":
    sys.exit(main())
