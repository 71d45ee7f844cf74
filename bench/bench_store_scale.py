"""The store at scale: ingest rate, compare, run lists and the monitor on a store of thousands of runs.

    python bench/bench_store_scale.py                         # SQLite file in a temp folder, full size
    python bench/bench_store_scale.py --postgres               # the same on a PostgreSQL started here
    python bench/bench_store_scale.py --runs 300 --long 5 --long-steps 20000 --compare-runs 10   # quick

The store is filled through the real write path: ``Store.create_run``, ``Store.ingest`` of journal events
(start, step x N, end, in batches of ``--batch`` events as the orchestrator flushes them) and
``Store.update_run`` with the figures the orchestrator stores at start and end (a real run's summary).
Runs: ``--long`` runs of ``--long-steps`` steps, ``--compare-runs`` runs of ``--compare-steps`` steps,
the rest (up to ``--runs``) of ``--short-steps``.

Measured, each ``--repeat`` times (median reported):
1. ingest: metric values per second while ingesting step events, counted as MLflow counts rows (one per
   metric value: loss, lr, grad_norm, tokens, step_time, tokens_per_s = 6 per step, plus ``--named``
   values of a ``metrics`` event per step, stored as ``named_metrics`` rows);
2. ``ftui compare`` of 10 runs and of the ``--compare-runs`` runs, and of the long runs: wall time of the
   command (a child process, interpreter start included), and the in-process time of reading the
   comparison and rendering its table; the 10-run child is also checked for torch/transformers imports
   (``-X importtime``);
3. ``ftui runs`` (wall, child process) and the Runs screen's first paint (spawn to the first frame
   showing the store's runs, and to the screen's first frame, headless, ``bench/bench_tui.py``'s child
   running what ``ftui`` runs), and the Compare screen's time to data;
4. the Monitor following a long run (running, one step and 16 samples every 0.5 s written by another
   process): CPU of the app process, ``bench/bench_tui.py``'s monitor child.

``--mlflow PYTHON`` also times MLflow's ``log_batch`` into a SQLite store with that interpreter (a venv
with ``pip install mlflow``) on the same metric values.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

METRICS_PER_STEP = 6
"""loss, lr, grad_norm, tokens, step_time, tokens_per_s: MLflow would store one row for each."""


def _summary_template() -> dict[str, Any]:
    """What a real 2-process quickstart run stored (orchestrator start + end), minus its pids/paths."""
    return {
        "estimate": {"per_device_bytes": {"params": 50843136, "grads": 491520, "optimizer": 983040, "master": 0,
                                          "activations": 73502720, "buffers": 0, "reserve": 0, "total": 125820416,
                                          "activations_stored": 73502720},
                     "strategy": "ddp", "n_devices": 2, "micro_batch": 2, "seq_len": 256,
                     "model": "builtin:tiny-llama (builtin config)"},
        "params": 12587904, "trainable_params": 122880, "local_param_numel": 12710784, "world_size": 2,
        "tokens_per_step": 1024, "mixed_precision": "no", "device_map": None, "threads": 1,
        "model_dims": {"layers": 6, "heads": 6, "head_dim": 64, "seq_len": 256, "embedding_params": 1572864},
        "ranks": [{"rank": r, "param_bytes": 50843136, "grad_bytes": 491520, "optimizer_bytes": 983232,
                   "activation_bytes": 73502724, "peak_rss_bytes": 747491328, "source": "psutil/getrusage"}
                  for r in range(2)],
        "telemetry": {"whole": {"kind": "rank", "devices": 2, "util_mean": 30.9, "util_peak": 48.4, "util_min": 30.8,
                                "util_max": 30.9, "util_unit": "CPU % of its 1 thread (psutil)", "threads": 1,
                                "mem_peak": 747626496}},
        "mfu_peak": {"flops": 25507223843.8, "source": "matmul probe in the ranks (CPU), fp32 512x512, 1 thread(s)",
                     "kind": "probe", "dtype": "fp32", "threads": 1, "measured_at": 1795447228.6,
                     "fingerprint": "2749f773ac9d640e", "machine": "AMD EPYC, 2 cores", "size": 512},
    }


def _add_run(store: Any, recipe: Any, name: str, steps: int, batch: int, status: str = "completed",
             named: int = 0) -> tuple[int, float]:
    """One run through the real write path; returns (run id, seconds spent ingesting step events)."""
    from runner.spec.flops import run_flops_per_token
    from store.store import utcnow

    summary = _summary_template()
    run_id = store.create_run(name=name, recipe_text=recipe.to_toml(), recipe_hash=recipe.digest(), strategy="ddp",
                              nproc=2, method="lora", model=recipe.model.name, run_dir="", total_steps=steps,
                              summary={"estimate": summary["estimate"]})
    store.update_run(run_id, status="running", started_at=utcnow())
    t0 = time.time() - steps * 0.01
    store.ingest(run_id, [{"seq": 0, "type": "start", "time": t0, "world_size": 2, "distributed_type": "MULTI_CPU",
                           "device_type": "cpu", "params": summary["params"], "model_dims": summary["model_dims"]}])
    start_keys = ("params", "trainable_params", "local_param_numel", "world_size", "tokens_per_step",
                  "mixed_precision", "device_map", "threads", "model_dims")
    store.update_run(run_id, distributed_type="MULTI_CPU", device_type="cpu", total_steps=steps,
                     summary={**{k: summary[k] for k in start_keys},
                              "flops_per_token": run_flops_per_token("lora", summary["params"],
                                                                     summary["trainable_params"],
                                                                     summary["model_dims"])})
    spent = 0.0
    seq = 1
    for lo in range(1, steps + 1, batch):
        events = [{"seq": seq + i, "type": "step", "time": t0 + s * 0.01, "step": s, "epoch": 0,
                   "loss": 5.0 / (1 + s / 1000) + 0.05 * ((s * 7919) % 13) / 13, "lr": 2e-3 * (1 - s / (steps + 1)),
                   "grad_norm": 1.0 + ((s * 31) % 7) / 7, "tokens": 1024 * s, "step_time": 0.01,
                   "tokens_per_s": 700.0 + (s % 50)}
                  for i, s in enumerate(range(lo, min(steps, lo + batch - 1) + 1))]
        if named:  # the trainer's ``metrics`` event beside each step (named_metrics rows)
            events = [e for step_event in events for e in (
                step_event, {"seq": 0, "type": "metrics", "time": step_event["time"], "rank": 0,
                             "step": step_event["step"],
                             "values": {f"train/m{k}": step_event["loss"] * (k + 2) for k in range(named)}})]
            for i, e in enumerate(events):
                e["seq"] = seq + i
        seq += len(events)
        w0, c0 = time.perf_counter(), time.process_time()
        store.ingest(run_id, events)
        spent += time.perf_counter() - w0
        INGEST_CPU[0] += time.process_time() - c0
    if status == "completed":
        store.ingest(run_id, [{"seq": seq, "type": "end", "time": t0 + steps * 0.01, "steps": steps}])
        store.update_run(run_id, status="completed", ended_at=utcnow(), exit_code=0, steps_done=steps,
                         train_seconds=steps * 0.01, tokens_per_s=700.0 + run_id % 97, final_loss=5.0 / (1 + steps / 1000),
                         peak_mem_bytes=747491328,
                         summary={k: summary[k] for k in ("ranks", "telemetry", "mfu_peak")})
    return run_id, spent


def fill(db: str, args: argparse.Namespace) -> dict[str, Any]:
    from runner.spec.recipe import load_recipe
    from store import Store

    store = Store(db)
    recipe = load_recipe(ROOT / "recipes" / "quickstart.toml", ["launch.strategy=ddp", "launch.nproc=2"])
    ids: dict[str, list[int]] = {"long": [], "compare": [], "short": []}
    steps = spent = 0.0
    plan = ([("long", args.long_steps)] * args.long + [("compare", args.compare_steps)] * args.compare_runs
            + [("short", args.short_steps)] * max(0, args.runs - args.long - args.compare_runs))
    t_fill = time.perf_counter()
    for i, (kind, n) in enumerate(plan):
        status = "running" if kind == "long" and i == 0 else "completed"  # the monitor follows this one
        run_id, took = _add_run(store, recipe, f"{kind}-{i}", n, args.batch, status, args.named)
        ids[kind].append(run_id)
        steps += n
        spent += took
    store.close()
    return {"ids": ids, "steps": int(steps), "ingest_s": spent, "fill_s": time.perf_counter() - t_fill,
            "values_per_s": steps * (METRICS_PER_STEP + args.named) / spent if spent else 0.0,
            "values_per_cpu_s": steps * (METRICS_PER_STEP + args.named) / INGEST_CPU[0] if INGEST_CPU[0] else 0.0}


INGEST_CPU = [0.0]
"""CPU seconds of this process inside ``Store.ingest`` of step events (SQLite's work included; a
PostgreSQL server's is not): the rate a free core would give on a shared machine."""
CHILD_CPU: list[float] = []
"""CPU seconds (user + sys) of each child run by :func:`_wall`: unlike wall time, not inflated by the
other processes of a shared machine."""


def _wall(argv: list[str], env: dict[str, str]) -> tuple[float, str, str]:
    import resource

    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True)
    took = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    CHILD_CPU.append((r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime))
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:6])}...: exit {proc.returncode}\n{proc.stderr[-2000:]}")
    return took, proc.stdout, proc.stderr


