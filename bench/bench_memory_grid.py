"""The memory estimate against the independent measurement, over a grid the formulas were not fitted to.

    python bench/bench_memory_grid.py [--archs llama,qwen2,gpt2] [--methods full,lora] [--precisions fp32,bf16]
        [--strategies single,ddp,fsdp] [--ckpt off,on] [--seqs 128,256] [--out FILE.jsonl] [--markdown]
        [--write-band]

Each point trains a tiny model of the architecture (built offline from transformers' config classes,
runner/service/memgrid.py) for two steps with the real trainer: ``single`` in this process, ``ddp``/``fsdp``
launched by the orchestrator over 2 ranks (gloo). The measured figure is the busiest rank's peak
(runner/rank/memtrack.py: live tensors on CPU, the CUDA allocator on GPU); the estimated one is
``runner.planner.estimate`` of the same recipe. Results are appended to ``--out`` as JSON lines, and
points already there are skipped, so an interrupted grid resumes. ``--markdown`` prints the table of
docs/memory-model.md from ``--out``; ``--write-band`` writes the error bands ``ftui estimate`` prints
(runner/planner/error_band.py) from ``--out``, re-estimated with the current formulas.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def table(rows: list[dict]) -> str:
    out = ["| config | estimated | measured | error | est. phase | measured fwd / bwd / opt |",
           "|---|---:|---:|---:|---|---|"]
    for r in rows:
        if r.get("measured") is None:
            out.append(f"| {r['config']} | - | - | - | - | {r.get('status', 'failed')} |")
            continue
        ph = r.get("measured_phases") or {}
        phases = " / ".join(f"{ph.get(k, 0) / 2**20:.1f}" for k in ("forward", "backward", "optimizer"))
        out.append(f"| {r['config']} | {r['estimated'] / 2**20:.1f} MiB | {r['measured'] / 2**20:.1f} MiB | "
                   f"{r['error_pct']:+.1f}% | {r.get('peak_phase', '-')} | {phases} MiB |")
    within = sum(1 for r in rows if r.get("error_pct") is not None and abs(r["error_pct"]) <= 10)
    measured = sum(1 for r in rows if r.get("error_pct") is not None)
    out.append("")
    out.append(f"{within} of {measured} measured configurations within 10%.")
    return "\n".join(out)


def reestimate(rows: list[dict]) -> list[dict]:
    from runner.service import memgrid

    return memgrid.reestimate(rows, Path(tempfile.mkdtemp(prefix="ftui-memgrid-models-")))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archs", default="llama,qwen2,gpt2")
    parser.add_argument("--methods", default="full,lora")
    parser.add_argument("--precisions", default="fp32,bf16")
    parser.add_argument("--strategies", default="single,ddp,fsdp")
    parser.add_argument("--ckpt", default="off,on")
    parser.add_argument("--seqs", default="128,256")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "memory_grid.jsonl")
    parser.add_argument("--markdown", action="store_true", help="print the table of --out and exit")
    parser.add_argument("--write-band", action="store_true",
                        help="re-estimate --out's measurements, write runner/planner/measured_error.json, exit")
    args = parser.parse_args()

    done: dict[str, dict] = {}
    if args.out.is_file():
        for line in args.out.read_text().splitlines():
            row = json.loads(line)
            done[row["config"]] = row
    if args.markdown:
        print(table(reestimate(list(done.values()))))
        return 0
    if args.write_band:
        from runner.planner import error_band

        bands = error_band.bands_from_rows(reestimate(list(done.values())), source=str(args.out.resolve().relative_to(ROOT)) if args.out.resolve().is_relative_to(ROOT) else args.out.name)
        error_band.write_bands(bands)
        for band in bands.values():
            print(band.sentence())
        return 0

    from runner.service import memgrid
    from store import Store

    work = Path(tempfile.mkdtemp(prefix="ftui-memgrid-"))
    models = work / "models"
    models.mkdir()
    store = Store(f"sqlite:///{work / 'grid.db'}")
    grid = itertools.product(args.archs.split(","), args.methods.split(","), args.precisions.split(","),
                             args.strategies.split(","), [c == "on" for c in args.ckpt.split(",")],
                             [int(s) for s in args.seqs.split(",")])
    with args.out.open("a") as out:
        for arch, method, precision, strategy, ckpt, seq in grid:
            point = memgrid.GridPoint(arch, method, precision, strategy, ckpt, seq)
            if point.label in done:
                continue
            t0 = time.perf_counter()
            recipe = memgrid.recipe_for(point, memgrid.model_folder(arch, models))
            breakdown, _ = memgrid.estimate_for(recipe)
            status = "completed"
            if strategy == "single":
                ranks = memgrid.measure_in_process(recipe, work / f"run-{len(done)}")
            else:
                status, ranks = memgrid.measure_launched(store, recipe, root=work / "runs")
            row = memgrid.compare(point, ranks, breakdown)
            row |= {"status": status, "peak_phase": breakdown.peak_phase, "seconds": time.perf_counter() - t0}
            done[point.label] = row
            out.write(json.dumps(row) + "\n")
            out.flush()
            err = row["error_pct"]
            print(f"{point.label:48s} {'-' if err is None else f'{err:+.1f}%'}", flush=True)
    print(table(list(done.values())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
