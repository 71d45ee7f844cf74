"""The accelerate engine: a model and optimizer that accelerate prepares (one process, DDP, FSDP1/2, the
torch ZeRO-2/3 stages as FSDP2, and ``mp`` in one process over the visible GPUs).

Also the rank's :class:`accelerate.Accelerator` (:func:`make_accelerator`), which every engine uses for its
process group and autocast.
"""

from __future__ import annotations

import contextlib
import math
import os
from typing import TYPE_CHECKING, Any

import torch

from runner.rank import compiling, gpu_switches, memtrack, sharding
from runner.rank.checkpointing import Checkpointer, save_accelerated
from runner.rank.engine import Engine, MicroBatch, StepResult
from runner.rank.measure import SavedBytes, local_numel
from runner.rank.model_load import device_map, input_device
from runner.spec import events as ev
from runner.spec import layout, zero

if TYPE_CHECKING:
    from runner.rank.context import DataShape, Setup
    from runner.spec.recipe import Recipe
    from runner.spec.strategies import Strategy


def make_accelerator(recipe: Recipe, strategy: Strategy, on_cpu: bool) -> Any:
    """The rank's accelerator for ``strategy``: DDP's bucket views, DeepSpeed's gloo process group on CPU,
    FSDP made real on CPU."""
    from accelerate import Accelerator  # deferred: accelerate imports transformers' stack
    from accelerate.utils import DistributedDataParallelKwargs, InitProcessGroupKwargs

    launch, train = recipe.launch, recipe.train
    cpu = on_cpu
    if cpu and strategy.takes_fsdp_version and launch.fsdp_version == 1:
        os.environ["ACCELERATE_TORCH_DEVICE"] = "cpu"
    mixed = train.accelerate_mixed_precision
    # Gradients as views into DDP's buckets: without it each rank holds the gradients twice (the
    # parameters' .grad and the reducer's flat buckets), +w bytes per trainable parameter
    # (PyTorch DDP docs, ``gradient_as_bucket_view``; docs/memory-model.md). Only DDP reads it.
    handlers: list[Any] = [DistributedDataParallelKwargs(gradient_as_bucket_view=True)]
    if strategy.accelerate_type == "DEEPSPEED":
        # cpu=True would skip DeepSpeed altogether; on CPU its process group must be gloo (docs/zero.md).
        handlers += [InitProcessGroupKwargs(backend="gloo")] if cpu else []
        if cpu:
            sharding.skip_shm_comm_build()
        cpu = False
    sizes = layout.mesh(recipe)  # hsdp: (replicate, shard)
    if cpu and sizes is not None:
        # accelerate refuses a ParallelismConfig on CPU processes (MULTI_CPU) before FSDP can be made real there:
        # the Accelerator is made without the one `accelerate launch` exported, and given it once FSDP is.
        os.environ.pop("ACCELERATE_USE_PARALLELISM_CONFIG", None)
    given = _parallelism_config(sizes) if sizes is not None and not cpu else None
    # Context parallelism (launch.cp_size): accelerate's cp mesh over the whole world (runner/rank/gpu_switches.py).
    given = given or gpu_switches.parallelism_config(recipe, layout.world_size(recipe))
    accelerator = Accelerator(cpu=cpu, mixed_precision=mixed, kwargs_handlers=handlers, parallelism_config=given)
    if cpu and strategy.accelerate_type == "FSDP":
        _force_fsdp_on_cpu(accelerator, launch.fsdp_version if strategy.takes_fsdp_version else 2, mixed)
        sharding.force_fsdp_offload_unpinned(getattr(accelerator.state, "fsdp_plugin", None))
        if sizes is not None:
            _install_mesh(accelerator, _parallelism_config(sizes))
    return accelerator


def _parallelism_config(sizes: layout.Mesh) -> Any:
    """accelerate's ParallelismConfig of an hsdp mesh: ``dp_replicate`` x ``dp_shard``. Its FSDP2 prepare
    passes ``mesh["dp_replicate", "dp_shard_cp"]`` to every ``fully_shard`` (accelerate/utils/fsdp_utils.py
    ``fsdp2_prepare_model``), so each parameter is a DTensor placed (Replicate(), Shard(0)) on that mesh."""
    from accelerate.parallelism_config import ParallelismConfig

    return ParallelismConfig(dp_replicate_size=sizes[0], dp_shard_size=sizes[1])


