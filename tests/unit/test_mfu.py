"""MFU you can bet a GPU-hour on: the CPU peak measured as a peak per machine fingerprint, dtype and
threads (cached, re-measured when stale), stored with each run; an MFU above 100% re-measured once and
then never shown; bf16 runs against the bf16 peak; the compare table naming the peak in every format;
utilisation as CPU % of the rank's threads, GPU busy % apart, and the spread over ranks.

Real benchmarks (small sizes), real SQLite, real subprocesses; the only thing injected is data: a
too-low peak written into the cache file, as a stale or wrong measurement would leave it.
"""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from runner.analysis import cpu_peak, mfu
from runner.analysis.compare import build_comparison, load_comparison
from runner.spec import flops
from store import Store
from tests.support import ROOT
from tui.render.compare import COLUMNS, markdown, to_csv, to_html, to_json

SMALL = {"sizes": (64, 128), "repeats": 3}
"""Benchmark sizes small enough for a test (the real ones take seconds)."""

TINY_DIMS = {"layers": 6, "heads": 6, "head_dim": 64, "seq_len": 256, "embedding_params": 1572864}
PARAMS, TRAINABLE = 12710784, 122880


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """FTUI_HOME of the test: the peak cache lives in its cache folder. A peak that compare measures
    (a run without one, or one re-measured) is the real benchmark at :data:`SMALL` sizes."""
    monkeypatch.setenv("FTUI_HOME", str(tmp_path))
    monkeypatch.delenv("FTUI_CACHE", raising=False)
    measure = cpu_peak.measure_cpu_peak

    def measure_small(threads: int, dtype: str = "fp32", **_sizes: Any) -> cpu_peak.PeakMeasurement:
        return measure(threads, dtype, **SMALL)
    monkeypatch.setattr(cpu_peak, "measure_cpu_peak", measure_small)
    return tmp_path


def _cache_file(home: Path) -> Path:
    return home / "cache" / cpu_peak.PEAK_CACHE_FILE


def _write_peak(home: Path, flops: float, dtype: str = "fp32", threads: int = 1, age_s: float = 0.0,
                fingerprint: str | None = None) -> mfu.Peak:
    """Put a peak in the cache file, as an earlier measurement would have left it."""
    fp = fingerprint or cpu_peak.machine_fingerprint().key
    peak = mfu.Peak(flops, f"{cpu_peak.CPU_PEAK_SOURCE}, written by the test", kind="measured", dtype=dtype,
                    threads=threads, measured_at=time.time() - age_s, fingerprint=fp, machine="test", size=64)
    return _write_peak_obj(home, peak)


def _write_peak_obj(home: Path, peak: mfu.Peak) -> mfu.Peak:
    assert peak.fingerprint and peak.dtype and peak.threads
    path = _cache_file(home)
    data = json.loads(path.read_text()) if path.exists() else {"version": cpu_peak.PEAK_CACHE_VERSION, "peaks": {}}
    data["peaks"][cpu_peak.cache_key(peak.fingerprint, peak.dtype, peak.threads)] = peak.to_json()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return peak


# ---------------------------------------------------------------------- the fingerprint and the cache


def test_fingerprint_reads_the_cpu_not_the_hostname() -> None:
    cpuinfo = ("processor\t: 0\nmodel name\t: AMD EPYC 9B14\ncpu family\t: 25\nmodel\t\t: 17\nstepping\t: 1\n"
               "flags\t\t: fpu sse avx avx2 fma avx512f avx512_bf16 amx_tile\n\nprocessor\t: 1\nmodel name\t: other\n")
    fp = cpu_peak.machine_fingerprint(cpuinfo)
    assert fp.cpu_model == "AMD EPYC 9B14 (25/17/1)"  # the first processor's fields
    assert fp.isa == ("avx", "avx2", "fma", "avx512f", "avx512_bf16", "amx_tile")
    assert fp.torch == __import__("importlib.metadata").metadata.version("torch")
    without_bf16 = cpu_peak.machine_fingerprint(cpuinfo.replace(" avx512_bf16", ""))
    assert without_bf16.key != fp.key  # another ISA is another peak
    assert cpu_peak.machine_fingerprint(cpuinfo).key == fp.key  # stable
    import socket

    assert socket.gethostname() not in json.dumps(fp.__dict__)
    assert "AMD EPYC 9B14" in fp.describe() and "torch" in fp.describe()


