"""``ftui sweep`` and ``ftui compare`` on real runs: the shared matrix's sweep of quickstart over every
strategy on CPU (real subprocesses, real SQLite, real training), its comparison in every format, a
strategy that cannot run as a row with its reason, and ``ftui show``'s figures. (Comparisons built by
hand: tests/unit/test_compare.py; the page in Chromium: tests/system/test_html_report.py.)"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
from typing import Any

import pytest

from runner.analysis import cpu_peak
from runner.spec import strategies
from tests.support import QUICKSTART, ROOT, Ftui
from tests.support.in_process import run_ftui
from tests.support.matrix import CORE, GLOBAL_BATCH, GRAD_ACCUM, STEPS, Matrix, Sweep, sweep_id

GOLDEN = ROOT / "tests" / "golden" / "compare.md"
"""The masked shape of the sweep's comparison (:func:`mask`). Regenerated, after a change of the table, by
``FTUI_REGEN_GOLDEN=1 python -m pytest tests/e2e/test_compare.py -k golden`` (then read its diff)."""
# Every strategy of the table (zero1-3 on their default engine, DeepSpeed); one that cannot run here is a row
# with its reason (the `refused` fixture).
STRATEGIES = list(CORE)


# ---------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def sweep(matrix: Matrix) -> Sweep:
    """quickstart under every strategy (2 processes where a strategy takes several), one sweep id."""
    return matrix.sweep()


@pytest.fixture(scope="module")
def refused(ftui: Ftui) -> dict[str, Any]:
    """fsdp with one process on CPU: pre-flight refuses it, and the sweep records why."""
    proc = ftui.run("sweep", str(QUICKSTART), "--strategies", "fsdp", "--nproc", "1",
                    "--set", f"train.max_steps={STEPS}", "--format", "json", timeout=300)
    return {"proc": proc, "id": sweep_id(proc.stdout + proc.stderr), "json": json.loads(proc.stdout)}


def _compare(ftui: Ftui, *args: str) -> str:
    return ftui.call("compare", *args, check=True).stdout


# ---------------------------------------------------------------------- the real sweep


def mask(md: str) -> str:
    """The shape of a markdown comparison: its table and heading lines, numbers and ids masked."""
    lines = [line for line in md.splitlines() if line.startswith(("|", "#"))]
    text = "\n".join(lines)
    text = re.sub(r"sweep-\d{8}-\d{6}-[0-9a-f]{4}", "SWEEP", text)
    text = re.sub(r"\d[\d,.]*", "#", text)
    text = re.sub(r"(#h)?(#m)?#s\b", "#s", text)  # 59.0s and 1m05s are the same shape
    # Whether a shared host's measured peak holds is checked on the JSON rows, not on the shape: an MFU
    # suppressed as > 100% fills the same cell.
    text = text.replace("| - [#] |", "| #% |")  # its cell is '-' with the footnote that says why
    text = re.sub(r",? busy host \(load #\)", "", text)  # a peak measured while others computed says so
    return re.sub(r"# (B|KiB|MiB|GiB|TiB)\b", "# B", text) + "\n"


def test_sweep_markdown_matches_the_golden_shape(ftui: Ftui, sweep: Sweep) -> None:
    md = _compare(ftui, "--sweep", sweep.id, "--format", "md")
    if os.environ.get("FTUI_REGEN_GOLDEN"):
        GOLDEN.write_text(mask(md))
    assert mask(md) == GOLDEN.read_text(), f"got:\n{mask(md)}"
    # The sweep printed the same comparison and one recommendation with numbers.
    assert mask(sweep.stdout) == GOLDEN.read_text()
    # One verdict line: a recommendation only beyond the run-to-run spread measured on this host.
    verdict = [line for line in md.splitlines()
               if line.startswith(("Use ", "Cannot tell: ", "No recommendation: ")) or " tie: " in line]
    assert len(verdict) == 1 and "tokens/s" in verdict[0] + md, verdict
    assert "global batch 4 kept" in md  # the fairness rule is stated


def test_every_format_has_one_plausible_row_per_strategy(ftui: Ftui, sweep: Sweep) -> None:
    data = json.loads(_compare(ftui, "--sweep", sweep.id, "--format", "json"))
    all_rows = data["runs"]
    assert [r["strategy"] for r in all_rows] == STRATEGIES
    for r in all_rows:
        if not strategies.get(r["strategy"]).launchable:
            assert r["status"] == "failed" and "refused before launch" in r["reason"], r
    rows = [r for r in all_rows if strategies.get(r["strategy"]).launchable]
    for r in rows:
        assert r["status"] == "completed", r
        assert r["devices"] == (1 if r["strategy"] == "single" else 2)
        # 1 row x 2 micro-steps x 2 processes for the data-parallel ones; pp, mp, tp share 2 rows x 2 micro-steps
        assert r["global_batch"] == GLOBAL_BATCH
        assert r["train_seconds"] > 0 and r["tokens_per_s"] > 0
        assert r["tokens_per_s_per_device"] == pytest.approx(r["tokens_per_s"] / r["devices"])
        threads = 2 if r["strategy"] == "single" else 1  # the 2 cores shared out over the processes
        assert r["cpu_threads"] == threads and r["gpu_busy"] is None, r
        assert 0 < r["cpu_util"] <= 150 and f"CPU % of its {threads} thread" in r["util_source"]
        if r["devices"] > 1:
            assert r["util_min"] <= r["cpu_util"] <= r["util_max"]
        # The peak was probed in the ranks beside the run and stored with it, in the run's dtype and threads.
        assert r["peak_source"].startswith(cpu_peak.PROBE_SOURCE) and r["peak_kind"] == "probe"
        assert (r["peak_dtype"], r["peak_threads"]) == ("fp32", threads)
        assert r["peak_fingerprint"] == cpu_peak.machine_fingerprint().key
        assert (0 < r["mfu"] <= 1) if r["mfu"] is not None else "peak not trustworthy" in r["mfu_note"], r
        # CPU MFU is per CPU-second the ranks ran (the probe's FLOPs per CPU-second x the CPU-seconds they ran)
        assert r["peak_per_cpu_second"] is True
        assert r["mfu"] is None or r["mfu_basis"].startswith("per CPU-second the rank"), r
        # a device holds at least its share of the fp32 weights (builtin:tiny-llama: 12,587,904 parameters)
        assert r["mem_measured"] > 12_587_904 * 4 / r["devices"] and r["mem_estimated"] > 0
        assert 0 < r["final_loss"] < 20 and math.isfinite(r["best_loss"]) and r["best_loss"] <= r["final_loss"]
        assert r["speedup"] > 0
    assert rows[0]["speedup"] == 1.0 and data["baseline_id"] == rows[0]["run_id"]
    fastest = max(rows, key=lambda r: r["tokens_per_s"])
    assert data["fastest_id"] == fastest["run_id"]
    assert data["recipe_diff"]["launch.strategy"] == STRATEGIES
    micro = GLOBAL_BATCH // GRAD_ACCUM
    assert data["recipe_diff"]["train.batch_size"] == [
        str(micro // 2) if strategies.get(s).data_parallel else str(micro) for s in STRATEGIES]
    assert "train.lr" not in data["recipe_diff"]

    table = list(csv.DictReader(io.StringIO(_compare(ftui, "--sweep", sweep.id, "--format", "csv"))))
    assert [r["strategy"] for r in table] == STRATEGIES
    assert all(float(r["tokens_per_s"]) > 0 for r in table if r["status"] == "completed")

    text = _compare(ftui, "--sweep", sweep.id, "--plot")
    for r in rows:
        assert f"run {r['run_id']}" in text
    assert "loss (measured, per step)" in text and "●" in text
    assert "faster than" in text or "slower than" in text or "the tokens/s of" in text

    other = _compare(ftui, *[str(r["run_id"]) for r in rows], "--baseline", str(rows[2]["run_id"]), "--format", "json")
    assert json.loads(other)["baseline_id"] == rows[2]["run_id"]


def test_a_strategy_that_cannot_run_is_a_row_with_its_reason(ftui: Ftui, sweep: Sweep,
                                                              refused: dict[str, Any]) -> None:
    proc = refused["proc"]
    assert proc.returncode == 1, proc.stderr  # nothing completed, but no crash
    assert "Traceback" not in proc.stderr
    (row,) = refused["json"]["runs"]
    assert row["strategy"] == "fsdp" and row["status"] == "failed"
    assert "fsdp on CPU needs at least 2 processes" in row["reason"]
    assert refused["json"]["recommendation"].startswith("No run completed")

    ids = [str(r["run_id"]) for r in json.loads(_compare(ftui, "--sweep", sweep.id, "--format", "json"))["runs"]]
    md = _compare(ftui, *ids, str(row["run_id"]), "--format", "md")
    last = [line for line in md.splitlines() if line.startswith(f"| {row['run_id']} |")]
    mark = re.search(r"\| failed (\[\d+\]) \|$", last[0]) if len(last) == 1 else None
    assert mark, last  # a short cell; the reason in its footnote
    note = [line for line in md.splitlines() if line.startswith(f"- {mark.group(1)} run {row['run_id']} failed: ")]
    assert len(note) == 1 and "refused before launch" in note[0] and "needs at least 2 processes" in note[0], note
    assert re.search(r"\b\d+ did not complete", md)


def test_show_names_the_thread_unit_the_spread_and_the_peak(ftui: Ftui, sweep: Sweep) -> None:
    data = json.loads(_compare(ftui, "--sweep", sweep.id, "--format", "json"))
    ddp = next(r for r in data["runs"] if r["strategy"] == "ddp")
    code, shown, err = run_ftui(["show", str(ddp["run_id"])], {**ftui.env, "COLUMNS": "400"}, ROOT)  # no wrapped cells
    assert code == 0, err
    assert "util min-max over devices" in shown and "CPU % of its 1 thread" in shown
    assert "MFU peak per CPU-second" in shown and "fp32, 1 thread" in shown and "matmul probe in the ranks" in shown
    assert "OpenMP waits yield" in shown  # the ranks' OpenMP threads yielded (ftui's CPU default, the session's too)
    assert re.search(r"│ MFU +│ +(\d+\.\d\d%|-) ", shown), shown
    summary = ftui.show(ddp["run_id"])["summary"]
    assert summary["threads"] == 1 and summary["model_dims"]["layers"] == 6
    peak = summary["mfu_peak"]
    assert (peak["dtype"], peak["threads"], peak["kind"], peak["omp_wait"]) == ("fp32", 1, "probe", "yield")
    assert peak["flops"] > 0 and peak["per_cpu_second"] is True
    # both ranks' CPU-seconds over their steady steps, summed: at most 2 cores' worth of rank 0's wall seconds
    assert 0 < summary["steady_cpu_seconds"] <= 2 * 1.5 * summary["steady_seconds"]
    assert peak["fingerprint"] == cpu_peak.machine_fingerprint().key and peak["measured_at"] > 0
    # Both ranks probed through the steady steps, and the probes' rates are the peak's spread.
    assert "mean over 2 rank(s)" in peak["source"] and peak["spread"][0] <= peak["flops"] <= peak["spread"][2]


def test_the_sweep_shows_the_running_runs_progress(sweep: Sweep) -> None:
    # Each run of a sweep has its live line (step/total, loss, elapsed), not one static line.
    for strategy in STRATEGIES:
        line = next((ln for ln in sweep.stderr.splitlines() if f" {strategy} completed" in ln and "loss" in ln), None)
        assert line is not None and f"{STEPS}/{STEPS}" in line, (strategy, sweep.stderr[-2000:])
