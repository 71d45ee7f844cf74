"""Strategies are data: one table from a name to how it is launched, what it shards and its rules.

Everything strategy-shaped reads this table: the recipe validator (names, process counts), the CLI's
``--strategy`` choices, the sweep, the planner (what is sharded), Compose's choices, compare's global
batch and the pre-flight. Adding a strategy means adding a row here, plus whatever the trainer does to
prepare the model for it; no list of strategy names is written anywhere else.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

Shard = str
"""What a strategy divides over its processes: ``optimizer`` (optimizer state and fp32 master),
``grads``, ``params`` (tensor parallel: a slice of each sharded matrix, with its gradient and
optimizer state); or ``layers`` (model and pipeline parallel: each device holds a slice of the layers)."""


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
    default_nproc: int | None = None
    """Processes when none is asked for (``ftui run --strategy``); None: one per visible GPU, at least 2."""
    pipeline_from: int | None = None
    """From this many processes on, the run is a pipeline of stages, one per process, trained by
    :mod:`runner.pipeline` (``torch.distributed.pipelining``) instead of accelerate's prepared model."""
    microbatches: int | None = None
    """Micro-batches per pipeline step fixed by the strategy (naive model parallel: 1, so exactly one
    stage works at a time); None: ``launch.microbatches``."""
    tensor_parallel: bool = False
    """Each process holds a slice of every sharded weight matrix (:mod:`runner.tensor_parallel`)."""

    def pipelined(self, nproc: int) -> bool:
        """Whether a run of ``nproc`` processes trains as a pipeline (:mod:`runner.pipeline`)."""
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

    def global_batch(self, micro_batch: int, grad_accum: int, nproc: int) -> int:
        """Rows per optimizer step over every process."""
        return micro_batch * grad_accum * (nproc if self.data_parallel else 1)


_ZERO_LATER = "ftui run cannot launch ZeRO stages yet (DeepSpeed and torch engines are planned); the planner estimates them"

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
        ),
        Strategy(
            name="tp",
            title="Tensor parallel",
            description="every decoder layer's weight matrices split over launch.tp_size processes "
            "(torch DTensor: column- then row-wise), the same batch on each",
            engine="torch",
            accelerate_type="MULTI_GPU",
            expect=frozenset({"TENSOR_PARALLEL"}),
            shards=frozenset({"params", "grads", "optimizer"}),
            data_parallel=False,
            min_procs=2,
            max_procs=None,
            min_procs_cpu=2,
            tensor_parallel=True,
        ),
        Strategy(
            name="zero1",
            title="ZeRO stage 1",
            description="optimizer state (and fp32 master) sharded, gradients and weights replicated",
            engine="deepspeed",
            accelerate_type=None,
            expect=frozenset({"DEEPSPEED"}),
            shards=frozenset({"optimizer"}),
            data_parallel=True,
            min_procs=1,
            max_procs=None,
            min_procs_cpu=2,
            launchable=False,
            not_launchable=_ZERO_LATER,
        ),
        Strategy(
            name="zero2",
            title="ZeRO stage 2",
            description="optimizer state and gradients sharded, weights replicated",
            engine="deepspeed",
            accelerate_type=None,
            expect=frozenset({"DEEPSPEED"}),
            shards=frozenset({"optimizer", "grads"}),
            data_parallel=True,
            min_procs=1,
            max_procs=None,
            min_procs_cpu=2,
            launchable=False,
            not_launchable=_ZERO_LATER,
        ),
        Strategy(
            name="zero3",
            title="ZeRO stage 3",
            description="optimizer state, gradients and weights sharded (as FSDP)",
            engine="deepspeed",
            accelerate_type=None,
            expect=frozenset({"DEEPSPEED"}),
            shards=frozenset({"optimizer", "grads", "params"}),
            data_parallel=True,
            min_procs=1,
            max_procs=None,
            min_procs_cpu=2,
            launchable=False,
            not_launchable=_ZERO_LATER,
        ),
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


def choices_text(options: Iterable[str]) -> str:
    """``'a', 'b' or 'c'``: the wording of a refused choice, as pydantic words a Literal."""
    quoted = [repr(o) for o in options]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


def global_batch(name: str, micro_batch: int, grad_accum: int, nproc: int) -> int:
    """Rows per optimizer step of a run of strategy ``name`` (an unknown name counts as one replica)."""
    strategy = STRATEGIES.get(name)
    if strategy is None:
        return micro_batch * grad_accum
    return strategy.global_batch(micro_batch, grad_accum, nproc)