def test_a_measured_peak_is_the_best_of_its_repeats() -> None:
    m = cpu_peak.measure_cpu_peak(1, "fp32", sizes=(64, 128, 256), repeats=4, min_repeat_s=0.01)
    assert set(m.rates) <= {64, 128, 256} and 64 in m.rates
    assert all(len(r) == 4 and all(v > 0 for v in r) for r in m.rates.values())
    assert m.flops == max(max(r) for r in m.rates.values())  # the best repeat of the best size
    lo, mid, hi = m.spread
    assert lo <= mid <= hi == m.flops


def test_cache_is_keyed_by_fingerprint_dtype_and_threads(home: Path) -> None:
    # Another machine's entry (same hostname, as on every VM here) is never used.
    _write_peak(home, 1.0, "fp32", 1, fingerprint="another-machine")
    peak = cpu_peak.cpu_peak(1, "fp32", **SMALL)
    assert peak.flops > 1e6 and peak.kind == "measured"
    assert peak.fingerprint == cpu_peak.machine_fingerprint().key and peak.dtype == "fp32" and peak.threads == 1
    assert peak.measured_at is not None and abs(peak.measured_at - time.time()) < 60
    assert peak.size in SMALL["sizes"] and peak.spread is not None and peak.machine
    # Both entries are in the file now, under their own keys.
    keys = set(json.loads(_cache_file(home).read_text())["peaks"])
    assert keys == {cpu_peak.cache_key("another-machine", "fp32", 1), cpu_peak.cache_key(peak.fingerprint, "fp32", 1)}
    # A fresh entry of this machine is read back, not measured again; other dtypes and threads are separate.
    assert cpu_peak.cpu_peak(1, "fp32", **SMALL) == peak
    _write_peak(home, 7e9, "bf16", 1)
    _write_peak(home, 9e9, "fp32", 2)
    assert cpu_peak.cpu_peak(1, "bf16", **SMALL).flops == 7e9
    assert cpu_peak.cpu_peak(2, "fp32", **SMALL).flops == 9e9
    assert cpu_peak.cpu_peak(1, "fp32", **SMALL) == peak


def test_a_stale_peak_is_measured_again(home: Path) -> None:
    old = _write_peak(home, 1.0, "fp32", 1, age_s=cpu_peak.PEAK_MAX_AGE_S + 60)
    assert cpu_peak.cached_cpu_peak(1, "fp32") is None
    again = cpu_peak.cpu_peak(1, "fp32", **SMALL)
    assert again.flops > 1e6 and again.measured_at is not None and old.measured_at is not None
    assert again.measured_at > old.measured_at + cpu_peak.PEAK_MAX_AGE_S
    # A young one is kept; remeasure forces a measurement all the same.
    young = _write_peak(home, 2.0, "fp32", 1, age_s=60)
    assert cpu_peak.cpu_peak(1, "fp32", **SMALL) == young
    assert cpu_peak.cpu_peak(1, "fp32", remeasure=True, **SMALL).flops > 1e6
    # Measured on a busy host (load above the cores): kept an hour, not a week.
    busy = replace(_write_peak(home, 3.0, "fp32", 1, age_s=120), load=float(os.cpu_count() or 1) + 5)
    _write_peak_obj(home, busy)
    assert cpu_peak.cpu_peak(1, "fp32", **SMALL) == busy and "busy host" in busy.label()
    _write_peak_obj(home, replace(busy, measured_at=time.time() - cpu_peak.PEAK_BUSY_MAX_AGE_S - 60))
    assert cpu_peak.cpu_peak(1, "fp32", **SMALL).flops > 1e6


