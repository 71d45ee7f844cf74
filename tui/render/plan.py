"""``ftui plan``'s output: one JSON-ready report (:func:`plan_report`) that the text table and the Markdown
are drawn from, so the three say the same thing. Candidate labels, reasons and notes are run or user text:
the table holds them as ``Text``, never markup."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from runner.analysis.noise import Spread
from runner.analysis.ranking import Ranking, Standing
from runner.analysis.track_record import Record
from runner.service.plan import Candidate, Progress, Setup
from runner.service.plan_model import PlanModel, model_of
from runner.spec import first_step as fs
from tui.render.report import fmt_bytes


def _spread(s: Spread | None) -> dict[str, float | int] | None:
    return None if s is None else {"median": s.median, "low": s.low, "high": s.high, "n": s.n}


WAITING = "waiting"
"""The status of a candidate not raced yet while its plan is still racing."""


def _status(c: Candidate, standing: Standing | None, left: int, racing: bool) -> tuple[str, str | None]:
    """What became of a candidate, and why (the planner's reason, the budget, its trial's error); ``racing``:
    the plan's process is still racing, so a candidate with no trial yet waits for its turn."""
    if c.skip is not None:
        return "not raced", c.skip
    if standing is None and racing:
        return WAITING, "not raced yet: the plan is racing"
    if standing is None:
        return "not raced", ("over the --budget" if left else "not reached (the plan was stopped)")
    if standing.status == "completed":
        return "completed", (f"{left} repeat(s) over the --budget" if left else None)
    return standing.status, standing.reason


def candidate_entry(c: Candidate, standing: Standing | None, left: int,
                    records: Mapping[str, Record] | None = None, racing: bool = False,
                    model: PlanModel | None = None) -> dict[str, Any]:
    """One candidate of the JSON report (``records``: this host's track record of the planner, by key;
    ``racing``: the plan is still racing; ``model``: the plan's performance model)."""
    record = (records or {}).get(c.band_key)
    status, reason = _status(c, standing, left, racing)
    return {
        "label": c.label, "strategy": c.strategy, "nproc": c.nproc, "engine": c.engine,
        "checkpointing": c.checkpointing, "offload": c.offload,
        "micro_batch": c.split.micro_batch if c.split else None,
        "grad_accum": c.split.grad_accum if c.split else None,
        "batch": c.note, "fit": c.fit, "status": status, "reason": reason,
        "run_ids": standing.run_ids if standing else [],
        "standing": standing.standing if standing else "",
        "tokens_per_s": _spread(standing.tokens_per_s) if standing else None,
        "peak_memory": {
            "estimated_bytes": c.estimated,
            "estimated_source": "runner.planner (runner/watch/estimate.py), per device",
            "error_band_pct": None if c.band is None else round(c.band * 100, 2),
            "error_band_source": c.band_source or None,
            "error_this_host": None if record is None else record.json(),
            "budget_bytes": c.budget,
            "measured_bytes": standing.mem_measured if standing else None,
            "measured_source": standing.mem_source if standing else None,
        },
        "utilisation": {"mean_pct": standing.util if standing else None,
                        "source": standing.util_source if standing else None},
        "time_to_first_step_s": _spread(standing.first_step_s) if standing else None,
        "time_to_first_step_split": standing.first_step_split if standing else {},
        "time_split": standing.time_split.json() if standing and standing.time_split else None,
        "time_split_text": standing.time_split.sentence() if standing and standing.time_split else None,
        "predicted": model.candidate_json(c.label) if model else None,
    }


