"""Time to first step, broken down: where the seconds between the launch and the end of step 1 go.

Short runs (a plan's trials, a smoke test) are dominated by it, so each run stores it
(``summary.time_to_first_step``, written at the first step by :mod:`runner.watch.stream`). Every moment
it is computed from is in the run folder's journals, so ``ftui db rebuild`` computes the same figures
(:class:`Moments`). Every stage is the difference of two of those moments, all taken on this host's
``time.time()`` clock (unix seconds):

- ``spawn``: the launcher's start (``launcher_started`` of the watcher's ``launch`` event in
  ``orchestrator.jsonl``) to rank 0's process start (``process_started`` of the ``start`` event):
  accelerate launch's own imports and the ranks' spawn (0 for one process, which runs in the launcher's
  own interpreter);
- ``imports``: rank 0's process start to its first phase event (``tokenizing``): torch, accelerate and
  transformers imported, the process group set up;
- ``data``: ``tokenizing`` to the next phase (the tokenizer, the data tokenized or read from its cache);
- ``model_load``: ``loading_model`` to the next phase;
- ``prepare``: ``preparing`` to the next phase or ``start``: the strategy wraps, shards or splits the model;
- any other phase the trainer journals before ``start`` (:data:`runner.spec.events.PHASE_WORDS`) is a stage
  of its own from its event to the next one: ``resume`` (``resuming``: a resumed run's restore),
  ``compile`` (``compile``), in the order they happened;
- ``first_step``: ``start`` to the end of step 1 (its ``step`` event): step 1 itself, with the matmul
  probe that runs right before it on CPU (:mod:`runner.rank.peak_probe`);
- ``compile``: with ``train.compile`` the trainer journals ``compiling`` after ``start``, as step 1 begins,
  and step 1 compiles each decoder layer: ``compile`` runs from that phase to the end of step 1 (step 1 with
  its compilation), and ``first_step`` keeps what came before it.

A stage whose two ends are not both known is None, never summed into a neighbour: a moment missing (a run
launched before the launch time was journaled; a script run, which journals no phases) leaves unknown
every stage between the known moments around it. ``total`` runs from the earliest known moment.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

STAGES: tuple[str, ...] = ("spawn", "imports", "data", "model_load", "prepare", "first_step")
"""The stages every trainer run has, in the order they happen; each is in every stored record (None when
unknown). A phase's stage of its own (``resume``, ``compile``) is in the record only when it was journaled."""

PHASE_STAGES: dict[str, str] = {"tokenizing": "data", "loading_model": "model_load", "preparing": "prepare",
                                "resuming": "resume", "compiling": "compile"}
"""The stage a trainer phase opens (:data:`runner.spec.events.Phase`); any other phase opens a stage of its
own name (``compile``)."""

STAGE_WORDS: dict[str, str] = {
    "spawn": "spawn", "imports": "imports", "data": "data", "model_load": "model load",
    "prepare": "prepare/shard", "resume": "resume", "first_step": "first step",
}
"""Each stage as a table cell says it; a stage not named here is said by its name."""

_REQUIRED: tuple[str, ...] = ("launched", "process_started", "tokenizing", "loading_model", "preparing", "start",
                              "first_step_end")
"""The moments every trainer run journals, in order; a phase not among them may come anywhere after
``loading_model`` (a missing one of these leaves the stages around it unknown)."""


@dataclass
class Moments:
    """The journaled moments before the end of step 1 (unix seconds; None where not journaled)."""

    launched: float | None = None
    """The launcher's process start (``launcher_started`` of the watcher's ``launch`` event)."""
    process_started: float | None = None
    """Rank 0's process start (``process_started`` of the ``start`` event)."""
    phases: list[tuple[str, float]] = field(default_factory=list)
    """The trainer's phase events before ``start``, in journal order: (phase, time)."""
    start: float | None = None
    """The ``start`` event's time."""
    stepping: list[tuple[str, float]] = field(default_factory=list)
    """The trainer's phase events after ``start`` and before step 1 ends (``compiling``): (phase, time)."""
    first_step_end: float | None = None
    """Step 1's ``step`` event's time."""

    def ordered(self) -> list[tuple[str, float]]:
        """The known moments in the order they happen: (name, time), a phase by its name."""
        ends = [("launched", self.launched), ("process_started", self.process_started)]
        start = [("start", self.start)] if self.start is not None else []
        end = [("first_step_end", self.first_step_end)] if self.first_step_end is not None else []
        return [(n, t) for n, t in ends if t is not None] + list(self.phases) + start + list(self.stepping) + end


