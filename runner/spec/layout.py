"""What a pipeline (``pp``, ``mp`` over processes), tensor-parallel (``tp``) or hybrid sharded (``hsdp``) run
needs from its recipe.

Pure checks, no torch: the recipe validator calls :func:`recipe_problem`, :func:`microbatches` says how
many micro-batches a pipelined run cuts each batch into and :func:`hsdp_mesh` the 2-D mesh of a hybrid
sharded run. The training loops are :mod:`runner.rank.pipeline` and :mod:`runner.rank.tensor_parallel`
(``hsdp``: accelerate's FSDP2 on the mesh, :mod:`runner.rank.engines.accelerate`). Also how many
processes one machine takes, whatever the layout (:func:`host_nproc_problem`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from runner.spec import strategies

if TYPE_CHECKING:
    from runner.spec.recipe import Recipe, TrainSection

NO_CHECKPOINTS = "writes no checkpoints yet (runner/rank/pipeline.py)"


def microbatches(recipe: Recipe) -> int:
    """Micro-batches per pipeline step: the strategy's own (``mp``: 1), else ``launch.microbatches``,
    else ``train.batch_size`` (one row each)."""
    strategy = strategies.get(recipe.launch.strategy)
    if strategy.microbatches is not None:
        return strategy.microbatches
    return recipe.launch.microbatches or recipe.train.batch_size


def tp_size(recipe: Recipe) -> int:
    """Processes each weight matrix is split over (``launch.tp_size``, default ``nproc``)."""
    return recipe.launch.tp_size or recipe.launch.nproc


def layout_name(recipe: Recipe) -> str:
    """``pp`` / ``mp over N processes`` / ``tp``: how messages name the run's layout."""
    name = recipe.launch.strategy
    return f"{name} over {recipe.launch.nproc} processes" if name == "mp" else name


EXPERT_PARALLEL_MISSING = (
    "expert parallelism is not available: transformers' mixture-of-experts models (Mixtral, Qwen2-MoE, OLMoE) "
    "keep a layer's experts in one module of stacked weights, which ftui's engines replicate (ddp) or shard as "
    "a whole (fsdp, ZeRO), never by expert; DeepSpeed-MoE's expert parallelism needs a model built of its own "
    "deepspeed.moe MoE layers, and ftui does not switch on DeepSpeed's AutoEP module replacement; "
    "set launch.ep_size = 1 (fsdp or zero3 shard the experts' weights instead)")
"""Why ``launch.ep_size`` above 1 is refused (docs/strategies.md, "Mixture of experts")."""


def expert_parallel_problem(recipe: Recipe) -> str | None:
    """One line refusing ``launch.ep_size`` above 1 (None: no expert parallelism asked for)."""
    size = recipe.launch.ep_size
    return None if size is None or size == 1 else f"launch.ep_size: {size}: {EXPERT_PARALLEL_MISSING}"


def stop_problem(train: TrainSection) -> str | None:
    """``train.stop_after`` past the schedule's end (``train.max_steps``), or None."""
    if train.max_steps and train.stop_after > train.max_steps:
        return f"train.stop_after: {train.stop_after} is past the schedule's end (train.max_steps = {train.max_steps})"
    return None


def recipe_problem(recipe: Recipe) -> str | None:
    """One line naming the field that a pipelined, tensor-parallel, hybrid sharded or expert-parallel recipe gets
    wrong (None: fine)."""
    launch, train = recipe.launch, recipe.train
    expert = expert_parallel_problem(recipe)
    if expert:
        return expert
    strategy = strategies.get(launch.strategy)
    if strategy.hybrid:
        return mesh_problem(recipe)
    pipelined = strategy.pipelined(launch.nproc)
    if not (pipelined or strategy.tensor_parallel):
        return None
    what = layout_name(recipe)
    if recipe.method.type == "qlora":
        return f"method.type: qlora is not supported under {what} (4-bit weights are not split); use lora"
    if train.resume_from is not None:
        return f"train.resume_from: {what} {NO_CHECKPOINTS}, so it cannot resume; use single, ddp or fsdp"
    if train.save_every:
        return f"train.save_every: {what} {NO_CHECKPOINTS}; set it to 0"
    if pipelined:
        if strategy.microbatches is not None:
            if launch.microbatches not in (None, strategy.microbatches):
                return (f"launch.microbatches: {what} is naive model parallel, one micro-batch "
                        f"(got {launch.microbatches}); use strategy pp for micro-batches")
            return None
        m = microbatches(recipe)
        if train.batch_size % m:
            return f"launch.microbatches: {m} does not divide train.batch_size {train.batch_size}"
        if launch.pp_schedule == "1f1b" and m < launch.nproc:
            return (f"launch.microbatches: 1F1B needs at least as many micro-batches as stages "
                    f"({m} < {launch.nproc}); raise it or use launch.pp_schedule = \"gpipe\"")
        return None
    size = tp_size(recipe)
    if size < 2 or launch.nproc % size:
        return (f"launch.tp_size: {size} must be at least 2 and divide nproc = {launch.nproc} (nproc / tp_size "
                "groups of tp_size processes train as data parallel replicas)")
    return None


