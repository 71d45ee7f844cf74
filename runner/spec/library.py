"""The maths library's memory beyond tensors, calibrated per host: the probe's record, its cache key and file.

What a training process holds beyond its tensors (CPU: oneDNN's primitive cache and MKL's buffers; GPU: the
CUDA context, cuBLAS's workspace and the caching allocator's reserve) depends on the host's library build, its
thread count and the set of GEMM shapes and dtypes a step runs, not on the weights' values. So it is measured
once per host and shape set by a probe (:mod:`runner.rank.lib_probe`, run by
:func:`runner.service.library.calibrate`) and kept in the cache folder; the estimate shows it as its own line
beside the tensor total, never inside it.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, TypedDict

from runner.spec.paths import cache_dir
from runner.spec.recipe import Recipe

CACHE_FOLDER = "library"
"""The cache's sub-folder of :func:`runner.spec.paths.cache_dir`: one JSON file per key."""


class ProbeResult(TypedDict):
    """What one probe process measured (its stdout line)."""

    beyond_tensors_bytes: int
    threads: int
    device: str
    torch: str
    detail: dict[str, Any]
    """The meter's record: ``heap_check`` on CPU, ``gpu_library`` on GPU (:mod:`runner.spec.summary`)."""


class LibraryTerm(TypedDict, total=False):
    """The estimate's library line: measured bytes per process, or why there are none."""

    bytes: int
    label: str
    """``maths library (measured on this host: ...)``, or ``maths library: not measured (...)``."""
    key: str
    measured: ProbeResult


def shape_set(recipe: Recipe) -> dict[str, Any]:
    """The recipe's fields that set a step's GEMM shapes and dtypes, per process: the model (its config),
    the micro-batch's tokens, the method and its adapters, the precision and the kernels. Learning rate,
    steps, data and the strategy's process count do not enter (the threads per process do, in the key)."""
    model, train, method = recipe.model, recipe.train, recipe.method
    return {
        "model": model.name, "revision": model.revision, "dtype": model.dtype, "attn": model.attn_implementation,
        "method": method.type,
        "lora": [method.lora.r, sorted(method.lora.target_modules) if not isinstance(method.lora.target_modules, str)
                 else method.lora.target_modules, method.lora.dropout] if method.type != "full" else None,
        "precision": train.precision, "micro_batch": train.batch_size, "seq": recipe.data.context_length,
        "gradient_checkpointing": train.gradient_checkpointing, "compile": train.compile,
    }


def cache_key(host: str, torch_version: str, device: str, threads: int, shapes: dict[str, Any]) -> str:
    """The cache key: host, torch version, device (``cpu`` or the GPU's name), threads per process and the
    shape set (:func:`shape_set`), hashed."""
    text = json.dumps([host, torch_version, device, threads, shapes], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def cache_file(key: str) -> Path:
    return cache_dir() / CACHE_FOLDER / f"{key}.json"


def read_cached(key: str) -> ProbeResult | None:
    """The probe's record under ``key``, or None (none yet, or a file that is not one)."""
    try:
        data = json.loads(cache_file(key).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("beyond_tensors_bytes"), int):
        return None
    return as_probe_result(data)


def as_probe_result(data: dict[str, Any]) -> ProbeResult:
    """A probe's record from its JSON (``beyond_tensors_bytes`` checked by the caller)."""
    return ProbeResult(beyond_tensors_bytes=data["beyond_tensors_bytes"], threads=int(data.get("threads", 0)),
                       device=str(data.get("device", "")), torch=str(data.get("torch", "")),
                       detail=dict(data.get("detail") or {}))


def write_cached(key: str, result: ProbeResult) -> None:
    """Keep ``result`` under ``key`` (written whole, then renamed: a reader never sees half a file)."""
    path = cache_file(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    tmp.replace(path)


def label(result: ProbeResult, cached: bool) -> str:
    """The estimate's line for a measured term."""
    where = "cached" if cached else "measured now"
    return (f"maths library (measured on this host: {result['device']}, {result['threads']} threads, torch "
            f"{result['torch']}; {where})")
