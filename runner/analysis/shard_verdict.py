"""Whether the sharding a strategy promises is in effect: for each kind of state (optimizer state, fp32
master, gradients, parameters), each rank's measured bytes against the whole it is a share of.

Both figures come from the ranks (:func:`runner.rank.sharding.state_bytes`: ``param_bytes`` and
``param_whole_bytes``, ...); what each strategy divides comes from the strategies table
(:attr:`runner.spec.strategies.Strategy.shards`). Pure: a strategy name and the summary's ranks in, one
:class:`ShardVerdict` out, whose :meth:`ShardVerdict.line` every view prints.

The rule of each promise, with ``tol(x) = REL_TOLERANCE * x + ABS_SLACK``:

- **sharded 1/N** (N ranks; hsdp: the N processes of its group, the groups replicas): every rank holds at most ``whole / N + tol(whole / N)``, and the ranks together
  at least ``whole - tol(whole)``. DeepSpeed ZeRO-3's parameters under its persistence threshold, held whole
  beside their partitions (``param_gathered_bytes``), are left out of the share and said beside it.
- **replicated** (nothing of the kind divided): every rank holds at least ``whole - tol(whole)``. A rank
  holding less is said, not failed: the question is whether the promised saving is in effect, and less
  is more than promised (DeepSpeed's ZeRO-1 keeps only its partition's gradients once they are reduced).
- **split by layers** (pp, mp over N processes): every rank holds less than ``whole - tol(whole)`` and the
  ranks together at least ``whole - tol(whole)``.
- **sliced** (tp over groups of N): every rank holds less than ``whole - tol(whole)`` and at least
  ``whole / N - tol(whole / N)`` (the split matrices' slices, the rest whole).
- **whole** (one process): every rank within ``tol(whole)`` of the whole.

A run recorded without the whole figures (before they were measured) is "not measured", never guessed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from runner.spec.strategies import STRATEGIES, Strategy
from runner.spec.summary import RunSummary

REL_TOLERANCE = 0.02
"""A share may exceed its promise by 2% of it: the alignment padding of flat partitions (DeepSpeed,
FSDP1) and ZeroRedundancyOptimizer's split of whole tensors. On quickstart every sharded kind of every
matrix run holds exactly whole/N (tests/e2e/test_zero.py): the 2% is the margin of the planner's own
model-state check (``MODEL_STATE_TOLERANCE`` there) for models that split less evenly."""
ABS_SLACK = 16 * 1024
"""And by 16 KiB whatever the whole: LoRA's adapters are a few hundred KiB, where one unevenly split
tensor, or one optimizer step counter per tensor and rank, is more than 2%."""

Promise = Literal["whole", "replicated", "sharded", "layers", "slices"]

KINDS: tuple[tuple[str, str, str, str], ...] = (
    ("optimizer", "optimizer_bytes", "optimizer_whole_bytes", "optimizer"),
    ("fp32 master", "master_bytes", "master_whole_bytes", "optimizer"),
    ("grads", "grad_bytes", "grad_whole_bytes", "grads"),
    ("params", "param_bytes", "param_whole_bytes", "params"),
)
"""(kind, a rank's bytes, the whole's bytes, the strategies table's shard that divides it); the master is
divided with the optimizer state."""

NOT_MEASURED = "not measured"


@dataclass(frozen=True)
class KindCheck:
    """One kind of state over the ranks: what the strategy promises, what each rank holds, the outcome."""

    kind: str
    promise: Promise
    n: int
    """The N of the 1/N share (ranks sharding, stages, tensor-parallel size); 1 for a whole."""
    held: tuple[int, ...]
    """Each rank's bytes of its share (ZeRO-3's gathered parameters left out)."""
    whole: int | None
    """None: not measured."""
    gathered: int = 0
    """The most any rank holds gathered whole beside its partitions (ZeRO-3's small parameters)."""
    ok: bool | None = None
    text: str = ""

    def shares(self) -> tuple[float, ...]:
        """Each rank's bytes over the whole (empty when the whole is not measured or nothing)."""
        return tuple(h / self.whole for h in self.held) if self.whole else ()


@dataclass(frozen=True)
class ShardVerdict:
    """Every kind's check for one run."""

    strategy: str
    checks: tuple[KindCheck, ...]
    why_not: str | None = None
    """Why nothing could be checked (a run recorded before the whole was measured, no ranks)."""

    @property
    def ok(self) -> bool | None:
        """True: every measured kind as promised; False: some kind not; None: nothing measured."""
        outcomes = [c.ok for c in self.checks if c.ok is not None]
        if not outcomes:
            return None
        return all(outcomes)

    def line(self) -> str:
        """``optimizer sharded 1/2: yes; grads sharded 1/2: yes; params: replicated (as zero2 promises)``."""
        if self.why_not is not None:
            return f"{NOT_MEASURED} ({self.why_not})"
        return "; ".join(c.text for c in self.checks)

    def short(self) -> str:
        """A comparison cell: ``as promised``, ``NOT: params, grads``, or ``not measured``."""
        if self.ok is None:
            return NOT_MEASURED
        if self.ok:
            return "as promised"
        return "NOT: " + ", ".join(c.kind for c in self.checks if c.ok is False)


def run_verdict(strategy: str, summary: RunSummary) -> ShardVerdict:
    """:func:`shard_verdict` of a stored run."""
    return shard_verdict(strategy, summary.ranks, summary.parallel, summary.sharding)


def shard_verdict(strategy: str, ranks: Sequence[Mapping[str, Any]], parallel: Mapping[str, Any] | None = None,
                  in_effect: Mapping[str, Any] | None = None) -> ShardVerdict:
    """The verdict of a run of ``strategy`` whose ranks measured ``ranks`` (the summary's ``ranks``;
    ``parallel``: its pipeline or tensor-parallel layout, for the stages and ``tp_size``; ``in_effect``: its
    ``sharding``, for a hybrid strategy's mesh: each group of ``shard`` processes divides the whole)."""
    row = STRATEGIES.get(strategy)
    if row is None:
        return ShardVerdict(strategy, (), f"unknown strategy {strategy!r}")
    if not ranks:
        return ShardVerdict(strategy, (), "no rank reported its memory")
    if any(r.get("param_whole_bytes") is None for r in ranks):
        return ShardVerdict(strategy, (), "recorded before the whole was measured")
    mesh = (in_effect or {}).get("mesh") or {}
    if row.hybrid and not isinstance(mesh.get("shard"), int):
        return ShardVerdict(strategy, (), "the rank recorded no mesh")
    layout = {**(parallel or {}), **({"shard": mesh["shard"]} if row.hybrid else {})}
    checks = []
    for kind, local_key, whole_key, shard in KINDS:
        promise, n = _promise(row, shard, len(ranks), layout)
        gathered = [int(r.get("param_gathered_bytes") or 0) if kind == "params" else 0 for r in ranks]
        held = tuple(int(r.get(local_key) or 0) - g for r, g in zip(ranks, gathered, strict=True))
        wholes = [int(w) for r in ranks if (w := r.get(whole_key)) is not None]
        whole = max(wholes) if wholes else None
        if kind == "fp32 master" and not whole:
            continue  # no master copy: the optimizer updates the weights themselves
        check = KindCheck(kind, promise, n, held, whole, max(gathered))
        checks.append(judge(check, strategy))
    return ShardVerdict(strategy, tuple(checks))


def _promise(row: Strategy, shard: str, nranks: int, parallel: Mapping[str, Any]) -> tuple[Promise, int]:
    """What ``row`` promises of the kind that ``shard`` divides, over ``nranks`` ranks, and its N."""
    if row.layer_split:
        stages = int(parallel.get("stages") or nranks)
        return ("layers", stages) if stages > 1 else ("whole", 1)
    if nranks == 1:
        return "whole", 1
    if shard not in row.shards:
        return "replicated", nranks
    if row.tensor_parallel:
        return "slices", int(parallel.get("tp_size") or nranks)
    return "sharded", int(parallel.get("shard") or nranks)  # hybrid: over its group, the groups replicas


def tol(x: float) -> float:
    """How far a share may be from its promise (module doc)."""
    return REL_TOLERANCE * x + ABS_SLACK


def judge(check: KindCheck, strategy: str) -> KindCheck:
    """``check`` with its outcome and its words (the rules of the module doc)."""
    kind, n, held, whole = check.kind, check.n, check.held, check.whole
    if whole is None:
        return replace(check, ok=None, text=f"{kind}: {NOT_MEASURED}")
    floor = whole - tol(whole)
    together = sum(held) >= floor
    below_whole = all(h < floor for h in held)
    holds = _holds(held, whole)
    if check.promise == "whole":
        ok = all(abs(h - whole) <= tol(whole) for h in held)
        return replace(check, ok=ok, text=f"{kind}: whole on its one process" if ok else
                       f"{kind}: NOT whole ({strategy} runs one process; {holds})")
    if check.promise == "replicated":
        whole_everywhere = all(h >= floor for h in held)
        return replace(check, ok=True, text=f"{kind}: replicated (as {strategy} promises)" if whole_everywhere
                       else f"{kind}: {holds}, less than {strategy} promises (replicated)")
    if check.promise == "layers":
        ok = below_whole and together
        return replace(check, ok=ok, text=f"{kind}: split by layers over {n} ({holds})" if ok else
                       f"{kind}: NOT split by layers ({strategy} promises each of {n} processes its stage; {holds})")
    if check.promise == "slices":
        ok = below_whole and all(h >= whole / n - tol(whole / n) for h in held)
        return replace(check, ok=ok, text=f"{kind}: sliced over {n} ({holds})" if ok else
                       f"{kind}: NOT sliced ({strategy} promises slices over {n}; {holds})")
    ok = all(h <= whole / n + tol(whole / n) for h in held) and together
    if ok:
        text = f"{kind} sharded 1/{n}: yes"
        if check.gathered:
            text += (f" (beside it each rank keeps {check.gathered / whole:.0%} of them whole: ZeRO-3's "
                     "persistence threshold)")
    elif all(h >= floor for h in held):
        text = f"{kind}: NOT sharded ({strategy} promises 1/{n}; {holds})"
    elif not together:
        text = f"{kind} sharded 1/{n}: NO (the ranks together hold {sum(held) / whole:.0%} of the whole)"
    else:
        text = f"{kind} sharded 1/{n}: NO, unevenly ({holds})"
    return replace(check, ok=ok, text=text)


def _holds(held: Sequence[int], whole: int) -> str:
    """``each rank holds 50%`` or ``rank 0 holds 100%, rank 1 0%``."""
    shares = [f"{h / whole:.0%}" for h in held]
    if len(set(shares)) == 1:
        return f"each rank holds {shares[0]}" if len(shares) > 1 else f"it holds {shares[0]}"
    return f"rank 0 holds {shares[0]}, " + ", ".join(f"rank {i} {s}" for i, s in enumerate(shares) if i)
