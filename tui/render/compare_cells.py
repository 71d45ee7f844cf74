"""The cells of a comparison table, shared by ``ftui compare``, the Compare screen and the HTML report.

Every cell is short (at most :data:`CELL_MAX` characters), so three runs fit at 120 columns and two at
80; what does not fit (the MFU peak's provenance, a failure's reason) goes to a numbered footnote under
the table (:func:`footnotes`), the cell keeping its gist and the footnote's mark.
"""

from __future__ import annotations

from collections.abc import Callable

from runner.analysis.compare import Comparison, RunRow
from runner.analysis.mfu import rate_text
from runner.analysis.run_peak import differing_peaks
from runner.analysis.shard_verdict import NOT_MEASURED
from runner.spec import first_step
from tui.render.ledger import cost_text, energy_text, per_cost_text
from tui.render.report import fmt_bytes, fmt_seconds

CELL_MAX = 24
"""The widest cell of a comparison table (characters)."""

Column = tuple[str, Callable[[RunRow], str]]


def _num(v: float | None, fmt: str, suffix: str = "") -> str:
    return "-" if v is None else format(v, fmt) + suffix


def _batch(r: RunRow) -> str:
    if r.micro_batch is None:
        return "-"
    return f"{r.micro_batch} x {r.grad_accum} (global {r.global_batch})"


def _cpu_util(r: RunRow) -> str:
    if r.cpu_util is None:
        return "-"
    if r.cpu_threads is None:
        return f"{r.cpu_util:.0f}% of one core"
    return f"{r.cpu_util:.0f}% of {r.cpu_threads} thread{'s' if r.cpu_threads != 1 else ''}"


def _spread(r: RunRow) -> str:
    # Shown for every run sampled on several devices (also when they agree), so a reader sees it was looked at.
    if r.util_min is None or r.util_max is None:
        return "-"
    return f"{r.util_min:.0f}-{r.util_max:.0f}%"


def _mfu_cell(r: RunRow) -> str:
    if r.mfu is not None:
        return f"{r.mfu * 100:.2f}%"
    return "- (> 100%: peak not trustworthy)" if r.mfu_rejected is not None else "-"


def _status(r: RunRow) -> str:
    return r.status if not r.reason else f"{r.status}: {r.reason}"


PEAK = "MFU peak/device"
MEM_MEASURED = "mem/device measured"
SHARDING = "sharding"

# (header, full cell) for the row-per-run formats; the sources are listed under the table.
COLUMNS: list[Column] = [
    ("run", lambda r: str(r.run_id)),
    ("strategy", lambda r: r.strategy_label + (f" [{r.grid}]" if r.grid else "")),
    ("method", lambda r: r.method),
    ("devices", lambda r: str(r.devices)),
    ("micro-batch x GA", _batch),
    ("CPU % of its threads", _cpu_util),
    ("GPU busy % (NVML)", lambda r: _num(r.gpu_busy, ".0f", "%")),
    ("util min-max", _spread),
    ("train time", lambda r: "-" if r.train_seconds is None else fmt_seconds(r.train_seconds)),
    ("tokens/s", lambda r: _num(r.tokens_per_s, ",.0f")),
    ("tokens/s/device", lambda r: _num(r.tokens_per_s_per_device, ",.0f")),
    ("MFU", _mfu_cell),
    (PEAK, lambda r: r.peak_label),
    (MEM_MEASURED, lambda r: fmt_bytes(r.mem_measured)),
    ("mem/device estimated", lambda r: fmt_bytes(r.mem_estimated)),
    (SHARDING, lambda r: r.sharding),
    ("final loss", lambda r: _num(r.final_loss, ".4f")),
    ("best loss", lambda r: _num(r.best_loss, ".4f")),
    ("speed-up", lambda r: _num(r.speedup, ".2f", "x")),
    ("status", _status),
]

EVAL_COLUMNS: list[Column] = [
    ("final eval loss", lambda r: _num(r.final_eval_loss, ".4f")),
    ("best eval loss", lambda r: _num(r.best_eval_loss, ".4f")),
]
"""Shown when a compared run was evaluated (``train.eval_every``, an eval set)."""

