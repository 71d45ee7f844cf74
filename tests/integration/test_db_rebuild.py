"""``ftui db rebuild``: a deleted database is recorded again from the run folders, field for field as
``ftui show --format json`` gave it, with every journal row; rebuilding twice adds nothing, and a store
that lost one run gets that one back. The runs are real ``ftui run --script`` launches of the scripted
rank (:mod:`tests.support.scripted_rank`): real watcher, launcher, journals and telemetry, no model."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from runner.analysis import ledger
from runner.hardware.rapl import read_counters
from runner.spec.summary import RunSummary
from runner.watch import journal
from store import Store
from tests.support import Ftui, new_home
from tests.support.scripted_rank import SCRIPT

pytestmark = pytest.mark.xdist_group(name="db-rebuild")
"""The module's home (two real runs) is made once: its tests go to one worker."""


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Ftui:
    """A home with two finished runs: one completed on one scripted GPU (its power samples: the ledger's
    energy), one whose rank failed (a bad script argument) on CPU alone."""
    ftui = new_home(tmp_path_factory.mktemp("rebuild"))
    ftui.run("--fake-gpus", "1", "run", "--script", str(SCRIPT), "--name", "good", "--", "--steps", "3", "--step-s", "0", check=True)
    bad = ftui.run("run", "--script", str(SCRIPT), "--name", "bad", "--", "--no-such-flag")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    return ftui


@pytest.fixture
def ftui(home: Ftui) -> Any:
    """``ftui ARGS`` against the home, in this process (the read and rebuild commands: no start-up cost)."""
    return home.call


def _everything(ftui: Any) -> list[dict[str, Any]]:
    runs = json.loads(ftui("runs", "--format", "json").stdout)
    return [json.loads(ftui("show", str(run["id"]), "--format", "json").stdout) for run in sorted(runs, key=lambda r: r["id"])]


def _rows(db: str, run_id: int) -> tuple[list[tuple[Any, ...]], int, int]:
    store = Store(db, create=False)
    try:
        events = sorted((e.source, e.seq, e.type, e.time, json.dumps(e.payload, sort_keys=True))
                        for e in store.events(run_id))
        return events, len(store.samples(run_id)), len(store.process_samples(run_id))
    finally:
        store.close()


def test_a_deleted_database_is_rebuilt_from_the_run_folders_field_for_field(home: Ftui, ftui: Any) -> None:
    before = _everything(ftui)
    assert [r["status"] for r in before] == ["completed", "failed"]
    # The time to first step, from the launch the watcher journaled (a script run journals no phases:
    # its stages before the start are unknown, its first step known): rebuilt below to the same figures.
    ttfs = before[0]["summary"]["time_to_first_step"]
    assert ttfs["total"] > 0 and ttfs["seconds"]["spawn"] is None, ttfs
    assert ttfs["seconds"]["first_step"] is not None and ttfs["total"] >= ttfs["seconds"]["first_step"], ttfs
    rows_before = [_rows(home.db, r["id"]) for r in before]
    db_file = Path(home.db.removeprefix("sqlite:///"))
    for path in db_file.parent.glob(db_file.name + "*"):  # the database and its WAL files
        path.rename(path.with_name("lost-" + path.name))
    rebuilt = ftui("db", "rebuild", "--format", "json")
    assert [r["action"] for r in json.loads(rebuilt.stdout)] == ["added", "added"]
    after = _everything(ftui)
    assert after == before
    assert [_rows(home.db, r["id"]) for r in after] == rows_before
    good_dir = Path(after[0]["run_dir"])
    assert len(_rows(home.db, 1)[0]) == len(journal.read_jsonl(good_dir / "events.jsonl")) + len(
        journal.read_jsonl(good_dir / journal.ORCHESTRATOR_FILE))

    again = ftui("db", "rebuild", "--format", "json")
    assert [r["action"] for r in json.loads(again.stdout)] == ["present", "present"]
    assert _everything(ftui) == before


def test_a_store_that_lost_one_run_gets_it_back_and_keeps_the_others(home: Ftui, ftui: Any) -> None:
    before = _everything(ftui)
    store = Store(home.db, create=False)
    try:
        assert store.delete_run(before[1]["id"])
    finally:
        store.close()
    out = ftui("db", "rebuild").stdout
    assert "bad: added as run" in out and "good: present" in out, out
    after = _everything(ftui)
    assert after[0] == before[0]
    assert {k: v for k, v in after[1].items() if k != "id"} == {k: v for k, v in before[1].items() if k != "id"}


def test_rebuild_of_a_missing_runs_folder_is_one_line_and_exit_2(ftui: Any, tmp_path: Path) -> None:
    proc = ftui("db", "rebuild", "--runs-dir", str(tmp_path / "nowhere"))
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "--runs-dir" in proc.stderr and "no such folder" in proc.stderr


def test_the_ledger_is_stored_at_the_end_from_the_samples_and_the_journal(home: Ftui, ftui: Any) -> None:
    """Device-hours over the launch-to-exit wall time, GPU energy integrated over the scripted NVML's power
    samples (rebuilt to the same figures by the tests above), CPU energy not measurable here, and the
    comparison's tokens per joule with its reason where there is none."""
    good, bad = _everything(ftui)
    stored = good["summary"]["ledger"]
    wall_s = (datetime.fromisoformat(good["ended_at"].removesuffix("Z"))
              - datetime.fromisoformat(good["started_at"].removesuffix("Z"))).total_seconds()
    assert stored["devices"] == 1 and stored["devices_kind"] == "gpu"
    assert stored["wall_s"] == pytest.approx(wall_s, abs=1e-3)
    assert stored["device_hours"] == pytest.approx(wall_s / 3600, rel=1e-3)
    store = Store(home.db, create=False)
    try:
        power = sorted((s.time, s.power_w) for s in store.samples(good["id"]) if s.kind == "gpu" and s.power_w)
    finally:
        store.close()
    assert len(power) >= 2
    span = power[-1][0] - power[0][0]
    trapezoid = sum((t1 - t0) * (p0 + p1) / 2 for (t0, p0), (t1, p1) in zip(power, power[1:], strict=False))
    assert stored["gpu_energy_j"] == pytest.approx(trapezoid)
    assert min(p for _, p in power) * span <= stored["gpu_energy_j"] <= max(p for _, p in power) * span
    assert stored["gpu_energy_source"].startswith("fake-nvml power_w, trapezoid over")
    figures = ledger.figures(RunSummary.from_json(good["summary"]), read_price=False)
    assert figures.tokens_per_joule == pytest.approx(good["summary"]["tokens"] / stored["gpu_energy_j"])
    compared = json.loads(ftui("compare", str(good["id"]), str(bad["id"]), "--format", "json").stdout)
    assert compared["runs"][0]["ledger"]["tokens_per_joule"] == pytest.approx(figures.tokens_per_joule)
    if read_counters().get("problem") is None:
        pytest.skip("this machine's RAPL counters are readable: the CPU's 'not measurable' case is not here")
    assert bad["summary"]["ledger"]["gpu_energy_j"] is None and bad["summary"]["ledger"]["cpu_energy_j"] is None
    assert bad["summary"]["ledger"]["cpu_energy_source"].startswith("no readable RAPL")
    assert compared["runs"][1]["ledger"]["energy_source"] == ledger.NOT_MEASURABLE
    assert compared["runs"][1]["ledger"]["tokens_per_joule"] is None
    assert any(f"run {bad['id']} energy -: {ledger.NOT_MEASURABLE}" in line for line in compared["sources"])
