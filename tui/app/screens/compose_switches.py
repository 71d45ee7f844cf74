"""Compose's list of every efficiency switch under its estimate: each switch turned to its other states, what
that does to the recipe's estimate, whether it runs here, and the switch the recommendation proposes
(:mod:`runner.service.switch_report`, as ``ftui estimate`` prints them)."""

from __future__ import annotations

from rich.text import Text

from runner.planner.inputs import EstimateInput
from runner.service import switch_report
from runner.spec.recipe import Recipe
from store import Store


def switches_text(recipe: Recipe, inp: EstimateInput, store: Store | None) -> Text:
    """The switches' lines (run text: never markup), then the proposals. Blocking (host checks, the store)."""
    rows = switch_report.switch_rows(recipe, inp)
    out = Text("\nevery switch, turned (estimated memory; whether it runs here):", style="bold")
    for row in rows:
        out.append(f"\n  {row.line()}", style="" if row.problem is None else "dim")
    proposals = [p for p in [switch_report.memory_proposal(rows, inp)] if p]
    if store is not None:
        proposals += switch_report.speed_proposals(store, recipe, inp.shape, rows)
    for line in proposals:
        out.append("\n  proposed: ", style="bold")
        out.append(line)
    return out
