"""The planner's error band: built from measured grid rows, keyed by family and strategy (and engine for the
ZeRO stages), and printed by ``ftui estimate`` and ``ftui show`` (unknown where never measured)."""

from __future__ import annotations

import statistics
from pathlib import Path

from runner.planner.error_band import Band, band_for, band_key, bands_from_rows, write_bands
from tui.render.estimate import error_cell
from tui.render.report import band_line


def rows(*errors: tuple[str, float | None]) -> list[dict[str, object]]:
    return [{"config": label, "error_pct": err} for label, err in errors]


def test_bands_group_by_family_and_strategy_with_the_median_and_the_signed_worst() -> None:
    measured = rows(("llama lora fp32 ddp no-ckpt seq128", 0.5), ("llama full bf16 ddp ckpt seq256", -3.0),
                    ("llama lora fp32 ddp ckpt seq128", 1.0), ("gpt2 full fp32 fsdp no-ckpt seq128", -9.0),
                    ("gpt2 full fp32 fsdp ckpt seq128", None))  # not measured: no part of any band
    bands = bands_from_rows(measured, source="grid.jsonl")
    assert set(bands) == {"llama/ddp", "gpt2/fsdp"}
    ddp = bands["llama/ddp"]
    assert (ddp.runs, ddp.median_pct, ddp.worst_pct) == (3, statistics.median([0.5, -3.0, 1.0]), -3.0)
    assert bands["gpt2/fsdp"].runs == 1
    assert ddp.cell() == "≤3.0% (3)"
    assert "-3.0% worst over 3 measured runs (grid.jsonl)" in ddp.sentence()


def test_the_zero_stages_are_banded_per_engine() -> None:
    assert band_key("llama", "zero2", "torch") == "llama/zero2@torch"
    assert band_key("llama", "zero2", "auto") == band_key("llama", "zero2", "deepspeed") == "llama/zero2@deepspeed"
    assert band_key("llama", "ddp", "torch") == "llama/ddp"  # the engine is the ZeRO stages' choice only
    bands = bands_from_rows(rows(("llama lora fp32 zero2@torch no-ckpt seq128", 2.0)), source="g")
    assert set(bands) == {"llama/zero2@torch"}


def test_fsdp1_is_banded_apart_from_fsdp2_and_is_unknown_until_the_grid_measures_it(tmp_path: Path) -> None:
    assert band_key("llama", "fsdp", fsdp_version=1) == "llama/fsdp@fsdp1"
    assert band_key("llama", "fsdp") == band_key("llama", "fsdp", fsdp_version=2) == "llama/fsdp"
    assert band_key("llama", "ddp", fsdp_version=1) == "llama/ddp"  # the version is fsdp's choice only
    path = tmp_path / "bands.json"
    write_bands(bands_from_rows(rows(("llama lora fp32 fsdp no-ckpt seq128", -2.0)), source="g"), path)
    assert band_for("llama", "fsdp", path=path) is not None
    assert band_for("llama", "fsdp", fsdp_version=1, path=path) is None  # FSDP2's rows say nothing of FSDP1
    assert set(bands_from_rows(rows(("llama lora fp32 fsdp@fsdp1 no-ckpt seq128", 1.0)), source="g")) == {
        "llama/fsdp@fsdp1"}


def test_offload_is_banded_apart_and_an_estimate_input_gives_its_own_key() -> None:
    from runner.planner import EstimateInput, shape_from_params
    from runner.planner.error_band import key_of

    assert band_key("llama", "zero3", "deepspeed", offload=True) == "llama/zero3@deepspeed+offload"
    assert set(bands_from_rows(rows(("llama full fp32 zero3@torch+offload no-ckpt seq128", 1.0)), source="g")) == {
        "llama/zero3@torch+offload"}
    inp = EstimateInput(shape_from_params(1e9), strategy="zero3", engine="torch", offload_params=True)
    assert key_of(inp) == f"{inp.shape.family}/zero3@torch+offload"
    assert key_of(inp, "fsdp") == f"{inp.shape.family}/fsdp+offload"


def test_a_written_band_is_found_and_an_unmeasured_one_is_unknown(tmp_path: Path) -> None:
    path = tmp_path / "bands.json"
    write_bands(bands_from_rows(rows(("qwen2 lora fp32 single no-ckpt seq128", -1.5)), source="g"), path)
    found = band_for("qwen2", "single", path=path)
    assert found is not None and found.worst_pct == -1.5
    assert band_for("qwen2", "pp", path=path) is None
    assert band_for("opt", "single", path=path) is None


def test_the_estimate_table_and_show_print_the_band_or_say_it_is_unknown() -> None:
    band = Band("llama/ddp", 16, 0.0, -2.0, "bench/memory_grid.jsonl")
    assert error_cell(None) == "?"
    assert error_cell({"key": "llama/ddp", "runs": 16, "median_pct": 0.0, "worst_pct": -2.0,
                       "source": "bench/memory_grid.jsonl"}) == "≤2.0% (16)"
    known = band_line({"band_key": "llama/ddp", "error_band": band.__dict__})
    assert "llama/ddp: +0.0% median, -2.0% worst over 16 measured runs" in known
    unknown = band_line({"band_key": "opt/pp", "error_band": None})
    assert "opt/pp was never measured" in unknown and "unknown" in unknown


def test_the_shipped_bands_cover_the_grids_families_and_strategies() -> None:
    for family in ("llama", "qwen2", "gpt2"):
        for strategy in ("single", "ddp", "fsdp"):
            band = band_for(family, strategy)
            assert band is not None and band.runs > 0 and band.source == "bench/memory_grid.jsonl", (family, strategy)