Mesh = tuple[int, int]
"""``(replicate, shard)``: an ``hsdp`` run's groups and the processes each group shards over."""


def hsdp_mesh(world: int, nnodes: int = 1, replicate: int | None = None, shard: int | None = None) -> Mesh:
    """The mesh of an ``hsdp`` run of ``world`` processes over ``nnodes`` machines: both sizes as given; one
    given, the other what it leaves of the world; none, a group per machine on several machines (replicate
    across machines, shard within one: the shard group's all-gathers and reduce-scatters, a layer at a
    time, stay on the machine's own links; only the replicas' all-reduce crosses machines), else two groups
    (the smallest hybrid). Not checked here (:func:`mesh_problem`)."""
    if shard is not None and replicate is None:
        return max(1, world // shard), shard
    if replicate is None:
        replicate = nnodes if nnodes > 1 else 2
    return replicate, shard if shard is not None else max(1, world // replicate)


def world_size(recipe: Recipe) -> int:
    """Processes over every machine: ``launch.nproc`` x ``launch.nnodes``."""
    return recipe.launch.nproc * (recipe.launch.nnodes or 1)


def mesh(recipe: Recipe) -> Mesh | None:
    """The recipe's ``hsdp`` mesh (:func:`hsdp_mesh` of ``launch.replicate`` and ``launch.shard``); None for
    another strategy."""
    launch = recipe.launch
    if not strategies.get(launch.strategy).hybrid:
        return None
    return hsdp_mesh(world_size(recipe), launch.nnodes or 1, launch.replicate, launch.shard)


def mesh_problem(recipe: Recipe) -> str | None:
    """One line naming the field of an ``hsdp`` recipe whose mesh cannot be built (None: it can): replicate x
    shard must be every process, both at least 2, and on several machines a shard group must be whole
    machines or lie within one."""
    launch = recipe.launch
    world, nnodes = world_size(recipe), launch.nnodes or 1
    replicate, shard = hsdp_mesh(world, nnodes, launch.replicate, launch.shard)
    field = "launch.shard" if launch.shard is not None and launch.replicate is None else "launch.replicate"
    every = f"nproc = {world}" if nnodes == 1 else f"nproc {launch.nproc} x nnodes {nnodes} = {world}"
    if launch.fsdp_version != 2:
        return f"launch.fsdp_version: hsdp is FSDP2 on a 2-D mesh (got {launch.fsdp_version}); set 2"
    if replicate * shard != world:
        given = "" if launch.replicate or launch.shard else " (the default; set launch.replicate or launch.shard)"
        return (f"{field}: replicate {replicate} x shard {shard} = {replicate * shard} is not every process "
                f"({every}){given}")
    if replicate < 2 or shard < 2:
        other = "fsdp" if replicate < 2 else "ddp"
        bad = "launch.replicate" if replicate < 2 else "launch.shard"
        named = field if (launch.replicate is None) != (launch.shard is None) else bad  # the one given
        return (f"{named}: hsdp needs at least 2 replicas of at least 2 shards (got replicate {replicate} x shard "
                f"{shard}; that is {other})")
    if nnodes > 1 and launch.nproc % shard and shard % launch.nproc:
        return (f"launch.shard: a shard group of {shard} processes would straddle machines of {launch.nproc}; "
                f"use a divisor or a multiple of nproc")
    return None


def mesh_text(sizes: Mesh) -> str:
    """``2x2``: replicate x shard, as the strategy column shows it beside the name."""
    return f"{sizes[0]}x{sizes[1]}"


def stored_mesh(strategy: str, nproc: int, launch: Mapping[str, Any], in_effect: Mapping[str, Any] | None) -> Mesh | None:
    """The mesh of a stored run of ``nproc`` processes per machine: what its rank found in effect
    (``sharding.mesh``), else its recipe's (``launch`` as stored, with the defaults of :func:`hsdp_mesh`); None
    for another strategy."""
    row = strategies.STRATEGIES.get(strategy)
    if row is None or not row.hybrid:
        return None
    seen = (in_effect or {}).get("mesh")
    if isinstance(seen, Mapping) and isinstance(seen.get("replicate"), int) and isinstance(seen.get("shard"), int):
        return seen["replicate"], seen["shard"]
    nnodes = launch.get("nnodes")
    nnodes = nnodes if isinstance(nnodes, int) and nnodes > 0 else 1
    given = [v if isinstance(v, int) and v > 0 else None for v in (launch.get("replicate"), launch.get("shard"))]
    return hsdp_mesh(max(1, nproc) * nnodes, nnodes, *given)


def mesh_mismatch(recipe: Recipe, seen: Mapping[str, Any]) -> str | None:
    """Why the mesh the rank found in effect (``seen``: :func:`runner.rank.sharding.in_effect`) is not the
    recipe's (one line), or None when it is (or the strategy has none)."""
    wanted = mesh(recipe)
    if wanted is None:
        return None
    got = seen.get("mesh") or {}
    if (got.get("replicate"), got.get("shard")) == wanted:
        return None
    return (f"launch.strategy: asked for hsdp replicate {wanted[0]} x shard {wanted[1]} but the rank runs "
            f"{seen.get('how')}; the run was stopped")


def stage_bounds(layers: int, stages: int) -> list[tuple[int, int]]:
    """Decoder layers ``[lo, hi)`` of each pipeline stage: as even as possible, earlier stages one more (the
    first also embeds, the last runs the head and the loss). The rank's split (:mod:`runner.rank.pipeline`)
    and the planner's stages both take it from here."""
    per, extra = divmod(layers, stages)
    bounds: list[tuple[int, int]] = []
    lo = 0
    for s in range(stages):
        hi = lo + per + (1 if s < extra else 0)
        bounds.append((lo, hi))
        lo = hi
    return bounds


def runs_1f1b(schedule: str, microbatches: int, stages: int) -> bool:
    """Whether a pipeline runs 1F1B: asked for, with at least one micro-batch per stage (else GPipe)."""
    return schedule == "1f1b" and microbatches >= stages


def in_flight(schedule: str, stage: int, stages: int, microbatches: int) -> int:
    """Micro-batches whose activations pipeline stage ``stage`` (0-based) holds at once: every one under
    GPipe (all forwards before any backward); under 1F1B the warm-up's, ``min(m, stages - stage)``: the
    first stage ``stages``, the last 1 (torch.distributed.pipelining ``Schedule1F1B``)."""
    if runs_1f1b(schedule, microbatches, stages):
        return min(microbatches, stages - stage)
    return microbatches


def rows_per_step(recipe: Recipe) -> int:
    """Rows of one optimizer step over every process: ``train.batch_size`` x ``train.grad_accum`` x the
    data parallel replicas of the strategy (:meth:`runner.spec.strategies.Strategy.global_batch`; the
    processes of one pipeline or tensor-parallel group are one replica, and so are those one sequence is split
    over by context parallelism). The rank's loop and the pre-flight both take it from here."""
    train, world = recipe.train, world_size(recipe) // recipe.launch.cp_size
    return strategies.get(recipe.launch.strategy).global_batch(train.batch_size, train.grad_accum, world,
                                                               tp_size(recipe))


@dataclass(frozen=True)
class BatchSplit:
    """How a strategy at some process count trains a recipe's global batch (:func:`keep_global_batch`)."""

    micro_batch: int
    grad_accum: int
    kept: bool
    """Whether the global batch is the recipe's (False: it could not be split evenly and grew)."""
    note: str
    """How the batch was split, in words, for the sweep's and the plan's output."""

    def overrides(self, micro_batch: int, grad_accum: int) -> list[str]:
        """The ``--set`` values that turn a recipe of ``micro_batch`` x ``grad_accum`` into this split."""
        out = [f"train.batch_size={self.micro_batch}"] if self.micro_batch != micro_batch else []
        return out + ([f"train.grad_accum={self.grad_accum}"] if self.grad_accum != grad_accum else [])


def keep_global_batch(strategy: str, nproc: int, micro_batch: int, grad_accum: int) -> BatchSplit:
    """The micro-batch and accumulation of ``strategy`` over ``nproc`` processes that train the same rows per
    optimizer step as one process of ``micro_batch`` x ``grad_accum``: the one fairness rule of ``ftui sweep``
    and ``ftui plan``.

    Strategies whose processes share one batch (``pp``, ``mp``, ``tp``: layers or matrices are split, not
    rows) keep it. A data-parallel one divides the micro-batch by N when N divides it; else it divides the
    rows per step (``micro x accumulation``) by N and takes the largest micro-batch up to the recipe's that
    divides a process's share (the rest is accumulation); when N divides neither, the micro-batch is kept
    and the global batch grows N-fold (``kept`` is False and the note says so).
    """
    rows = micro_batch * grad_accum
    if nproc <= 1:
        return BatchSplit(micro_batch, grad_accum, True, f"micro-batch {micro_batch} x 1 process")
    if not strategies.get(strategy).data_parallel:
        return BatchSplit(micro_batch, grad_accum, True,
                          f"micro-batch {micro_batch} through {nproc} processes (global batch {rows} kept)")
    if micro_batch % nproc == 0:
        micro = micro_batch // nproc
        return BatchSplit(micro, grad_accum, True, f"micro-batch {micro_batch}/{nproc} = {micro} x {nproc} "
                                                   f"processes (global batch {rows} kept)")
    if rows % nproc == 0:
        share = rows // nproc
        micro = max(m for m in range(1, min(micro_batch, share) + 1) if share % m == 0)
        return BatchSplit(micro, share // micro, True, f"micro-batch {micro} x grad_accum {share // micro} x "
                                                       f"{nproc} processes (global batch {rows} kept)")
    return BatchSplit(micro_batch, grad_accum, False, f"micro-batch {micro_batch} x {nproc} processes: global "
                                                      f"batch {rows * nproc} ({rows} rows per step not "
                                                      f"divisible by {nproc})")


def batch_problem(recipe: Recipe, rows: int) -> str | None:
    """The one line when ``rows`` of train data (blocks) cannot fill one optimizer step (None: they can)."""
    step = rows_per_step(recipe)
    if rows >= step:
        return None
    train = recipe.train
    replicas = step // (train.batch_size * train.grad_accum)
    return (f"train.batch_size: {rows} rows of data cannot fill one optimizer step of {step} rows (batch_size "
            f"{train.batch_size} x {replicas} data parallel replicas x grad_accum {train.grad_accum})")


def replicas(recipe: Recipe) -> int:
    """Data parallel replicas of a tensor-parallel run: its processes over every machine in groups of
    ``tp_size`` (1 for other layouts; :func:`rows_per_step` counts the same)."""
    if not strategies.get(recipe.launch.strategy).tensor_parallel:
        return 1
    return max(1, world_size(recipe) // tp_size(recipe))


CPU_RANKS_PER_CORE = 2
"""Ranks a CPU run may start per physical core before the pre-flight refuses it: more only share the
cores, and each rank holds its own model, so memory grows with every one."""


def host_nproc_limit(on_cpu: bool, gpus: int, cpu_cores: int) -> int:
    """The most processes one machine runs: one per GPU on a GPU run, its cores x
    :data:`CPU_RANKS_PER_CORE` on CPU."""
    return max(1, cpu_cores) * CPU_RANKS_PER_CORE if on_cpu else gpus


def host_nproc_problem(nproc: int, on_cpu: bool, gpus: int, cpu_cores: int, listed: bool = False) -> str | None:
    """Why ``nproc`` processes on one machine are more than it has devices for (None: they fit).

    The one place that decides it, for ``ftui run``, ``sweep``, ``resume``, ``--dry-run`` and Compose alike.
    ``nproc`` is per machine (``launch.nproc``; a multi-node run checks it on each node against that node),
    ``gpus`` the GPUs the ranks will see (``listed``: those ``launch.gpus`` names), ``cpu_cores`` the physical
    cores. The line names the field and the host's count; the caller adds how to go on anyway (``--force``,
    or Compose's toggle). This host's figures for a recipe: :func:`runner.watch.host.nproc_over_host`.
    """
    if not on_cpu and gpus == 0:  # a GPU run with no GPU here: the device's own check says so
        return None
    limit = host_nproc_limit(on_cpu, gpus, cpu_cores)
    if nproc <= limit:
        return None
    if on_cpu:
        have = (f"this host trains on CPU with {cpu_cores} core{'s' if cpu_cores != 1 else ''} "
                f"(at most {limit} processes: {CPU_RANKS_PER_CORE} per core)")
    else:
        owner = "launch.gpus lists" if listed else "this host has"
        have = f"{owner} {gpus} GPU{'s' if gpus != 1 else ''} (one process per GPU)"
    return f"launch.nproc (--nproc): {nproc} processes, but {have}"