FIRST_STEP = "time to first step"
FIRST_STEP_COLUMN: Column = (FIRST_STEP, lambda r: first_step.words(r.first_step))
"""Shown when a compared run has it stored (:mod:`runner.spec.first_step`): the total, its stages in a footnote."""

LEDGER_COLUMNS: list[Column] = [
    ("tokens/J", lambda r: _num(r.ledger.tokens_per_joule, ".3g") if r.ledger else "-"),
    ("tokens per cost", lambda r: per_cost_text(r.ledger) if r.ledger else "-"),
]
"""Shown when a compared run has a stored ledger (:mod:`runner.analysis.ledger`); '-' with its reason in
the sources."""

KERNEL_COLUMNS: list[Column] = [
    ("attention", lambda r: (r.kernels.attention or "-") if r.kernels is not None else "-"),
    ("compile", lambda r: r.kernels.compile_cell() if r.kernels is not None else "-"),
]
"""Shown when a compared run recorded its kernels (the trainer's ``kernels`` event: what was in effect)."""

NOT_REPORTED = "not reported"
SCRIPT_REPORTS = frozenset({"micro-batch x GA", "train time", "tokens/s", "tokens/s/device", MEM_MEASURED,
                            "final loss", "best loss"})
"""Figures a script run has only when the script reports them (runner.track): '-' reads "not reported"."""


def _reported(cell: Callable[[RunRow], str]) -> Callable[[RunRow], str]:
    def text(r: RunRow) -> str:
        value = cell(r)
        return NOT_REPORTED if r.script and value == "-" else value

    return text


COLUMNS = [(h, _reported(c) if h in SCRIPT_REPORTS else c) for h, c in COLUMNS]


ROUTER_PREFIX = "moe/"
"""A mixture of experts' router load (runner/rank/router_load.py): shown when a compared run reported it."""


def _router_columns(cmp: Comparison) -> list[Column]:
    """One column per ``moe/*`` name any compared run reported: its last value."""
    names = sorted({n for values in cmp.named.values() for n in values if n.startswith(ROUTER_PREFIX)})

    def last(name: str) -> Callable[[RunRow], str]:
        return lambda r: _num(cmp.named.get(r.run_id, {}).get(name), ".3g")

    return [(f"{name} (last)", last(name)) for name in names]


def full_columns(cmp: Comparison) -> list[Column]:
    """:data:`COLUMNS` with their full texts: the kernels before the losses when any run recorded them, the eval
    figures and the router's load before ``speed-up`` when any run has them."""
    cols = list(COLUMNS)
    if any(r.first_step for r in cmp.rows):
        at = next(i for i, (h, _) in enumerate(cols) if h == "train time")
        cols.insert(at, FIRST_STEP_COLUMN)
    if any(r.kernels is not None for r in cmp.rows):
        at = next(i for i, (h, _) in enumerate(cols) if h == "final loss")
        cols[at:at] = KERNEL_COLUMNS
    ledger = LEDGER_COLUMNS if any(r.ledger is not None and r.ledger.recorded for r in cmp.rows) else []
    extra = [*(EVAL_COLUMNS if cmp.eval_curves else []), *_router_columns(cmp), *ledger]
    if not extra:
        return cols
    at = next(i for i, (h, _) in enumerate(cols) if h == "speed-up")
    return [*cols[:at], *extra, *cols[at:]]


def peak_brief(r: RunRow) -> str:
    """The MFU peak's provenance in one line: its label and what it is (``matmul probe in the ranks (CPU)``,
    a datasheet, given); the full source is in JSON (``peak_source``) and the HTML report's details."""
    return f"{r.peak_label}; {(r.peak_source or '').split(', ')[0]}"


