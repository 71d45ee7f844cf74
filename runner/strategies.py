"""Strategies are data: one table from a name to its launch settings and the checks on it.

Adding a strategy (ZeRO stages through DeepSpeed, pipeline parallel, ...) means adding a row here,
plus whatever the trainer needs to prepare the model, not branches scattered through the code.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Strategy:
    """How one strategy is launched and what must be in effect once it runs."""

    name: str
    title: str
    accelerate_type: str
    """``distributed_type`` written into the generated accelerate config."""
    expect: frozenset[str]
    """accelerate ``DistributedType`` values the trainer may report for this strategy; anything
    else means the launch silently became something else, and the run is failed."""
    min_procs: int
    max_procs: int | None
    description: str


STRATEGIES: dict[str, Strategy] = {
    s.name: s
    for s in (
        Strategy(
            name="single",
            title="Single device",
            accelerate_type="NO",
            expect=frozenset({"NO"}),
            min_procs=1,
            max_procs=1,
            description="one process on one device",
        ),
        Strategy(
            name="mp",
            title="Naive model parallel",
            accelerate_type="NO",
            expect=frozenset({"NO"}),
            min_procs=1,
            max_procs=1,
            description='one process, layers spread over the visible GPUs (device_map="auto"); '
            "on a CPU-only machine there is one device",
        ),
        Strategy(
            name="ddp",
            title="Distributed data parallel",
            accelerate_type="MULTI_GPU",
            expect=frozenset({"MULTI_GPU", "MULTI_CPU"}),
            min_procs=2,
            max_procs=None,
            description="a full replica per process, gradients all-reduced (NCCL on GPU, gloo on CPU)",
        ),
        Strategy(
            name="fsdp",
            title="Fully sharded data parallel",
            accelerate_type="FSDP",
            expect=frozenset({"FSDP"}),
            min_procs=1,
            max_procs=None,
            description="parameters, gradients and optimizer state sharded over the processes",
        ),
    )
}


def get(name: str) -> Strategy:
    """The strategy called ``name``; ``KeyError`` lists the known ones."""
    try:
        return STRATEGIES[name]
    except KeyError:
        raise KeyError(f"unknown strategy {name!r} (have {', '.join(STRATEGIES)})") from None
