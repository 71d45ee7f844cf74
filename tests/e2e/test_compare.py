"""``ftui sweep`` and ``ftui compare``: the shared matrix's sweep of quickstart over every strategy on CPU
(real subprocesses, real SQLite, real training), its comparison in every format, the HTML page rendered by
headless Chromium; and unit tests of the MFU formula, the recipe diff and the speed-ups."""

from __future__ import annotations

import csv
import io
import json
import math
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from runner.analysis import cpu_peak, mfu
from runner.analysis.compare import build_comparison, flatten, recipe_diff, speedups
from runner.analysis.run_figures import default_peak, device_count, peak_note
from runner.spec import flops, strategies
from runner.spec.summary import RunSummary
from store import MetricPoint, RunInfo, SampleInfo
from tests.support import QUICKSTART, ROOT, Ftui
from tests.support.matrix import CORE, GLOBAL_BATCH, GRAD_ACCUM, STEPS, Matrix, Sweep, sweep_id
from tui.render.compare import markdown, sources

GOLDEN = ROOT / "tests" / "golden" / "compare.md"
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
    return ftui.run("compare", *args, check=True).stdout


@pytest.fixture(scope="session")
def chromium() -> str:
    """Headless Chromium from Debian, installed when missing (needs root and the package mirror)."""
    path = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
    if path:
        return path
    if shutil.which("apt-get") is None:
        pytest.skip("chromium is not installed and apt-get is not available to install it")
    try:
        subprocess.run(["apt-get", "update", "-qq"], check=True, capture_output=True, timeout=600)
        subprocess.run(["apt-get", "install", "-y", "-qq", "chromium"], check=True, capture_output=True,
                       timeout=900, env={"DEBIAN_FRONTEND": "noninteractive", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, PermissionError) as exc:
        pytest.skip(f"chromium is not installed and could not be installed with apt-get: {exc}")
    path = shutil.which("chromium")
    if path is None:
        pytest.skip("apt-get install chromium ran but no chromium binary appeared")
    return path


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
    text = text.replace("- (> #%: peak not trustworthy)", "#%")
    text = re.sub(r",? busy host \(load #\)", "", text)  # a peak measured while others computed says so
    return re.sub(r"# (B|KiB|MiB|GiB|TiB)\b", "# B", text) + "\n"


def test_sweep_markdown_matches_the_golden_shape(ftui: Ftui, sweep: Sweep) -> None:
    md = _compare(ftui, "--sweep", sweep.id, "--format", "md")
    assert mask(md) == GOLDEN.read_text(), f"got:\n{mask(md)}"
    # The sweep printed the same comparison and one recommendation with numbers.
    assert mask(sweep.stdout) == GOLDEN.read_text()
    verdict = [line for line in md.splitlines() if line.startswith("Use ")]
    assert len(verdict) == 1 and "tokens/s" in verdict[0] and "the fastest that completed" in verdict[0]
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
        # The peak was measured on this machine after the run and stored with it, in the run's dtype
        # and threads. On a shared host a peak can still come out low: then MFU is '-' with the reason.
        assert r["peak_source"].startswith(cpu_peak.CPU_PEAK_SOURCE) and r["peak_kind"] == "measured"
        assert (r["peak_dtype"], r["peak_threads"]) == ("fp32", threads)
        assert r["peak_fingerprint"] == cpu_peak.machine_fingerprint().key
        assert "measured by compare" not in r["peak_source"]  # stored with the run when it ended
        assert (0 < r["mfu"] <= 1) if r["mfu"] is not None else "peak not trustworthy" in r["mfu_note"], r
        assert r["mem_measured"] > 50 * 2**20 and r["mem_estimated"] > 0
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
    assert "faster than" in text or "slower than" in text

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
    assert len(last) == 1 and "failed: refused before launch" in last[0] and "needs at least 2 processes" in last[0]
    assert re.search(r"\b\d+ did not complete", md)


def test_html_report_renders_in_headless_chromium(ftui: Ftui, sweep: Sweep, chromium: str,
                                                  tmp_path: Path) -> None:
    page = tmp_path / "compare.html"
    ftui.run("compare", "--sweep", sweep.id, "--format", "html", "-o", str(page), check=True)
    html = page.read_text()
    assert "<svg" in html and "training loss, all runs" in html and "utilisation per device" in html
    assert "Recipe differences" in html
    assert not re.search(r"""(src|href)=["']?https?:""", html), "the page must not load anything"
    png = tmp_path / "compare.png"
    proc = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}",
         f"--screenshot={png}", "--window-size=1400,1800", page.as_uri()],
        capture_output=True, text=True, timeout=180,
    )
    assert png.exists(), f"no screenshot: exit {proc.returncode}\n{proc.stderr[-2000:]}"
    assert png.stat().st_size > 30_000, png.stat().st_size  # a blank page is a few KB
    print(f"screenshot: {png}")  # pytest -s shows where to look


