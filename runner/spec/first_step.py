"""Time to first step, broken down: where the seconds between the launch and the end of step 1 go.

Short runs (a plan's trials, a smoke test) are dominated by it, so each run stores it
(``summary.time_to_first_step``, written by the watcher at the first step: :mod:`runner.watch.stream`).
Every stage is the difference of two times both taken on this host (unix seconds):

- ``spawn``: the launcher's start (the watcher's ``launch``: its process's create time) to rank 0's
  process start (its create time, in the ``start`` event's ``process_started``): accelerate launch's own
  imports and the ranks' spawn;
- ``imports``: rank 0's process start to its first phase event (``tokenizing``): torch, accelerate and
  transformers imported, the process group set up;
- ``data``: ``tokenizing`` to ``loading_model`` (the tokenizer, the data tokenized or read from its cache);
- ``model_load``: ``loading_model`` to ``preparing``;
- ``prepare``: ``preparing`` to ``resuming`` or ``start``: the strategy wraps, shards or splits the model;
- ``resume``: ``resuming`` to ``start`` (a resumed run only);
- ``first_step``: ``start`` to the end of step 1 (its ``step`` event): step 1 itself, with the matmul
  probe that runs right before it on CPU (:mod:`runner.rank.peak_probe`).

The trainer has no compile step (no ``torch.compile`` option), so no stage is named for one. A stage whose
two ends are not both known (a run recovered without its launch time) is None; ``total`` is from the
earliest known end.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

STAGES: tuple[str, ...] = ("spawn", "imports", "data", "model_load", "prepare", "resume", "first_step")
"""The stages, in the order they happen."""

STAGE_WORDS: dict[str, str] = {
    "spawn": "spawn", "imports": "imports", "data": "data", "model_load": "model load",
    "prepare": "prepare/shard", "resume": "resume", "first_step": "first step",
}
"""Each stage as a table cell says it."""

PHASE_ENDS: dict[str, str] = {"tokenizing": "data", "loading_model": "model_load", "preparing": "prepare",
                              "resuming": "resume"}
"""The trainer's phase events (:data:`runner.spec.events.Phase`) that open a stage."""


def breakdown(marks: Mapping[str, float]) -> dict[str, Any]:
    """The stored record from the moments ``marks`` (unix seconds): ``launched``, ``process_started``,
    the phases of :data:`PHASE_ENDS` by their event name, ``start`` and ``first_step_end``. Returns
    ``{"seconds": {stage: float | None}, "total": float | None}``."""
    order = ["launched", "process_started", "tokenizing", "loading_model", "preparing", "resuming", "start",
             "first_step_end"]
    opens = {"launched": "spawn", "process_started": "imports", **PHASE_ENDS, "start": "first_step"}
    seconds: dict[str, float | None] = dict.fromkeys(STAGES)
    known = [m for m in order if isinstance(marks.get(m), int | float)]
    for here, after in zip(known, known[1:], strict=False):
        stage = opens.get(here)
        if stage is None:
            continue
        # A stage ends at the next known mark only when no mark between them is missing (else unknown).
        if all(m == "resuming" for m in order[order.index(here) + 1:order.index(after)]):
            seconds[stage] = max(0.0, float(marks[after]) - float(marks[here]))
    total = float(marks[known[-1]]) - float(marks[known[0]]) if len(known) > 1 and known[-1] == "first_step_end" else None
    return {"seconds": seconds, "total": total}


def stage_seconds(record: Mapping[str, Any] | None) -> dict[str, float | None]:
    """The stored record's seconds per stage (every stage, None where unknown); all None without one."""
    raw = record.get("seconds") if isinstance(record, Mapping) else None
    raw = raw if isinstance(raw, Mapping) else {}
    return {s: float(v) if isinstance(v, int | float) else None for s, v in ((s, raw.get(s)) for s in STAGES)}


def total_seconds(record: Mapping[str, Any] | None) -> float | None:
    """The stored record's total (launch, or the earliest known mark, to the end of step 1)."""
    value = record.get("total") if isinstance(record, Mapping) else None
    return float(value) if isinstance(value, int | float) else None


def stages_words(record: Mapping[str, Any] | None) -> str:
    """``"spawn 4.1, imports 12.0, data 0.3, model load 1.2, prepare/shard 0.8, first step 12.8"``: the
    stages known, in seconds (a stage that did not happen or is unknown is left out)."""
    return ", ".join(f"{STAGE_WORDS[s]} {v:.1f}" for s, v in stage_seconds(record).items() if v is not None)


def words(record: Mapping[str, Any] | None) -> str:
    """``"31.2 s: spawn 4.1, imports 12.0, ..."``: the total, then :func:`stages_words`; ``"-"`` without a
    record."""
    total, parts = total_seconds(record), stages_words(record)
    if total is None and not parts:
        return "-"
    head = "-" if total is None else f"{total:.1f} s"
    return f"{head}: {parts}" if parts else head