def in_process_compare(db: str, run_ids: list[int]) -> tuple[float, float]:
    """Seconds (wall, CPU of this process) to read a comparison and render its table (no interpreter start)."""
    from rich.console import Console

    from runner.analysis.compare import load_comparison
    from store import Store
    from tui.render import compare as rep

    store = Store(db, create=False)
    t0, c0 = time.perf_counter(), time.process_time()
    cmp = load_comparison(store, run_ids)
    Console(file=io.StringIO(), width=160).print(rep.rich_table(cmp))
    took, cpu = time.perf_counter() - t0, time.process_time() - c0
    store.close()
    return took, cpu


def _compare_screen_child(db: str, ids: list[int]) -> None:
    import asyncio

    from store import Store
    from tui.app import make_app
    from tui.app.screens.compare import CompareScreen

    app = make_app(Store(db, create=False))

    async def main() -> None:
        async with app.run_test(size=(160, 50)) as pilot:
            await pilot.pause()
            screen = CompareScreen(ids)
            t0 = time.monotonic()
            app.push_screen(screen)
            while screen.comparison is None and time.monotonic() - t0 < 120:
                await asyncio.sleep(0.005)
            # Time to data: the comparison is in the screen (drawing a wide table is Textual's time).
            print(json.dumps({"to_data": time.monotonic() - t0, "rows": len(screen.comparison.rows)
                              if screen.comparison else 0}), flush=True)
            app.exit()

    asyncio.run(main())


