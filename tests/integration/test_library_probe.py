"""The library probe for real (runner/watch/library.py -> ``python -m runner.rank.lib_probe``): one process
trains the quickstart's model two steps at a small shape, its figure is cached, and the next estimate reads the
cache without a probe. On a GPU (marked ``gpu``): the CUDA context and libraries are measured outside the
allocator."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.spec import library as lib
from runner.spec.recipe import load_recipe
from runner.watch import library
from runner.watch.host import cuda_device_count
from tests.support import ROOT

QUICK = ROOT / "recipes" / "quickstart.toml"
SMALL = ["data.context_length=16", "train.batch_size=1"]
"""The smallest step that still runs every GEMM of the model (the probe's cost is its imports)."""


def test_the_probe_measures_once_and_the_cache_answers_after(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    recipe = load_recipe(QUICK, SMALL)
    key, _ = library.key_for(recipe)
    # The library's cache folder of this test alone (the session's warm cache keeps the tokenizer).
    monkeypatch.setattr(lib, "CACHE_FOLDER", str(tmp_path / "library"))
    term = library.calibrate(recipe, QUICK, SMALL)
    assert "bytes" in term, term["label"]
    measured = term["measured"]
    detail = measured["detail"]
    assert measured["device"] == "cpu" and measured["threads"] >= 1
    assert detail["heap_growth_bytes"] - detail["tensor_growth_bytes"] == detail["beyond_tensors_bytes"] == term["bytes"]
    assert term["bytes"] > 0, "oneDNN/MKL keep buffers for the step's GEMMs beyond its tensors"
    assert term["label"].endswith("measured now)") and term["key"] == key
    cached = library.cached_term(recipe)
    assert cached["bytes"] == term["bytes"] and cached["label"].endswith("cached)")


@pytest.mark.gpu
@pytest.mark.skipif(cuda_device_count() == 0, reason="needs a CUDA GPU")
def test_on_a_gpu_the_probe_measures_the_context_and_libraries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    overrides = [*SMALL, 'launch.device="cuda"', 'train.precision="bf16"']
    monkeypatch.setattr(lib, "CACHE_FOLDER", str(tmp_path / "library"))
    term = library.calibrate(load_recipe(QUICK, overrides), QUICK, overrides)
    assert "bytes" in term, term["label"]
    detail = term["measured"]["detail"]
    assert term["measured"]["device"] == "cuda"
    # The CUDA context alone is hundreds of MiB (outside the allocator); the reserve is never negative.
    assert detail["outside_allocator_bytes"] > 100 * 2**20 and detail["allocator_reserve_bytes"] >= 0
    assert detail["beyond_tensors_bytes"] == detail["outside_allocator_bytes"] + detail["allocator_reserve_bytes"]
