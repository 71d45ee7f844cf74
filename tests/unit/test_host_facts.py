"""Host facts (CUDA, GPUs, cores) are detected once per command, not once per question."""

from __future__ import annotations

import pytest


def test_host_facts_are_detected_once_per_command(monkeypatch: pytest.MonkeyPatch) -> None:
    """"Is this a CPU run?" is asked by the pre-flight, the thread count, the device count and the
    estimate: NVML is started once for all of them."""
    from runner.hardware import hostfacts
    from runner.spec.recipe import parse_recipe
    from runner.watch.estimate import estimate_summary
    from runner.watch.host import cpu_threads, cuda_device_count
    from runner.watch.preflight import preflight

    calls: list[hostfacts.HostFacts] = []
    real = hostfacts.detect

    def counting() -> hostfacts.HostFacts:
        calls.append(real())
        return calls[-1]

    monkeypatch.setattr(hostfacts, "detect", counting)
    hostfacts.facts_for.cache_clear()
    recipe = parse_recipe("")
    preflight(recipe)
    cpu_threads(recipe)
    cuda_device_count()
    estimate_summary(recipe)
    assert len(calls) == 1
    facts = calls[0]
    assert facts.has_cuda == (facts.visible_gpus > 0) and facts.cpu_cores >= 1
    hostfacts.facts_for.cache_clear()


def test_host_facts_follow_cuda_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    """The facts are kept per value of CUDA_VISIBLE_DEVICES: a process that changes it (a test running
    ``ftui`` in its own process) sees the GPUs it now makes visible, NVML started once per value."""
    from runner.hardware import hostfacts

    started: list[int] = []

    class FourGpus:  # the NVML boundary: a driver that lists 4 GPUs
        def __init__(self) -> None:
            started.append(1)

        def device_count(self) -> int:
            return 4

        def close(self) -> None:
            pass

    monkeypatch.setattr(hostfacts, "NvmlBackend", FourGpus)
    hostfacts.facts_for.cache_clear()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert (hostfacts.current().gpu_count, hostfacts.current().visible_gpus) == (4, 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    assert hostfacts.current().visible_gpus == 1
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert hostfacts.current().visible_gpus == 4
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert hostfacts.current().visible_gpus == 2 and len(started) == 3, "NVML started once per value"
    hostfacts.facts_for.cache_clear()
