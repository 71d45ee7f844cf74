"""Building a comparison without training: the MFU formula and GPU peaks, the recipe diff, speed-ups
against the baseline, devices of a model-parallel run, the CPU peak's host, the memory columns, and a
resumed run's curve joined to its parent's."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest

from runner.analysis import cpu_peak, mfu
from runner.analysis.compare import build_comparison, speedups
from runner.analysis.noise import NoiseFloor
from runner.analysis.recipe_diff import flatten, recipe_diff
from runner.analysis.run_peak import default_peak, device_count, peak_note
from runner.spec import flops
from store import MetricPoint, SampleInfo
from tests.support import run_info
from tui.render.compare import markdown, sources


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

def test_speedups_against_the_baseline() -> None:
    assert speedups([100.0, 390.0, None], 0) == [1.0, 3.9, None]
    assert speedups([None, 390.0], 0) == [None, None]
    runs = [run_info(1, "mp", 1, 100.0), run_info(2, "ddp", 4, 390.0), run_info(3, "fsdp", 4, 50.0), run_info(4, "fsdp", 2, None, "failed")]
    metrics = {1: [MetricPoint(1, 0.0, 3.0, None, None, None, None, None), MetricPoint(2, 1.0, 2.5, None, None, None, None, None)]}
    floor = NoiseFloor(0.1, "repeats of mp (runs 7, 8) on h")  # the run-to-run spread measured on the host
    cmp = build_comparison(runs, metrics, floor=floor)
    assert cmp.baseline_id == 1 and cmp.fastest_id == 2
    assert [r.speedup for r in cmp.rows] == [1.0, 3.9, 0.5, None]
    assert cmp.rows[0].best_loss == 2.5 and cmp.rows[3].reason == "boom"
    beyond = ": beyond the run-to-run spread of 10% (repeats of mp (runs 7, 8) on h)"
    assert cmp.speedup_sentences() == [
        "ddp x4 (run 2) 3.90x faster than mp (run 1)" + beyond,
        "fsdp x4 (run 3) 2.00x slower than mp (run 1)" + beyond,
    ]
    assert cmp.recommendation().startswith("Use ddp x4 (run 2): the fastest that completed, 390 tokens/s")
    assert "1 did not complete" in cmp.recommendation()
    assert build_comparison(runs, metrics, baseline_id=2).rows[0].speedup == pytest.approx(100 / 390)

def test_model_parallel_on_gpus_counts_the_gpus_of_its_device_map() -> None:
    device_map = {"model.embed_tokens": 0, "model.layers.0": "0", "model.layers.21": "cuda:1", "lm_head": "1",
                  "model.norm": "cpu", "model.rotary": "disk"}
    mp = run_info(1, "mp", 1, 1000.0, params=1000, device_map=device_map)
    assert device_count(mp) == 2  # one process, two GPUs
    assert device_count(run_info(2, "mp", 1, 1000.0, device_map={"": "cpu"})) == 1  # mp on CPU: one device
    assert device_count(run_info(3, "ddp", 4, 1000.0)) == 4  # no device map: the world size
    row = build_comparison([mp], {}).rows[0]
    assert row.devices == 2 and row.tokens_per_s_per_device == 500.0
    # MFU divides by the devices too: twice the devices, half the MFU.
    dims = {"layers": 2, "heads": 4, "head_dim": 8, "seq_len": 16, "embedding_params": 0}
    peak = mfu.Peak(1e9, "x")
    one = run_info(4, "mp", 1, 1000.0, params=1000, device_map={"a": "0"})
    rows = build_comparison([mp, one], {}, peaks={1: peak, 4: peak}, dims={1: dims, 4: dims}).rows
    assert rows[0].mfu is not None and rows[1].mfu is not None
    assert rows[1].mfu == pytest.approx(2 * rows[0].mfu)

def test_an_unknown_baseline_is_refused() -> None:
    with pytest.raises(ValueError, match="baseline run 99"):
        build_comparison([run_info(1, "single", 1, 100.0)], {}, baseline_id=99)

def _gpu_sample(name: str) -> SampleInfo:
    return SampleInfo(time=0.0, host="h", kind="gpu", index=0, name=name, util_pct=90.0, mem_used=1, mem_total=2,
                      power_w=None, temp_c=None, sm_clock_mhz=None, pid=None, source="nvml")

def test_mfu_dash_says_why_for_an_unknown_gpu() -> None:
    run = run_info(1, "single", 1, 1000.0, params=1000)
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

def test_a_cpu_run_gets_its_stored_peak_or_none_never_one_measured_now() -> None:
    """Compare reads the peak a CPU run stored (probed beside it); without one it benchmarks nothing: a peak
    measured now did not share the run's load."""
    run = run_info(1, "single", 1, 1000.0, threads=1)
    assert default_peak(run, {}) is None and "no CPU peak measured beside the run" in peak_note(run, {})
    probed = mfu.Peak(2e10, f"{cpu_peak.PROBE_SOURCE}, fp32", kind="probe", dtype="fp32", threads=1,
                      measured_at=time.time(), fingerprint="f")
    stored = replace(run, summary=replace(run.summary, mfu_peak=probed.to_json()))
    assert default_peak(stored, {}) == probed
    failed = replace(run, summary=replace(run.summary, mfu_peak={"error": "ValueError: the peak probe measured nothing"}))
    assert default_peak(failed, {}) is None and "the peak probe beside the run measured nothing" in peak_note(failed, {})

def test_the_recipe_can_name_the_mfu_peak_and_the_command_line_wins() -> None:
    run = run_info(1, "single", 1, 1000.0)
    recipe = {"launch": {"peak_tflops": 0.25}}
    from_recipe = default_peak(run, recipe)
    assert from_recipe is not None and from_recipe.flops == 0.25e12
    assert from_recipe.source == "given (recipe launch.peak_tflops 0.25)"
    flag = default_peak(run, recipe, peak_tflops=2.0)
    assert flag is not None and flag.flops == 2.0e12 and "--peak-tflops" in flag.source

def test_memory_columns_are_the_measured_peak_and_the_stored_estimate() -> None:
    """Measured = the independent peak (live tensors on CPU), never RSS; estimated = the estimate stored at
    prepare time, read from its key (not re-estimated without model.dtype)."""
    ranks = [{"rank": 0, "peak_tensor_bytes": 200 * 2**20, "peak_rss_bytes": 900 * 2**20},
             {"rank": 1, "peak_tensor_bytes": 210 * 2**20, "peak_rss_bytes": 950 * 2**20}]
    run = run_info(1, "ddp", 2, 100.0, ranks=ranks,
               estimate={"per_device_bytes": {"total": 205 * 2**20, "params": 1}, "strategy": "ddp"})
    row = build_comparison([run], {}).rows[0]
    assert (row.mem_measured, row.mem_estimated) == (210 * 2**20, 205 * 2**20)
    assert row.mem_measured_source == "measured: live-tensor peak, busiest rank"
    assert row.mem_estimated_source == "estimated at prepare time (runner.planner)"
    rss_only = build_comparison([run_info(2, "single", 1, 100.0, ranks=[{"rank": 0, "peak_rss_bytes": 9}])], {}).rows[0]
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