def _opens(moment: str) -> str:
    """The stage that starts at ``moment``."""
    return {"launched": "spawn", "process_started": "imports", "start": "first_step"}.get(
        moment, PHASE_STAGES.get(moment, moment))


def breakdown(moments: Moments) -> dict[str, Any]:
    """The stored record: ``{"seconds": {stage: float | None}, "total": float | None}``, the stages in the
    order they happened (:data:`STAGES`, with any other phase's stage where it came)."""
    known = moments.ordered()
    rank = {m: i for i, m in enumerate(_REQUIRED)}
    seconds: dict[str, float | None] = {}
    for i, (here, at) in enumerate(known):
        before = max((rank[m] for m, _ in known[:i + 1] if m in rank), default=-1)
        after = min((rank[m] for m, _ in known[i + 1:] if m in rank), default=len(_REQUIRED))
        nxt = known[i + 1][1] if i + 1 < len(known) else None
        # Known only when no required moment is missing between the required ones around this stage.
        seconds[_opens(here)] = max(0.0, nxt - at) if nxt is not None and after - before == 1 else None
    seconds.pop(_opens("first_step_end"), None)  # the last moment opens nothing
    for i, stage in enumerate(STAGES):  # a stage never opened (its moment missing) is unknown, in its place
        if stage not in seconds:
            prior = [s for s in STAGES[:i] if s in seconds]
            seconds = _insert_after(seconds, prior[-1] if prior else None, stage)
    end, first = moments.first_step_end, known[0][1] if known else None
    total = end - first if end is not None and first is not None and len(known) > 1 else None
    return {"seconds": seconds, "total": total}


def _insert_after(seconds: dict[str, float | None], after: str | None, stage: str) -> dict[str, float | None]:
    """``seconds`` with ``stage`` (unknown) right after ``after`` (first when None)."""
    items = list(seconds.items())
    at = 0 if after is None else [k for k, _ in items].index(after) + 1
    return dict([*items[:at], (stage, None), *items[at:]])


def stage_seconds(record: Mapping[str, Any] | None) -> dict[str, float | None]:
    """The stored record's seconds per stage, in its order (every stage of :data:`STAGES` at least, None where
    unknown); all None without one."""
    raw = record.get("seconds") if isinstance(record, Mapping) else None
    raw = raw if isinstance(raw, Mapping) else {}
    names = [*raw, *(s for s in STAGES if s not in raw)]
    return {s: float(v) if isinstance(v := raw.get(s), int | float) else None for s in names}


def median_order(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """Every stage of ``records`` once, in the order they happened: a stage only some have comes right after
    the stage before it in the first record that has it."""
    out: list[str] = []
    for record in records:
        prev: str | None = None
        for stage in stage_seconds(record):
            if stage not in out:
                out.insert(0 if prev is None else out.index(prev) + 1, stage)
            prev = stage
    return out


def total_seconds(record: Mapping[str, Any] | None) -> float | None:
    """The stored record's total (launch, or the earliest known moment, to the end of step 1)."""
    value = record.get("total") if isinstance(record, Mapping) else None
    return float(value) if isinstance(value, int | float) else None


def stages_words(record: Mapping[str, Any] | None) -> str:
    """``"spawn 4.1, imports 12.0, data 0.3, model load 1.2, prepare/shard 0.8, first step 12.8"``: the
    stages known, in seconds (a stage that did not happen or is unknown is left out)."""
    return ", ".join(f"{STAGE_WORDS.get(s, s.replace('_', ' '))} {v:.1f}"
                     for s, v in stage_seconds(record).items() if v is not None)


def words(record: Mapping[str, Any] | None) -> str:
    """``"31.2 s: spawn 4.1, imports 12.0, ..."``: the total, then :func:`stages_words`; ``"-"`` without a
    record."""
    total, parts = total_seconds(record), stages_words(record)
    if total is None and not parts:
        return "-"
    head = "-" if total is None else f"{total:.1f} s"
    return f"{head}: {parts}" if parts else head
