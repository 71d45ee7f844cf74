"""The independent memory measurement (runner/rank/memtrack.py) and the rules that read it (runner/spec/summary.py):
live-tensor accounting on CPU, per phase, and "measured" never meaning RSS."""

from __future__ import annotations

import gc
from typing import Any

import pytest
import torch

from runner.rank import memtrack
from runner.service.batch import trial_bytes
from runner.spec.summary import MEASURED_LIVE, busiest_peak, rank_peak, rank_rss, trained_bytes

F32 = 4


def test_live_tensor_peak_sees_allocations_and_frees_per_phase() -> None:
    meter = memtrack.LiveTensorPeaks()
    with meter.phase("forward"):
        a = torch.empty(1000)
        b = torch.empty(2000)
        del a  # freed: the next allocation does not raise the peak above a + b
        c = torch.empty(500)
    assert meter.peak == 3000 * F32
    assert meter.live == 2500 * F32
    with meter.phase("backward"):
        d = torch.empty(100)
    result = meter.result()
    assert result["phase_peaks"] == {"forward": 3000 * F32, "backward": 2600 * F32}
    assert result["memory_source"] == memtrack.LIVE_TENSOR_SOURCE
    del b, c, d
    assert meter.live == 0


def test_views_count_once_and_in_place_resizes_are_seen() -> None:
    meter = memtrack.LiveTensorPeaks()
    with meter.phase("forward"):
        x = torch.zeros(1000)
        v = x[:10].view(2, 5)  # a view shares the storage
        assert meter.live == 1000 * F32
        x.untyped_storage().resize_(0)  # FSDP frees unsharded parameters this way
        assert meter.live == 0
        x.untyped_storage().resize_(400 * F32)
        assert meter.live == 400 * F32
    assert meter.peak == 1000 * F32
    del v


def test_tensors_alive_before_the_step_are_seeded_and_saved_tensors_stay_live() -> None:
    weight = torch.nn.Parameter(torch.randn(64, 64))
    meter = memtrack.LiveTensorPeaks([weight])
    assert meter.live == 64 * 64 * F32
    with meter.phase("forward"):
        x = torch.randn(8, 64, requires_grad=True)
        h = (x @ weight).sin()  # the matmul output is saved by sin for backward
        loss = h.sum()
        del h
    saved_live = meter.live
    with meter.phase("backward"):
        loss.backward()
    del loss
    # Backward released what the forward saved; the peak of the backward includes the gradients.
    assert meter.live < saved_live + 64 * 64 * F32
    assert meter.result()["phase_peaks"]["backward"] >= saved_live


def test_frozen_meter_ignores_later_allocations() -> None:
    meter = memtrack.LiveTensorPeaks()
    with meter.phase("forward"):
        keep = torch.empty(100)
    first = meter.result()
    later = torch.empty(10_000)  # outside any phase: not an op the mode sees
    assert meter.result()["peak_tensor_bytes"] == first["peak_tensor_bytes"] == 100 * F32
    del keep, later


def test_merge_keeps_the_largest_peak_of_each_phase() -> None:
    one = {"peak_tensor_bytes": 10, "phase_peaks": {"forward": 8, "backward": 10, "optimizer": 6},
           "memory_source": memtrack.LIVE_TENSOR_SOURCE, "heap_check": {"x": 1}}
    two = {"peak_tensor_bytes": 12, "phase_peaks": {"forward": 11, "backward": 12, "optimizer": 5},
           "memory_source": memtrack.LIVE_TENSOR_SOURCE}
    merged = memtrack.merge([one, two])
    assert merged["peak_tensor_bytes"] == 12
    assert merged["phase_peaks"] == {"forward": 11, "backward": 12, "optimizer": 6}
    assert merged["measured_steps"] == 2 and merged["heap_check"] == {"x": 1}
    assert memtrack.merge([]) == {}


def test_the_heap_beyond_the_tensors_is_a_bounded_library_cache() -> None:
    """What the trainer stores beside the peak: glibc's heap growth against the tensors' over the measured span."""
    from transformers import AutoModelForCausalLM

    from runner.spec.builtin import tiny_llama_config

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_llama_config())
    optimizer = torch.optim.AdamW(model.parameters())
    ids = torch.randint(0, 4000, (2, 256))
    model(input_ids=ids, labels=ids).loss.backward()  # the autograd engine's first-use allocations
    model.zero_grad(set_to_none=True)
    cycle: list[object] = [bytearray(8 * 2**20)]  # garbage from before the span, in a cycle: only the collector frees it
    cycle.append(cycle)
    del cycle
    meter = memtrack.meter_for(False, model, optimizer)
    with meter.phase("forward"):
        gc.collect()  # a collection inside the span (the collector runs when it likes): frees nothing from before
        loss = model(input_ids=ids, labels=ids).loss
    with meter.phase("backward"):
        loss.backward()
    result = meter.result()
    check = result["heap_check"]
    grads = sum(p.numel() * 4 for p in model.parameters())
    assert check["tensor_growth_bytes"] == pytest.approx(grads, rel=0.01)  # the gradients, alive after the backward
    # The heap holds what the tensors hold, and the library's caches beside them (tens of MiB, not hundreds).
    assert check["beyond_tensors_bytes"] == check["heap_growth_bytes"] - check["tensor_growth_bytes"]
    assert 0 <= check["beyond_tensors_bytes"] < 64 * 2**20
    params = sum(p.numel() * 4 for p in model.parameters())
    assert result["phase_peaks"]["backward"] > params + check["tensor_growth_bytes"]


def _rank(**kw: Any) -> dict[str, Any]:
    return {"rank": 0, "param_bytes": 10, "grad_bytes": 1, "optimizer_bytes": 2, **kw}


