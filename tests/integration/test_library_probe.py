"""The library probe for real on a GPU (marked ``gpu``; runner/watch/library.py -> ``python -m
runner.rank.lib_probe``): the CUDA context and libraries are measured outside the allocator. On CPU the probe's
steps are tested in process (tests/unit/test_library_term.py) and its figure against the ranks' by
bench/bench_library.py (docs/BENCHMARKS.md): a probe process costs 8.5 s of CPU, mostly imports."""

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