def plan_report(plan: Setup, progress: Progress, ranking: Ranking | None,
                records: Mapping[str, Record] | None = None, racing: bool = False) -> dict[str, Any]:
    """The whole plan as JSON: its id, settings, the memory it judged against, the decision, every candidate
    (raced or not) in ranking order, then those not raced; ``records``: this host's track record of the
    planner (:func:`runner.analysis.track_record.host_track_record`), shown beside each estimate; ``racing``:
    the plan's process is still racing (the dashboard's Plan view of a plan in progress)."""
    by_run = {rid: s for s in (ranking.standings if ranking else []) for rid in s.run_ids}
    left: dict[str, int] = {}
    for t in progress.over_budget:
        left[t.candidate.label] = left.get(t.candidate.label, 0) + 1
    order = {s.label: i for i, s in enumerate(ranking.standings)} if ranking else {}
    model = model_of(plan, progress, ranking)
    ranked: list[tuple[tuple[bool, int], dict[str, Any]]] = []
    for c in plan.candidates:  # raced ones in ranking order (fastest first), then those not raced
        ids = [r.id for r in progress.runs.get(c.key(), [])]
        standing = next((by_run[i] for i in ids if i in by_run), None)
        entry = candidate_entry(c, standing, left.get(c.label, 0), records, racing, model)
        place = order.get(standing.label, len(order)) if standing else len(order)
        ranked.append(((entry["status"] == "not raced", place), entry))
    entries = [e for _, e in sorted(ranked, key=lambda x: x[0])]
    decision = ranking.decision if ranking else None
    return {
        "plan_id": plan.pid, "recipe": plan.base.name, "steps": plan.steps, "repeat": plan.repeat,
        "memory": {"bytes": plan.memory.bytes, "shared_by_ranks": plan.memory.shared, "source": plan.memory.source},
        "decision": {"kind": decision.kind if decision else "none",
                     "text": ranking.text if ranking else "No trial ran, so there is nothing to decide.",
                     "winner_run_id": decision.run_id if decision else None,
                     "ties": ranking.ties if ranking else []},
        "candidates": entries,
        "performance_model": model.json(),
        "reopen": f"ftui compare --sweep {plan.pid}",
    }


def _tps(t: dict[str, Any] | None) -> str:
    if not t:
        return "-"
    return f"{t['median']:,.0f}" + (f" ({t['low']:,.0f}-{t['high']:,.0f}, n={t['n']})" if t["n"] > 1 else "")


def _result(e: dict[str, Any]) -> str:
    """``leader``, ``tie``, ``slower``, ``cannot tell`` for a completed candidate, else its status."""
    return (e["standing"] or "completed") if e["status"] == "completed" else e["status"]


def _predicted(e: dict[str, Any]) -> tuple[str, str]:
    """The model's tokens/s and, for a raced candidate, its held-out error (``-`` where there is none)."""
    pred = e.get("predicted") or {}
    tps = "-" if pred.get("tokens_per_s") is None else f"{pred['tokens_per_s']:,.0f}"
    err = pred.get("error_pct")
    return tps, "-" if err is None else f"{err:+.0f}%"


def cells(e: dict[str, Any]) -> list[str]:
    """A candidate's row of the table (:data:`HEADERS`)."""
    mem, util, first = e["peak_memory"], e["utilisation"], e["time_to_first_step_s"]
    return [e["label"], _result(e), _tps(e["tokens_per_s"]), *_predicted(e), fmt_bytes(mem["estimated_bytes"]),
            fmt_bytes(mem["measured_bytes"]), "-" if util["mean_pct"] is None else f"{util['mean_pct']:.0f}%",
            "-" if not first else f"{first['median']:.1f}s", ", ".join(map(str, e["run_ids"])) or "-"]


HEADERS = ("candidate", "result", "tokens/s", "predicted", "model err", "est. mem", "meas. mem", "util", "1st step", "runs")
"""tokens/s: steady-state median (min-max over the repeats); predicted: the performance model's tokens/s
(:mod:`runner.service.plan_model`; for a raced candidate, fitted without its trials); model err: that
prediction's error against the measured tokens/s; est. mem: the planner's per device; meas. mem:
the busiest rank's measured peak; 1st step: seconds from launch to the end of step 1 (median; its stages on
the candidate's line under the table: :mod:`runner.spec.first_step`)."""


