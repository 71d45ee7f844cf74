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
    hostfacts.current.cache_clear()
    recipe = parse_recipe("")
    preflight(recipe)
    cpu_threads(recipe)
    cuda_device_count()
    estimate_summary(recipe)
    assert len(calls) == 1
    facts = calls[0]
    assert facts.has_cuda == (facts.visible_gpus > 0) and facts.cpu_cores >= 1
    hostfacts.current.cache_clear()