def _install_mesh(accelerator: Any, config: Any) -> None:
    """Give a CPU accelerator, once FSDP is in effect, the ParallelismConfig that its constructor would
    have taken on a GPU, as the constructor does (accelerate/accelerator.py): the state keeps the config and
    its device mesh (``init_device_mesh("cpu", ...)``, gloo), then the config checks the accelerator (its
    sizes against the processes; a dimension to shard over)."""
    state = accelerator.state
    state.parallelism_config = config
    state.device_mesh = config.get_device_mesh(accelerator.device.type)
    config._validate_accelerator(accelerator)


def _force_fsdp_on_cpu(accelerator: Any, version: int, mixed: str) -> None:
    """Make FSDP real on CPU. accelerate only switches to FSDP for GPU-like devices and silently runs
    plain multi-CPU DDP otherwise; setting the plugin and the distributed type on both state objects
    before ``prepare`` gives real sharding over gloo (docs/cpu-facts.md). The plugin reads the FSDP_*
    variables that ``accelerate launch`` exported from the generated config."""
    from accelerate import FullyShardedDataParallelPlugin
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    if accelerator.distributed_type not in (DistributedType.MULTI_CPU, DistributedType.NO):
        return
    if accelerator.num_processes < 2 and accelerator.distributed_type == DistributedType.NO:
        return  # one process: there is nothing to shard over; the start event says NO
    os.environ.setdefault("FSDP_VERSION", str(version))
    plugin = FullyShardedDataParallelPlugin(fsdp_version=version)
    if mixed != "no":
        plugin.set_mixed_precision(mixed)
    state = AcceleratorState()
    state.fsdp_plugin = plugin
    state.distributed_type = DistributedType.FSDP
    PartialState().distributed_type = DistributedType.FSDP