def mlflow_rate(python: str, steps: int) -> dict[str, Any]:
    """MLflow 3 ``log_batch`` (1000 metrics per call, its limit) into a fresh SQLite store."""
    code = f"""
import json, tempfile, time
import mlflow
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient
d = tempfile.mkdtemp()
mlflow.set_tracking_uri(f"sqlite:///{{d}}/mlflow.db")
client = MlflowClient()
exp = client.create_experiment("bench")
run = client.create_run(exp)
names = ["loss", "lr", "grad_norm", "tokens", "step_time", "tokens_per_s"]
ms = [Metric(n, float(s), int(1e3 * s), s) for s in range({steps}) for n in names]
t0, c0 = time.perf_counter(), time.process_time()
for i in range(0, len(ms), 1000):
    client.log_batch(run.info.run_id, metrics=ms[i:i + 1000])
took, cpu = time.perf_counter() - t0, time.process_time() - c0
t1 = time.perf_counter()
hist = client.get_metric_history(run.info.run_id, "loss")
print(json.dumps({{"rows": len(ms), "seconds": took, "cpu_s": cpu, "history_s": time.perf_counter() - t1,
                  "history_rows": len(hist), "version": mlflow.__version__}}))
"""
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


@contextlib.contextmanager
def postgres() -> Iterator[str]:
    """A throwaway PostgreSQL server (as tests/support/postgres.py starts one); yields a database URL."""
    import glob

    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if not found:
        raise SystemExit("--postgres: no /usr/lib/postgresql/*/bin/initdb (apt-get install postgresql)")
    bindir = Path(found[-1]).parent

    def as_server(argv: list[str]) -> list[str]:
        return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv

    root = Path(tempfile.mkdtemp(prefix="ftui-pg-bench-"))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    subprocess.run(as_server([str(bindir / "initdb"), "-D", str(root / "data"), "-U", "postgres", "--auth=trust",
                              "--no-sync", "-E", "UTF8"]), check=True, capture_output=True)
    subprocess.run(as_server([str(bindir / "pg_ctl"), "-D", str(root / "data"), "-o",
                              f"-p {port} -k {root} -c listen_addresses=127.0.0.1", "-l", str(root / "log"),
                              "-w", "-t", "60", "start"]), check=True, capture_output=True)
    try:
        import psycopg

        with psycopg.connect(f"postgresql://postgres@127.0.0.1:{port}/postgres", autocommit=True) as conn:
            conn.execute('CREATE DATABASE "ftui_bench"')
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/ftui_bench"
    finally:
        subprocess.run(as_server([str(bindir / "pg_ctl"), "-D", str(root / "data"), "-m", "fast", "-w", "stop"]),
                       capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def measure(db: str, args: argparse.Namespace, tmp: str) -> None:
    env = {**os.environ, "FTUI_HOME": tmp, "PYTHONPATH": str(ROOT)}
    print(f"load average at start: {os.getloadavg()}", flush=True)
    filled = fill(db, args)
    ids = filled["ids"]
    print(f"filled: {sum(len(v) for v in ids.values())} runs, {filled['steps']:,} steps in {filled['fill_s']:.0f} s; "
          f"ingest {filled['values_per_s']:,.0f} metric values/s ({filled['steps'] / filled['ingest_s']:,.0f} "
          f"steps/s, batches of {args.batch} step events, {METRICS_PER_STEP} per-step columns + {args.named} named "
          "metrics per step)", flush=True)
    cli = [sys.executable, "-m", "tui.cli"]
    results: dict[str, list[float]] = {}

    def rec(key: str, value: float) -> None:
        results.setdefault(key, []).append(value)
        print(f"  {key}: {value:.3f} (load {os.getloadavg()[0]:.1f})", flush=True)

    def rec_child(key: str, value: float) -> None:
        rec(key, value)
        rec(key.replace("(wall)", "(CPU of the child)").replace("(spawn to paint)", "(CPU of the child)")
            if "(wall)" in key or "(spawn" in key else key + " (CPU of the child)", CHILD_CPU[-1])

    ten = (ids["compare"] + ids["short"])[:10]
    many = ids["compare"]
    _, _, imports = _wall([sys.executable, "-X", "importtime", *cli[1:], "compare", *map(str, ten), "--db", db], env)
    heavy = sorted({line.split("|")[-1].strip().split(".")[0] for line in imports.splitlines()
                    if line.startswith("import time:") and line.split("|")[-1].strip().split(".")[0]
                    in ("torch", "transformers")})
    print(f"ftui compare of 10 runs imports: {', '.join(heavy) or 'neither torch nor transformers'}", flush=True)
    for _ in range(args.repeat):
        rec_child("compare 10 (wall)", _wall([*cli, "compare", *map(str, ten), "--db", db], env)[0])
        rec_child(f"compare {len(many)}x{args.compare_steps} (wall)", _wall([*cli, "compare", *map(str, many), "--db", db], env)[0])
        for label, chosen in ((f"compare {len(many)}x{args.compare_steps}", many), ("compare 10", ten),
                              (f"compare {len(ids['long'])}x{args.long_steps}", ids["long"])):
            wall, cpu = in_process_compare(db, chosen)
            rec(f"{label} (in-process read + table, wall)", wall)
            rec(f"{label} (in-process read + table, CPU)", cpu)
        rec_child("ftui runs (wall)", _wall([*cli, "runs", "--db", db], env)[0])
        t0 = time.monotonic()
        out = _wall([sys.executable, str(ROOT / "bench" / "bench_tui.py"), "--child", db, "paint", "0"], env)[1]
        got = json.loads(out.strip().splitlines()[-1])
        rec_child("Runs screen first paint with its runs (spawn to paint)", got["painted"] - t0)
        rec("Runs screen first frame, before the store answers (spawn to frame)", got["framed"] - t0)
        out = _wall([sys.executable, __file__, "--compare-child", db, ",".join(map(str, ten))], env)[1]
        rec("Compare screen of 10 runs, time to data (from push)", json.loads(out.strip().splitlines()[-1])["to_data"])
        out = _wall([sys.executable, __file__, "--compare-child", db, ",".join(map(str, many))], env)[1]
        rec(f"Compare screen of {len(many)} runs x {args.compare_steps} steps, time to data (from push)", json.loads(out.strip().splitlines()[-1])["to_data"])
        print(f"  round done, load {os.getloadavg()[0]:.2f}", flush=True)
    if args.monitor_seconds > 0 and ids["long"]:
        follow = ids["long"][0]
        writer = subprocess.Popen([sys.executable, str(ROOT / "bench" / "bench_tui.py"), "--writer", db, str(follow),
                                   "--seconds", str(args.monitor_seconds + 8)], env=env)
        out = _wall([sys.executable, str(ROOT / "bench" / "bench_tui.py"), "--child", db, "monitor", str(follow),
                     "--seconds", str(args.monitor_seconds)], env)[1]
        writer.wait()
        mon = json.loads(out.strip().splitlines()[-1])
        rec(f"Monitor following a {args.long_steps}-step run (% of one core)", 100 * mon["cpu_s"] / mon["wall_s"])
    print(f"\nresults ({args.repeat} rounds, median; all rounds in brackets), load average now {os.getloadavg()}:")
    print(f"  ingest: {filled['values_per_s']:,.0f} metric values/s (wall), "
          f"{filled['values_per_cpu_s']:,.0f} per CPU second of the writer")
    for key, values in results.items():
        print(f"  {key}: {statistics.median(values):.3f} [{', '.join(f'{v:.3f}' for v in values)}]")
    if args.mlflow:
        ml = mlflow_rate(args.mlflow, args.mlflow_steps)
        print(f"  MLflow {ml['version']} log_batch on SQLite: {ml['rows'] / ml['seconds']:,.0f} metric rows/s "
              f"(wall), {ml['rows'] / ml['cpu_s']:,.0f} per CPU second "
              f"({ml['rows']:,} rows in {ml['seconds']:.1f} s); one {ml['history_rows']:,}-row history "
              f"read in {ml['history_s']:.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", help="a database URL (default: a SQLite file in a temp folder)")
    parser.add_argument("--postgres", action="store_true", help="start a PostgreSQL server here and use it")
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--long", type=int, default=50)
    parser.add_argument("--long-steps", type=int, default=100_000)
    parser.add_argument("--compare-runs", type=int, default=50)
    parser.add_argument("--compare-steps", type=int, default=10_000)
    parser.add_argument("--short-steps", type=int, default=100)
    parser.add_argument("--batch", type=int, default=1000, help="step events per ingest call")
    parser.add_argument("--named", type=int, default=2,
                        help="named metrics per step (a 'metrics' event beside each step event; 0: none)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--monitor-seconds", type=float, default=20.0)
    parser.add_argument("--mlflow", metavar="PYTHON", help="an interpreter with mlflow installed")
    parser.add_argument("--mlflow-steps", type=int, default=20_000)
    parser.add_argument("--compare-child", nargs=2, metavar=("DB", "IDS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.compare_child:
        _compare_screen_child(args.compare_child[0], [int(i) for i in args.compare_child[1].split(",")])
        return
    with tempfile.TemporaryDirectory() as tmp:
        if args.postgres:
            with postgres() as url:
                measure(url, args, tmp)
        else:
            measure(args.db or f"sqlite:///{tmp}/ftui.db", args, tmp)


if __name__ == "__main__":
    main()
