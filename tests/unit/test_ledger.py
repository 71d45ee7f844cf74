"""The ledger (runner/analysis/ledger.py): RAPL counters read from a sysfs folder and their wrap-around,
GPU energy as the trapezoid of power over the samples' times, device-hours, the price variable and its
refusal, the figures with their sources."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.analysis import ledger
from runner.hardware import DeviceSample
from runner.hardware.rapl import joules_between, read_counters
from runner.spec.price import PRICE_ENV, Price, PriceError, configured_price, parse_price
from runner.spec.summary import RunSummary
from tests.support import run_in_process


def _zone(root: Path, name: str, energy_uj: int, max_uj: int) -> None:
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "energy_uj").write_text(f"{energy_uj}\n")
    (folder / "max_energy_range_uj").write_text(f"{max_uj}\n")


def test_rapl_reads_package_zones_only_and_wraps(tmp_path: Path) -> None:
    _zone(tmp_path, "intel-rapl:0", 1_000_000, 262_143_328_850)
    _zone(tmp_path, "intel-rapl:1", 262_143_000_000, 262_143_328_850)
    _zone(tmp_path, "intel-rapl:0:0", 5, 10)  # a subzone (cores): part of package 0, never counted again
    start = read_counters(tmp_path)
    assert sorted(start["zones"]) == ["intel-rapl:0", "intel-rapl:1"] and "problem" not in start
    _zone(tmp_path, "intel-rapl:0", 4_500_000, 262_143_328_850)  # 3.5 J
    _zone(tmp_path, "intel-rapl:1", 171_150, 262_143_328_850)  # wrapped: 328_850 + 171_150 uJ = 0.5 J
    end = read_counters(tmp_path)
    assert joules_between(start, end) == pytest.approx(4.0)
    assert joules_between(start, {"zones": {}}) is None


def test_rapl_unreadable_or_absent_is_a_problem_not_an_error(tmp_path: Path) -> None:
    assert read_counters(tmp_path / "none")["problem"].startswith("no RAPL package zone")
    (tmp_path / "intel-rapl:0").mkdir()
    absent = read_counters(tmp_path)
    assert absent["zones"] == {} and "energy_uj not readable" in absent["problem"]
    counters = [{"at": "start", **absent}, {"at": "end", **absent}]
    joules, source = ledger.cpu_energy(counters)
    assert joules is None and source.startswith("no readable RAPL")


def _gpu(index: int, t: float, power: float | None, source: str = "fake-nvml") -> DeviceSample:
    return DeviceSample(time=t, host="h", kind="gpu", index=index, name="H100", util_pct=50.0, mem_used=1,
                        mem_total=2, power_w=power, temp_c=None, sm_clock_mhz=None, source=source, pid=None)


def test_gpu_energy_is_the_trapezoid_per_gpu_summed() -> None:
    samples = [_gpu(0, 10.0, 100.0), _gpu(0, 12.0, 200.0), _gpu(0, 11.0, None), _gpu(0, 13.0, 200.0),
               _gpu(1, 10.0, 50.0), _gpu(1, 14.0, 50.0),
               DeviceSample(time=10.0, host="h", kind="rank", index=0, name="rank 0", util_pct=1.0, mem_used=1,
                            mem_total=2, power_w=None, temp_c=None, sm_clock_mhz=None, source="psutil", pid=1)]
    joules, source = ledger.gpu_energy(samples)
    # gpu 0: (100+200)/2 x 2 s + 200 x 1 s = 500 J; gpu 1: 50 W x 4 s = 200 J (the None reading skipped)
    assert joules == pytest.approx(700.0)
    assert source == "fake-nvml power_w, trapezoid over 5 readings of 2 GPUs"
    assert ledger.gpu_energy(samples[-1:]) == (None, "no NVML power")
    assert ledger.gpu_energy(samples[:1]) == (None, "fewer than two NVML power readings per GPU")


def test_account_device_hours_from_the_telemetry_devices_and_the_wall_time() -> None:
    telemetry = {"whole": {"kind": "gpu", "devices": 2}, "window": [100.0, 1900.0]}
    counters = [{"at": "start", "zones": {"intel-rapl:0": {"energy_uj": 0, "max_energy_range_uj": 10**9}}},
                {"at": "end", "zones": {"intel-rapl:0": {"energy_uj": 3_000_000, "max_energy_range_uj": 10**9}}}]
    stored = ledger.account([_gpu(0, 0.0, 100.0), _gpu(0, 10.0, 100.0)], 3600.0, telemetry, counters, ranks=8)
    assert stored["devices"] == 2 and stored["devices_kind"] == "gpu"
    assert stored["device_hours"] == pytest.approx(2.0) and stored["active_device_hours"] == pytest.approx(1.0)
    assert stored["gpu_energy_j"] == pytest.approx(1000.0) and stored["cpu_energy_j"] == pytest.approx(3.0)
    # no telemetry: the recipe's processes are the devices
    cpu = ledger.account([], 1800.0, None, [], ranks=2)
    assert (cpu["devices"], cpu["device_hours"], cpu["active_device_hours"]) == (2, pytest.approx(1.0), None)
    assert cpu["cpu_energy_source"] == "no RAPL reading at the launch and at the exit"

    summary = RunSummary(tokens=4000, ledger=stored)
    figures = ledger.figures(summary, Price(2.5, "USD"))
    assert figures.energy_j == pytest.approx(1003.0) and figures.tokens_per_joule == pytest.approx(4000 / 1003)
    assert figures.cost == pytest.approx(5.0) and figures.tokens_per_cost == pytest.approx(800.0)
    assert figures.cost_source == f"device-hours x 2.5 USD per device-hour ({PRICE_ENV})"
    assert figures.device_hours_source == "2 GPUs (sampled by NVML) x 3600.0 s, launch to exit (the watcher's journal)"
    no_energy = ledger.figures(RunSummary(tokens=10, ledger=cpu), read_price=False)
    assert (no_energy.energy_j, no_energy.energy_source) == (None, ledger.NOT_MEASURABLE)
    assert no_energy.tokens_per_joule is None and no_energy.tokens_per_joule_source == f"energy {ledger.NOT_MEASURABLE}"
    assert no_energy.cost is None and no_energy.cost_source == f"no price set ({PRICE_ENV})"
    assert not ledger.figures(RunSummary(), read_price=False).recorded


def test_price_is_an_amount_and_a_currency() -> None:
    assert parse_price(" 2.50 usd ") == Price(2.5, "USD")
    assert configured_price({}) is None and configured_price({PRICE_ENV: ""}) is None
    assert configured_price({PRICE_ENV: "0.9 EUR"}) == Price(0.9, "EUR")
    for bad in ("2.50", "USD 2.50", "-1 USD", "two USD", "1e400 USD"):
        with pytest.raises(PriceError, match=PRICE_ENV):
            parse_price(bad)


def test_a_bad_price_is_refused_in_one_line_with_exit_2(capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FTUI_HOME", str(tmp_path))
    monkeypatch.setenv("FTUI_DB", f"sqlite:///{tmp_path / 'ftui.db'}")
    monkeypatch.setenv(PRICE_ENV, "lots")
    result = run_in_process(capsys, "runs")
    assert result.returncode == 2, result
    assert result.stderr.strip().count("\n") == 0 and PRICE_ENV in result.stderr and "2.50 USD" in result.stderr
    assert not (tmp_path / "ftui.db").exists()
