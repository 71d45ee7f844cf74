"""Peak memory of one training step, measured independently of the planner, per phase.

Two meters with one interface (``phase(name)`` around forward, backward and the optimizer step, then
``result()``), used by runner/rank/loop.py on the first optimizer steps only (normal steps pay nothing):

* :class:`CudaPeaks` (GPU): the CUDA caching allocator's own accounting. ``torch.cuda.reset_peak_memory_stats``
  at the start of each phase, ``max_memory_allocated`` / ``max_memory_reserved`` at its end
  (PyTorch docs, "CUDA semantics: memory management").
* :class:`LiveTensorPeaks` (CPU, where torch keeps no allocator statistics): the peak bytes of LIVE tensor
  storages. A ``TorchDispatchMode`` sees the output of every ATen op (forward, autograd's backward ops on
  the calling thread, the optimizer's foreach kernels, DDP's bucket copies); each new storage is counted
  once, by identity, with its ``nbytes``, and a ``weakref.finalize`` on the storage (storages keep their
  Python object alive as long as the C++ storage lives, torch >= 2.0) subtracts it when it is freed.
  Storages resized in place (FSDP frees and re-allocates its unsharded parameters with
  ``UntypedStorage.resize_``) are re-read after every resize. What was alive before the step and belongs to
  training (parameters, buffers, gradients, optimizer state) is counted from the start; other storages an
  op touches (DDP's buckets, allocated at wrap time) are counted from their first use.

  Beside it, glibc's ``mallinfo2`` (heap in use, small blocks plus mmapped ones) is read at the first forward
  and at the end of the last measured optimizer step; its growth is stored beside the tensor growth over the
  same span (``heap_check``). The difference is what the process kept beyond tensors: the maths library's
  caches (oneDNN's primitives, about 1.6 MiB per GEMM shape under bf16; MKL's buffers under fp32) and the
  runtime's. On the quickstart (context 64, single) that was 20.2 MiB under bf16 and 30.2 MiB under fp32.

On GPU, :class:`CudaPeaks` also reads, at the end of the last measured optimizer step, what the process holds
beyond the allocator's tensors (``gpu_library``): NVML's memory of the process minus
``torch.cuda.memory_reserved`` (the CUDA context, cuBLAS's workspace, NCCL and the other libraries), plus the
allocator's reserve (peak reserved minus peak allocated over the measured steps).

Compiled layers (``train.compile``, and flex_attention's kernel) run compiled under the meter
(``ignore_compile_internals``): what a compiled graph saves for backward and returns is counted (it passes
through the dispatcher), the temporaries inductor's fused kernels allocate and free inside the graph are
not, so on CPU the peak of a compiled run is a lower bound. A layer first met inside DDP's forward is
compiled under the meter too (Dynamo's DDPOptimizer path keeps the dispatch modes its plain path turns off):
the FakeTensors and FunctionalTensors it traces with hold no memory and are not counted (:func:`holds_memory`).

Why not the profiler's memory timeline: with ``profile_memory=True`` one step of the tiny Llama took 15 s
on this machine (against 0.4 s), and ``prof.events()`` held no ``[memory]`` records in torch 2.13.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import os
import weakref
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

from runner.hardware.nvml import NvmlBackend
from runner.spec.summary import GpuLibrary, HeapCheck

MEASURED_STEPS = 2
"""Optimizer steps measured: the first creates the optimizer state, the second runs forward and backward
with it alive, which is the steady-state peak."""

PHASES = ("forward", "backward", "optimizer")
"""The phases of a step measured separately (``phase_peaks`` keys)."""

LIVE_TENSOR_SOURCE = "live tensors (TorchDispatchMode)"
CUDA_SOURCE = "CUDA allocator peak"


class Meter(Protocol):
    """What the training loop wraps its phases in."""

    def phase(self, name: str) -> contextlib.AbstractContextManager[None]: ...


class LiveTensorPeaks:
    """Peak bytes of live tensor storages on CPU, per phase (see the module doc).

    Args:
        seed: Tensors alive before the step that belong to training (parameters, buffers, gradients,
            optimizer state); counted from the start.
    """

    def __init__(self, seed: Iterable[Any] = ()) -> None:
        self.sizes: dict[int, int] = {}
        self.live = 0
        self.peak = 0
        self.phase_peaks: dict[str, int] = {}
        self.current: str | None = None
        self.heap: dict[str, int] = {}
        self.tensor_marks: dict[str, int] = {}
        self.optimizer_steps = 0
        # FTUI_MEMTRACK_DUMP=FILE appends the storages alive at the peak to FILE (a debugging aid), each as its
        # size and what made it: the op, the shape and dtype of the tensor it was first seen through.
        self.dump = os.environ.get("FTUI_MEMTRACK_DUMP")
        self.labels: dict[int, str] = {}
        self.at_peak: tuple[str | None, list[tuple[int, str]]] = (None, [])
        self.at_phase_peak: dict[str, list[tuple[int, str]]] = {}
        for t in seed:
            self._track(t, "before the step")

    # ---------------------------------------------------------------- storages

    def _track(self, t: Any, made_by: str = "") -> None:
        import torch

        if not isinstance(t, torch.Tensor):
            return
        local = t.to_local() if hasattr(t, "to_local") else t
        try:
            storage = local.untyped_storage()
        except (RuntimeError, NotImplementedError):  # sparse or wrapper tensors have no plain storage
            return
        if holds_memory(storage):
            self._storage(storage, f"{made_by} {tuple(local.shape)} {local.dtype}" if self.dump is not None else "")

    def _storage(self, storage: Any, made_by: str = "") -> None:
        key = id(storage)
        size = int(storage.nbytes())
        old = self.sizes.get(key)
        if old is None:
            self.sizes[key] = size
            if self.dump is not None:
                self.labels[key] = made_by
            weakref.finalize(storage, self._freed, key)
            self._add(size)
        elif old != size:
            self.sizes[key] = size
            self._add(size - old)

    def _freed(self, key: int) -> None:
        self.labels.pop(key, None)
        self._add(-self.sizes.pop(key, 0))

    def _alive(self) -> list[tuple[int, str]]:
        """The live storages, largest first, each with what made it (the dump's entries)."""
        return sorted(((size, self.labels.get(key, "")) for key, size in self.sizes.items()), reverse=True)

    def _add(self, delta: int) -> None:
        self.live += delta
        if self.live > self.peak:
            self.peak = self.live
            if self.dump is not None:  # what made the peak: the live storages by size, and the phase
                self.at_peak = (self.current, self._alive())
        if self.current is not None and self.live > self.phase_peaks.get(self.current, 0):
            self.phase_peaks[self.current] = self.live
            if self.dump is not None:
                self.at_phase_peak[self.current] = self._alive()

    # ---------------------------------------------------------------- measuring

    @contextlib.contextmanager
    def measuring(self) -> Iterator[None]:
        """Count every op's outputs (and storages resized in place) while inside."""
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_leaves

        tracker = self

        class _Mode(TorchDispatchMode):  # type: ignore[no-untyped-call]
            @classmethod
            def ignore_compile_internals(cls) -> bool:
                # Compiled code runs compiled under the meter (Dynamo skips a frame for good under any other
                # mode): the meter sees the ops it dispatches and what it saves and returns (module doc).
                return True

            def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                out = func(*args, **(kwargs or {}))
                for t in tree_leaves(out):
                    tracker._track(t, str(func))
                # In-place and out= ops may grow a storage, or touch one allocated before the step.
                for t in tree_leaves((args, kwargs)):
                    tracker._track(t, f"input of {func}")
                return out

        original = torch.UntypedStorage.resize_

        def resize(storage: Any, size: int) -> Any:
            result = original(storage, size)
            tracker._storage(storage, f"resize_ to {size}")
            return result

        torch.UntypedStorage.resize_ = resize  # type: ignore[method-assign,assignment]
        try:
            with _Mode():  # type: ignore[no-untyped-call]
                yield
        finally:
            torch.UntypedStorage.resize_ = original  # type: ignore[method-assign]

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Attribute the peak inside to ``name`` (one of :data:`PHASES`); the phase starts at the live bytes."""
        self.current = name
        self.phase_peaks[name] = max(self.phase_peaks.get(name, 0), self.live)
        check = name == "forward" and "forward_start" not in self.heap
        if check:
            self._mark("forward_start")
        try:
            with self.measuring():
                yield
        finally:
            self.current = None
            if check:
                self._mark("forward_end")
            if name == "optimizer":
                self.optimizer_steps += 1
                if self.optimizer_steps == MEASURED_STEPS:
                    self._mark("measured_end")

    def _mark(self, at: str) -> None:
        if at == "forward_start":
            # Garbage made before the span (cycles the collector has not reached yet) is freed now: freed
            # inside the span, it would read as the heap shrinking beside the tensors.
            gc.collect()
        self.heap[at], self.tensor_marks[at] = heap_in_use(), self.live

    def result(self) -> dict[str, Any]:
        """The figures of a :class:`~runner.spec.summary.RankFigures`: ``peak_tensor_bytes``, ``phase_peaks``,
        ``memory_source`` and the heap cross-check (``heap_check``)."""
        if self.dump is not None:
            with open(self.dump, "a") as fh:
                fh.write(json.dumps({"pid": os.getpid(), "peak": self.peak, "phase": self.at_peak[0],
                                     "sizes": self.at_peak[1][:80],
                                     "phases": {k: v[:80] for k, v in self.at_phase_peak.items()}}) + "\n")
        out: dict[str, Any] = {
            "peak_tensor_bytes": self.peak,
            "phase_peaks": {k: self.phase_peaks[k] for k in PHASES if k in self.phase_peaks},
            "memory_source": LIVE_TENSOR_SOURCE,
        }
        if "forward_start" in self.heap and "measured_end" not in self.heap:
            self._mark("measured_end")  # a run shorter than the measured steps: its end
        if self.heap.get("forward_start", -1) >= 0:
            out["heap_check"] = self.heap_figures()
        return out

    def heap_figures(self) -> HeapCheck:
        """glibc's heap growth beside the tensors' over the measured steps (from the first forward to the end
        of the last measured optimizer step); what the heap kept beyond tensors is the maths library's
        (oneDNN's primitive cache, MKL's packing buffers) and the runtime's other allocations."""
        start, end = "forward_start", "measured_end"
        heap = self.heap[end] - self.heap[start]
        tensors = self.tensor_marks[end] - self.tensor_marks[start]
        return HeapCheck(heap_growth_bytes=heap, tensor_growth_bytes=tensors, beyond_tensors_bytes=heap - tensors,
                         span="the measured steps")


class CudaPeaks:
    """The CUDA allocator's peak allocated and reserved bytes, per phase (see the module doc); at the end of the
    last measured optimizer step, what the process holds beyond them (``gpu_library``)."""

    def __init__(self) -> None:
        self.phase_peaks: dict[str, int] = {}
        self.phase_reserved: dict[str, int] = {}
        self.optimizer_steps = 0
        self.library: GpuLibrary | None = None

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        import torch

        # Every visible device: a model-parallel rank spreads its layers over several, and the busiest counts.
        devices = range(torch.cuda.device_count())
        for d in devices:
            torch.cuda.synchronize(d)
            torch.cuda.reset_peak_memory_stats(d)
        try:
            yield
        finally:
            for d in devices:
                torch.cuda.synchronize(d)
            allocated = max((int(torch.cuda.max_memory_allocated(d)) for d in devices), default=0)
            reserved = max((int(torch.cuda.max_memory_reserved(d)) for d in devices), default=0)
            self.phase_peaks[name] = max(self.phase_peaks.get(name, 0), allocated)
            self.phase_reserved[name] = max(self.phase_reserved.get(name, 0), reserved)
            if name == "optimizer":
                self.optimizer_steps += 1
                if self.optimizer_steps == MEASURED_STEPS:
                    self.library = self.library_figures()

    def library_figures(self) -> GpuLibrary | None:
        """NVML's memory of this process on every device against the allocator's (None without NVML)."""
        import torch

        process = process_gpu_bytes(os.getpid())
        if process is None:
            return None
        reserved_now = sum(int(torch.cuda.memory_reserved(d)) for d in range(torch.cuda.device_count()))
        return gpu_library(process, reserved_now, max(self.phase_reserved.values(), default=0),
                           max(self.phase_peaks.values(), default=0))

    def result(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "peak_tensor_bytes": max(self.phase_peaks.values(), default=0),
            "phase_peaks": {k: self.phase_peaks[k] for k in PHASES if k in self.phase_peaks},
            "phase_reserved": {k: self.phase_reserved[k] for k in PHASES if k in self.phase_reserved},
            "memory_source": CUDA_SOURCE,
        }
        if self.library is None and self.optimizer_steps:
            self.library = self.library_figures()  # a run shorter than the measured steps: its end
        if self.library is not None:
            out["gpu_library"] = self.library
        return out


def gpu_library(process: int, reserved_now: int, reserved_peak: int, allocated_peak: int) -> GpuLibrary:
    """What a GPU process holds beyond its tensors: the CUDA context, cuBLAS's workspace and the other
    libraries outside the allocator (``process - reserved_now``), and the allocator's reserve over the measured
    steps (``reserved_peak - allocated_peak``)."""
    outside = process - reserved_now
    reserve = reserved_peak - allocated_peak
    return GpuLibrary(process_bytes=process, reserved_bytes=reserved_now, outside_allocator_bytes=outside,
                      allocator_reserve_bytes=reserve, beyond_tensors_bytes=outside + reserve,
                      span="the end of the measured steps")


def process_gpu_bytes(pid: int) -> int | None:
    """NVML's used memory of process ``pid`` summed over the GPUs (None where NVML lists none of it)."""
    backend = NvmlBackend()
    try:
        used = [r.used_bytes for r in backend.process_memory({0: pid}, owners={pid: 0}) if r.pid == pid]
    finally:
        backend.close()
    known = [u for u in used if u is not None]
    return sum(known) if known else None


class NoMeter:
    """Steps that are not measured: every phase is a no-op."""

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        yield


def holds_memory(storage: Any) -> bool:
    """Whether ``storage`` holds memory of its own. Not a storage on meta (meta tensors, and the FakeTensors
    that torch.compile traces with: they report the device they stand for while their storage is on meta),
    nor the data-less storage of a wrapper subclass (the FunctionalTensors of AOTAutograd's tracing), whose
    data pointer cannot be read. Compilation runs under the meter when Dynamo compiles a layer inside DDP's
    forward (its DDPOptimizer path keeps the dispatch modes the plain path turns off), and its graphs keep
    those tensors alive as example values for the life of the process."""
    if storage.device.type == "meta":
        return False
    try:
        storage.data_ptr()
    except RuntimeError:  # "Attempted to access the data pointer on an invalid python storage"
        return False
    return True


def training_tensors(model: Any, optimizer: Any) -> list[Any]:
    """Tensors alive between steps that training owns: parameters, their gradients, buffers, optimizer state."""
    out: list[Any] = []
    for p in model.parameters():
        out.append(p)
        if p.grad is not None:
            out.append(p.grad)
    out.extend(model.buffers())
    for state in optimizer.state.values():
        out.extend(v for v in state.values() if hasattr(v, "untyped_storage"))
    return out


def meter_for(cuda: bool, model: Any, optimizer: Any) -> LiveTensorPeaks | CudaPeaks:
    """The meter for a measured step: :class:`CudaPeaks` on GPU, else :class:`LiveTensorPeaks`."""
    return CudaPeaks() if cuda else LiveTensorPeaks(training_tensors(model, optimizer))


def merge(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Several measured steps into one figure set: the largest peak per phase and overall."""
    if not results:
        return {}
    out: dict[str, Any] = dict(results[-1])
    for key in ("phase_peaks", "phase_reserved"):
        merged: dict[str, int] = {}
        for r in results:
            for k, v in (r.get(key) or {}).items():
                merged[k] = max(merged.get(k, 0), int(v))
        if merged:
            out[key] = merged
    out["peak_tensor_bytes"] = max(int(r.get("peak_tensor_bytes") or 0) for r in results)
    out["measured_steps"] = len(results)
    for key in ("heap_check", "gpu_library"):
        for r in results:
            if key in r:
                out[key] = r[key]
                break
    return out


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def heap_in_use() -> int:
    """glibc's heap bytes in use (``uordblks + hblkhd`` of ``mallinfo2``), or -1 where there is none."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        fn = libc.mallinfo2
    except (OSError, AttributeError):
        return -1
    fn.restype = _MallInfo2
    info = fn()
    return int(info.uordblks + info.hblkhd)


def current_rss() -> int | None:
    """The process's resident set now (psutil), or None."""
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except Exception:  # noqa: BLE001 (a figure we cannot read is absent, never a failed run)
        return None
