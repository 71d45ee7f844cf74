"""Where a run's steps go, from the step each rank profiled (runner/rank/step_split.py): compute,
communication or waiting on another rank, the batch, and the rest, as shares of the step.

A run's split is the mean over its ranks of each share, with the rank held up the most named apart (a
pipeline's first stage and its last wait differently; a mean alone would hide it). Several trials of one
candidate: the median of each share. Pure: summaries in, figures out.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from runner.spec.summary import RunSummary

PARTS = ("compute", "comm", "data", "other")
WORDS = {"compute": "compute", "comm": "communication or waiting on another rank", "data": "preparing the batch",
         "other": "other (Python between ops, launches)"}


@dataclass(frozen=True)
class TimeSplit:
    """Shares of one step (fractions adding up to 1), mean over ranks."""

    shares: Mapping[str, float]
    worst_rank: int
    """The rank with the largest communication-or-waiting share."""
    worst_comm: float
    ranks: int
    runs: int
    source: str

    def json(self) -> dict[str, Any]:
        return {**{f"{k}_share": round(v, 4) for k, v in self.shares.items()}, "worst_rank": self.worst_rank,
                "worst_comm_share": round(self.worst_comm, 4), "ranks": self.ranks, "runs": self.runs,
                "source": self.source}

    def sentence(self) -> str:
        """``compute 61%, communication or waiting on another rank 35% (rank 1: 52%), ...``."""
        parts = []
        for k in PARTS:
            text = f"{WORDS[k]} {self.shares[k] * 100:.0f}%"
            if k == "comm" and self.ranks > 1:
                text += f" (rank {self.worst_rank}: {self.worst_comm * 100:.0f}%)"
            parts.append(text)
        return ", ".join(parts)


def _rank_shares(split: Mapping[str, Any]) -> dict[str, float] | None:
    wall = float(split.get("wall_s") or 0.0)
    if wall <= 0:
        return None
    return {k: float(split.get(f"{k}_s") or 0.0) / wall for k in PARTS}


def of_run(summary: RunSummary) -> TimeSplit | None:
    """The run's split from its ranks' profiled step; None when no rank profiled one (a run too short, or
    older than the profile)."""
    found = [(int(r.get("rank", i)), s, str(r["step_split"].get("source", "")))
             for i, r in enumerate(summary.ranks or []) if isinstance(r.get("step_split"), Mapping)
             and (s := _rank_shares(r["step_split"])) is not None]
    if not found:
        return None
    shares = {k: statistics.fmean(s[k] for _, s, _ in found) for k in PARTS}
    worst_rank, worst, _ = max(found, key=lambda f: f[1]["comm"])
    return TimeSplit(shares, worst_rank, worst["comm"], len(found), 1, found[0][2])


def merge(splits: Iterable[TimeSplit | None]) -> TimeSplit | None:
    """The median of each share over a candidate's trials (None when none has a split)."""
    have = [s for s in splits if s is not None]
    if not have:
        return None
    if len(have) == 1:
        return have[0]
    shares = {k: statistics.median(s.shares[k] for s in have) for k in PARTS}
    worst = max(have, key=lambda s: s.worst_comm)
    return TimeSplit(shares, worst.worst_rank, worst.worst_comm, worst.ranks, len(have), have[0].source)