def _gist(header: str, r: RunRow, text: str) -> tuple[str, str | None]:
    """A cell's short text and, when something was left out of it, the footnote that holds it."""
    if header == PEAK and r.peak_flops is not None:
        return f"{rate_text(r.peak_flops, r.peak_per_cpu_second, short=True)} {r.peak_dtype or ''}".rstrip(), peak_brief(r)
    if header == SHARDING and text.startswith("NOT"):  # what is not as promised, kind by kind
        return text if len(text) <= CELL_MAX else "NOT as promised", f"run {r.run_id} sharding: {r.sharding_line}"
    if len(text) <= CELL_MAX:
        return text, None
    if header == FIRST_STEP:
        return fmt_seconds(first_step.total_seconds(r.first_step)), f"run {r.run_id} {header}: {text}"
    if header == "status":
        return r.status, f"run {r.run_id} {text}"
    if header == "MFU":
        return "-", f"run {r.run_id} MFU: {text.removeprefix('- (').removesuffix(')')}"
    return text[:CELL_MAX - 5].rstrip() + "…", f"run {r.run_id} {header}: {text}"


def _cells(cmp: Comparison) -> tuple[dict[tuple[str, int], str], list[str]]:
    """Each (header, run id)'s short cell with its footnote mark, and the footnotes in order (one per text)."""
    notes: list[str] = []
    cells: dict[tuple[str, int], str] = {}
    for header, cell in full_columns(cmp):
        for r in cmp.rows:
            short, note = _gist(header, r, cell(r))
            if note is not None:
                if note not in notes:
                    notes.append(note)
                short = f"{short} [{notes.index(note) + 1}]"
            cells[(header, r.run_id)] = short
    return cells, notes


def columns(cmp: Comparison) -> list[Column]:
    """The table's columns with short cells (long texts replaced by a footnote's mark: :func:`footnotes`)."""
    cells, _ = _cells(cmp)

    def short(header: str) -> Callable[[RunRow], str]:
        return lambda r: cells[(header, r.run_id)]

    return [(header, short(header)) for header, _ in full_columns(cmp)]


def footnotes(cmp: Comparison) -> list[str]:
    """``[1] 40.6 GFLOP/s fp32, 2 threads, probed beside the run; matmul probe in the ranks (CPU)``: what the
    short cells of :func:`columns` left out."""
    return [f"[{i}] {note}" for i, note in enumerate(_cells(cmp)[1], start=1)]


def sources(cmp: Comparison) -> list[str]:
    """Where each figure comes from (one line each), then the footnotes of the short cells."""
    return figure_sources(cmp) + footnotes(cmp)


def figure_sources(cmp: Comparison) -> list[str]:
    """Where each figure comes from, one line each."""
    out = []
    util = sorted({r.util_source for r in cmp.rows if r.util_source != "-"})
    if util:
        out.append("utilisation: " + "; ".join(util))
    out.append("train time, tokens/s, loss: measured by the trainer (tokens/s over all devices; first to last step)")
    if any(r.first_step for r in cmp.rows):
        out.append("time to first step: the launcher's start to the end of step 1, timed by the watcher and the "
                   "trainer's phase events on this host (docs/compare.md)")
    if cmp.eval_curves:
        out.append("eval loss: measured by the trainer over the whole held-out set (token-weighted mean over ranks)")
    if _router_columns(cmp):
        out.append("moe/*: the router's top-k choice per token, counted by the trainer per expert and layer over "
                   "every rank, at the last logged step (docs/metrics.md)")
    if any(r.script for r in cmp.rows):
        out.append("script runs: what the script reported through runner.track or FtuiCallback (train time from "
                   "its start to its last step); 'not reported' where it did not")
    if any(r.peak_source and not r.peak_per_cpu_second for r in cmp.rows):
        out.append("MFU: FLOPs/token x tokens/s / (peak x devices), in the run's dtype (docs/compare.md)")
    if any(r.peak_per_cpu_second for r in cmp.rows):
        out.append("MFU on CPU: the run's FLOPs over its steady steps / (the matmul FLOPs per CPU-second probed "
                   "beside it x the CPU-seconds its ranks ran over those steps), in the run's dtype (docs/compare.md)")
    out += [f"MFU of run {r.run_id}: {r.mfu_basis}" for r in cmp.rows if r.mfu is not None and r.peak_per_cpu_second]
    out += differing_peaks((r.run_id, r.peak_dtype, r.peak_threads, r.peak_flops, r.peak_kind, r.peak_per_cpu_second)
                           for r in cmp.rows)
    out += [f"MFU '-' for run {r.run_id}: {r.mfu_note}" for r in cmp.rows if r.mfu_note]
    mem = sorted({r.mem_measured_source for r in cmp.rows if r.mem_measured is not None})
    if mem:
        out.append("mem measured: " + "; ".join(mem))
    out += kernel_sources(cmp)
    est = sorted({r.mem_estimated_source for r in cmp.rows if r.mem_estimated is not None})
    if est:
        out.append("mem estimated: " + "; ".join(est))
    if any(r.sharding != NOT_MEASURED for r in cmp.rows):
        out.append("sharding: each rank's measured bytes of each kind of state against the whole and the share its "
                   "strategy promises (docs/strategies.md)")
    out += ledger_sources(cmp)
    base = cmp.row(cmp.baseline_id)
    if base and base.tokens_per_s:
        out.append(f"speed-up: tokens/s over the baseline's, run {base.run_id} ({cmp.label(base)})")
    notes = sorted({f"{r.strategy_label}: {r.note}" for r in cmp.rows if r.note})
    out += [f"batch: {n}" for n in notes]
    return out