# ---------------------------------------------------------------------- unit tests


def test_flops_per_token_by_hand() -> None:
    # N = 1000, L = 2, H = 4, Q = 8, T = 16: 6*1000 + 12*2*4*8*16 = 6000 + 12288
    assert flops.flops_per_token(1000, 2, 4, 8, 16) == 18288
    # LoRA: 900 frozen, 100 trainable: 4*900 + 6*100 + 12288
    assert flops.flops_per_token(1000, 2, 4, 8, 16, trainable_params=100) == 3600 + 600 + 12288
    m = mfu.compute_mfu(18288, tokens_per_s=1000, peak=mfu.Peak(1e8, "x"), devices=2)
    assert m.achieved_flops == 18_288_000 and m.mfu == pytest.approx(18_288_000 / 2e8)


def test_gpu_peaks_match_the_right_model() -> None:
    a100 = mfu.gpu_peak("NVIDIA A100-SXM4-80GB", "bf16")
    assert a100 is not None and a100.flops == 312e12
    a10 = mfu.gpu_peak("NVIDIA A10", "bf16")
    assert a10 is not None and a10.flops == 125e12
    assert mfu.gpu_peak("NVIDIA L40S", "fp32").flops == 91.6e12  # type: ignore[union-attr]
    assert mfu.gpu_peak("NVIDIA L4", "bf16").flops == 121e12  # type: ignore[union-attr]
    assert mfu.gpu_peak("NVIDIA H100 PCIe", "bf16").flops == 756e12  # type: ignore[union-attr]
    assert mfu.gpu_peak("NVIDIA H100 80GB HBM3", "bf16").flops == 989.4e12  # type: ignore[union-attr]
    assert mfu.gpu_peak("NVIDIA GeForce RTX 4090", "fp16").flops == 165.2e12  # type: ignore[union-attr]
    assert mfu.gpu_peak("Tesla T4", "bf16").flops == 65e12  # type: ignore[union-attr]  # fp16 rate
    assert mfu.gpu_peak("Some Future GPU", "bf16") is None


def test_recipe_diff_keeps_only_the_fields_that_differ() -> None:
    a = 'name = "q"\n[train]\nbatch_size = 4\nlr = 0.002\n[launch]\nstrategy = "single"\n'
    b = 'name = "q"\n[train]\nbatch_size = 2\nlr = 0.002\n[launch]\nstrategy = "ddp"\nnproc = 2\n'
    assert flatten({"a": {"b": {"c": 1}}, "d": 2}) == {"a.b.c": 1, "d": 2}
    assert recipe_diff([a, b]) == {
        "launch.nproc": ["-", "2"],
        "launch.strategy": ["single", "ddp"],
        "train.batch_size": ["4", "2"],
    }
    assert recipe_diff([a, a]) == {}


def _run(id_: int, strategy: str, nproc: int, tps: float | None, status: str = "completed",
         **summary: Any) -> RunInfo:
    now = datetime(2026, 1, 1)
    return RunInfo(id=id_, uid=f"uid{id_}", name="q", sweep_id=None, recipe_text=f'[launch]\nstrategy = "{strategy}"\n',
                   recipe_hash="", recipe_source=None, strategy=strategy, nproc=nproc, method="lora",
                   model="builtin:tiny-llama", status=status, distributed_type=None, device_type="cpu", host="h",
                   run_dir="", pgid=None, created_at=now, started_at=now, ended_at=now, exit_code=0,
                   error=None if status == "completed" else "boom", total_steps=5, steps_done=5,
                   train_seconds=10.0, tokens_per_s=tps, final_loss=2.0, peak_mem_bytes=None, mean_util=50.0,
                   summary=RunSummary.from_json({"world_size": nproc, **summary}))


