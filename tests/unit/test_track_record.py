"""The planner's track record on this host (runner/analysis/track_record.py): its peak-memory estimate error
over the store's completed runs of this host, per family and strategy, in ``ftui estimate`` and ``ftui plan``
beside (never merged with) the held-out grid's band."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from runner.analysis.track_record import host_track_record, peak_error_pct, track_record
from store import RunInfo, Store
from tests.support import run_in_process, run_info

MIB = 2**20
ROOT = Path(__file__).resolve().parents[2]


def measured(id_: int, key: str, est_mib: float, peaks_mib: list[float], status: str = "completed",
             **estimate: Any) -> RunInfo:
    """A run of host ``h`` that estimated ``est_mib`` per device and whose ranks measured ``peaks_mib``."""
    return run_info(id_, key.split("/")[1].split("@")[0], len(peaks_mib), 1000.0, status=status,
                    estimate={"band_key": key, "per_device_bytes": {"total": int(est_mib * MIB)}, **estimate},
                    ranks=[{"rank": i, "peak_tensor_bytes": int(p * MIB)} for i, p in enumerate(peaks_mib)])


def test_the_error_is_the_estimate_against_the_busiest_ranks_peak() -> None:
    run = measured(1, "llama/ddp", 110, [90, 100])
    assert peak_error_pct(run.summary) == pytest.approx(10.0)
    assert peak_error_pct(measured(2, "llama/ddp", 110, [100], approximate="not modelled").summary) is None
    assert peak_error_pct(run_info(3, "ddp", 2, 1.0, ranks=[{"peak_tensor_bytes": 5}]).summary) is None


def test_count_median_and_worst_per_family_and_strategy_of_this_hosts_completed_runs() -> None:
    runs = [measured(1, "llama/ddp", 110, [100]), measured(2, "llama/ddp", 95, [100]),
            measured(3, "llama/ddp", 102, [100]), measured(4, "llama/zero2@torch", 80, [100, 100]),
            measured(5, "llama/ddp", 300, [100], status="failed"),
            measured(6, "llama/zero2@deepspeed", 100, [])]
    other_host = measured(7, "llama/ddp", 500, [100])
    records = track_record([*runs, RunInfo(**{**other_host.__dict__, "host": "elsewhere"})], "h")
    assert set(records) == {"llama/ddp", "llama/zero2@torch"}  # the failed, unmeasured and other host's: out
    ddp = records["llama/ddp"]
    assert (ddp.runs, ddp.run_ids) == (3, (1, 2, 3))
    assert ddp.median_pct == pytest.approx(2.0) and ddp.worst_pct == pytest.approx(10.0)
    assert ddp.cell() == "≤10.0% (3)" and records["llama/zero2@torch"].worst_pct == pytest.approx(-20.0)
    assert track_record(runs, "elsewhere") == {}


def _store_with_runs(tmp_path: Path) -> Store:
    """A real SQLite store with two completed quickstart runs of this host whose estimate was 25% and 5% over."""
    store = Store(f"sqlite:///{tmp_path / 'ftui.db'}")
    for est, peak in ((125, 100), (105, 100)):
        run_id = store.create_run(name="q", recipe_text="", recipe_hash="", strategy="single", nproc=1,
                                  method="lora", model="builtin:tiny-llama", run_dir="")
        store.update_run(run_id, status="completed", summary={
            "estimate": {"band_key": "llama/single", "per_device_bytes": {"total": est * MIB}},
            "ranks": [{"rank": 0, "peak_tensor_bytes": peak * MIB}]})
    return store


def test_estimate_prints_this_hosts_record_apart_from_the_grids_band(tmp_path: Path, capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    store = _store_with_runs(tmp_path)
    assert host_track_record(store)["llama/single"].runs == 2
    assert host_track_record(store, host="elsewhere") == {}
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("COLUMNS", "200")
    found = run_in_process(capsys, "estimate", "recipes/quickstart.toml", "--db", store.url, "--format", "json")
    assert found.returncode == 0, found.stderr
    rows = json.loads(found.stdout)["strategies"]
    assert rows["single"]["track_record"]["runs"] == 2 and rows["single"]["track_record"]["worst_pct"] == 25.0
    assert rows["single"]["track_record"]["median_pct"] == 15.0 and rows["ddp"]["track_record"] is None
    text = run_in_process(capsys, "estimate", "recipes/quickstart.toml", "--db", store.url).stdout
    line = next(line for line in text.splitlines() if line.startswith("single"))
    assert line.rstrip().endswith("≤25.0% (2)")  # the last column: this host's, beside the grid's "error here"
    assert "host error: the largest" in " ".join(text.split())