def note_line(e: dict[str, Any]) -> str:
    """A candidate's line under the table: why it was not raced or did not complete, else its batch split;
    then where its time to first step went, and where a step's time went."""
    split = fs.stages_words({"seconds": e["time_to_first_step_split"]})
    line = f"{e['label']}: {e['reason'] or e['batch']}" + (f"; to first step (s): {split}" if split else "")
    return line + (f"; a step: {e['time_split_text']}" if e.get("time_split_text") else "")


def track_lines(report: dict[str, Any]) -> list[str]:
    """The planner's error on this host's own runs, one line per family and strategy among the candidates
    (none when no run here measured one), apart from the held-out grid's band the fit was judged with."""
    seen: dict[str, dict[str, Any]] = {}
    for e in report["candidates"]:
        if (record := e["peak_memory"]["error_this_host"]) is not None:
            seen.setdefault(record["key"], record)
    return [f"estimate error this host, {r['key']}: {r['median_pct']:+.1f}% median, {r['worst_pct']:+.1f}% worst "
            f"over {r['runs']} run(s) (runs {', '.join(map(str, r['run_ids']))}; estimate at prepare time vs "
            "the busiest rank's measured peak)" for r in seen.values()]


def model_lines(report: dict[str, Any]) -> list[str]:
    """The performance model's source, then one line per configuration the plan did not race."""
    model = report.get("performance_model")
    if not model:
        return []
    return [f"performance model: {model['source']}",
            *(f"predicted, not raced: {w['label']}, {w['change']}: {w['tokens_per_s']:,.0f} tokens/s"
              for w in model["not_raced"])]


WIDE = 120
"""Below this many columns the table is printed as two (speed, then memory and start), each readable at 80."""
SPEED = ("candidate", "result", "tokens/s", "predicted", "model err", "runs")
MEMORY = ("candidate", "est. mem", "meas. mem", "util", "1st step")


def _table(report: dict[str, Any], title: str, headers: tuple[str, ...]) -> Table:
    table = Table(title=title, box=box.SIMPLE_HEAD)
    for h in headers:
        table.add_column(h, justify="left" if h in ("candidate", "result") else "right")
    at = [HEADERS.index(h) for h in headers]
    for e in report["candidates"]:
        row = cells(e)
        table.add_row(*(Text(row[i]) for i in at))
    return table


def plan_table(report: dict[str, Any], width: int = WIDE) -> RenderableType:
    """The candidates as a table (two under :data:`WIDE` columns), each one's reason or batch split under it,
    then the decision."""
    title = f"plan {report['plan_id']} · {report['steps']} steps per trial"
    tables = ([_table(report, title, HEADERS)] if width >= WIDE else
              [_table(report, title, SPEED), _table(report, "memory and start", MEMORY)])
    mem = report["memory"]
    return Group(*tables, *(Text(note_line(e), style="dim") for e in report["candidates"]),
                 *(Text(line, style="dim") for line in track_lines(report)),
                 *(Text(line, style="dim") for line in model_lines(report)),
                 Text(f"memory judged against: {fmt_bytes(mem['bytes'])} ({mem['source']})", style="dim"),
                 Text(report["decision"]["text"], style="bold"),
                 Text(f"reopen with: {report['reopen']}", style="dim"))


def plan_markdown(report: dict[str, Any]) -> str:
    """The same table in Markdown (``|`` in a cell escaped)."""
    lines = [f"## plan {report['plan_id']}", "", f"**{report['decision']['text']}**", "",
             "| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    for e in report["candidates"]:
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells(e)) + " |")
    lines += ["", *(f"- {note_line(e)}" for e in report["candidates"])]
    lines += [f"- {line}" for line in track_lines(report)]
    lines += [f"- {line}" for line in model_lines(report)]
    lines += ["", f"Memory per device judged against: {fmt_bytes(report['memory']['bytes'])} "
                  f"({report['memory']['source']}). Reopen with `{report['reopen']}`."]
    return "\n".join(lines) + "\n"
