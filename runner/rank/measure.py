"""What a rank measures of its memory: the step collective's three figures, the memory event's ``ranks``
list, the end event's per-rank record, and the bytes autograd saves in one forward."""

from __future__ import annotations

import os
import resource
from typing import Any

import torch
from accelerate.utils import gather_object


def gather_list(items: list[Any]) -> list[Any]:
    """Every rank's ``items``, concatenated in rank order (a collective: every rank calls it)."""
    return list(gather_object(items))


def local_tensor(t: Any) -> Any:
    """A DTensor's local shard, or the tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def local_numel(model: Any) -> int:
    """Elements of the parameters this rank holds (local shards)."""
    return int(sum(local_tensor(p).numel() for p in model.parameters()))


def rss_now() -> int:
    """Resident set size of this process now (Linux /proc; psutil elsewhere)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import psutil

        return int(psutil.Process().memory_info().rss)


class RankMemory:
    """This rank's memory figures: on CUDA the allocator's, on CPU the process RSS.

    Args:
        accelerator: The rank's accelerator (process index and count, device).
        on_cpu: Whether the rank trains on CPU.
        all_devices: One process spreads the model over every visible GPU (its figures sum them).
    """

    def __init__(self, accelerator: Any, on_cpu: bool, all_devices: bool) -> None:
        self.accelerator = accelerator
        self.on_cpu = on_cpu
        self.all_devices = all_devices
        self.rss_baseline: int | None = None
        """The runtime's resident memory before the model exists (the part of RSS training did not add)."""

    def now(self) -> tuple[float, float, float]:
        """This rank's three memory figures for the step collective: on CUDA the allocator's allocated,
        reserved and peak allocated bytes of its device(s); on CPU, where torch keeps no allocator
        statistics, the process RSS now and its peak (getrusage), third slot unused."""
        if not self.on_cpu and torch.cuda.is_available():
            devices = list(range(torch.cuda.device_count())) if self.all_devices else [self.accelerator.device]
            return (float(sum(torch.cuda.memory_allocated(d) for d in devices)),
                    float(sum(torch.cuda.memory_reserved(d) for d in devices)),
                    float(sum(torch.cuda.max_memory_allocated(d) for d in devices)))
        rss = rss_now()  # /proc counts pages, getrusage kilobytes: the peak is at least what is held now
        return float(rss), float(max(rss, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)), 0.0

    def ranks(self, slots: list[float]) -> list[dict[str, Any]]:
        """The ``ranks`` list of a ``memory`` event from the reduced slots (three per rank)."""
        cuda = not self.on_cpu
        ranks: list[dict[str, Any]] = []
        for r in range(len(slots) // 3):
            a, b, c = (int(v) for v in slots[3 * r : 3 * r + 3])
            if cuda:
                ranks.append({"rank": r, "source": "torch.cuda", "allocated_bytes": a, "reserved_bytes": b,
                              "peak_allocated_bytes": c})
            else:
                ranks.append({"rank": r, "source": "rss", "rss_bytes": a, "peak_rss_bytes": b})
        return ranks

    def summary(self, memory: dict[str, Any]) -> list[dict[str, Any]]:
        """The end event's ``ranks``: every rank's ``memory`` record with its peaks (a collective)."""
        mine: dict[str, Any] = {
            "rank": self.accelerator.process_index,
            "pid": os.getpid(),
            **memory,
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "rss_baseline_bytes": self.rss_baseline,
            "source": "psutil/getrusage" if self.on_cpu else "torch.cuda",
        }
        if not self.on_cpu and torch.cuda.is_available():
            # The measured phases reset the allocator's peak; the rest of the run kept counting after.
            mine["peak_allocated_bytes"] = max(torch.cuda.max_memory_allocated(), int(memory.get("peak_tensor_bytes") or 0))
            reserved = (memory.get("phase_reserved") or {}).values()
            mine["peak_reserved_bytes"] = max([torch.cuda.max_memory_reserved(), *reserved])
        if self.accelerator.num_processes == 1:
            return [mine]
        return gather_list([mine])


class SavedBytes:
    """Bytes autograd saves for backward during one forward, parameters excluded.

    The method of ``tests/unit/test_estimate.py``: a ``saved_tensors_hooks`` pack hook sums the unique
    storages (deduplicated by ``data_ptr``) of what is saved. Parameters are recognised by storage while
    their module runs (pre/post forward hooks), which also catches FSDP's all-gathered weights, whose
    memory is freed and can be reused by later activations. On CUDA the allocator's growth across the
    forward is reported too (``activation_alloc_bytes``), which includes what the hooks cannot see
    (e.g. tensors kept by non-reentrant checkpointing).

    Modules in ``compiled`` (ids: the modules of compiled decoder layers) get no hooks, which Dynamo would
    trace into their graphs; their parameters are recognised by the storages they hold when the forward starts.
    """

    def __init__(self, model: Any, device: Any, compiled: frozenset[int] = frozenset()) -> None:
        self.model = model
        self.cuda = getattr(device, "type", "") == "cuda"
        self.compiled = compiled
        self.fixed: set[int] = set()
        """Parameter storages of the compiled modules."""
        self.live: dict[int, int] = {}
        self.seen: dict[int, int] = {}
        self.handles: list[Any] = []
        self.ctx: Any = None
        self.alloc0 = 0
        self.alloc1 = 0

    def _pre(self, module: Any, args: Any) -> None:
        for p in module.parameters(recurse=False):
            ptr = local_tensor(p).untyped_storage().data_ptr()
            self.live[ptr] = self.live.get(ptr, 0) + 1

    def _post(self, module: Any, args: Any, out: Any) -> None:
        for p in module.parameters(recurse=False):
            ptr = local_tensor(p).untyped_storage().data_ptr()
            if self.live.get(ptr, 0) > 1:
                self.live[ptr] -= 1
            else:
                self.live.pop(ptr, None)

    def _pack(self, t: Any) -> Any:
        if isinstance(t, torch.nn.Parameter):
            return t
        storage = local_tensor(t).untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in self.live and ptr not in self.seen and ptr not in self.fixed:
            self.seen[ptr] = int(storage.nbytes())
        return t

    def __enter__(self) -> None:
        for module in self.model.modules():
            if id(module) in self.compiled:
                self.fixed.update(local_tensor(p).untyped_storage().data_ptr() for p in module.parameters(recurse=False))
                continue
            self.handles.append(module.register_forward_pre_hook(self._pre))
            self.handles.append(module.register_forward_hook(self._post))
        if self.cuda:
            torch.cuda.synchronize()
            self.alloc0 = torch.cuda.memory_allocated()
        self.ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self.ctx.__enter__()

    def __exit__(self, *exc: object) -> None:
        self.ctx.__exit__(*exc)
        for handle in self.handles:
            handle.remove()
        self.handles.clear()
        if self.cuda:
            torch.cuda.synchronize()
            self.alloc1 = torch.cuda.memory_allocated()

    def result(self) -> dict[str, Any]:
        out: dict[str, Any] = {"activation_bytes": sum(self.seen.values()),
                               "activation_source": "saved_tensors_hooks (one forward, step 1)"}
        if self.cuda:
            out["activation_alloc_bytes"] = self.alloc1 - self.alloc0
        return out
