"""Telemetry of a real run: the shared matrix's 2-process DDP run on CPU is sampled per rank into the store."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from store import Store
from tests.support import Ftui
from tests.support.matrix import Matrix


def test_ddp_run_has_per_rank_samples_at_the_configured_rate(ftui: Ftui, matrix: Matrix) -> None:
    run = matrix["ddp"]
    store = Store(ftui.db)
    samples = store.samples(run.id)
    ranks = Counter(s.index for s in samples if s.kind == "rank")
    assert set(ranks) == {0, 1}, f"one series per rank, got {ranks}"
    assert all(s.source == "psutil" for s in samples if s.kind == "rank")
    assert any(s.kind == "host" for s in samples)
    # 2 Hz from the moment each rank wrote its pid to its exit: compare with the rank's lifetime.
    times = sorted(s.time for s in samples if s.kind == "rank" and s.index == 0)
    span = times[-1] - times[0]
    assert span > 2
    assert len(times) == pytest.approx(span / 0.5 + 1, rel=0.25)
    tele = run.summary["telemetry"]
    for rank in (0, 1):
        dev = tele["devices"][f"rank:{rank}"]
        assert dev["active"]["n"] > 0
        assert 5 < dev["active"]["util_mean"] <= 100 * 2, "a training rank keeps its core busy"
        assert dev["whole"]["mem_peak"] > 100 * 2**20
    assert tele["active"]["kind"] == "rank" and tele["active"]["devices"] == 2
    assert run.summary["mean_util"] == pytest.approx(tele["active"]["util_mean"])
    assert "rank:0 util mean/peak" in matrix.show_text(run)


def test_ftui_gpus_without_nvml_says_so_in_one_line(ftui: Ftui) -> None:
    proc = ftui.call("gpus", check=True)
    assert "no NVML" in proc.stdout and "host" in proc.stdout
    fake = ftui.call("--fake-gpus", "8", "gpus", check=True)
    # One line per GPU, its index first; the source named once, in the title (fits 80 columns).
    indices = re.findall(r"^\s+(\d+)\s+H100", fake.stdout, flags=re.M)
    assert indices == [str(i) for i in range(8)] and "every figure: fake NVML" in fake.stdout