def test_speedups_against_the_baseline() -> None:
    assert speedups([100.0, 390.0, None], 0) == [1.0, 3.9, None]
    assert speedups([None, 390.0], 0) == [None, None]
    runs = [_run(1, "mp", 1, 100.0), _run(2, "ddp", 4, 390.0), _run(3, "fsdp", 4, 50.0), _run(4, "fsdp", 2, None, "failed")]
    metrics = {1: [MetricPoint(1, 0.0, 3.0, None, None, None, None, None), MetricPoint(2, 1.0, 2.5, None, None, None, None, None)]}
    cmp = build_comparison(runs, metrics)
    assert cmp.baseline_id == 1 and cmp.fastest_id == 2
    assert [r.speedup for r in cmp.rows] == [1.0, 3.9, 0.5, None]
    assert cmp.rows[0].best_loss == 2.5 and cmp.rows[3].reason == "boom"
    assert cmp.speedup_sentences() == [
        "ddp x4 (run 2) 3.90x faster than mp (run 1)",
        "fsdp x4 (run 3) 2.00x slower than mp (run 1)",
    ]
    assert cmp.recommendation().startswith("Use ddp x4 (run 2): the fastest that completed, 390 tokens/s")
    assert "1 did not complete" in cmp.recommendation()
    assert build_comparison(runs, metrics, baseline_id=2).rows[0].speedup == pytest.approx(100 / 390)


def test_bad_input_is_one_line_and_exit_2(ftui: Ftui) -> None:
    for args in (["compare"], ["compare", "9999"], ["compare", "--sweep", "no-such-sweep"],
                 ["sweep", str(QUICKSTART), "--strategies", "single,warp"],
                 ["sweep", str(QUICKSTART), "--grid", "train.batch_size"]):
        proc = ftui.run(*args)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert proc.stderr.startswith("ftui: ") and "Traceback" not in proc.stderr, proc.stderr


def test_model_parallel_on_gpus_counts_the_gpus_of_its_device_map() -> None:
    device_map = {"model.embed_tokens": 0, "model.layers.0": "0", "model.layers.21": "cuda:1", "lm_head": "1",
                  "model.norm": "cpu", "model.rotary": "disk"}
    mp = _run(1, "mp", 1, 1000.0, params=1000, device_map=device_map)
    assert device_count(mp) == 2  # one process, two GPUs
    assert device_count(_run(2, "mp", 1, 1000.0, device_map={"": "cpu"})) == 1  # mp on CPU: one device
    assert device_count(_run(3, "ddp", 4, 1000.0)) == 4  # no device map: the world size
    row = build_comparison([mp], {}).rows[0]
    assert row.devices == 2 and row.tokens_per_s_per_device == 500.0
    # MFU divides by the devices too: twice the devices, half the MFU.
    dims = {"layers": 2, "heads": 4, "head_dim": 8, "seq_len": 16, "embedding_params": 0}
    peak = mfu.Peak(1e9, "x")
    one = _run(4, "mp", 1, 1000.0, params=1000, device_map={"a": "0"})
    rows = build_comparison([mp, one], {}, peaks={1: peak, 4: peak}, dims={1: dims, 4: dims}).rows
    assert rows[0].mfu is not None and rows[1].mfu is not None
    assert rows[1].mfu == pytest.approx(2 * rows[0].mfu)


def test_an_unknown_baseline_is_refused() -> None:
    with pytest.raises(ValueError, match="baseline run 99"):
        build_comparison([_run(1, "single", 1, 100.0)], {}, baseline_id=99)


def _gpu_sample(name: str) -> SampleInfo:
    return SampleInfo(time=0.0, host="h", kind="gpu", index=0, name=name, util_pct=90.0, mem_used=1, mem_total=2,
                      power_w=None, temp_c=None, sm_clock_mhz=None, pid=None, source="nvml")


