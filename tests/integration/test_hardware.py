"""runner.hardware: psutil on real subprocesses, NvmlBackend on FakeNvml and on the real pynvml."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import psutil
import pynvml
import pytest
from rich.console import Console

from runner.hardware import (
    GIB,
    FakeGpu,
    FakeNvml,
    NvmlBackend,
    Probe,
    ProcessProbe,
    ProcessTree,
    check_gpus_free,
    nvml_query,
    visible_mapping,
)
from tui.render.gpus import format_gpus

BUSY = "import time\nt = time.time()\nwhile time.time() - t < {s}: pass\n"
SLEEP = "import time; time.sleep(60)"
READY = "print('ready', flush=True)\n"  # start-up CPU is spent before the baseline reading
# A parent that starts a child running CHILD_CODE, prints the child's pid, then sleeps.
PARENT = (
    "import subprocess, sys, time\n"
    "c = subprocess.Popen([sys.executable, '-c', {code!r}])\n"
    "print(c.pid, flush=True)\n"
    "time.sleep(60)\n"
)

Spawn = Callable[..., subprocess.Popen[str]]


@pytest.fixture
def spawn() -> Iterator[Spawn]:
    """Start Python subprocesses; kill them and their descendants afterwards."""
    started: list[subprocess.Popen[str]] = []

    def _spawn(code: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        started.append(proc)
        return proc

    yield _spawn
    for proc in started:
        try:
            family = psutil.Process(proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            family = []
        for p in [*family, psutil.Process(proc.pid) if proc.poll() is None else None]:
            if p is not None:
                try:
                    p.kill()
                except psutil.NoSuchProcess:
                    pass
        proc.wait()
        if proc.stdout:
            proc.stdout.close()


def grandchild_pid(parent: subprocess.Popen[str]) -> int:
    assert parent.stdout is not None
    return int(parent.stdout.readline())


def cpu_seconds(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def render(renderable: object) -> str:
    console = Console(record=True, width=200)
    console.print(renderable)
    return console.export_text()


def by_kind(samples: list, kind: str) -> dict:  # type: ignore[type-arg]
    return {s.index: s for s in samples if s.kind == kind}


# ------------------------------------------------------------------------------------------------
# ProcessProbe and ProcessTree on real processes


def test_process_probe_busy_and_sleeping(spawn: Spawn) -> None:
    busy, sleeper = spawn(READY + BUSY.format(s=5)), spawn(READY + SLEEP)
    for proc in (busy, sleeper):
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    probe = ProcessProbe()
    pids = {0: busy.pid, 1: sleeper.pid}
    first = by_kind(probe.sample(pids), "rank")
    assert first[0].util_pct is None and first[1].util_pct is None  # CPU% needs a previous reading
    before, t0 = cpu_seconds(busy.pid), time.monotonic()
    time.sleep(1.5)
    samples = probe.sample(pids)
    expected = 100 * (cpu_seconds(busy.pid) - before) / (time.monotonic() - t0)
    ranks = by_kind(samples, "rank")
    # ~100 on an idle machine; these 2 cores are shared, so compare with psutil's own CPU times.
    assert ranks[0].util_pct is not None and ranks[0].util_pct > 15
    assert ranks[0].util_pct == pytest.approx(expected, abs=10)
    assert ranks[1].util_pct is not None and ranks[1].util_pct < 3
    for rank, pid in pids.items():
        s = ranks[rank]
        assert (s.pid, s.source, s.name) == (pid, "psutil", f"rank {rank}")
        assert s.mem_used is not None and s.mem_used > 1 << 20
        assert s.mem_total == psutil.virtual_memory().total
    (host,) = [s for s in samples if s.kind == "host"]
    assert host.index == -1 and host.util_pct is not None and 0 <= host.util_pct <= 100
    assert host.mem_used is not None and host.mem_total is not None and 0 < host.mem_used < host.mem_total


def test_process_probe_counts_descendants_cpu(spawn: Spawn) -> None:
    parent = spawn(PARENT.format(code=BUSY.format(s=4)))
    child = grandchild_pid(parent)
    probe, tree = ProcessProbe(), ProcessTree(refresh_s=0)
    pids = {0: parent.pid}
    assert tree.owners(pids) == {parent.pid: 0, child: 0}
    probe.sample(pids, tree.owners(pids))
    before, t0 = cpu_seconds(child), time.monotonic()
    time.sleep(1.5)
    (rank,) = by_kind(probe.sample(pids, tree.owners(pids)), "rank").values()
    expected = 100 * (cpu_seconds(child) - before) / (time.monotonic() - t0)
    assert rank.util_pct is not None and rank.util_pct > 15  # the parent sleeps; its child works
    assert rank.util_pct == pytest.approx(expected, abs=10)
    assert rank.pid == parent.pid


def test_process_that_exits_does_not_break_sampling(spawn: Spawn) -> None:
    short = spawn("import time; time.sleep(0.3)")
    sleeper = spawn(SLEEP)
    probe = ProcessProbe()
    pids = {0: short.pid, 1: sleeper.pid}
    assert set(by_kind(probe.sample(pids), "rank")) == {0, 1}
    # Not yet reaped: a zombie, which must not raise either.
    while psutil.Process(short.pid).status() != psutil.STATUS_ZOMBIE:
        time.sleep(0.05)
    probe.sample(pids)
    short.wait()
    samples = probe.sample(pids)
    assert set(by_kind(samples, "rank")) == {1}
    assert [s.kind for s in samples].count("host") == 1


def test_process_tree_nearest_rank_and_cache(spawn: Spawn) -> None:
    # rank 0's pid is a launcher whose child is rank 1's pid: the child stays rank 1's.
    launcher = spawn(PARENT.format(code=SLEEP))
    worker = grandchild_pid(launcher)
    clock = [0.0]
    tree = ProcessTree(refresh_s=5.0, clock=lambda: clock[0])
    assert tree.owners({0: launcher.pid, 1: worker}) == {launcher.pid: 0, worker: 1}
    assert tree.owners({0: launcher.pid}) == {launcher.pid: 0, worker: 0}  # new ranks: rescan
    # Between scans the map is cached: a process started meanwhile shows once it is refresh_s old.
    me = {0: os.getpid()}
    tree.owners(me)
    late = spawn(SLEEP)
    assert late.pid not in tree.owners(me)
    clock[0] += 5.0
    assert tree.owners(me)[late.pid] == 0


# ------------------------------------------------------------------------------------------------
# NvmlBackend on FakeNvml


def test_eight_fake_gpus_sampled() -> None:
    fake = FakeNvml.demo(8, tick_s=None)
    nvml = NvmlBackend(lib=fake)
    assert not fake.initialised  # lazy: nothing happens before first use
    assert nvml.device_count() == 8 and nvml.available and nvml.unavailable_reason is None
    infos = nvml.gpu_infos()
    assert [i.index for i in infos] == list(range(8))
    assert len({i.uuid for i in infos}) == 8 and all(i.mem_total == 80 * GIB for i in infos)
    fake.advance(30)
    samples = nvml.gpu_samples()
    assert [s.index for s in samples] == list(range(8))
    for s in samples:
        assert (s.kind, s.source, s.name, s.pid) == ("gpu", "fake-nvml", "NVIDIA H100 80GB HBM3", None)
        assert s.util_pct is not None and 85 <= s.util_pct <= 100
        assert s.mem_used is not None and 60 * GIB < s.mem_used < 64 * GIB and s.mem_total == 80 * GIB
        assert s.power_w is not None and s.temp_c is not None and s.sm_clock_mhz == 1980


def test_scripted_values_replay_per_tick() -> None:
    fake = FakeNvml([FakeGpu(util=[10, 50, 90], mem_used=lambda t: t * GIB, power_w=[100.5, 200.25])])
    nvml = NvmlBackend(lib=fake)
    seen = []
    for _ in range(4):
        (s,) = nvml.gpu_samples()
        seen.append((s.util_pct, s.mem_used, s.power_w))
        fake.advance()
    assert seen == [(10, 0, 100.5), (50, GIB, 200.25), (90, 2 * GIB, 200.25), (90, 3 * GIB, 200.25)]


def test_gpu_memory_attributed_to_ranks_through_process_tree(spawn: Spawn) -> None:
    rank0 = spawn(SLEEP)
    launcher = spawn(PARENT.format(code=SLEEP))  # rank 1 does its CUDA work in a child
    cuda_child = grandchild_pid(launcher)
    fake = FakeNvml([FakeGpu() for _ in range(3)])
    fake.set_processes(0, [(rank0.pid, 3 * GIB)])
    fake.set_processes(1, [(cuda_child, 5 * GIB), (4_000_000, GIB)])  # plus someone else's job
    fake.set_processes(2, [(launcher.pid, None)])  # the driver may not say how much
    probe = Probe(nvml=NvmlBackend(lib=fake), tree=ProcessTree(refresh_s=0))
    samples, procs = probe.sample({0: rank0.pid, 1: launcher.pid})
    assert {(p.gpu_index, p.pid, p.rank, p.used_bytes, p.source) for p in procs} == {
        (0, rank0.pid, 0, 3 * GIB, "fake-nvml"),
        (1, cuda_child, 1, 5 * GIB, "fake-nvml"),
        (1, 4_000_000, None, GIB, "fake-nvml"),
        (2, launcher.pid, 1, None, "fake-nvml"),
    }
    assert [s.kind for s in samples] == ["gpu"] * 3 + ["rank", "rank", "host"]
    # The backend alone scans the process table itself.
    direct = NvmlBackend(lib=fake).process_memory({1: launcher.pid})
    assert {p.pid: p.rank for p in direct} == {
        rank0.pid: None,
        cuda_child: 1,
        4_000_000: None,
        launcher.pid: 1,
    }


def test_failing_field_reads_as_none_for_that_field_only() -> None:
    gpus = [FakeGpu(util=40, mem_used=GIB, power_w=250.0) for _ in range(4)]
    gpus[3].faults = {
        "nvmlDeviceGetPowerUsage": pynvml.NVML_ERROR_NOT_SUPPORTED,
        "nvmlDeviceGetTemperature": pynvml.NVML_ERROR_NO_PERMISSION,
    }
    samples = NvmlBackend(lib=FakeNvml(gpus)).gpu_samples()
    assert (samples[3].power_w, samples[3].temp_c) == (None, None)
    assert (samples[3].util_pct, samples[3].mem_used, samples[3].sm_clock_mhz) == (40, GIB, 1980)
    assert all(s.power_w == 250.0 and s.temp_c == 35 for s in samples[:3])


def test_function_missing_from_binding_reads_as_none() -> None:
    class OldDriver(FakeNvml):
        nvmlDeviceGetClockInfo = None  # type: ignore[assignment]  # this binding/driver has no such function

    (s,) = NvmlBackend(lib=OldDriver([FakeGpu(util=7)])).gpu_samples()
    assert s.sm_clock_mhz is None and s.util_pct == 7


def test_old_driver_process_list_falls_back_to_v2() -> None:
    class OldDriver(FakeNvml):
        def nvmlDeviceGetComputeRunningProcesses(self, handle):  # type: ignore[no-untyped-def]
            raise pynvml.NVMLLibraryMismatchError("driver lacks nvmlDeviceGetComputeRunningProcesses_v3")

        def nvmlDeviceGetComputeRunningProcesses_v2(self, handle):  # type: ignore[no-untyped-def]
            return FakeNvml.nvmlDeviceGetComputeRunningProcesses(self, handle)

    fake = OldDriver([FakeGpu(processes=[(1234, GIB)])])
    (p,) = NvmlBackend(lib=fake).process_memory({}, owners={})
    assert (p.pid, p.used_bytes, p.rank) == (1234, GIB, None)


def test_nvml_query_turns_any_nvml_error_into_default() -> None:
    def not_found() -> int:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

    assert nvml_query(not_found) is None
    assert nvml_query(not_found, default=-1) == -1
    assert nvml_query(None, 1, 2, default="x") == "x"
    assert nvml_query(lambda a, b: a + b, 1, 2) == 3
    with pytest.raises(ZeroDivisionError):  # a bug in our code is not a driver quirk
        nvml_query(lambda: 1 / 0)


def test_gpu_lost_mid_run_gives_empty_readings_without_exception(spawn: Spawn) -> None:
    rank = spawn(SLEEP)
    gpus = [FakeGpu(util=80, mem_used=10 * GIB, processes=[(rank.pid, 10 * GIB)]) for _ in range(4)]
    gpus[2].lost_at_tick = 3
    fake = FakeNvml(gpus)
    probe = Probe(nvml=NvmlBackend(lib=fake))
    for _ in range(3):
        samples, procs = probe.sample({0: rank.pid})
        assert by_kind(samples, "gpu")[2].util_pct == 80 and len(procs) == 4
        fake.advance()
    samples, procs = probe.sample({0: rank.pid})
    gpu = by_kind(samples, "gpu")
    assert sorted(gpu) == [0, 1, 2, 3]  # the lost GPU keeps its row: the gap shows
    lost = gpu[2]
    assert lost.name == "NVIDIA H100 80GB HBM3" and lost.mem_total == 80 * GIB  # from the start-up read
    assert (lost.util_pct, lost.mem_used, lost.power_w, lost.temp_c, lost.sm_clock_mhz) == (None,) * 5
    assert all(gpu[i].util_pct == 80 for i in (0, 1, 3))
    assert sorted(p.gpu_index for p in procs) == [0, 1, 3]
    assert "NVIDIA" in render(format_gpus(probe, {0: rank.pid}))


def test_gpu_lost_before_start_is_retried() -> None:
    gpus = [FakeGpu(util=1), FakeGpu(util=2, lost_at_tick=0)]
    nvml = NvmlBackend(lib=FakeNvml(gpus))
    assert [i.name for i in nvml.gpu_infos()] == ["NVIDIA H100 80GB HBM3", "N/A"]
    assert [s.util_pct for s in nvml.gpu_samples()] == [1, None]
    gpus[1].lost_at_tick = None  # came back (e.g. after a reset)
    assert [s.util_pct for s in nvml.gpu_samples()] == [1, 2]


def test_init_failure_on_fake_is_reported_not_raised() -> None:
    nvml = NvmlBackend(lib=FakeNvml([FakeGpu()], init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED))
    assert nvml.device_count() == 0 and nvml.gpu_samples() == [] and nvml.process_memory({0: 1}) == []
    assert nvml.unavailable_reason == "no NVML: NVIDIA driver not loaded"


def test_fake_refuses_calls_before_init() -> None:
    fake = FakeNvml([FakeGpu()])
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()
    backend = NvmlBackend(lib=fake)
    backend.gpu_samples()
    backend.close()
    assert not fake.initialised


def test_demo_is_training_like() -> None:
    fake = FakeNvml.demo(2, pids=[4242], tick_s=None)
    nvml = NvmlBackend(lib=fake)
    trace = []
    for _ in range(100):
        (g0, _), (p,) = nvml.gpu_samples(), nvml.process_memory({0: 4242}, owners={4242: 0})
        assert g0.util_pct is not None and g0.mem_used is not None
        trace.append((g0.util_pct, g0.mem_used, p.used_bytes, p.rank))
        fake.advance()
    utils = [t[0] for t in trace]
    mems = [t[1] for t in trace]
    assert max(utils[:5]) < 20 and min(utils[12:40]) > 85 and min(utils[46:50]) < 40  # load, train, dip
    assert mems == sorted(mems) and mems[0] < GIB and mems[30] == mems[99] > 60 * GIB  # climb, then flat
    assert all(t[1] == t[2] and t[3] == 0 for t in trace)  # the pid holds the GPU's memory


# ------------------------------------------------------------------------------------------------
# The real pynvml on this machine


def test_real_nvml_without_gpu_reports_unavailable_once(caplog: pytest.LogCaptureFixture) -> None:
    nvml = NvmlBackend()
    assert nvml.unavailable_reason is None  # lazy
    with caplog.at_level(logging.INFO, logger="runner.hardware"):
        if nvml.available:
            pytest.skip("this machine has a working NVML")
        for _ in range(3):
            assert nvml.device_count() == 0
            assert nvml.gpu_infos() == [] and nvml.gpu_samples() == [] and nvml.process_memory({}) == []
    assert nvml.unavailable_reason is not None and nvml.unavailable_reason.startswith("no NVML: ")
    try:
        import ctypes

        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        assert nvml.unavailable_reason == "no NVML: libnvidia-ml.so.1 not found"
    assert [r.getMessage() for r in caplog.records].count(
        f"{nvml.unavailable_reason}; GPU telemetry off, showing host CPU/memory"
    ) == 1
    samples, procs = Probe(nvml=nvml).sample({})
    assert [s.kind for s in samples] == ["host"] and procs == []
    text = render(format_gpus(Probe(nvml=nvml)))
    assert f"no NVML ({nvml.unavailable_detail}): no NVIDIA GPU visible; showing host CPU/memory" in text
    assert "psutil" in text


@pytest.mark.gpu
def test_real_gpus_read() -> None:
    nvml = NvmlBackend()
    if not nvml.available or nvml.device_count() == 0:
        pytest.skip(nvml.unavailable_reason or "NVML sees no GPU")
    samples = nvml.gpu_samples()
    assert len(samples) == nvml.device_count()
    assert all(s.source == "nvml" and s.mem_total and s.name != "N/A" for s in samples)
    nvml.process_memory({})
    nvml.close()


# ------------------------------------------------------------------------------------------------
# Views and checks


def test_format_gpus_names_sources() -> None:
    probe = Probe.fake(3)
    text = render(format_gpus(probe))
    assert "every figure: fake NVML" in text and "NVIDIA H100 80GB HBM3" in text and "/80.0" in text
    assert "NVML sees no GPU" in render(format_gpus(Probe(nvml=NvmlBackend(lib=FakeNvml([])))))


def test_check_gpus_free() -> None:
    gpus = [
        FakeGpu(util=95, mem_used=70 * GIB, processes=[(555, 70 * GIB)]),
        FakeGpu(util=0, mem_used=GIB // 2),
        FakeGpu(util=0, mem_used=GIB, processes=[(777, GIB)], faults={"nvmlDeviceGetMemoryInfo": 999}),
    ]
    probe = Probe(nvml=NvmlBackend(lib=FakeNvml(gpus)))
    assert check_gpus_free(probe, [1], need_bytes=40 * GIB) == []
    warnings = check_gpus_free(probe, [0, 1, 2, 5], need_bytes=40 * GIB, ignore_pids=[777])
    assert warnings == [
        "GPU 0 has 1 other process(es): pid 555 (70.0 GiB)",
        "GPU 0 is busy: 95% utilisation",
        "GPU 0 has 10.0 GiB free, the plan needs 40.0 GiB",
        "GPU 2: memory unreadable, cannot check it is free",
        "GPU 5 requested but NVML sees only 3 GPU(s)",
    ]
    off = Probe(nvml=NvmlBackend(lib=FakeNvml([], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)))
    assert check_gpus_free(off, [0, 1]) == [
        "no NVML: libnvidia-ml.so.1 not found: cannot check that GPU(s) 0, 1 are free"
    ]


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (None, [(0, 0), (1, 1), (2, 2), (3, 3)]),
        ("", []),
        ("2,0", [(0, 2), (1, 0)]),
        (" 3 , 1 ", [(0, 3), (1, 1)]),
        ("1,7,2", [(0, 1)]),  # out of range ends the list, as in CUDA
        ("1,-1,2", [(0, 1)]),
        ("0,0", [(0, 0)]),
        ("1,x,2", [(0, 1)]),
        ("GPU-bbb,0", [(0, 1), (1, 0)]),
        ("GPU-a", []),  # ambiguous prefix
    ],
)
def test_visible_mapping(env: str | None, expected: list[tuple[int, int]]) -> None:
    assert visible_mapping(env, 4, uuids=["GPU-aaa", "GPU-bbb", "GPU-acc", None]) == expected


def test_visible_mapping_uuid_without_uuids() -> None:
    assert visible_mapping("GPU-bbb", 4) == []