def test_a_damaged_cache_is_measured_over(home: Path) -> None:
    _cache_file(home).parent.mkdir(parents=True)
    _cache_file(home).write_text("{not json")
    assert cpu_peak.read_cache() == {}
    assert cpu_peak.cpu_peak(1, "fp32", **SMALL).flops > 1e6
    with pytest.raises(ValueError, match="dtype 'int8'"):
        cpu_peak.cpu_peak(1, "int8")


def test_the_run_peak_follows_its_precision(home: Path) -> None:
    _write_peak(home, 3e10, "fp32", 2)
    _write_peak(home, 8e10, "bf16", 2)
    bf16 = cpu_peak.peak_for_run("cpu", "bf16", 2)
    fp32 = cpu_peak.peak_for_run("cpu", "fp32", 2)
    assert bf16 is not None and bf16.flops == 8e10 and bf16.dtype == "bf16"
    assert fp32 is not None and fp32.flops == 3e10 and fp32.dtype == "fp32"
    h100 = cpu_peak.peak_for_run("cuda", "bf16", None, ["NVIDIA H100 80GB HBM3"])
    assert h100 is not None and h100.flops == 989.4e12 and h100.kind == "datasheet" and h100.dtype == "bf16"
    fp16 = cpu_peak.peak_for_run("cuda", "fp16", None, ["NVIDIA A100-SXM4-80GB"])
    assert fp16 is not None and fp16.flops == 312e12 and fp16.dtype == "fp16"
    assert cpu_peak.peak_for_run("cuda", "bf16", None, []) is None
    assert cpu_peak.peak_for_run("cpu", "fp32", None) is None  # threads unknown: no guess
    assert mfu.Peak.from_json(bf16.to_json()) == bf16
    assert mfu.Peak.from_json({"error": "x"}) is None and mfu.Peak.from_json(None) is None


# ---------------------------------------------------------------------- the FLOPs convention