def test_mfu_dash_says_why_for_an_unknown_gpu() -> None:
    run = _run(1, "single", 1, 1000.0, params=1000)
    run = replace(run, device_type="cuda")
    recipe = {"train": {"precision": "bf16"}}
    samples = [_gpu_sample("NVIDIA Quantum Q9000")]
    assert default_peak(run, recipe, samples=samples) is None
    note = peak_note(run, recipe, samples)
    assert "NVIDIA Quantum Q9000" in note and "bf16" in note and "--peak-tflops" in note
    assert "no NVML samples" in peak_note(run, recipe, [])
    cmp = build_comparison([run], {}, peak_notes={1: note})
    assert cmp.rows[0].mfu is None and cmp.rows[0].mfu_note == note
    assert f"MFU '-' for run 1: {note}" in sources(cmp)
    assert f"- MFU '-' for run 1: {note}" in markdown(cmp)
    # A given peak fixes it: no note.
    assert default_peak(run, recipe, peak_tflops=100.0, samples=samples) == mfu.Peak(1e14, "given (--peak-tflops 100)")


def test_cpu_peak_measured_by_compare_on_another_host_is_flagged(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A run stored before runs kept their peak: compare takes this machine's cached peak and says so."""
    import socket
    import time

    monkeypatch.setenv("FTUI_HOME", str(tmp_path))
    monkeypatch.setenv("FTUI_CACHE", str(tmp_path / "cache"))
    key = cpu_peak.machine_fingerprint().key
    cached = mfu.Peak(1e10, f"{cpu_peak.CPU_PEAK_SOURCE}, cached", kind="measured", dtype="fp32", threads=1,
                      measured_at=time.time(), fingerprint=key)
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / cpu_peak.PEAK_CACHE_FILE).write_text(json.dumps(
        {"version": cpu_peak.PEAK_CACHE_VERSION, "peaks": {cpu_peak.cache_key(key, "fp32", 1): cached.to_json()}}))
    here = _run(1, "single", 1, 1000.0, threads=1)
    here = replace(here, host=socket.gethostname())
    elsewhere = replace(here, host="gpu-box-7")
    same = default_peak(here, {})
    other = default_peak(elsewhere, {})
    assert same is not None and other is not None and same.flops == other.flops == 1e10
    assert "measured by compare, not stored with the run" in same.source
    assert "not on the run's host" not in same.source
    assert "not on the run's host gpu-box-7" in other.source and "--peak-tflops" in other.source
    # A run that stored its peak is read as it ran: no cache, no host question.
    stored = replace(elsewhere, summary=replace(elsewhere.summary, mfu_peak=replace(cached, flops=2e10).to_json()))
    assert default_peak(stored, {}) == replace(cached, flops=2e10)


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["compare", "1", "-o", "/missing/dir/x.md"], "-o/--output"),
        (["compare", "1", "--baseline", "99"], "--baseline 99"),
        (["compare", "1", "--peak-tflops", "-5"], "--peak-tflops"),
        (["compare", "1", "--peak-tflops", "nan"], "--peak-tflops"),
        (["sweep", str(QUICKSTART), "--nproc", "0"], "--nproc"),
        (["sweep", str(QUICKSTART), "--peak-tflops", "0"], "--peak-tflops"),
        (["sweep", str(QUICKSTART), "-o", "/missing/dir/x.html", "--format", "html"], "-o/--output"),
    ],
)
def test_bad_flags_are_one_line_naming_the_flag(ftui: Ftui, args: list[str], named: str) -> None:
    proc = ftui.run(*args)
    assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ftui: ") and named in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr and "sweep-" not in proc.stdout  # nothing ran


def test_the_recipe_can_name_the_mfu_peak_and_the_command_line_wins() -> None:
    run = _run(1, "single", 1, 1000.0)
    recipe = {"launch": {"peak_tflops": 0.25}}
    from_recipe = default_peak(run, recipe)
    assert from_recipe is not None and from_recipe.flops == 0.25e12
    assert from_recipe.source == "given (recipe launch.peak_tflops 0.25)"
    flag = default_peak(run, recipe, peak_tflops=2.0)
    assert flag is not None and flag.flops == 2.0e12 and "--peak-tflops" in flag.source


def test_show_names_the_thread_unit_the_spread_and_the_peak(ftui: Ftui, sweep: Sweep) -> None:
    data = json.loads(_compare(ftui, "--sweep", sweep.id, "--format", "json"))
    ddp = next(r for r in data["runs"] if r["strategy"] == "ddp")
    proc = subprocess.run([sys.executable, "-m", "tui.cli", "show", str(ddp["run_id"])], cwd=ROOT, text=True,
                          capture_output=True, timeout=120, env={**ftui.env, "COLUMNS": "400"})  # no wrapped cells
    assert proc.returncode == 0, proc.stderr
    shown = proc.stdout
    assert "util min-max over devices" in shown and "CPU % of its 1 thread" in shown
    assert "MFU peak/device" in shown and "fp32, 1 thread" in shown
    summary = ftui.show(ddp["run_id"])["summary"]
    assert summary["threads"] == 1 and summary["model_dims"]["layers"] == 6
    peak = summary["mfu_peak"]
    assert (peak["dtype"], peak["threads"], peak["kind"]) == ("fp32", 1, "measured") and peak["flops"] > 0
    assert peak["fingerprint"] == cpu_peak.machine_fingerprint().key and peak["measured_at"] > 0


