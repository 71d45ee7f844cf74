"""The planner's estimate against the independent measurement: the shared matrix's runs (LoRA under single,
DDP and FSDP, full fine-tuning under single and FSDP), architectures and configurations it was not fitted to
(tiny models built offline, runner/service/memgrid.py), and the batch-size finder's real trial runs; the
architecture features read from configs, the approximate label, and compare reading the stored estimate."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from runner.analysis.run_figures import estimated_memory
from runner.planner import EstimateInput, estimate, inputs_from_recipe, shape_from_config
from runner.service import memgrid
from runner.spec.recipe import load_recipe
from runner.spec.summary import RunSummary
from tests.support import QUICKSTART, ROOT, Ftui
from tests.support.matrix import Matrix
from tui.render.report import estimate_vs_measured

VOCAB = 4098


@pytest.mark.parametrize(
    ("arch", "features"),
    [
        ("llama", {"norm": "rms", "mlp": "gated", "attn_in": ("q_proj", "k_proj", "v_proj"), "kv_heads": 2}),
        ("mistral", {"norm": "rms", "mlp": "gated", "kv_heads": 2}),
        ("qwen2", {"norm": "rms", "mlp": "gated", "biases": True}),
        ("gemma", {"norm": "rms", "act": "gelu_pytorch_tanh", "tied_embeddings": True, "norm_fp32_output": True}),
        ("phi3", {"attn_in": ("qkv_proj",), "mlp_in": ("gate_up_proj",), "mlp": "gated"}),
        ("phi", {"norm": "layer", "mlp": "plain", "parallel_block": True, "act": "gelu_new", "biases": True,
                 "attn_out_copy": True}),
        ("gpt_neox", {"norm": "layer", "mlp": "plain", "parallel_residual": True, "rotary_fraction": 0.25}),
        ("opt", {"norm": "layer", "act": "relu", "resid_dropout": 0.1, "positions_per_token": True}),
        ("falcon", {"kv_heads": 1, "kv_layout": "broadcast", "parallel_block": True, "mask_always": True}),
        ("mixtral", {"mlp": "moe", "experts": 4, "experts_per_token": 2}),
        ("mistral-sw", {"sliding_window": 48, "sliding_layers": 4}),
        ("gpt2", {"norm": "layer", "mlp": "plain", "attn_in": ("c_attn",), "kv_heads": 4, "tied_embeddings": True,
                  "attn_dropout": 0.1, "resid_dropout": 0.1, "act": "gelu_new"}),
    ],
)
def test_architecture_features_are_read_from_the_config(arch: str, features: dict[str, Any]) -> None:
    shape = shape_from_config(memgrid.tiny_config(arch, VOCAB))
    assert shape.family == arch.split("-")[0] and shape.approximate is None
    for key, value in features.items():
        assert getattr(shape, key) == value, (arch, key)
    # Every linear the formula names exists in the model (the GPT-2 c_proj pair is told apart by shape).
    names = {k.split("@")[0] for k in shape.linears}
    for group in (shape.attn_in, shape.attn_out, shape.mlp_in, shape.mlp_out):
        assert all(m.split("@")[0] in names for m in group), (arch, group)


def test_an_unmodelled_architecture_is_labelled_approximate() -> None:
    from transformers import BloomConfig

    shape = shape_from_config(BloomConfig(hidden_size=128, n_layer=2, n_head=4, vocab_size=VOCAB))
    assert shape.family == "bloom"
    assert shape.approximate is not None and "'bloom' is not modelled" in shape.approximate
    b = estimate(EstimateInput(shape, method="lora", micro_batch=1, seq_len=64))
    assert b.approximate == shape.approximate


def test_ftui_estimate_says_approximate(ftui: Ftui, tmp_path: Path) -> None:
    from transformers import BloomConfig

    folder = tmp_path / "tiny-bloom"
    BloomConfig(hidden_size=128, n_layer=2, n_head=4, vocab_size=VOCAB).save_pretrained(str(folder))
    text = ftui.call("estimate", "--model", str(folder), "--gpu-mem", "8GiB", check=True).stdout
    assert "APPROXIMATE: architecture 'bloom' is not modelled" in " ".join(text.split())
    report = json.loads(ftui.call("estimate", "--model", str(folder), "--gpu-mem", "8GiB", "--format", "json",
                                 check=True).stdout)
    assert "not modelled" in report["strategies"]["single"]["per_device_bytes"]["approximate"]
    llama = json.loads(ftui.call("estimate", "--model", "builtin:tiny-llama", "--gpu-mem", "8GiB", "--format",
                                "json", check=True).stdout)
    assert "approximate" not in llama["strategies"]["single"]["per_device_bytes"]


def _run(summary: dict[str, Any], recipe_text: str = "", device_type: str = "cpu") -> Any:
    return SimpleNamespace(id=1, summary=RunSummary.from_json(summary), recipe_text=recipe_text, device_type=device_type)


def test_compare_reads_the_stored_estimate() -> None:
    stored = {"estimate": {"per_device_bytes": {"total": 123_456, "params": 1}, "strategy": "single"}}
    assert estimated_memory(_run(stored), {}, None) == (123_456, "estimated at prepare time (runner.planner)")


def test_compare_recomputes_from_the_recipe_with_its_dtypes() -> None:
    """Without a stored estimate, compare re-estimates from the stored recipe through the same glue as
    ``ftui run``, so ``model.dtype`` counts (it used to be dropped)."""
    from runner.planner import inputs_from_recipe
    from runner.spec.builtin import tiny_llama_config
    from runner.spec.recipe import parse_recipe
    from tests.support import QUICKSTART

    dims = {"config": tiny_llama_config()}
    text32 = QUICKSTART.read_text().replace('type = "lora"', 'type = "full"')
    text16 = text32.replace('name = "builtin:tiny-llama"', 'name = "builtin:tiny-llama"\ndtype = "bf16"')
    est32, source = estimated_memory(_run({}, text32), {}, dims)
    est16, _ = estimated_memory(_run({}, text16), {}, dims)
    assert source == "estimated from the stored recipe (runner.planner)"
    from dataclasses import replace

    want16 = estimate(replace(inputs_from_recipe(parse_recipe(text16), shape=shape_from_config(dims["config"])),
                              device="cpu")).total
    assert est16 == want16 and est32 is not None and est16 < est32  # the old recomputation ignored model.dtype


# ---------------------------------------------------------------------- the grid (real training)

IN_PROCESS = [
    memgrid.GridPoint("llama", "lora", "fp32", seq=128),
    memgrid.GridPoint("gpt2", "full", "fp32", ckpt=True, seq=256),
    memgrid.GridPoint("qwen2", "lora", "bf16", ckpt=True, seq=128),
    memgrid.GridPoint("gemma", "full", "bf16", seq=128),
    memgrid.GridPoint("phi3", "lora", "fp32", seq=128, lora_dropout=0.1),
    memgrid.GridPoint("llama", "full", "bf16", seq=128, dtype="bf16"),
]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("memgrid-models")


@pytest.mark.parametrize("point", IN_PROCESS, ids=[p.label for p in IN_PROCESS])
def test_estimate_within_10_percent_of_the_measured_peak(point: memgrid.GridPoint, models: Path,
                                                          tmp_path: Path, ftui: Ftui,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FTUI_HOME", str(ftui.home))
    recipe = memgrid.recipe_for(point, memgrid.model_folder(point.arch, models))
    breakdown, _ = memgrid.estimate_for(recipe)
    ranks = memgrid.measure_in_process(recipe, tmp_path / "run")
    row = memgrid.compare(point, ranks, breakdown)
    print(json.dumps(row))
    assert row["source"] == "measured: live-tensor peak"
    assert abs(row["error_pct"]) <= 10, row
    for phase, measured in row["measured_phases"].items():
        assert abs(row["estimated_phases"][phase] - measured) / measured <= 0.10, (phase, row)


LAUNCHED = [
    memgrid.GridPoint("llama", "full", "fp32", "ddp", seq=128),
    memgrid.GridPoint("gpt2", "lora", "fp32", "fsdp", seq=128),
]


@pytest.mark.parametrize("point", LAUNCHED, ids=[p.label for p in LAUNCHED])
def test_distributed_estimate_within_10_percent(point: memgrid.GridPoint, models: Path, ftui: Ftui,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from store import Store

    monkeypatch.setenv("FTUI_HOME", str(ftui.home))
    recipe = memgrid.recipe_for(point, memgrid.model_folder(point.arch, models))
    breakdown, _ = memgrid.estimate_for(recipe)
    status, ranks = memgrid.measure_launched(Store(ftui.db), recipe)
    assert status == "completed" and len(ranks) == 2
    row = memgrid.compare(point, ranks, breakdown)
    print(json.dumps(row))
    assert abs(row["error_pct"]) <= 10, row
    for phase, measured in row["measured_phases"].items():
        assert abs(row["estimated_phases"][phase] - measured) / measured <= 0.10, (phase, row)


# ---------------------------------------------------------------------- the matrix's runs against their estimate

STATES_ROWS = ("params", "grads", "optimizer state")


def _check_against_measured(name: str, run: dict[str, Any]) -> list[str]:
    """The stored estimate against the run's independent measurement: the peak (and each phase's peak)
    within 10% of the live-tensor peak, the model states within 2% of their exact bytes (never the
    saved-tensor figure the activation formula was fitted to)."""
    summary = run["summary"]
    est = summary["estimate"]
    assert "per_device_bytes" in est, est
    rows = {kind: (e, m, err) for kind, e, m, err in estimate_vs_measured(RunSummary.from_json(summary))}
    assert all(rows[k][1] for k in ("peak", "forward peak", "backward peak", "optimizer-step peak", *STATES_ROWS)), rows
    assert all(r.get("memory_source") == "live tensors (TorchDispatchMode)" for r in summary["ranks"])
    states_est = sum(rows[k][0] for k in STATES_ROWS)
    states_meas = sum(rows[k][1] or 0 for k in STATES_ROWS)
    assert states_est == pytest.approx(states_meas, rel=0.02), (name, rows)
    for kind in ("peak", "forward peak", "backward peak", "optimizer-step peak"):
        assert abs(rows[kind][2]) <= 10, (name, kind, rows)
    # A row may have no measurement (fp32 master where the optimizer updates the weights themselves).
    return [f"{name} {k}: est {e} meas {'-' if m is None else f'{m:.0f}'} ({'-' if err is None else f'{err:+.2f}%'})"
            for k, (e, m, err) in rows.items()]


@pytest.mark.parametrize("strategy", ["single", "ddp", "fsdp"])
def test_lora_runs_match_their_estimate(ftui: Ftui, matrix: Matrix, strategy: str) -> None:
    run = matrix[strategy].shown
    print("\n".join(_check_against_measured(f"lora/{strategy}", run)))
    assert all("activation_bytes" in r for r in run["summary"]["ranks"])
    # A wide terminal: at rich's default 80 columns the source column wraps its phrases over lines.
    proc = subprocess.run([sys.executable, "-m", "tui.cli", "show", str(run["id"])], cwd=ROOT, text=True,
                          capture_output=True, timeout=120, env={**ftui.env, "COLUMNS": "400"})
    assert proc.returncode == 0, proc.stderr
    shown = " ".join(proc.stdout.split())
    assert "memory per device: estimated vs measured" in shown and "optimizer-step peak" in shown
    # Every memory figure names its source; RSS is its own row, never "measured memory".
    assert "measured: live-tensor peak" in shown and "peak RSS" in shown and "not training memory" in shown
    # the peak is printed once, under one name ("rank 0 peak memory" is each rank's row, for several ranks)
    assert ("rank 0 peak memory" in shown) == (strategy != "single")


@pytest.mark.parametrize("key", ["full", "full-fsdp"])
def test_full_finetune_runs_match_their_estimate(matrix: Matrix, key: str) -> None:
    run = matrix[key].shown
    print("\n".join(_check_against_measured(key, run)))
    if key == "full-fsdp":  # sharded over 2 ranks: half the single run's optimizer state
        single = matrix["full"].summary["estimate"]["per_device_bytes"]
        assert run["summary"]["estimate"]["per_device_bytes"]["optimizer"] == pytest.approx(
            single["optimizer"] / 2, rel=1e-6)


# ---------------------------------------------------------------------- batch-size finder


def test_batch_finder_stops_at_the_cap(ftui: Ftui) -> None:
    short = ["data.context_length=64"]  # a quarter of quickstart's: a quarter of the steps' work
    inp = inputs_from_recipe(load_recipe(QUICKSTART, short))
    one, two = estimate(replace(inp, micro_batch=1)), estimate(replace(inp, micro_batch=2))
    cap = (one.total + two.total) // 2  # batch 1 fits, batch 2 does not
    proc = ftui.run("run", str(QUICKSTART), "--set", short[0], "--find-batch-size", "--mem-cap", str(cap), "--format", "json",
                    timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert result["chosen"] == 1
    assert [t["batch_size"] for t in result["trials"]] == [1, 2]
    assert [t["fits"] for t in result["trials"]] == [True, False]
    # The finder compared the MEASURED peak (the live-tensor peak of the busiest rank), not the estimate.
    for trial in result["trials"]:
        ranks = ftui.show(trial["run_id"])["summary"]["ranks"]
        assert trial["measured_bytes"] == max(r["peak_tensor_bytes"] for r in ranks)
    sweep = [r for r in ftui.runs() if r["sweep_id"] == result["sweep_id"]]
    assert sorted(r["id"] for r in sweep) == sorted(t["run_id"] for t in result["trials"])
    assert result["sweep_id"].startswith("find-batch-")
    last = ftui.show(result["trials"][-1]["run_id"])
    assert last["summary"]["find_batch"]["chosen"] == 1
    assert all(r["status"] == "completed" for r in sweep)


# ---------------------------------------------------------------------- the engines' runs of the matrix, within 5%

ENGINE_RUNS = ["zero2-torch", "pp", "pp-gpipe", "zero1", "zero2", "zero3"]
"""torch ZeRO-2 (FSDP2 without reshard after forward), the sweep's 1F1B pipeline and the GPipe one, and the
sweep's DeepSpeed ZeRO-1, 2 and 3 (buckets, prefetch and gathered parameters from the config ftui writes): the
estimate of the busiest device (the largest stage's, for a pipeline) against the busiest rank's measured
live-tensor peak (runner/planner/fsdp.py, runner/planner/pipeline.py, runner/planner/deepspeed.py)."""


@pytest.mark.parametrize("key", ENGINE_RUNS)
def test_engine_runs_are_within_5_percent_of_the_measured_peak(matrix: Matrix, key: str) -> None:
    summary = matrix[key].summary
    est = summary["estimate"]["per_device_bytes"]
    measured = max(r["peak_tensor_bytes"] for r in summary["ranks"])
    error = (est["total"] - measured) / measured
    print(f"{key}: est {est['total']} meas {measured} ({error:+.2%})")
    assert "approximate" not in est, est
    assert abs(error) <= 0.05, (key, est["total"], measured, est["phases"],
                                [r["phase_peaks"] for r in summary["ranks"]])


def test_the_shipped_error_bands_are_the_grids_errors_under_the_current_formulas(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """``ftui estimate``'s error bands (runner/planner/measured_error.json) are what the grid's stored
    measurements give against today's estimate: a formula changed without ``bench/bench_memory_grid.py
    --write-band`` fails here (no training: the estimate is a pure function of the recipe)."""
    from runner.planner import error_band

    grid = [json.loads(line) for line in (ROOT / "bench" / "memory_grid.jsonl").read_text().splitlines()]
    now = error_band.bands_from_rows(memgrid.reestimate(grid, tmp_path_factory.mktemp("band-models")),
                                     source="bench/memory_grid.jsonl")
    shipped = {k: error_band.Band(**v) for k, v in json.loads(error_band.BAND_FILE.read_text()).items()}
    assert set(shipped) == set(now)
    for key, band in now.items():
        assert shipped[key].runs == band.runs, key
        assert shipped[key].median_pct == pytest.approx(band.median_pct, abs=0.05), key
        assert shipped[key].worst_pct == pytest.approx(band.worst_pct, abs=0.05), key
