"""The plan's performance model against what the plan measured: predicted vs measured tokens/s per candidate.

    python bench/bench_perf_model.py [--home DIR] [--recipe recipes/quickstart.toml] [--nproc 2]
                                     [--strategies LIST] [--steps K] [--set FIELD=VALUE ...] [--out FILE]

Runs ``ftui plan RECIPE --nproc N --format json`` in ``--home`` (default: a fresh one). A home where the same
plan is stored races nothing again: the command only reads the trials and fits the model (so the costly race
runs once, and the figures can be read again). Prints a Markdown table: each candidate's measured median
tokens/s, the model's prediction (for a raced candidate: fitted without its own trials) and its error
(``runner.spec.summary.error_pct``), then one line per configuration the plan did not race, and the model's
source (what it was fitted on). ``--out``: the same as JSON (what bench/gpu_checks.py records).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def run_plan(home: Path, recipe: str, nproc: int, sets: list[str], strategies: str | None = None,
             steps: int | None = None, timeout: float = 3600) -> dict[str, Any]:
    """``ftui plan`` in ``home``, its JSON report (SystemExit with its stderr when it exits otherwise than 0/1)."""
    env = {**os.environ, "FTUI_HOME": str(home), "FTUI_DB": f"sqlite:///{home / 'ftui.db'}",
           "PYTHONPATH": os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(ROOT)) if p)}
    args = ["plan", recipe, "--nproc", str(nproc), "--format", "json", *(f"--set={s}" for s in sets)]
    args += ["--strategies", strategies] if strategies else []
    args += ["--steps", str(steps)] if steps else []
    proc = subprocess.run([sys.executable, "-m", "tui.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, check=False, timeout=timeout)
    if proc.returncode not in (0, 1) or not proc.stdout.strip():
        raise SystemExit(f"ftui {' '.join(args)}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
    report: dict[str, Any] = json.loads(proc.stdout)
    return report


def rows(report: dict[str, Any]) -> dict[str, Any]:
    """Predicted against measured per candidate, and the predictions of what was not raced."""
    out = []
    for e in report["candidates"]:
        pred = e.get("predicted") or {}
        out.append({"candidate": e["label"], "status": e["status"],
                    "measured": (e["tokens_per_s"] or {}).get("median"), "predicted": pred.get("tokens_per_s"),
                    "held_out": bool(pred.get("held_out")), "error_pct": pred.get("error_pct"),
                    "source": pred.get("source") or pred.get("error_source")})
    model = report.get("performance_model") or {}
    return {"plan_id": report["plan_id"], "candidates": out, "not_raced": model.get("not_raced", []),
            "model_source": model.get("source"), "fitted_on": model.get("fitted_on", [])}


def _n(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f}"


def markdown(found: dict[str, Any]) -> str:
    lines = ["| candidate | status | measured tokens/s | predicted (held out) | error |", "|---|---|---:|---:|---:|"]
    for r in found["candidates"]:
        err = "-" if r["error_pct"] is None else f"{r['error_pct']:+.0f}%"
        lines.append(f"| {r['candidate']} | {r['status']} | {_n(r['measured'])} | {_n(r['predicted'])} | {err} |")
    errors = [abs(r["error_pct"]) for r in found["candidates"] if r["error_pct"] is not None]
    if errors:
        errors.sort()
        lines += ["", f"Held-out error over {len(errors)} raced candidates: median {errors[len(errors) // 2]:.0f}%, "
                      f"worst {errors[-1]:.0f}% (absolute)."]
    lines += ["", *(f"- not raced: {w['label']}, {w['change']}: {_n(w['tokens_per_s'])} tokens/s predicted"
                    for w in found["not_raced"])]
    lines += ["", f"Model: {found['model_source']}"]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--home", type=Path, default=None, help="an ftui home (where the plan may be stored)")
    parser.add_argument("--recipe", default="recipes/quickstart.toml")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--strategies", default=None)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--set", dest="sets", action="append", default=[])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    home = args.home or Path(tempfile.mkdtemp(prefix="ftui-bench-perf-"))
    home.mkdir(parents=True, exist_ok=True)
    found = rows(run_plan(home, args.recipe, args.nproc, args.sets, args.strategies, args.steps))
    if args.out:
        args.out.write_text(json.dumps(found, indent=2))
    print(markdown(found), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