def test_memory_columns_are_the_measured_peak_and_the_stored_estimate() -> None:
    """Measured = the independent peak (live tensors on CPU), never RSS; estimated = the estimate stored at
    prepare time, read from its key (not re-estimated without model.dtype)."""
    ranks = [{"rank": 0, "peak_tensor_bytes": 200 * 2**20, "peak_rss_bytes": 900 * 2**20},
             {"rank": 1, "peak_tensor_bytes": 210 * 2**20, "peak_rss_bytes": 950 * 2**20}]
    run = _run(1, "ddp", 2, 100.0, ranks=ranks,
               estimate={"per_device_bytes": {"total": 205 * 2**20, "params": 1}, "strategy": "ddp"})
    row = build_comparison([run], {}).rows[0]
    assert (row.mem_measured, row.mem_estimated) == (210 * 2**20, 205 * 2**20)
    assert row.mem_measured_source == "measured: live-tensor peak, busiest rank"
    assert row.mem_estimated_source == "estimated at prepare time (runner.planner)"
    rss_only = build_comparison([_run(2, "single", 1, 100.0, ranks=[{"rank": 0, "peak_rss_bytes": 9}])], {}).rows[0]
    assert rss_only.mem_measured is None


def test_a_resumed_runs_curve_is_joined_to_its_parents(tmp_path: Path) -> None:
    """Compare shows a resumed run's loss curve joined to its parent's (the parent's steps up to the
    checkpoint, then the resumed run's own), through a chain of resumes."""
    from runner.analysis.compare import joined_metrics, load_comparison
    from store import Store

    store = Store(f"sqlite:///{tmp_path / 'ftui.db'}")

    def run(name: str, steps: range, loss: float, parent: int | None = None, at: int | None = None) -> int:
        rid = store.create_run(name=name, recipe_text="", recipe_hash="", strategy="single", nproc=1, method="lora",
                               model="builtin:tiny-llama", run_dir="", resumed_from=parent)
        store.ingest(rid, [{"seq": i, "type": "step", "time": 1000.0 + s, "step": s, "loss": loss - 0.01 * s}
                           for i, s in enumerate(steps)])
        if parent is not None:
            store.update_run(rid, summary={"resumed_from": {"run_id": parent, "checkpoint": "x", "step": at}})
        return rid

    first = run("first", range(1, 9), 9.0)          # stopped after step 8, checkpointed at step 4
    second = run("second", range(5, 13), 8.0, first, 4)   # resumed at 5, stopped after 12, checkpoint at 10
    third = run("third", range(11, 16), 7.0, second, 10)
    joined = joined_metrics(store, store.get_run(third))  # type: ignore[arg-type]
    assert [m.step for m in joined] == list(range(1, 16))
    assert [m.loss for m in joined[:4]] == [9.0 - 0.01 * s for s in range(1, 5)]       # the first run's
    assert [m.loss for m in joined[4:10]] == [8.0 - 0.01 * s for s in range(5, 11)]    # the second's
    assert [m.loss for m in joined[10:]] == [7.0 - 0.01 * s for s in range(11, 16)]    # its own
    cmp = load_comparison(store, [first, third])
    assert [s for s, _ in cmp.curves[third]] == list(range(1, 16))
    assert [s for s, _ in cmp.curves[first]] == list(range(1, 9))


def test_the_sweep_shows_the_running_runs_progress(sweep: Sweep) -> None:
    # Each run of a sweep has its live line (step/total, loss, elapsed), not one static line.
    for strategy in STRATEGIES:
        line = next((ln for ln in sweep.stderr.splitlines() if f" {strategy} completed" in ln and "loss" in ln), None)
        assert line is not None and f"{STEPS}/{STEPS}" in line, (strategy, sweep.stderr[-2000:])
