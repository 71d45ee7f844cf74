"""The maths library's line of the estimate: its cache key and file (runner/spec/library.py), the probe's output
read back and when a probe cannot stand for a run (runner/watch/library.py), the GPU figure of a rank
(runner/rank/memtrack.py), and how the estimate and ``ftui show`` print it (tui/render)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from runner.rank import lib_probe, memtrack
from runner.spec import library as lib
from runner.spec.recipe import load_recipe
from runner.spec.summary import RunSummary, library_measured
from runner.watch import library
from tests.support import ROOT, run_in_process
from tui.render.estimate import library_line
from tui.render.report import library_text

QUICK = ROOT / "recipes" / "quickstart.toml"
MIB = 2**20


def _probe(beyond: int = 20 * MIB) -> lib.ProbeResult:
    return lib.ProbeResult(beyond_tensors_bytes=beyond, threads=2, device="cpu", torch="2.13.0+cpu",
                           detail={"heap_growth_bytes": beyond + 100, "tensor_growth_bytes": 100,
                                   "beyond_tensors_bytes": beyond, "span": "the measured steps"})


def test_the_shape_set_follows_what_sets_a_gemm_and_nothing_else() -> None:
    base = lib.shape_set(load_recipe(QUICK))
    assert lib.shape_set(load_recipe(QUICK, ["train.max_steps=3", "train.lr=0.1", 'launch.strategy="ddp"', "launch.nproc=2"])) == base
    for override in ("train.batch_size=2", "data.context_length=64", 'train.precision="bf16"', "method.lora.r=4"):
        assert lib.shape_set(load_recipe(QUICK, [override])) != base, override


def test_the_key_names_host_torch_device_threads_and_shapes() -> None:
    shapes = lib.shape_set(load_recipe(QUICK))
    key = lib.cache_key("h", "2.13", "cpu", 2, shapes)
    assert key == lib.cache_key("h", "2.13", "cpu", 2, dict(shapes))
    others = {lib.cache_key("h2", "2.13", "cpu", 2, shapes), lib.cache_key("h", "2.14", "cpu", 2, shapes),
              lib.cache_key("h", "2.13", "cuda:H100", 2, shapes), lib.cache_key("h", "2.13", "cpu", 1, shapes),
              lib.cache_key("h", "2.13", "cpu", 2, {**shapes, "seq": 1})}
    assert key not in others and len(others) == 5


def test_the_cache_keeps_a_record_and_refuses_what_is_not_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FTUI_CACHE", str(tmp_path))
    assert lib.read_cached("k") is None
    lib.write_cached("k", _probe())
    assert lib.read_cached("k") == _probe()
    assert [p.name for p in (tmp_path / lib.CACHE_FOLDER).iterdir()] == ["k.json"]
    (tmp_path / lib.CACHE_FOLDER / "k.json").write_text('{"beyond_tensors_bytes": "many"}')
    assert lib.read_cached("k") is None
    (tmp_path / lib.CACHE_FOLDER / "k.json").write_text("{half")
    assert lib.read_cached("k") is None


def test_a_run_reads_the_cached_line_or_says_how_to_measure_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FTUI_CACHE", str(tmp_path))
    recipe = load_recipe(QUICK, ["data.context_length=64"])
    term = library.cached_term(recipe)
    assert "bytes" not in term and "--library" in term["label"]
    lib.write_cached(term["key"], _probe(21 * MIB))
    term = library.cached_term(recipe)
    assert term["bytes"] == 21 * MIB and term["label"].startswith("maths library (measured on this host: cpu, 2 threads")
    assert library.calibrate(recipe, QUICK, ["data.context_length=64"]) == term  # cached: no probe runs


def test_the_probe_runs_the_recipe_s_measured_steps_under_the_trainer_s_meter() -> None:
    # In this process (a probe process costs 8.5 s of CPU, mostly imports): the quickstart's model, one row a
    # micro-batch, two optimizer steps; the figure is the meter's heap check, read back as the probe prints it.
    # Context 64 is the shared matrix's (tests/support/matrix.py): the session's warm cache holds its blocks.
    recipe = load_recipe(QUICK, ["data.context_length=64", "train.batch_size=1"])
    figures, inputs = lib_probe.measure(recipe, "cpu")
    assert inputs == "the run's first rows (rank 0)"
    assert set(figures["phase_peaks"]) == {"forward", "backward", "optimizer"}
    out = lib_probe.result(figures, "cpu", inputs)
    check = figures["heap_check"]
    assert out["detail"] == {**check, "inputs": inputs} and out["beyond_tensors_bytes"] == check["beyond_tensors_bytes"]
    assert check["heap_growth_bytes"] - check["tensor_growth_bytes"] == check["beyond_tensors_bytes"]
    assert check["span"] == "the measured steps" and out["device"] == "cpu"
    assert library.parse_probe(0, json.dumps(out) + "\n", "") == out
    with pytest.raises(RuntimeError, match="no library figure on cuda"):
        lib_probe.result(figures, "cuda", inputs)


def test_the_probe_output_is_read_or_its_failure_named_in_one_line() -> None:
    line = json.dumps(_probe())
    assert library.parse_probe(0, f"a warning\n{line}\n", "") == _probe()
    assert library.parse_probe(1, "", "Traceback...\nRuntimeError: boom\n") == "exit 1: RuntimeError: boom"
    assert library.parse_probe(0, "", "") == "exit 0: no output"
    assert library.parse_probe(0, "{nope\n", "") == "its output is not JSON"
    assert library.parse_probe(0, '{"threads": 2}\n', "") == "its output has no beyond_tensors_bytes"


def test_the_probe_argv_is_this_interpreter_the_recipe_and_its_overrides() -> None:
    assert library.probe_argv(QUICK, ["train.batch_size=2"], 0, "cuda") == [
        sys.executable, "-m", "runner.rank.lib_probe", str(QUICK), "--threads", "1", "--device", "cuda",
        "--set", "train.batch_size=2"]


def test_what_the_probe_cannot_stand_for_is_not_measured() -> None:
    assert library.not_probed(load_recipe(QUICK)) is None
    assert "QLoRA" in str(library.not_probed(load_recipe(QUICK, ['method.type="qlora"'])))
    assert "splits" in str(library.not_probed(load_recipe(QUICK, ['launch.strategy="tp"', "launch.nproc=2"])))
    # CodeLlama-34B's step is tens of GiB: over half of this host's available memory (shape from the repo's
    # recipe, offline).
    big = library.not_probed(load_recipe(ROOT / "recipes" / "codellama-34b-lora-fsdp.toml"))
    assert big is not None and "available memory" in big


def test_a_gpu_rank_s_library_is_outside_the_allocator_plus_its_reserve() -> None:
    fig = memtrack.gpu_library(process=900 * MIB, reserved_now=600 * MIB, reserved_peak=700 * MIB,
                               allocated_peak=650 * MIB)
    assert fig["outside_allocator_bytes"] == 300 * MIB and fig["allocator_reserve_bytes"] == 50 * MIB
    assert fig["beyond_tensors_bytes"] == 350 * MIB
    merged = memtrack.merge([{"peak_tensor_bytes": 1, "gpu_library": fig}, {"peak_tensor_bytes": 2}])
    assert merged["gpu_library"] == fig
    assert library_measured({"gpu_library": fig}) == 350 * MIB
    assert library_measured({"heap_check": _probe()["detail"]}) == 20 * MIB  # type: ignore[typeddict-item]
    assert library_measured({}) is None


def test_show_sets_the_line_beside_the_ranks_measure_with_the_difference() -> None:
    ranks = [{"rank": r, "heap_check": {**_probe(b)["detail"]}} for r, b in ((0, 20 * MIB), (1, 19 * MIB))]
    term = {"bytes": 21 * MIB, "label": "maths library (measured on this host: cpu, 1 threads, torch 2.13; cached)"}
    text = library_text(RunSummary.from_json({"world_size": 2, "ranks": ranks, "estimate": {"library": term}}))
    assert text is not None
    assert "21.0 MiB per process (beside the tensor rows, not in them)" in text
    assert "measured in the run: 20.0 MiB beyond tensors (2 ranks, the largest" in text
    assert text.endswith("difference +1.0 MiB")
    unmeasured = library_text(RunSummary.from_json({"world_size": 1, "ranks": ranks[:1], "estimate": {
        "library": {"label": "maths library: not measured on this host for this shape set"}}}))
    assert unmeasured is not None and "difference" not in unmeasured and "20.0 MiB" in unmeasured
    assert library_text(RunSummary.from_json({"world_size": 1, "ranks": [{"rank": 0}]})) is None


def test_the_estimate_line_is_beside_the_total_or_says_why_not() -> None:
    assert library_line({"bytes": 3 * MIB, "label": "maths library (x)"}) == (
        "maths library (x): 3.0 MiB per process, beside the tensor total (not in it)")
    assert library_line({"label": "maths library: not measured (y)"}) == "maths library: not measured (y)"


@pytest.mark.parametrize(("argv", "names"), [
    (["estimate", "--params", "1e9", "--library"], "needs a recipe file"),
    (["estimate", str(QUICK), "--library", "--precision", "bf16"], "--precision change what the recipe trains"),
    (["estimate", "--params", "1e9", "--set", "train.lr=1"], "--set overrides a recipe's fields"),
])
def test_library_refuses_what_it_cannot_measure_in_one_line(capsys: pytest.CaptureFixture[str], argv: list[str],
                                                            names: str) -> None:
    result = run_in_process(capsys, *argv)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1 and names in result.stderr, result
