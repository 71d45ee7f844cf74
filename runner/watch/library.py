"""The maths library's line of the estimate on this host: the cached figure (cheap: every estimate and every
run's stored estimate read it), and the calibration that measures it (``ftui estimate RECIPE --library``: the
only caller of the probe, :mod:`runner.rank.lib_probe`, in a process of its own).

The cache key is the host, torch's version, the device (``cpu`` or the GPU's name), the threads per process
and the recipe's shape set (:mod:`runner.spec.library`).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from dataclasses import replace
from importlib import metadata
from pathlib import Path

import psutil

from runner import planner
from runner.hardware import NvmlBackend
from runner.spec import library as lib
from runner.spec import strategies
from runner.spec.recipe import Recipe
from runner.watch.host import cpu_threads, runs_on_cpu

PROBE_SHARE = 0.5
"""The largest share of this host's available memory (psutil; on GPU NVML's free memory of the first GPU) the
probe's one-process step may take by the planner's estimate; a larger model is "not measured"."""

PROBE_TIMEOUT_S = 600.0
"""Seconds a probe may run (two optimizer steps of a model within :data:`PROBE_SHARE`: seconds on this
host's quickstart, 4-6 s of CPU with the imports)."""


def _device(recipe: Recipe) -> str:
    """``cpu``, or the name of the first GPU NVML lists."""
    if runs_on_cpu(recipe):
        return "cpu"
    backend = NvmlBackend()
    try:
        infos = backend.gpu_infos()
    finally:
        backend.close()
    return f"cuda:{infos[0].name}" if infos else "cuda"


def key_for(recipe: Recipe) -> tuple[str, int]:
    """The recipe's cache key on this host, and the threads per process it was made with (0 on GPU)."""
    threads = cpu_threads(recipe) or 0
    key = lib.cache_key(socket.gethostname(), metadata.version("torch"), _device(recipe), threads,
                        lib.shape_set(recipe))
    return key, threads


def cached_term(recipe: Recipe) -> lib.LibraryTerm:
    """The library line from the cache, or "not measured" with the command that measures it."""
    key, _ = key_for(recipe)
    found = lib.read_cached(key)
    if found is None:
        return lib.LibraryTerm(label="maths library: not measured on this host for this shape set (ftui estimate "
                               "RECIPE --library measures it)", key=key)
    return lib.LibraryTerm(bytes=found["beyond_tensors_bytes"], label=lib.label(found, cached=True), key=key,
                           measured=found)


def not_probed(recipe: Recipe) -> str | None:
    """Why the probe cannot stand for this run (None: it can)."""
    if recipe.method.type == "qlora":
        return "the probe builds no 4-bit model (QLoRA)"
    strategy = strategies.resolve(recipe.launch.strategy, recipe.launch.engine)
    if strategy.layer_split or strategy.tensor_parallel:
        return f"{recipe.launch.strategy} splits the model's layers or matrices; the probe runs it whole"
    try:
        source = planner.resolve_model_shape(recipe.model.name, allow_network=False)
    except ValueError as exc:
        return f"the model's shape cannot be had offline: {exc}"
    inp = planner.inputs_from_recipe(recipe, shape=source.shape)
    one = replace(inp, strategy="single", n_devices=1, device="cpu" if runs_on_cpu(recipe) else "cuda",
                  reserve_bytes=0)
    step = planner.estimate(one).total
    room = _room(recipe)
    if step > PROBE_SHARE * room:
        return (f"its step ({step / 2**30:.2f} GiB, estimated) is over {PROBE_SHARE:.0%} of this host's available "
                f"memory ({room / 2**30:.2f} GiB)")
    return None


def _room(recipe: Recipe) -> int:
    """Memory available to a probe now: psutil's available host memory, or NVML's free memory of GPU 0."""
    if runs_on_cpu(recipe):
        return int(psutil.virtual_memory().available)
    backend = NvmlBackend()
    try:
        samples = backend.gpu_samples()
    finally:
        backend.close()
    free = [s.mem_total - s.mem_used for s in samples if s.mem_total is not None and s.mem_used is not None]
    return int(free[0]) if free else 0


def probe_argv(recipe_path: Path, overrides: list[str], threads: int, device: str) -> list[str]:
    """The probe's command line: this interpreter, the recipe file, its overrides."""
    argv = [sys.executable, "-m", "runner.rank.lib_probe", str(recipe_path), "--threads", str(max(threads, 1)),
            "--device", "cpu" if device == "cpu" else "cuda"]
    for item in overrides:
        argv += ["--set", item]
    return argv


def calibrate(recipe: Recipe, recipe_path: Path, overrides: list[str]) -> lib.LibraryTerm:
    """The library line, measured by the probe when the cache has none (then cached)."""
    term = cached_term(recipe)
    if "bytes" in term:
        return term
    key = term["key"]
    why = not_probed(recipe)
    if why is not None:
        return lib.LibraryTerm(label=f"maths library: not measured ({why})", key=key)
    _, threads = key_for(recipe)
    argv = probe_argv(recipe_path, overrides, threads, "cpu" if runs_on_cpu(recipe) else "cuda")
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return lib.LibraryTerm(label=f"maths library: not measured (the probe ran over {PROBE_TIMEOUT_S:.0f} s)",
                               key=key)
    result = parse_probe(done.returncode, done.stdout, done.stderr)
    if isinstance(result, str):
        return lib.LibraryTerm(label=f"maths library: not measured (the probe failed: {result})", key=key)
    lib.write_cached(key, result)
    return lib.LibraryTerm(bytes=result["beyond_tensors_bytes"], label=lib.label(result, cached=False), key=key,
                           measured=result)


def parse_probe(returncode: int, stdout: str, stderr: str) -> lib.ProbeResult | str:
    """The probe's record from its output, or the one line saying why there is none."""
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    if returncode != 0 or not lines:
        last = [line for line in stderr.splitlines() if line.strip()]
        return f"exit {returncode}: {last[-1].strip()[:200] if last else 'no output'}"
    try:
        data = json.loads(lines[-1])
    except ValueError:
        return "its output is not JSON"
    if not isinstance(data, dict) or not isinstance(data.get("beyond_tensors_bytes"), int):
        return "its output has no beyond_tensors_bytes"
    return lib.as_probe_result(data)
