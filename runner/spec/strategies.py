"""Strategies are data: one table from a name to how it is launched, what it shards and its rules.

Everything strategy-shaped reads this table: the recipe validator (names, process counts), the CLI's
``--strategy`` choices, the sweep, the planner (what is sharded), Compose's choices, compare's global
batch and the pre-flight. Adding a strategy means adding a row here, plus whatever the trainer does to
prepare the model for it; no list of strategy names is written anywhere else.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

Shard = str
"""What a strategy divides over its processes: ``optimizer`` (optimizer state and fp32 master),
``grads``, ``params`` (tensor parallel: a slice of each sharded matrix, with its gradient and
optimizer state); or ``layers`` (model and pipeline parallel: each device holds a slice of the layers)."""

OFFLOADS: tuple[str, ...] = ("none", "optimizer", "optimizer+params", "nvme")
"""``launch.offload`` values: what lives in host memory (``nvme``: on an NVMe folder) instead of the device."""


@dataclass(frozen=True)
class Engine:
    """One engine that implements a strategy (the ZeRO stages have two), and what the run must show."""

    name: str
    """``deepspeed`` or ``torch`` (``launch.engine``)."""
    accelerate_type: str
    """``distributed_type`` of the generated accelerate config."""
    expect: frozenset[str]
    """accelerate ``DistributedType`` values the trainer may report (see :attr:`Strategy.expect`)."""
    how: str
    """What it is in the engine's own terms (recorded and checked from inside the trainer)."""
    offloads: tuple[str, ...] = ("none",)
    """The ``launch.offload`` values it implements."""
    stage: int | None = None
    """The ZeRO stage (DeepSpeed's ``zero_optimization.stage``; for torch, the stage it stands for)."""
    checkpoints: bool = False
    """Whether the trainer's checkpoints (accelerate ``save_state``) hold everything of its run."""
    wraps_in_ddp: bool = False
    """The model is wrapped in ``DistributedDataParallel`` (a replica per process, gradient buckets)."""
    zero_redundancy_optimizer: bool = False
    """torch's ``ZeroRedundancyOptimizer`` shards the optimizer state (accelerate prepares the model alone)."""
    keeps_gathered: bool = False
    """FSDP2 ``reshard_after_forward=False``: weights sharded at rest, each layer gathered from its forward
    to its backward."""
    offloads_grads: bool = False
    """Offload moves the sharded gradients to the host with the parameters (FSDP's ``CPUOffloadPolicy``)."""
    compile_refused: str | None = None
    """Why ``train.compile`` is refused under this engine (None: the trainer compiles each decoder layer)."""