class AccelerateEngine(Engine):
    """A model (and optimizer) prepared by accelerate; every process is a data parallel replica."""

    def __init__(self, setup: Setup) -> None:
        replicas, replica = gpu_switches.data_replica(setup.accelerator)  # CP: a sequence's group shares its rows
        super().__init__(setup, replicas=replicas, replica=replica)
        self.sharding: dict[str, Any] = {}
        self.offloaded = False  # the first forward's saved tensors went to the host (activation offload)
        self.activations: dict[str, Any] = {}
        self.compute_dtype: sharding.ComputeDtype | None = None
        self.compiled: frozenset[int] = frozenset()
        """The modules of compiled decoder layers (no measuring hook goes on them)."""

    def preparing_detail(self) -> str:
        acc = self.setup.accelerator
        return f"{super().preparing_detail()} ({acc.distributed_type.value})"

    def build(self, model: Any, trainable: list[Any]) -> tuple[Any, Any]:
        """The prepared ``(model, optimizer)``: torch's AdamW over ``trainable``."""
        train = self.setup.recipe.train
        optimizer = torch.optim.AdamW(trainable, lr=train.lr, weight_decay=train.weight_decay)
        return self.setup.accelerator.prepare(model, optimizer)  # type: ignore[no-any-return]

    def prepare(self, model: Any, shape: DataShape) -> None:
        setup = self.setup
        if setup.recipe.train.precision == "fp8":  # Float8Linear keeps each Linear's parameters
            model = gpu_switches.convert_fp8(model)
        trainable = [p for p in model.parameters() if p.requires_grad]
        self.model, self.optimizer = model, optimizer = self.build(model, trainable)
        # What really runs, read from the prepared objects; a run that became something else stops here.
        self.sharding = sharding.in_effect(model, optimizer, setup.accelerator)
        wrong = (zero.mismatch(setup.strategy, setup.recipe.launch.offload, self.sharding)
                 or layout.mesh_mismatch(setup.recipe, self.sharding))
        if wrong:
            raise RuntimeError(wrong)
        self.checkpointer = Checkpointer(setup, model, shape)
        if setup.strategy.loads_over_devices:
            self.input_device = input_device(model)
        self.compiled = compiling.compiled_modules(model)
        self.compute_dtype = sharding.ComputeDtype(model, self.compiled)

    def describe(self, start: ev.StartEvent) -> None:
        setup = self.setup
        kind = setup.accelerator.distributed_type.value
        start["distributed_type"] = kind
        start["fsdp_version"] = setup.recipe.launch.fsdp_version if kind == "FSDP" else None
        start["local_param_numel"] = local_numel(self.model)
        start["device_map"] = device_map(self.model) if setup.strategy.loads_over_devices else None
        start["engine"] = setup.strategy.engine
        start["sharding"] = self.sharding

    def register_scheduler(self, scheduler: Any) -> None:
        # Not prepared: accelerate's scheduler wrapper steps once per process, which would make the lr
        # curve depend on the world size. Registered, so that save_state/load_state carry it.
        self.setup.accelerator.register_for_checkpointing(scheduler)

    def meter(self) -> memtrack.LiveTensorPeaks | memtrack.CudaPeaks:
        return memtrack.meter_for(not self.setup.on_cpu, self.model, sharding.inner_optimizer(self.optimizer))

    def zero_loss(self) -> Any:
        return torch.zeros((), device=self.setup.accelerator.device)

    def no_sync(self, batch: MicroBatch) -> contextlib.AbstractContextManager[Any]:
        """Where gradients are not synchronised: every micro-step but the last. The backward must run
        inside too: FSDP (1 and 2) reads the sync flag while reducing gradients in backward, DDP at
        forward time."""
        if batch.last:
            return contextlib.nullcontext()
        return self.setup.accelerator.no_sync(self.model)  # type: ignore[no-any-return]

    def backward(self, loss: Any, batch: MicroBatch) -> None:
        """Backward of one micro-step's weighted loss."""
        self.setup.accelerator.backward(loss)

    def forward_backward(self, batch: MicroBatch, peaks: memtrack.Meter) -> Any:
        acc = self.setup.accelerator
        device = self.input_device
        inputs: dict[str, Any] = {"input_ids": batch.input_ids.to(device)}
        if batch.attention_mask is not None:
            inputs["attention_mask"] = batch.attention_mask.to(device)
        inputs["labels"] = batch.labels.to(device)
        # One forward (the run's first micro-step) measures what autograd saves and the compute dtype.
        saved = SavedBytes(self.model, acc.device, self.compiled) if batch.first else contextlib.nullcontext()
        compute = self.compute_dtype if batch.first and self.compute_dtype is not None else contextlib.nullcontext()
        recipe = self.setup.recipe
        with self.no_sync(batch), gpu_switches.step_context(recipe, acc, inputs):
            with peaks.phase("forward"), acc.autocast(), saved, compute, gpu_switches.forward_context(recipe):
                if batch.first:
                    self.offloaded = gpu_switches.saved_to_host()
                # Only the loss is kept: holding the output would keep the logits alive through
                # backward and into the next forward (docs/memory-model.md).
                loss = self.model(**inputs).loss
                # Masked labels (data.train_on = "completions"): rows learn different numbers of tokens, so
                # the loss is token-weighted over the whole optimizer step, and one process, DDP and FSDP at
                # the same global batch compute the same update.
                if batch.step_learned:
                    loss = loss * (batch.learned * self.replicas / batch.step_learned)
                else:
                    loss = loss / batch.accumulation
            if isinstance(saved, SavedBytes):
                self.activations = saved.result()
            with peaks.phase("backward"):
                self.backward(loss, batch)
        return loss.detach().to(acc.device)

    def clip_and_step(self, max_grad_norm: float, grad_sq: float) -> StepResult:
        grad_norm = None
        if max_grad_norm > 0:
            grad_norm = float(self.setup.accelerator.clip_grad_norm_(self.model.parameters(), max_grad_norm))
            if not math.isfinite(grad_norm):  # global norm: the same on every rank
                return StepResult(grad_norm=grad_norm, stepped=False)
        self.optimizer.step()
        return StepResult(grad_norm=grad_norm, stepped=True)

    def state_bytes(self) -> dict[str, Any]:
        return {**sharding.state_bytes(self.model, self.optimizer), **self.activations}

    def precision(self) -> dict[str, Any] | None:
        compute = self.compute_dtype.result() if self.compute_dtype is not None else None
        return {**sharding.precision_in_effect(self.model, self.optimizer, compute),
                "switches": gpu_switches.in_effect(self.model, self.setup.accelerator, self.offloaded)}

    def loss_scale(self) -> float | None:
        return sharding.loss_scale(self.model, self.setup.accelerator)

    def save(self) -> str:
        return save_accelerated(self.setup, self.model)