def kernel_sources(cmp: Comparison) -> list[str]:
    """Where the attention and compile columns come from, and what a compiled CPU run's measured memory is."""
    if not any(r.kernels is not None for r in cmp.rows):
        return []
    out = ["attention, compile: in effect, read by the trainer from the live model and torch._dynamo's counters "
           "(compile: mode, layers, graph breaks, the compile phase's seconds: the first step)"]
    lower = [str(r.run_id) for r in cmp.rows
             if r.kernels is not None and r.kernels.compile_mode is not None and r.device_type == "cpu"]
    if lower:
        out.append(f"mem measured of compiled CPU runs ({', '.join(lower)}): a lower bound (what inductor's fused "
                   "kernels allocate and free inside a graph is not seen)")
    return out


def ledger_sources(cmp: Comparison) -> list[str]:
    """Where each run's tokens per joule and per unit of cost come from, or why they are '-'."""
    out = []
    for r in cmp.rows:
        if r.ledger is None or not r.ledger.recorded:
            continue
        f = r.ledger
        out.append(f"run {r.run_id} energy {energy_text(f.energy_j)}: {f.energy_source}; tokens/J "
                   f"{_num(f.tokens_per_joule, '.3g')}: {f.tokens_per_joule_source}")
        out.append(f"run {r.run_id} device-hours {_num(f.device_hours, '.4g')}: {f.device_hours_source}; cost "
                   f"{cost_text(f)}: {f.cost_source}; tokens per cost {per_cost_text(f)}: {f.tokens_per_cost_source}")
    return out


def summary_lines(cmp: Comparison) -> list[str]:
    """The ratios against the baseline (when more than two configurations ran: with two, the verdict says
    the same), then the verdict (:mod:`runner.analysis.verdict`)."""
    pairs = cmp.speedup_sentences()
    return [*(pairs if len(pairs) > 1 else []), cmp.recommendation()]


def sample_rows(cmp: Comparison) -> tuple[list[int], list[tuple[str, list[str]]]]:
    """The runs with samples, and per prompt (in first-seen order) each such run's completion."""
    ids = [r.run_id for r in cmp.rows if cmp.samples.get(r.run_id)]
    prompts: dict[str, dict[int, str]] = {}
    for rid in ids:
        for sample in cmp.samples[rid]:
            prompts.setdefault(sample["prompt"], {})[rid] = sample["completion"]
    return ids, [(p, [by_run.get(rid, "-") for rid in ids]) for p, by_run in prompts.items()]
