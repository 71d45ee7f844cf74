"""runner.watch.telemetry: the sampler on real processes and FakeNvml, the summary, the hang detector."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from runner.analysis.utilisation import summarise
from runner.hardware import DeviceSample, FakeNvml, NvmlBackend, Probe, ProcessGpuMemory
from runner.spec.summary import CPU_CORE_UNIT, GPU_UTIL_UNIT
from runner.watch.telemetry import HangDetector, Sampler


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


class Collector:
    """A sink that keeps every batch with the thread it ran on."""

    def __init__(self) -> None:
        self.batches: list[tuple[list[DeviceSample], list[ProcessGpuMemory]]] = []
        self.threads: set[str] = set()

    def __call__(self, samples: list[DeviceSample], procs: list[ProcessGpuMemory]) -> None:
        self.batches.append((samples, procs))
        self.threads.add(threading.current_thread().name)

    @property
    def samples(self) -> list[DeviceSample]:
        return [s for batch, _ in self.batches for s in batch]


def until(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    """Until the sampler has done what the test looks at (its thread's pace is the subject, not a sleep)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the sampler never got there"
        time.sleep(0.01)


def fake_probe(n_gpus: int = 2) -> Probe:
    return Probe(nvml=NvmlBackend(lib=FakeNvml.demo(n_gpus, tick_s=0.1)))


# ------------------------------------------------------------------------------------------------
# Sampler


def test_sampler_rate_batches_and_final_flush(sleeper: subprocess.Popen[bytes]) -> None:
    sink = Collector()
    sampler = Sampler(fake_probe(2), lambda: {0: sleeper.pid}, sink, interval_s=0.1, flush_every_s=0.5)
    sampler.start()
    until(lambda: sampler.readings + sampler.skipped >= 15)
    sampler.stop()
    assert not sampler._thread or not sampler._thread.is_alive()
    readings = sampler.readings
    slots = readings + sampler.skipped  # a loaded machine may skip slots; it never bunches them
    assert 15 <= slots <= 20, (readings, sampler.skipped)  # stopped a few slots after the 15th at most
    # Every reading: 2 GPUs, 1 rank, 1 host; all of them reached the sink (stop flushed the rest).
    assert len(sink.samples) == 4 * readings
    assert 3 <= len(sink.batches) <= 5 and all(len(b) < len(sink.samples) for b, _ in sink.batches)
    if sampler.skipped == 0:  # flushes follow the slot grid: 5 readings of 4 samples between two
        assert [len(b) for b, _ in sink.batches[1:-1]] == [20] * (len(sink.batches) - 2)
    assert sink.threads == {"ftui-sampler"}
    # Monotonic schedule: reading k lands at start + k * interval, without accumulated drift.
    times = sorted({s.time for s in sink.samples if s.kind == "host"})
    assert len(times) == readings
    assert abs((times[-1] - times[0]) - (slots - 1) * 0.1) < 0.05
    assert sampler.errors == 0 and sampler.thread_cpu_s > 0


def test_sampler_stop_flushes_everything_in_one_batch(sleeper: subprocess.Popen[bytes]) -> None:
    sink = Collector()
    with Sampler(fake_probe(1), lambda: {0: sleeper.pid}, sink, interval_s=0.05, flush_every_s=60) as sampler:
        until(lambda: sampler.readings >= 4)
        assert sink.batches == []
    assert len(sink.batches) == 1 and len(sink.batches[0][0]) >= 4 * 3  # 4 readings of GPU, rank and host


def test_sampler_survives_failures_and_logs_once(
    sleeper: subprocess.Popen[bytes], caplog: pytest.LogCaptureFixture
) -> None:
    calls = 0

    def flaky_pids() -> dict[int, int]:
        nonlocal calls
        calls += 1
        if calls in (2, 3, 4):
            raise RuntimeError("launcher not ready")
        return {0: sleeper.pid}

    sink = Collector()
    with caplog.at_level(logging.ERROR, logger="runner.watch.telemetry"):
        with Sampler(fake_probe(1), flaky_pids, sink, interval_s=0.05, flush_every_s=0.1) as sampler:
            until(lambda: sampler.readings >= 6)
    assert sampler.errors == 3 and sampler.readings >= 6
    assert len([r for r in caplog.records if "telemetry probe failed" in r.getMessage()]) == 1
    assert len(sink.samples) == 3 * sampler.readings


def test_sampler_follows_ranks_as_they_start(sleeper: subprocess.Popen[bytes]) -> None:
    ranks: dict[int, int] = {}
    sink = Collector()
    with Sampler(fake_probe(1), lambda: ranks, sink, interval_s=0.05, flush_every_s=0.1) as sampler:
        until(lambda: sampler.readings >= 3)
        ranks[0] = sleeper.pid
        seen = sampler.readings
        until(lambda: sampler.readings >= seen + 5)
    kinds = [s.kind for s in sink.samples]
    first_rank = kinds.index("rank")
    assert first_rank > 0 and kinds[first_rank + 1 :].count("rank") >= 3


def test_sampler_skips_missed_slots_when_overrunning() -> None:
    def slow_pids() -> dict[int, int]:
        time.sleep(0.25)  # a reading that overruns its 0.1 s slot: the subject of the test
        return {}

    sink = Collector()
    probe = fake_probe(1)
    # A pids_provider slower than the interval: the sampler must not try to catch up in a burst.
    with Sampler(probe, slow_pids, sink, interval_s=0.1, flush_every_s=0.1) as s:
        until(lambda: s.readings >= 4)
    assert s.skipped >= 3 and 4 <= s.readings <= 6, (s.readings, s.skipped)


# ------------------------------------------------------------------------------------------------
# summarise


def sample(
    t: float,
    kind: str,
    index: int,
    util: float | None,
    mem: int | None = None,
    power: float | None = None,
    host: str = "box",
) -> DeviceSample:
    return DeviceSample(
        t, host, kind, index, f"{kind}{index}", util, mem, 100, power, None, None, "test", None
    )


def test_summarise_exact_figures_and_window() -> None:
    samples = [
        # GPU 0: start-up at 0, training 10..30, final save at 40.
        sample(0, "gpu", 0, 0, mem=10, power=50),
        sample(10, "gpu", 0, 80, mem=60, power=300),
        sample(20, "gpu", 0, 100, mem=70, power=400),
        sample(30, "gpu", 0, 90, mem=65, power=350),
        sample(40, "gpu", 0, 5, mem=90, power=100),
        # GPU 1: one unreadable utilisation, no power (not supported).
        sample(0, "gpu", 1, 10, mem=5),
        sample(10, "gpu", 1, None, mem=50),
        sample(20, "gpu", 1, 60, mem=55),
        sample(40, "gpu", 1, 0, mem=20),
        # A rank and the host never enter the overall GPU figures.
        sample(10, "rank", 0, 300.0, mem=1000),
        sample(20, "host", -1, 50.0, mem=5000),
    ]
    out = summarise(samples, (10, 30))
    assert list(out["devices"]) == ["gpu:0", "gpu:1", "rank:0", "host:-1"]
    g0 = out["devices"]["gpu:0"]
    assert g0["whole"] == {"n": 5, "util_mean": 55.0, "util_peak": 100, "mem_peak": 90, "power_mean_w": 240.0}
    assert g0["active"] == {
        "n": 3,
        "util_mean": 90.0,
        "util_peak": 100,
        "mem_peak": 70,
        "power_mean_w": 350.0,
    }
    g1 = out["devices"]["gpu:1"]
    assert g1["whole"] == {
        "n": 4,
        "util_mean": pytest.approx(70 / 3),
        "util_peak": 60,
        "mem_peak": 55,
        "power_mean_w": None,
    }
    assert g1["active"] == {"n": 2, "util_mean": 60.0, "util_peak": 60, "mem_peak": 55, "power_mean_w": None}
    assert out["whole"] == {
        "kind": "gpu",
        "devices": 2,
        "util_mean": pytest.approx((55.0 + 70 / 3) / 2),
        "util_peak": 100,
        "util_min": pytest.approx(70 / 3),
        "util_max": 55.0,
        "util_unit": GPU_UTIL_UNIT,
        "threads": None,
        "power_mean_w": 240.0,
        "power_total_w": 240.0,
        "mem_peak": 90,
    }
    assert out["active"] == {
        "kind": "gpu",
        "devices": 2,
        "util_mean": 75.0,
        "util_peak": 100,
        "util_min": 60.0,
        "util_max": 90.0,
        "util_unit": GPU_UTIL_UNIT,
        "threads": None,
        "power_mean_w": 350.0,
        "power_total_w": 350.0,
        "mem_peak": 70,
    }
    assert out["window"] == (10, 30)


def test_summarise_cpu_run_uses_ranks_and_no_window() -> None:
    samples = [
        sample(1, "rank", 0, 200.0, mem=3),
        sample(2, "rank", 0, 100.0, mem=4),
        sample(1, "rank", 1, 50.0, mem=2),
        sample(1, "host", -1, 99.0, mem=50),
    ]
    out = summarise(samples, None)
    assert out["active"] is None and out["devices"]["rank:0"]["active"] is None
    assert out["whole"] == {
        "kind": "rank",
        "devices": 2,
        "util_mean": 100.0,  # (150 + 50) / 2: each rank counts once
        "util_peak": 200.0,
        "util_min": 50.0,
        "util_max": 150.0,
        "util_unit": CPU_CORE_UNIT,  # threads unknown: left in CPU% of one core
        "threads": None,
        "power_mean_w": None,
        "power_total_w": None,
        "mem_peak": 4,
    }


def test_summarise_normalises_rank_cpu_by_its_threads() -> None:
    """A single process with 2 threads at 198% and two 1-thread ranks at 96% are 99% vs 96%."""
    single = [sample(t, "rank", 0, 198.0) for t in range(4)]
    ddp = [sample(t, "rank", r, u) for t in range(4) for r, u in ((0, 100.0), (1, 92.0))]
    one = summarise(single, None, threads=2)["whole"]
    two = summarise(ddp, None, threads=1)["whole"]
    assert one["util_mean"] == pytest.approx(99.0) and one["util_unit"] == "CPU % of its 2 threads (psutil)"
    assert one["util_min"] == one["util_max"] == pytest.approx(99.0) and one["threads"] == 2
    assert two["util_mean"] == pytest.approx(96.0) and two["util_unit"] == "CPU % of its 1 thread (psutil)"
    assert (two["util_min"], two["util_max"]) == (pytest.approx(92.0), pytest.approx(100.0))  # the spread
    # Samples stay raw (CPU% of one core): the per-device figures are untouched, they carry the threads.
    dev = summarise(single, None, threads=2)["devices"]["rank:0"]
    assert dev["whole"]["util_mean"] == 198.0 and dev["threads"] == 2
    # GPUs are never divided by a thread count.
    gpu = summarise([sample(0, "gpu", 0, 80.0), sample(0, "rank", 0, 100.0)], None, threads=4)["whole"]
    assert gpu["util_mean"] == 80.0 and gpu["util_unit"] == GPU_UTIL_UNIT and gpu["threads"] is None


def test_summarise_window_with_no_samples_and_several_hosts() -> None:
    samples = [sample(1, "gpu", 0, 50, host="a"), sample(1, "gpu", 0, 70, host="b")]
    out = summarise(samples, (5, 6))
    assert list(out["devices"]) == ["a/gpu:0", "b/gpu:0"]
    assert out["devices"]["a/gpu:0"]["active"] == {
        "n": 0,
        "util_mean": None,
        "util_peak": None,
        "mem_peak": None,
        "power_mean_w": None,
    }
    assert out["active"] is not None and out["active"]["devices"] == 0 and out["active"]["util_mean"] is None
    assert out["whole"]["util_mean"] == 60.0
    assert summarise([], None)["whole"]["kind"] is None


# ------------------------------------------------------------------------------------------------
# HangDetector


def test_hang_detector_fires_once_per_episode() -> None:
    det = HangDetector(hang_after_s=60, idle_util_pct=5, window_s=30)
    idle = [sample(t, "rank", r, 1.0) for t in (95, 100) for r in (0, 1)] + [sample(100, "host", -1, 0.0)]
    assert det.check(50, 0, idle) is None  # not long enough without progress
    event = det.check(100, 0, idle)
    assert event == {
        "event": "hang_suspected",
        "time": 100,
        "since_progress_s": 100.0,
        "last_progress": 0,
        "last_event_time": 0,
        "idle": ["rank:0", "rank:1"],
        "busy": [],
        "max_util_pct": 1.0,
    }
    assert det.check(110, 0, idle) is None  # same episode
    assert det.check(120, 100, idle) is None  # an event came: episode over, and recent
    assert det.check(161, 100, idle) is None  # no reading in the last 30 s: nothing to judge
    assert det.check(161, 100, [sample(160, "rank", 0, 0.0)]) is not None  # a new episode


def test_hang_detector_one_busy_device_is_progress_and_old_samples_are_not_judged() -> None:
    det = HangDetector(hang_after_s=60, window_s=30)
    mixed = [sample(100, "gpu", 0, 0.0), sample(100, "gpu", 1, 97.0)]
    assert det.check(100, 10, mixed) is None, "GPU 1 works: the run makes progress"
    assert det.last_busy == 100
    old_idle = [sample(10, "gpu", 0, 0.0)]
    assert HangDetector(hang_after_s=60, window_s=30).check(100, 10, old_idle) is None
    # Everything idle from then on: flagged hang_after_s after the last busy reading.
    assert det.check(159, 10, [sample(159, "gpu", 0, 0.0), sample(159, "gpu", 1, 0.0)]) is None
    event = det.check(160, 10, [sample(160, "gpu", 0, 0.0), sample(160, "gpu", 1, 0.0)])
    assert event is not None and event["since_progress_s"] == 60.0 and event["idle"] == ["gpu:0", "gpu:1"]


def test_hang_detector_before_first_step() -> None:
    idle = [sample(300, "rank", 0, 0.0)]
    assert HangDetector(hang_after_s=60).check(300, None, idle) is None
    event = HangDetector(hang_after_s=60, started_at=200).check(300, None, idle)
    assert event is not None and event["since_progress_s"] == 100.0 and event["last_event_time"] is None
