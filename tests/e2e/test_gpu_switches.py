"""The GPU-only efficiency switches trained for real on CUDA GPUs (``pytest -m gpu``; bench/gpu_session.sh runs
them on a lent GPU machine). Each skips, saying why, where the host lacks what the switch needs: the
pre-flight's own refusal (runner/spec/switches.py) is the reason. On a CPU host they cost nothing; the CPU
refusals are tests/integration/test_bad_arguments.py's."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

from runner.hardware import NvmlBackend
from runner.spec.switches import FP8_MIN_CAPABILITY
from runner.watch.preflight import async_io_problem
from tests.support import QUICKSTART, Ftui

pytestmark = pytest.mark.gpu

SHORT = ["--set", "launch.device=cuda", "--set", "train.max_steps=4", "--set", "data.context_length=128",
         "--set", "data.rows=64"]


def _gpus() -> list[tuple[int, int] | None]:
    nvml = NvmlBackend()
    try:
        return [info.compute_capability for info in nvml.gpu_infos()] if nvml.available else []
    finally:
        nvml.close()


def _needs(gpus: int = 1) -> None:
    have = len(_gpus())
    if have < gpus:
        pytest.skip(f"needs {gpus} CUDA GPU(s), NVML sees {have}")


def _trained(ftui: Ftui, *args: str) -> dict[str, Any]:
    proc = ftui.run("run", str(QUICKSTART), *SHORT, *args, "--format", "json", timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = ftui.show(max(r["id"] for r in ftui.runs()))
    assert run["status"] == "completed", run.get("error")
    return run


def _switches(run: dict[str, Any]) -> dict[str, Any]:
    return ((run.get("summary") or {}).get("precision") or {}).get("switches") or {}


def test_fp8_runs_the_decoder_linears_as_float8_linear(ftui: Ftui) -> None:
    _needs(1)
    if any(cap is None or cap < FP8_MIN_CAPABILITY for cap in _gpus()[:1]):
        pytest.skip(f"fp8 needs compute capability 8.9; this GPU has {_gpus()[0]}")
    if importlib.util.find_spec("torchao") is None:
        pytest.skip("torchao is not installed")
    run = _trained(ftui, "--set", "train.precision=fp8")
    # builtin tiny Llama: 6 layers x (q, k, v, o bases + gate, up, down); the head stays bf16.
    assert _switches(run)["fp8_linears"] == 6 * 7
    assert run["summary"]["precision"]["compute"] == "bf16"


def test_activation_offload_saves_the_forward_to_host_memory(ftui: Ftui) -> None:
    _needs(1)
    base = _trained(ftui, "--set", "train.precision=bf16")
    run = _trained(ftui, "--set", "train.precision=bf16", "--set", "train.activation_offload=true")
    assert _switches(run)["activation_offload"] is True and not _switches(base)["activation_offload"]
    estimate = run["summary"]["estimate"]["per_device_bytes"]
    assert estimate["offloaded"]["activations"] > 0 and estimate["activations"] == 0
    peak = [r["peak_allocated_bytes"] for r in run["summary"]["ranks"]]
    assert max(peak) < max(r["peak_allocated_bytes"] for r in base["summary"]["ranks"])


def test_context_parallel_splits_each_sequence_over_two_gpus(ftui: Ftui) -> None:
    _needs(2)
    run = _trained(ftui, "--strategy", "fsdp", "--nproc", "2", "--cp-size", "2", "--set", "train.precision=bf16")
    assert _switches(run)["cp_size"] == 2


def test_nvme_offload_swaps_zero3_to_the_nvme_folder(ftui: Ftui, tmp_path: Any) -> None:
    _needs(2)
    problem = async_io_problem()
    if problem:
        pytest.skip(f"DeepSpeed's async_io op: {problem}")
    run = _trained(ftui, "--strategy", "zero3", "--nproc", "2", "--offload", "nvme", "--nvme-path", str(tmp_path),
                   "--set", "train.precision=bf16")
    assert run["summary"]["sharding"]["offload"] == "nvme"
    assert run["summary"]["estimate"]["per_device_bytes"]["nvme_bytes"] > 0