@pytest.mark.parametrize("method", ["full", "lora"])
def test_flops_per_token_matches_torch_flop_counter(method: str) -> None:
    """6N (full) and 4N_frozen + 6N_trainable (LoRA) against torch's own count of the matmuls of one
    forward and backward of the builtin model's layers (a 512-token vocabulary and 32-token sequences:
    the convention holds for any shape, and these keep the count quick). The counter leaves out CPU
    attention (SDPA), so the attention term 12*L*H*Q*T is taken off the formula here; LoRA's count is a
    little lower because autograd skips the input gradients of the first layer's frozen projections."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import LlamaForCausalLM

    from runner.spec.builtin import tiny_llama_config

    cfg = tiny_llama_config(vocab_size=512)
    torch.manual_seed(0)
    model: Any = LlamaForCausalLM(cfg)
    if method == "lora":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    params = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    seq, batch = 32, 2
    x = torch.randint(0, cfg.vocab_size, (batch, seq))
    with FlopCounterMode(display=False) as counter:
        model(input_ids=x, labels=x).loss.backward()
    counted = counter.get_total_flops() / (batch * seq)
    dims = flops.dims_from_config(cfg, seq)
    assert dims is not None and dims["embedding_params"] == cfg.vocab_size * cfg.hidden_size  # untied
    formula = flops.flops_per_token(params - dims["embedding_params"], dims["layers"], dims["heads"], dims["head_dim"],
                                  seq, trainable if method == "lora" else None)
    attention = 12 * dims["layers"] * dims["heads"] * dims["head_dim"] * seq
    assert formula - attention == pytest.approx(counted, rel=0.002 if method == "full" else 0.02)


# ---------------------------------------------------------------------- compare: stored runs


def _stored_run(store: Store, *, precision: str = "fp32", tps: float = 1000.0, threads: int = 1,
                strategy: str = "single", nproc: int = 1, peak: mfu.Peak | None = None,
                telemetry: dict[str, Any] | None = None) -> int:
    recipe = (f'name = "q"\n[model]\nname = "builtin:tiny-llama"\n[data]\ncontext_length = 256\n'
              f'[train]\nbatch_size = 4\ngrad_accum = 1\nprecision = "{precision}"\n'
              f'[launch]\nstrategy = "{strategy}"\nnproc = {nproc}\n')
    rid = store.create_run(name="q", recipe_text=recipe, recipe_hash="", strategy=strategy, nproc=nproc,
                           method="lora", model="builtin:tiny-llama", run_dir="")
    summary: dict[str, Any] = {"params": PARAMS, "trainable_params": TRAINABLE, "world_size": nproc,
                               "threads": threads, "model_dims": TINY_DIMS, "estimate": 1000}
    if peak is not None:
        summary["mfu_peak"] = peak.to_json()
    if telemetry is not None:
        summary["telemetry"] = telemetry
    store.update_run(rid, status="completed", device_type="cpu", tokens_per_s=tps, train_seconds=10.0,
                     final_loss=2.0, summary=summary)
    return rid


def _fpt() -> float:
    return flops.flops_per_token(PARAMS - TINY_DIMS["embedding_params"], 6, 6, 64, 256, TRAINABLE)


def test_mfu_over_100_is_remeasured_once_then_shown(home: Path) -> None:
    """A too-low peak in the cache (1 kFLOP/s) gives an absurd MFU: compare measures the peak again
    and shows the MFU against the new one."""
    store = Store(f"sqlite:///{home / 'ftui.db'}")
    bad = _write_peak(home, 1e3, "fp32", 1)
    rid = _stored_run(store, tps=1.0, peak=bad)  # 1 token/s: far below any real peak
    row = load_comparison(store, [rid]).rows[0]
    assert row.mfu is not None and 0 < row.mfu < 1 and row.mfu_rejected is None
    assert row.peak_flops is not None and row.peak_flops > 1e6 and "re-measured once" in (row.peak_source or "")
    fresh = cpu_peak.read_cache()[cpu_peak.cache_key(cpu_peak.machine_fingerprint().key, "fp32", 1)]
    assert fresh.flops == row.peak_flops and fresh.measured_at and bad.measured_at and fresh.measured_at > bad.measured_at
    # The next compare uses that re-measurement (newer than the run's peak): no second benchmark.
    again = load_comparison(store, [rid]).rows[0]
    assert again.peak_flops == row.peak_flops and again.peak_measured_at == row.peak_measured_at


def test_mfu_still_over_100_after_remeasuring_is_never_printed(home: Path) -> None:
    store = Store(f"sqlite:///{home / 'ftui.db'}")
    bad = _write_peak(home, 1e3, "fp32", 1)
    rid = _stored_run(store, tps=1e12, peak=bad)  # a throughput no CPU reaches: still > 100%
    cmp = load_comparison(store, [rid])
    row = cmp.rows[0]
    assert row.mfu is None and row.mfu_rejected is not None and row.mfu_rejected > 1
    assert row.mfu_note is not None and row.mfu_note.startswith("MFU > 100%") and "peak not trustworthy" in row.mfu_note
    assert "re-measured once" in row.mfu_note
    fresh = cpu_peak.read_cache()[cpu_peak.cache_key(cpu_peak.machine_fingerprint().key, "fp32", 1)]
    assert fresh.measured_at and bad.measured_at and fresh.measured_at > bad.measured_at  # it was re-measured
    rejected = f"{row.mfu_rejected * 100:,.0f}"  # kept in the data (mfu_rejected), never in a table or a line
    for text in (markdown(cmp), to_html(cmp)):
        assert "peak not trustworthy" in text and rejected not in text
    # the cell stays short: its mark, and the footnote says why
    assert "| - [1] |" in markdown(cmp).splitlines()[4]
    assert "- [1] run 1 MFU: > 100%: peak not trustworthy" in markdown(cmp)
    assert "MFU " not in cmp.recommendation()
    # A peak from another machine cannot be re-measured here: suppressed, and it says why.
    other = mfu.Peak(1e3, "elsewhere", kind="measured", dtype="fp32", threads=1, measured_at=time.time(),
                     fingerprint="another-machine", machine="a big box")
    rid2 = _stored_run(store, tps=1000.0, peak=other)
    row2 = load_comparison(store, [rid2]).rows[0]
    assert row2.mfu is None and row2.mfu_note and "another machine (a big box)" in row2.mfu_note


def test_bf16_runs_divide_by_the_bf16_peak(home: Path) -> None:
    store = Store(f"sqlite:///{home / 'ftui.db'}")
    fp32 = _write_peak(home, 1e11, "fp32", 2)
    bf16 = _write_peak(home, 4e11, "bf16", 2)
    # Stored before runs recorded their peak: compare takes the cached one for the run's dtype.
    a = _stored_run(store, precision="fp32", tps=1000.0, threads=2)
    b = _stored_run(store, precision="bf16", tps=1000.0, threads=2)
    rows = load_comparison(store, [a, b]).rows
    assert rows[0].peak_dtype == "fp32" and rows[0].peak_flops == fp32.flops
    assert rows[1].peak_dtype == "bf16" and rows[1].peak_flops == bf16.flops
    assert rows[0].mfu == pytest.approx(_fpt() * 1000 / 1e11)
    assert rows[1].mfu == pytest.approx(rows[0].mfu / 4)
    assert "measured by compare, not stored with the run" in (rows[1].peak_source or "")


def _tel(kind: str, means: list[float], threads: int | None) -> dict[str, Any]:
    from runner.analysis.utilisation import summarise
    from runner.hardware import DeviceSample

    samples = [DeviceSample(time=float(t), host="h", kind=kind, index=i, name="x", util_pct=u, mem_used=1,
                            mem_total=2, power_w=None, temp_c=None, sm_clock_mhz=None, pid=None, source="psutil")
               for t in range(3) for i, u in enumerate(means)]
    return json.loads(json.dumps(summarise(samples, None, threads=threads)))


def _table_runs(home: Path) -> tuple[Store, list[int]]:
    store = Store(f"sqlite:///{home / 'ftui.db'}")
    single_peak = mfu.Peak(5e11, "measured for the test", kind="measured", dtype="bf16", threads=2,
                           measured_at=1_790_000_000.0, fingerprint="fp-a", machine="m")
    ddp_peak = mfu.Peak(2.5e11, "measured for the test", kind="measured", dtype="bf16", threads=1,
                        measured_at=1_790_000_000.0, fingerprint="fp-a", machine="m")
    single = _stored_run(store, precision="bf16", tps=2000.0, threads=2, peak=single_peak,
                         telemetry=_tel("rank", [198.0], 2))
    ddp = _stored_run(store, precision="bf16", tps=2000.0, threads=1, strategy="ddp", nproc=2, peak=ddp_peak,
                      telemetry=_tel("rank", [100.0, 92.0], 1))
    return store, [single, ddp]


def test_compare_names_the_peak_dtype_and_threads_in_every_format(home: Path) -> None:
    store, ids = _table_runs(home)
    cmp = load_comparison(store, ids)
    single, ddp = cmp.rows
    assert single.peak_label == "500.0 GFLOP/s bf16, 2 threads, measured 2026-09-21"
    assert ddp.peak_label == "250.0 GFLOP/s bf16, 1 thread, measured 2026-09-21"
    assert single.mfu == pytest.approx(_fpt() * 2000 / 5e11)
    assert ddp.mfu == pytest.approx(_fpt() * 2000 / (2.5e11 * 2))  # per device x 2 devices
    md = markdown(cmp)
    assert "| MFU peak/device |" in md.splitlines()[2]
    assert "500.0 GFLOP/s bf16 [1]" in md and "250.0 GFLOP/s bf16 [2]" in md
    assert f"[1] {single.peak_label}; measured for the test" in md and f"[2] {ddp.peak_label}" in md
    assert single.peak_label in to_html(cmp) and "MFU peak/device" in to_html(cmp)
    rows = list(csv.DictReader(io.StringIO(to_csv(cmp))))
    assert [(r["peak_dtype"], r["peak_threads"], r["peak_kind"]) for r in rows] == [("bf16", "2", "measured"), ("bf16", "1", "measured")]
    assert float(rows[0]["peak_flops"]) == 5e11 and rows[0]["peak_measured_at"] == "2026-09-21T14:13:20+00:00"
    data = json.loads(to_json(cmp))["runs"]
    assert [(r["peak_dtype"], r["peak_threads"], r["peak_flops"], r["peak_fingerprint"]) for r in data] == [
        ("bf16", 2, 5e11, "fp-a"), ("bf16", 1, 2.5e11, "fp-a")]
    from rich.console import Console

    from tui.render.compare import rich_table

    console = Console(width=400, record=True)
    console.print(rich_table(cmp))
    text = console.export_text()
    assert "MFU peak/device" in text and "2 threads" in text and "1 thread," in text


def test_cpu_util_is_normalised_by_threads_and_spread_shown(home: Path) -> None:
    store, ids = _table_runs(home)
    gpu = _stored_run(store, telemetry=_tel("gpu", [80.0, 40.0], None))
    cmp = load_comparison(store, [*ids, gpu])
    single, ddp, gpu_row = cmp.rows
    # 198% of one core with 2 threads vs 96% with 1: 99% vs 96%.
    assert single.cpu_util == pytest.approx(99.0) and single.cpu_threads == 2 and single.gpu_busy is None
    assert ddp.cpu_util == pytest.approx(96.0) and ddp.cpu_threads == 1
    assert (ddp.util_min, ddp.util_max) == (pytest.approx(92.0), pytest.approx(100.0))
    assert gpu_row.gpu_busy == pytest.approx(60.0) and gpu_row.cpu_util is None
    headers = [h for h, _ in COLUMNS]
    assert len(set(headers)) == len(headers)
    assert "CPU % of its threads" in headers and "GPU busy % (NVML)" in headers
    cells = {h: [cell(r) for r in cmp.rows] for h, cell in COLUMNS}
    assert cells["CPU % of its threads"] == ["99% of 2 threads", "96% of 1 thread", "-"]
    assert cells["GPU busy % (NVML)"] == ["-", "-", "60%"]
    assert cells["util min-max"] == ["-", "92-100%", "40-80%"]
    md = markdown(cmp)
    assert "CPU % of its 2 threads (psutil)" in md and "GPU busy % (NVML" in md


def test_old_runs_without_threads_stay_in_cpu_percent_of_one_core() -> None:
    from tests.support import run_info

    old = run_info(1, "single", 1, 1000.0, telemetry={"whole": {"kind": "rank", "util_mean": 198.0, "devices": 1}})
    row = build_comparison([old], {}).rows[0]
    assert row.cpu_util == 198.0 and row.cpu_threads is None and "one core" in row.util_source
    recorded = run_info(1, "single", 1, 1000.0, threads=2,
                    telemetry={"whole": {"kind": "rank", "util_mean": 198.0, "devices": 1}})
    assert build_comparison([recorded], {}).rows[0].cpu_util == 99.0


def test_compare_of_runs_with_stored_peaks_imports_no_torch(home: Path) -> None:
    """Ten runs with their peak and model dims stored compare without a benchmark or a torch import."""
    store = Store(f"sqlite:///{home / 'ftui.db'}")
    peak = mfu.Peak(5e10, "stored", kind="measured", dtype="fp32", threads=1, measured_at=time.time(),
                    fingerprint="fp-a", machine="m")
    ids = [_stored_run(store, tps=100.0 + i, peak=peak, telemetry=_tel("rank", [90.0], 1)) for i in range(10)]
    code = ("import sys, time, json; t = time.perf_counter(); from store import Store; "
            "from runner.analysis.compare import load_comparison; from tui.render.compare import markdown; "
            f"cmp = load_comparison(Store({store.url!r}), {ids!r}); markdown(cmp); "
            "print(json.dumps({'torch': 'torch' in sys.modules, 'transformers': 'transformers' in sys.modules, "
            "'mfu': [r.mfu for r in cmp.rows], 's': time.perf_counter() - t}))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "FTUI_HOME": str(home), "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["torch"] is False and out["transformers"] is False
    assert all(m is not None and m > 0 for m in out["mfu"])
    assert not _cache_file(home).exists()  # nothing was measured