def test_measured_peak_is_the_independent_measurement_never_rss() -> None:
    cpu = _rank(peak_tensor_bytes=500, peak_rss_bytes=900_000_000, rss_baseline_bytes=300_000_000,
                activation_bytes=100)
    assert rank_peak(cpu) == (500, MEASURED_LIVE)
    assert rank_rss(cpu) == (900_000_000, 300_000_000)
    gpu = _rank(peak_allocated_bytes=700, peak_tensor_bytes=650, peak_rss_bytes=2_000_000_000)
    assert rank_peak(gpu)[0] == 700 and "CUDA" in rank_peak(gpu)[1]
    rss_only = _rank(peak_rss_bytes=900_000_000)
    assert rank_peak(rss_only) == (None, "not measured")
    assert busiest_peak([cpu, _rank(peak_tensor_bytes=800)]) == (800, MEASURED_LIVE)


def test_the_batch_finder_fits_against_the_measured_peak() -> None:
    ranks = [_rank(peak_tensor_bytes=5000, activation_bytes=100), _rank(peak_tensor_bytes=7000, activation_bytes=100)]
    assert trial_bytes(ranks) == 7000
    assert trained_bytes(ranks[0]) == 5000
    # A summary from before the measurement existed: model states plus saved activations.
    assert trial_bytes([_rank(activation_bytes=100)]) == 113
    assert trial_bytes([_rank()]) is None


def test_storages_without_memory_of_their_own_are_not_counted() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch._subclasses.functional_tensor import FunctionalTensor, FunctionalTensorMode

    with FakeTensorMode():
        fake = torch.empty(256, 256)  # reports cpu; its storage is on meta
    with FunctionalTensorMode():
        functional = FunctionalTensor.to_functional(fake)  # a wrapper: a storage with no data pointer
    real = torch.empty(256, 256)
    freed = torch.empty(256, 256)
    freed.untyped_storage().resize_(0)  # FSDP's freed unsharded parameter: a real storage, empty now
    assert str(fake.device) == "cpu" and str(functional.device) == "cpu"
    assert not memtrack.holds_memory(fake.untyped_storage())
    assert not memtrack.holds_memory(functional.untyped_storage())
    assert not memtrack.holds_memory(torch.empty(256, device="meta").untyped_storage())
    assert memtrack.holds_memory(real.untyped_storage()) and memtrack.holds_memory(freed.untyped_storage())
    meter = memtrack.LiveTensorPeaks([fake, functional, real])
    assert meter.live == 256 * 256 * F32


@pytest.fixture()
def one_process_group(tmp_path: Any) -> Any:
    """A gloo process group of this process alone (DDP needs one)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


class _Block(torch.nn.Module):
    """A residual MLP, as a decoder layer's: what each compiled graph is."""

    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(64, 512), torch.nn.Linear(512, 64)

    def forward(self, x: Any) -> Any:
        return x + self.down(torch.relu(self.up(x)))


def _ddp_step(compiled: bool) -> tuple[int, int, int]:
    """One measured step of a frozen layer and two blocks under DDP: the meter's peak and live bytes after it,
    and the bytes training holds then (weights, bucketed grads, Adam's state), read by a fresh meter (while
    the model lives: the meter subtracts what is freed)."""
    import gc

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), _Block(), _Block())
    model[0].requires_grad_(False)  # frozen, as a LoRA base weight
    if compiled:
        for block in model[1:]:
            block.compile(backend="aot_eager")  # AOTAutograd's tracing, without inductor's C++ build
    ddp = torch.nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=True)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    meter = memtrack.LiveTensorPeaks(memtrack.training_tensors(model, optimizer))
    with meter.phase("forward"):
        loss = ddp(torch.randn(32, 64)).square().mean()
    with meter.phase("backward"):
        loss.backward()
    with meter.phase("optimizer"):
        optimizer.step()
    del loss
    gc.collect()
    return meter.peak, meter.live, memtrack.LiveTensorPeaks(memtrack.training_tensors(model, optimizer)).live


def test_layers_compiled_inside_ddp_leave_nothing_counted_but_training(one_process_group: Any) -> None:
    """Dynamo compiles a layer met inside DDP's forward through its DDPOptimizer, with the meter's dispatch mode
    active: the FakeTensors and FunctionalTensors it traces with pass through the meter, and the graphs keep
    the fake ones alive. The meter counts what training holds, and a compiled step peaks no higher than the
    eager one (the partitioner recomputes the ReLU rather than keep it)."""
    peak, live, held = _ddp_step(compiled=True)
    assert live == held
    eager_peak, eager_live, _ = _ddp_step(compiled=False)
    assert eager_live == held and peak <= eager_peak


def test_the_dump_names_what_made_each_storage_alive_at_the_peak(tmp_path: Any, monkeypatch: Any) -> None:
    import json

    dump = tmp_path / "dump.jsonl"
    monkeypatch.setenv("FTUI_MEMTRACK_DUMP", str(dump))
    w = torch.ones(8, 4)
    meter = memtrack.LiveTensorPeaks(seed=[w])
    with meter.phase("forward"):
        y = torch.mm(torch.ones(16, 8), w)  # the mm's output (16, 4) and its input (16, 8) at the peak
        del y
    meter.result()
    entry = json.loads(dump.read_text().splitlines()[0])
    alive = {tuple(x) for x in entry["phases"]["forward"]}
    assert (16 * 8 * F32, "aten.ones.default (16, 8) torch.float32") in alive
    assert (16 * 4 * F32, "aten.mm.default (16, 4) torch.float32") in alive
    assert (8 * 4 * F32, "before the step (8, 4) torch.float32") in alive