@dataclass(frozen=True)
class Strategy:
    """How one strategy is launched, what it shards, and what must be in effect once it runs."""

    name: str
    title: str
    description: str
    engine: str
    """What implements it: ``accelerate`` (its own launch types), ``deepspeed``, ``torch``."""
    accelerate_type: str | None
    """``distributed_type`` written into the generated accelerate config (None: not launchable)."""
    expect: frozenset[str]
    """accelerate ``DistributedType`` values the trainer may report for this strategy; anything
    else means the launch silently became something else, and the run is failed."""
    shards: frozenset[Shard]
    """What is divided over the processes (see :data:`Shard`); empty for a replica per process."""
    data_parallel: bool
    """Each process trains its own micro-batch, so the global batch is micro x accumulation x processes."""
    min_procs: int
    max_procs: int | None
    min_procs_cpu: int
    """At least this many processes on a CPU-only machine (FSDP needs two to shard over there)."""
    launchable: bool = True
    """Whether ``ftui run`` can launch it; otherwise the planner still estimates it."""
    not_launchable: str | None = None
    """Why not, when it is not launchable (one sentence)."""
    engines: tuple[Engine, ...] = ()
    """Engines to choose from with ``launch.engine`` (the first is the default); empty: ``engine`` alone."""

    default_nproc: int | None = None
    """Processes when none is asked for (``ftui run --strategy``); None: one per visible GPU, at least 2."""
    pipeline_from: int | None = None
    """From this many processes on, the run is a pipeline of stages, one per process, trained by
    :mod:`runner.rank.pipeline` (``torch.distributed.pipelining``) instead of accelerate's prepared model."""
    microbatches: int | None = None
    """Micro-batches per pipeline step fixed by the strategy (naive model parallel: 1, so exactly one
    stage works at a time); None: ``launch.microbatches``."""
    tensor_parallel: bool = False
    """Each process holds a slice of every sharded weight matrix (:mod:`runner.rank.tensor_parallel`)."""
    hybrid: bool = False
    """Hybrid sharding: FSDP2 over a 2-D mesh of ``launch.replicate`` groups of ``launch.shard`` processes;
    each group shards what :attr:`shards` names over its own processes only, and the groups are replicas
    (gradients reduce-scattered within a group, then all-reduced across the groups). The mesh:
    :func:`runner.spec.layout.hsdp_mesh`."""
    loads_over_devices: bool = False
    """The model loads spread over the visible GPUs (``device_map="auto"``), its inputs on the first one."""
    takes_fsdp_version: bool = False
    """``launch.fsdp_version`` picks FSDP1 or FSDP2 (the torch ZeRO stages are FSDP2 always)."""
    checkpoints: bool = True
    """Whether the trainer's checkpoints (accelerate ``save_state``) hold everything of its run (the ZeRO
    rows: as their engine says)."""
    wraps_in_ddp: bool = False
    """See :attr:`Engine.wraps_in_ddp` (the ZeRO rows: as their engine says)."""
    zero_redundancy_optimizer: bool = False
    """See :attr:`Engine.zero_redundancy_optimizer`."""
    keeps_gathered: bool = False
    """See :attr:`Engine.keeps_gathered`."""
    offloads_grads: bool = False
    """See :attr:`Engine.offloads_grads`."""
    compile_refused: str | None = None
    """See :attr:`Engine.compile_refused` (the ZeRO rows: as their engine says)."""

    def engine_names(self) -> tuple[str, ...]:
        """The ``launch.engine`` values this strategy takes (``auto`` picks the first)."""
        return tuple(e.name for e in self.engines) or (self.engine,)

    def with_engine(self, engine: str) -> Strategy:
        """This row as run by ``engine`` (``auto``: the default): its accelerate type, expectations and
        engine name replaced by that engine's. ``KeyError`` for an engine the row does not take."""
        if not self.engines:
            if engine not in ("auto", self.engine):
                raise KeyError(f"strategy {self.name!r} runs on {self.engine} only, not {engine!r}")
            return self
        chosen = self.engines[0] if engine == "auto" else next((e for e in self.engines if e.name == engine), None)
        if chosen is None:
            raise KeyError(f"strategy {self.name!r} runs on {choices_text(self.engine_names())}, not {engine!r}")
        return replace(self, engine=chosen.name, accelerate_type=chosen.accelerate_type, expect=chosen.expect,
                       checkpoints=chosen.checkpoints, wraps_in_ddp=chosen.wraps_in_ddp,
                       zero_redundancy_optimizer=chosen.zero_redundancy_optimizer,
                       keeps_gathered=chosen.keeps_gathered, offloads_grads=chosen.offloads_grads,
                       compile_refused=chosen.compile_refused)

    def engine_row(self, engine: str | None = None) -> Engine | None:
        """The :class:`Engine` that runs this row (as resolved by :meth:`with_engine`), or that runs it under
        ``engine``; None for a one-engine row."""
        name = self.engine if engine is None else self.with_engine(engine).engine
        return next((e for e in self.engines if e.name == name), None)

    def pipelined(self, nproc: int) -> bool:
        """Whether a run of ``nproc`` processes trains as a pipeline (:mod:`runner.rank.pipeline`)."""
        return self.pipeline_from is not None and nproc >= self.pipeline_from

    @property
    def own_loop(self) -> bool:
        """Whether some nproc trains outside accelerate's prepared model (pipeline or tensor parallel)."""
        return self.pipeline_from is not None or self.tensor_parallel

    @property
    def layer_split(self) -> bool:
        """Model parallel: the layers spread over devices (one process over the visible GPUs, or one
        stage per process when :meth:`pipelined`)."""
        return "layers" in self.shards

    def nproc_problem(self, nproc: int, on_cpu: bool = False) -> str | None:
        """What is wrong with running this strategy on ``nproc`` processes (None: nothing)."""
        if self.max_procs == 1 and nproc != 1:
            return f"strategy {self.name!r} runs one process, got nproc = {nproc}"
        if nproc < self.min_procs:
            return f"strategy {self.name!r} needs at least {self.min_procs} processes"
        if self.max_procs is not None and nproc > self.max_procs:
            return f"strategy {self.name!r} runs at most {self.max_procs} processes, got nproc = {nproc}"
        if on_cpu and nproc < self.min_procs_cpu:
            return f"{self.name} on CPU needs at least {self.min_procs_cpu} processes to shard over"
        return None

    def procs(self, requested: int | None, default: int) -> int:
        """Processes to run with: one for a one-process strategy, else ``requested`` or ``default``."""
        if self.max_procs == 1:
            return 1
        if requested is None and self.default_nproc is not None:
            return self.default_nproc
        return max(self.min_procs, requested if requested is not None else default)

    def global_batch(self, micro_batch: int, grad_accum: int, nproc: int, tp_size: int | None = None) -> int:
        """Rows per optimizer step over every process (tensor parallel: one batch per group of
        ``tp_size`` processes, default all of them)."""
        if self.tensor_parallel:
            return micro_batch * grad_accum * max(1, nproc // (tp_size or nproc))
        return micro_batch * grad_accum * (nproc if self.data_parallel else 1)


_DDP_TYPES = frozenset({"MULTI_GPU", "MULTI_CPU"})

_NO_COMPILE_DEEPSPEED = "DeepSpeed wraps the model in an engine of its own, which ftui does not compile"
_NO_COMPILE_SPLIT = "the layers are split over processes or devices, and their parts are not compiled"


def _zero_engines(stage: int) -> tuple[Engine, ...]:
    """DeepSpeed's ZeRO stage ``stage``, and the same sharding with PyTorch alone (docs/zero.md)."""
    deepspeed = Engine("deepspeed", "DEEPSPEED", frozenset({"DEEPSPEED"}), f"DeepSpeed ZeRO stage {stage}",
                       offloads=OFFLOADS if stage == 3 else ("none", "optimizer"), stage=stage,
                       compile_refused=_NO_COMPILE_DEEPSPEED)
    if stage == 1:
        torch = Engine("torch", "MULTI_GPU", _DDP_TYPES, "DDP + ZeroRedundancyOptimizer", stage=1,
                       wraps_in_ddp=True, zero_redundancy_optimizer=True, offloads_grads=True)
    else:
        # FSDP2 offloads parameters, gradients and optimizer state together (CPUOffloadPolicy): no
        # optimizer-only offload there.
        torch = Engine("torch", "FSDP", frozenset({"FSDP"}),
                       "FSDP2 fully_shard(reshard_after_forward=False)" if stage == 2 else "FSDP2 fully_shard",
                       offloads=("none", "optimizer+params"), stage=stage, checkpoints=True,
                       keeps_gathered=stage == 2, offloads_grads=True)
    return deepspeed, torch

def _zero(stage: int, description: str, shards: tuple[str, ...]) -> Strategy:
    """ZeRO stage ``stage``: DeepSpeed by default, PyTorch's own sharding as its second engine."""
    return Strategy(
        name=f"zero{stage}",
        title=f"ZeRO stage {stage}",
        description=description,
        engine="deepspeed",
        accelerate_type="DEEPSPEED",
        expect=frozenset({"DEEPSPEED"}),
        shards=frozenset(shards),
        data_parallel=True,
        min_procs=1,
        max_procs=None,
        min_procs_cpu=2,
        checkpoints=False,
        engines=_zero_engines(stage),
        compile_refused=_NO_COMPILE_DEEPSPEED,
    )


STRATEGIES: dict[str, Strategy] = {
    s.name: s
    for s in (
        Strategy(
            name="single",
            title="Single device",
            description="one process on one device",
            engine="accelerate",
            accelerate_type="NO",
            expect=frozenset({"NO"}),
            shards=frozenset(),
            data_parallel=False,
            min_procs=1,
            max_procs=1,
            min_procs_cpu=1,
            default_nproc=1,
        ),
        Strategy(
            name="mp",
            title="Naive model parallel",
            description='the layers split over devices, one micro-batch, so one device works at a time: with '
            'one process, over the visible GPUs (device_map="auto"); with N processes, one stage per '
            "process (torch.distributed.pipelining, gloo on CPU)",
            engine="torch",
            accelerate_type="NO",
            expect=frozenset({"NO", "PIPELINE"}),
            shards=frozenset({"layers"}),
            data_parallel=False,
            min_procs=1,
            max_procs=None,
            min_procs_cpu=1,
            default_nproc=1,
            pipeline_from=2,
            microbatches=1,
            loads_over_devices=True,
            checkpoints=False,
            compile_refused=_NO_COMPILE_SPLIT,
        ),
        Strategy(
            name="pp",
            title="Pipeline parallel",
            description="one stage of layers per process, the batch cut into launch.microbatches micro-batches "
            "that flow through the stages (launch.pp_schedule: GPipe or 1F1B; torch.distributed.pipelining)",
            engine="torch",
            accelerate_type="MULTI_GPU",
            expect=frozenset({"PIPELINE"}),
            shards=frozenset({"layers"}),
            data_parallel=False,
            min_procs=2,
            max_procs=None,
            min_procs_cpu=2,
            pipeline_from=2,
            checkpoints=False,
            compile_refused=_NO_COMPILE_SPLIT,
        ),
        Strategy(
            name="ddp",
            title="Distributed data parallel",
            description="a full replica per process, gradients all-reduced (NCCL on GPU, gloo on CPU)",
            engine="accelerate",
            accelerate_type="MULTI_GPU",
            expect=frozenset({"MULTI_GPU", "MULTI_CPU"}),
            shards=frozenset(),
            data_parallel=True,
            min_procs=2,
            max_procs=None,
            min_procs_cpu=2,
            wraps_in_ddp=True,
        ),
        Strategy(
            name="fsdp",
            title="Fully sharded data parallel",
            description="parameters, gradients and optimizer state sharded over the processes",
            engine="accelerate",
            accelerate_type="FSDP",
            expect=frozenset({"FSDP"}),
            shards=frozenset({"optimizer", "grads", "params"}),
            data_parallel=True,
            min_procs=1,
            max_procs=None,
            min_procs_cpu=2,
            takes_fsdp_version=True,
        ),
        Strategy(
            name="hsdp",
            title="Hybrid sharded data parallel",
            description="FSDP2 on a 2-D mesh: parameters, gradients and optimizer state sharded within each "
            "group of launch.shard processes, the launch.replicate groups replicas of each other (gradients "
            "all-reduced across them); several machines: a group per machine",
            engine="accelerate",
            accelerate_type="FSDP",
            expect=frozenset({"FSDP"}),
            shards=frozenset({"optimizer", "grads", "params"}),
            data_parallel=True,
            # Two replicas of two shards: one fewer is FSDP (one group) or DDP (groups of one).
            min_procs=4,
            max_procs=None,
            min_procs_cpu=4,
            hybrid=True,
        ),
        Strategy(
            name="tp",
            title="Tensor parallel",
            description="every decoder layer's weight matrices split over launch.tp_size processes "
            "(torch DTensor: column- then row-wise), the same batch on each; nproc / tp_size such groups "
            "train side by side as data parallel replicas",
            engine="torch",
            accelerate_type="MULTI_GPU",
            expect=frozenset({"TENSOR_PARALLEL"}),
            shards=frozenset({"params", "grads", "optimizer"}),
            data_parallel=False,
            min_procs=2,
            max_procs=None,
            min_procs_cpu=2,
            tensor_parallel=True,
            checkpoints=False,
            compile_refused=_NO_COMPILE_SPLIT,
        ),
        _zero(1, "optimizer state (and fp32 master) sharded, gradients and weights replicated", ("optimizer",)),
        _zero(2, "optimizer state and gradients sharded, weights replicated", ("optimizer", "grads")),
        _zero(3, "optimizer state, gradients and weights sharded (as FSDP)", ("optimizer", "grads", "params")),
    )
}


def get(name: str) -> Strategy:
    """The strategy called ``name``; ``KeyError`` lists the known ones."""
    try:
        return STRATEGIES[name]
    except KeyError:
        raise KeyError(f"unknown strategy {name!r} (have {', '.join(STRATEGIES)})") from None


def names(launchable: bool = False) -> tuple[str, ...]:
    """Every strategy's name in table order (only those ``ftui run`` can launch, with ``launchable``)."""
    return tuple(s.name for s in STRATEGIES.values() if s.launchable or not launchable)


def engine_names() -> tuple[str, ...]:
    """Every ``launch.engine`` value: ``auto`` (the strategy's default) and each engine some row names."""
    seen: dict[str, None] = {"auto": None}
    for s in STRATEGIES.values():
        seen.update(dict.fromkeys(s.engine_names()))
    return tuple(seen)


def resolve(name: str, engine: str = "auto") -> Strategy:
    """The strategy ``name`` as run by ``engine`` (:meth:`Strategy.with_engine`)."""
    return get(name).with_engine(engine)


def choices_text(options: Iterable[str]) -> str:
    """``'a', 'b' or 'c'``: the wording of a refused choice, as pydantic words a Literal."""
    quoted = [repr(o) for o in options]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


def recipe_global_batch(name: str, recipe: Mapping[str, Any], nproc: int) -> int | None:
    """:func:`global_batch` of a stored recipe (its TOML as a dict: ``train.batch_size``,
    ``train.grad_accum``, ``launch.tp_size``, ``launch.cp_size``: the processes one sequence is split over are
    one replica); None when the recipe does not give the batch."""
    train, launch = recipe.get("train") or {}, recipe.get("launch") or {}
    micro, ga, tp, cp = train.get("batch_size"), train.get("grad_accum"), launch.get("tp_size"), launch.get("cp_size")
    if not isinstance(micro, int) or not isinstance(ga, int) or not micro or not ga:
        return None
    replicas = nproc // cp if isinstance(cp, int) and cp > 1 else nproc
    return global_batch(name, micro, ga, replicas, tp if isinstance(tp, int) else None)


def global_batch(name: str, micro_batch: int, grad_accum: int, nproc: int, tp_size: int | None = None) -> int:
    """Rows per optimizer step of a run of strategy ``name`` (an unknown name counts as one replica)."""
    strategy = STRATEGIES.get(name)
    if strategy is None:
        return micro_batch * grad_accum
    return strategy.global_batch(micro_batch, grad_accum, nproc, tp_size)
