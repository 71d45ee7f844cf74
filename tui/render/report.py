"""Rich renderings of runs for the command line: lists, one run, JSON for scripts.

Every figure says where it comes from: "measured" figures come from the trainer's own events; measured
memory is the CUDA allocator's peak on GPU and the peak of live tensor bytes on CPU (runner/rank/memtrack.py);
process RSS (getrusage/psutil) is shown as such, never as "measured memory".
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from runner.analysis import ledger
from runner.analysis.mfu import Peak
from runner.analysis.run_figures import kernels
from runner.analysis.run_peak import stored_mfu
from runner.analysis.shard_verdict import run_verdict
from runner.hardware.records import SOURCE_LABELS
from runner.planner.error_band import Band
from runner.spec import first_step
from runner.spec.events import RECIPE_FILE
from runner.spec.strategies import STRATEGIES, recipe_global_batch
from runner.spec.summary import (
    RunSummary,
    TelemetrySummary,
    busiest_peak,
    error_pct,
    library_measured,
    model_state_bytes,
    rank_peak,
    rank_rss,
)
from store import MetricPoint, NamedMetricPoint, RunInfo
from tui.render.ledger import ledger_rows
from tui.render.plain import row as text_row
from tui.render.words import distributed_words, strategy_words


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def fmt_seconds(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 60:
        return f"{s:.1f}s"
    m, sec = divmod(int(round(s)), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m{sec:02d}s" if h else f"{m}m{sec:02d}s"


def tokens_per_s_rows(run: RunInfo) -> list[tuple[str, str, str]]:
    """The steady-state tokens/s and, where the trainer reported it, the whole window's beside it."""
    window = run.summary.window_tokens_per_s
    if window is None:  # a run from before the steady state was measured, or a script's
        return [("tokens/s", _num(run.tokens_per_s, ",.0f"), "measured")]
    if run.tokens_per_s is None:
        steady = ("tokens/s", "-", "no steady-state figure: every step was memory-metered")
    else:
        n = run.summary.steady_steps or 0
        steady = ("tokens/s", _num(run.tokens_per_s, ",.0f"),
                  f"measured: steady state, the {n} step{'s' if n != 1 else ''} after the memory-metered ones")
    return [steady, ("tokens/s whole window", _num(window, ",.0f"), "measured: every step, memory-metered ones included")]


def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


STATUS_STYLE = {"completed": "green", "failed": "red", "stopped": "yellow", "killed": "magenta", "running": "cyan",
                "created": "dim"}



# The columns of ``ftui runs``, most important first: at a narrow width the last ones are left out
# rather than every cell being cut. (header, justify, cell, most width given)
_RUN_COLUMNS: tuple[tuple[str, str, Any, int], ...] = (
    ("id", "right", lambda r: str(r.id), 8),
    ("name", "left", lambda r: r.name, 28),
    ("status", "left", lambda r: Text(r.status, style=STATUS_STYLE.get(r.status, "")), 9),
    ("strategy", "left", lambda r: strategy_words(r.strategy, r.nproc), 10),
    ("tokens/s", "right", lambda r: _num(r.tokens_per_s, ",.0f"), 9),
    ("final loss", "right", lambda r: _num(r.final_loss, ".4f"), 10),
    ("train time", "right", lambda r: fmt_seconds(r.train_seconds), 10),
    ("method", "left", lambda r: r.method, 6),
    ("started", "left", lambda r: r.started_at.strftime("%m-%d %H:%M") if r.started_at else "-", 11),
    ("in effect", "left", lambda r: distributed_words(r.distributed_type), 12),
)


def runs_table(runs: list[RunInfo], width: int | None = None) -> Table:
    """Every run, one line each. Columns are chosen to fit ``width`` (the terminal's; None: all): the
    least important are left out, never a cell cut short (a long name folds onto a second line)."""
    from rich import box

    chosen = list(_RUN_COLUMNS)
    if width is not None:
        def natural(col: tuple[str, str, Any, int]) -> int:
            header, _, get, most = col
            cells = [len(str(get(r))) for r in runs[:200]]
            return min(most, max([len(header), *cells]))

        # each column costs its content plus 2 of padding (box.SIMPLE_HEAD draws no vertical lines)
        # (and the table's own edges: 4)
        while len(chosen) > 3 and sum(natural(c) + 2 for c in chosen) + 4 > width:
            chosen.pop()
    table = Table(title="runs", caption="tokens/s, loss and time: measured by the trainer", box=box.SIMPLE_HEAD)
    for header, justify, _, _ in chosen:
        table.add_column(header, justify=justify, overflow="fold",  # type: ignore[arg-type]
                         no_wrap=header != "name", min_width=8 if header == "name" else None)
    for r in runs:
        table.add_row(*text_row(*(get(r) for _, _, get, _ in chosen)))
    return table


def global_batch_words(run: RunInfo) -> tuple[str, str] | None:
    """(``"8 rows"``, ``"micro-batch 4 x 2 processes x GA 1 (recipe)"``), or None for a recipe without one."""
    try:
        parsed = tomllib.loads(run.recipe_text or "")
    except tomllib.TOMLDecodeError:
        return None
    train = parsed.get("train") or {}
    micro, ga = train.get("batch_size"), train.get("grad_accum")
    if not isinstance(micro, int) or not isinstance(ga, int):
        return None
    rows = recipe_global_batch(run.strategy, parsed, run.nproc)
    if rows is None:
        return None
    replicas = rows // (micro * ga)
    row = STRATEGIES.get(run.strategy)
    # Tensor parallel: each group of tp_size processes trains one batch.
    unit = ("tensor-parallel group", "s") if row is not None and row.tensor_parallel else ("process", "es")
    return f"{rows} rows", f"micro-batch {micro} x {replicas} {unit[0]}{unit[1] if replicas != 1 else ''} x GA {ga} (recipe)"


def run_summary_table(run: RunInfo | None) -> Table:
    """The end-of-run table: time, throughput, loss, peak memory per rank."""
    table = Table(title=f"run {run.id if run else '?'} summary", show_header=True)
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_column("source", overflow="fold")  # a long source (the CPU's ISA flags) folds, never cut
    if run is None:
        return table
    table.add_row("status", Text(run.status, style=STATUS_STYLE.get(run.status, "")), "orchestrator")
    if run.summary.ended:  # a stop: the step it ended at, and the checkpoint it can resume from or none
        table.add_row(*text_row("ended", run.summary.ended, "orchestrator (checkpoint manifest checked)"))
    script = run.method == "script" or "script = " in (run.recipe_text or "")  # launch.script (runner.spec.script)
    missing = "not reported" if script and run.status != "running" else "-"
    table.add_row(*text_row("distributed type", run.distributed_type or missing, "accelerate (in effect)"))
    for row in zero_rows(run.summary):
        table.add_row(*text_row(*row))
    table.add_row("steps", f"{run.steps_done or 0}/{run.total_steps or '?'}", "script" if script else "trainer")
    batch = global_batch_words(run)
    if batch:  # what tokens/s means: a --nproc 2 DDP run trains twice the rows of a single one per step
        table.add_row("global batch", batch[0], batch[1])
    table.add_row("training time", fmt_seconds(run.train_seconds), "measured (first to last step)")
    if run.summary.time_to_first_step:  # launch to the end of step 1, and where it went (runner.spec.first_step)
        ttfs = run.summary.time_to_first_step
        table.add_row("time to first step", fmt_seconds(first_step.total_seconds(ttfs)),
                      f"measured (launch to step 1's end): {first_step.stages_words(ttfs) or '-'}")
    for row in tokens_per_s_rows(run):
        table.add_row(*row)
    table.add_row("final loss", _num(run.final_loss, ".4f"), "measured (mean over ranks)")
    _add_rank_rows(table, run)
    for row in sharding_rows(run):
        table.add_row(*text_row(*row))
    approximate = (run.summary.estimate or {}).get("approximate")
    if approximate:
        table.add_row(*text_row("estimate", "approximate", str(approximate)))
    _add_telemetry_rows(table, run.summary.telemetry)
    if run.status == "completed" and run.tokens_per_s:
        mfu, why = stored_mfu(run)
        table.add_row(*text_row("MFU", "-" if mfu is None else f"{mfu:.2%}", why))
    mfu_peak = run.summary.mfu_peak
    if mfu_peak is not None and mfu_peak.get("flops"):
        stored = Peak.from_json(mfu_peak)
        if stored is not None:
            # the source's first clause (its details, the CPU's ISA flags, are in `ftui compare`'s notes)
            source = stored.source.split(", ")[0]  # a probe's source says it was beside the run
            # a probe's conditions: how the run's OpenMP threads waited (runner/spec/openmp.py)
            why = (", ".join(filter(None, (source, stored.waits()))) if stored.kind == "probe"
                   else f"{stored.provenance()}: {source}")
            label = "MFU peak per CPU-second" if stored.per_cpu_second else "MFU peak/device"
            table.add_row(*text_row(label, stored.figure(), why))
    if run.summary.ledger is not None:  # device-hours, energy, cost (runner.analysis.ledger)
        for row in ledger_rows(ledger.figures(run.summary)):
            table.add_row(*text_row(*row))
    if run.error:
        table.add_row("error", Text(run.error, style="red"), "")
    stacks = run.summary.stacks
    if stacks is not None:  # where each rank was when the watcher asked (a hang, a collective timeout)
        table.add_row(*text_row("stacks", stacks["summary"],
                                f"faulthandler at the {stacks['cause']}; full dumps: {stacks['folder']}"))
    return table


def _add_rank_rows(table: Table, run: RunInfo) -> None:
    """Each rank's measured memory: peak and phases (unless the memory table has them), model states, RSS."""
    ranks = run.summary.ranks
    # One rank: the memory table (estimate_table) shows its peak and phases; printing them here too was
    # the same figure twice under two names.
    peaks_elsewhere = len(ranks) == 1 and bool(estimate_vs_measured(run.summary))
    for rank in ranks:
        peak, src = rank_peak(rank)
        if not peaks_elsewhere:
            table.add_row(f"rank {rank['rank']} peak memory", fmt_bytes(peak), src)
        phases = rank.get("phase_peaks")
        if phases and not peaks_elsewhere:
            table.add_row(f"rank {rank['rank']} peak fwd/bwd/opt",
                          " / ".join(fmt_bytes(v) for v in (phases.get("forward"), phases.get("backward"),
                                                            phases.get("optimizer"))),
                          f"{src}, per phase of the first {rank.get('measured_steps', 1)} step(s)")
        states = model_state_bytes(rank)
        table.add_row(f"rank {rank['rank']} model states", fmt_bytes(states), "measured (tensor bytes)")
        rss, baseline = rank_rss(rank)
        if rss is not None:
            table.add_row(f"rank {rank['rank']} peak RSS", fmt_bytes(rss), "getrusage: whole process, not training memory")
            if baseline:
                table.add_row(f"rank {rank['rank']} RSS before the model", fmt_bytes(baseline), "psutil (the runtime)")


def _add_telemetry_rows(table: Table, telemetry: TelemetrySummary | None) -> None:
    """The sampled devices' and ranks' utilisation and memory, then the mean over the devices."""
    for key, dev in (telemetry["devices"] if telemetry is not None else {}).items():
        if dev["kind"] == "host":
            continue
        stats = dev["active"] or dev["whole"]
        span = "active" if dev["active"] else "whole run"
        unit = "% GPU busy" if dev["kind"] == "gpu" else "% of a core"
        threads = dev["threads"]
        if dev["kind"] == "rank" and threads and stats["util_mean"] is not None:
            unit += f" ({stats['util_mean'] / threads:.0f}% of {threads} thread{'s' if threads != 1 else ''})"
        table.add_row(*text_row(
            f"{key} util mean/peak",
            f"{_num(stats['util_mean'], '.0f')}/{_num(stats['util_peak'], '.0f')}{unit}",
            f"{SOURCE_LABELS.get(dev['source'], dev['source'])}, {span}, {stats['n']} samples",
        ))
        # a rank's psutil memory is its RSS: named so, not another "peak memory"
        table.add_row(*text_row(f"{key} {'RSS' if dev['kind'] == 'rank' else 'memory'} peak",
                                fmt_bytes(stats["mem_peak"]), SOURCE_LABELS.get(dev["source"], dev["source"])))
    for rank_id, gpu_mem in (telemetry.get("rank_gpu_mem_peak") or {} if telemetry is not None else {}).items():
        table.add_row(f"rank {rank_id} GPU memory peak", fmt_bytes(gpu_mem), "NVML (the rank's own processes)")
    overall = (telemetry["active"] or telemetry["whole"]) if telemetry is not None else None
    if telemetry is not None and overall and overall["util_mean"] is not None:
        span = "active window" if telemetry["active"] else "whole run"
        unit = overall["util_unit"]
        table.add_row(*text_row("mean/peak device util",
                                f"{overall['util_mean']:.0f}/{_num(overall['util_peak'], '.0f')}%",
                                f"{unit}, {overall['devices']} {overall['kind']}{'s' if overall['devices'] != 1 else ''}, "
                                f"{span.removesuffix(' window')}"))
        low, high = overall["util_min"], overall["util_max"]
        if overall["devices"] > 1 and low is not None and high is not None:
            table.add_row(*text_row("util min-max over devices", f"{low:.0f}-{high:.0f}%",
                                    f"{unit}: the lowest and highest device's mean, {span}"))


def sharding_rows(run: RunInfo) -> list[tuple[str, str, str]]:
    """Whether the sharding the run's strategy promises is in effect (:mod:`runner.analysis.shard_verdict`):
    the verdict of every kind in one line, then each kind's bytes per rank against the whole. Nothing for a
    run of one process (nothing is divided) or whose ranks reported nothing (a script, a run that never
    stepped)."""
    ranks = run.summary.ranks
    if len(ranks) < 2:
        return []
    verdict = run_verdict(run.strategy, run.summary)
    rows = [("sharding", verdict.short(), verdict.why_not or verdict.line())]
    for check in verdict.checks:
        held = " / ".join(fmt_bytes(h) for h in check.held)
        if check.gathered:  # ZeRO-3's small parameters, whole beside the partitions
            held += f" (+ {fmt_bytes(check.gathered)} gathered whole)"
        whole = "the whole not measured" if check.whole is None else f"of {fmt_bytes(check.whole)}"
        rows.append((f"{check.kind} per rank", f"{held} {whole}",
                     "measured: tensor bytes, rank 0 first, against the whole the ranks counted"))
    return rows


def zero_rows(summary: RunSummary) -> list[tuple[str, str, str]]:
    """(figure, value, source) rows for what the trainer found in effect: the engine and sharding (ZeRO
    runs and every strategy since) and the precision of the live tensors."""
    rows: list[tuple[str, str, str]] = []
    sharding = summary.sharding
    if sharding is not None:
        value = str(sharding.get("how") or sharding.get("engine") or "-")
        if sharding.get("offload") not in (None, "none"):
            value += f", offload {sharding['offload']}"
        rows.append(("engine / sharding", value, "trainer (in effect: read from the prepared model and optimizer)"))
    precision = summary.precision
    if precision is not None:
        parts = [("params", "params"), ("frozen", "frozen_params"), ("compute", "compute"),
                 ("optimizer state", "optimizer_state"), ("master", "master")]
        value = " · ".join(f"{label} {precision.get(key) or 'none'}" for label, key in parts
                           if key != "frozen_params" or precision.get(key))
        rows.append(("precision", value, "measured (dtypes of rank 0's live tensors)"))
    switched = switch_text((precision or {}).get("switches"))
    if switched:
        rows.append(("efficiency switches", switched, "measured (rank 0's cp mesh, Float8Linear modules, saved-tensor "
                                                      "hooks)"))
    found = kernels(summary.kernels)
    if found is not None:
        rows.append(("attention", found.attention or "-", "trainer (in effect: the live model's config)"))
        rows.append(("compile", found.compile_cell(), "trainer (in effect: compiled layers, torch._dynamo's counters; "
                                                      "seconds: the compiling phase, the first step)"))
    if summary.loss_scale_drops:
        rows.append(("fp16 loss-scale drops", str(summary.loss_scale_drops), "trainer (loss_scale events)"))
    per_device = (summary.estimate or {}).get("per_device_bytes") or {}
    if per_device.get("host_bytes"):
        rows.append(("offloaded to host", fmt_bytes(per_device["host_bytes"]),
                     "estimated (per rank: host memory, not the device's)"))
    if per_device.get("nvme_bytes"):
        rows.append(("offloaded to NVMe", fmt_bytes(per_device["nvme_bytes"]), "estimated (per rank: ZeRO-Infinity)"))
    return rows


def switch_text(switches: dict[str, Any] | None) -> str | None:
    """The efficiency switches found live (the precision event's ``switches``), or None when none is on."""
    if not switches:
        return None
    parts = []
    if int(switches.get("cp_size") or 1) > 1:
        parts.append(f"context parallel over {switches['cp_size']}")
    if switches.get("fp8_linears"):
        parts.append(f"fp8 in {switches['fp8_linears']} Linear layers")
    if switches.get("activation_offload"):
        parts.append("activations saved to host")
    return " · ".join(parts) or None


# (row, estimate key in per_device_bytes, measured key in a rank's figures, how the ranks combine, source note)
ESTIMATE_KINDS: tuple[tuple[str, str, str, str, str], ...] = (
    ("peak", "total", "peak", "max", "busiest rank"),
    ("forward peak", "phases.forward", "phase_peaks.forward", "max", "busiest rank"),
    ("backward peak", "phases.backward", "phase_peaks.backward", "max", "busiest rank"),
    ("optimizer-step peak", "phases.optimizer", "phase_peaks.optimizer", "max", "busiest rank"),
    ("params", "params", "param_bytes", "mean", "exact tensor bytes"),
    ("grads", "grads_total|grads", "grad_bytes", "mean", "exact tensor bytes"),
    ("optimizer state", "optimizer", "optimizer_bytes", "mean", "exact tensor bytes"),
    ("fp32 master", "master", "master_bytes", "mean", "exact tensor bytes"),
    ("saved activations", "activations_stored", "activation_bytes", "mean",
     "saved_tensors_hooks, one forward: a detail, not the peak"),
)


def _dig(mapping: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(mapping, dict):
            return None
        mapping = mapping.get(part)
    return mapping


def estimate_vs_measured(summary: RunSummary) -> list[tuple[str, int, float | None, float | None]]:
    """(kind, estimated bytes per device, measured bytes, error in percent) for each figure both sides
    have: the peak and each phase's peak against the independent measurement (runner/rank/memtrack.py: the
    CUDA allocator's peak on GPU, the live-tensor peak on CPU; busiest rank), the model states against their
    exact tensor bytes (mean over ranks), and the saved activations of one forward (a detail). Empty when the
    run has no estimate; a row is left out when the estimate lacks its key (an estimate of fewer parts)."""
    per_device = (summary.estimate or {}).get("per_device_bytes")
    if not per_device:
        return []
    ranks = summary.ranks
    out: list[tuple[str, int, float | None, float | None]] = []
    for kind, key_est, key_meas, how, _ in ESTIMATE_KINDS:
        est = next((v for k in key_est.split("|") if (v := _dig(per_device, k)) is not None), None)
        if est is None:
            continue
        # The measured bytes count a rank's tensors wherever they live: the estimate's offloaded (host) part
        # of the same kind is added (a ZeRO offload; on a CPU-only machine both are host memory).
        host = {"params": "params", "grads": "grads", "optimizer state": "optimizer", "fp32 master": "master"}
        est = int(est) + int((per_device.get("offloaded") or {}).get(host.get(kind, ""), 0))
        measured: float | None
        if key_meas == "peak":
            measured = busiest_peak(ranks)[0]
        else:
            values = [v for r in ranks if (v := _dig(r, key_meas)) is not None]
            if how == "max":
                measured = max(values) if values else None
            else:
                measured = sum(values) / len(values) if values else None
        out.append((kind, est, measured, error_pct(est, measured)))
    return out


def estimate_rows(summary: RunSummary) -> list[tuple[str, str, str]]:
    rows = []
    n = len(summary.ranks)
    notes = {kind: note for kind, _, _, _, note in ESTIMATE_KINDS}
    peak_source = next((rank_peak(r)[1] for r in summary.ranks if rank_peak(r)[0] is not None),
                       "not measured")
    for kind, est, measured, err in estimate_vs_measured(summary):
        value = f"{fmt_bytes(est)} est. / {fmt_bytes(measured)} meas."
        what = peak_source if "peak" in kind else "measured"
        note = f"estimated (runner.planner) vs {what} ({notes[kind]}"
        note += f", {n} ranks)" if n > 1 and "busiest" not in notes[kind] else ")"
        rows.append((f"{kind} per device", value + ("" if err is None else f" ({err:+.1f}%)"), note))
    approximate = (summary.estimate or {}).get("approximate")
    if approximate:
        rows.append(("estimate", "approximate", str(approximate)))
    return rows


def estimate_table(summary: RunSummary) -> Group | None:
    """Memory per device, estimated against measured: one row per figure (peak, each phase's peak, model
    states, saved activations), the error in percent; None when the run stored no estimate."""
    compared = estimate_vs_measured(summary)
    if not compared:
        return None
    n = len(summary.ranks)
    peak_source = next((rank_peak(r)[1] for r in summary.ranks if rank_peak(r)[0] is not None),
                       "not measured")
    notes = {kind: note for kind, _, _, _, note in ESTIMATE_KINDS}
    table = Table(title="memory per device: estimated vs measured")
    table.caption = None
    sources = Text(f"estimated: runner.planner; peaks {peak_source} (busiest rank); params, grads, optimizer "
                   f"state: exact tensor bytes{f' (mean of {n} ranks)' if n > 1 else ''}; saved "
                   f"activations: {notes['saved activations']}", style="dim")
    for col in ("figure", "estimated", "measured", "error"):
        table.add_column(col, justify="left" if col == "figure" else "right", no_wrap=True)
    for kind, est, measured, err in compared:
        table.add_row(kind, fmt_bytes(est), fmt_bytes(measured), "-" if err is None else f"{err:+.1f}%")
    library = library_text(summary)
    return Group(table, sources, *([Text(library)] if library else []),
                 Text(band_line(summary.estimate or {}), style="dim"))


def library_text(summary: RunSummary) -> str | None:
    """The maths library's line: the estimate's term (measured on this host by ``ftui estimate --library``)
    beside what the ranks measured beyond tensors over their measured steps (the largest rank), and the
    difference; None when neither side has one."""
    term = (summary.estimate or {}).get("library") or {}
    measured = [m for m in (library_measured(r) for r in summary.ranks) if m is not None]
    if not term and not measured:
        return None
    est = term.get("bytes")
    label = str(term.get("label") or "maths library: not in this run's estimate")
    ranks = f"{len(measured)} ranks, the largest" if len(measured) > 1 else "rank 0"
    beside = (f"; measured in the run: {fmt_bytes(max(measured))} beyond tensors ({ranks}: heap or NVML minus "
              f"tensors over the measured steps)" if measured else "; not measured in the run")
    diff = (f"; difference {'+' if est >= max(measured) else '-'}{fmt_bytes(abs(est - max(measured)))}"
            if est is not None and measured else "")
    head = f"{label}: {fmt_bytes(est)} per process" if est is not None else label
    return f"{head} (beside the tensor rows, not in them){beside}{diff}"


def band_line(estimate: Mapping[str, Any]) -> str:
    """What the planner's error has been for this run's model family and strategy, elsewhere than here."""
    band = estimate.get("error_band")
    if band:
        return f"the planner's error on the held-out grid for {Band(**band).sentence()}"
    key = estimate.get("band_key")
    if key:
        return f"the planner's error for {key} was never measured on the held-out grid: unknown beyond this run"
    return "the planner's error band was not recorded for this run"


def run_report(run: RunInfo) -> Group:
    """The summary of one run with its memory table (``ftui run``'s end, the head of ``ftui show``)."""
    memory = estimate_table(run.summary)
    return Group(run_summary_table(run), *([memory] if memory is not None else []))


def named_table(named: Mapping[str, tuple[int, float]]) -> Table:
    """The last value of each named metric (``eval/*``, ``moe/*``, a script's own), by name."""
    table = Table(title="named metrics (last value)")
    for col, justify in (("name", "left"), ("step", "right"), ("value", "right")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for name in sorted(named):
        step, value = named[name]
        table.add_row(Text(name), str(step), f"{value:.4g}")  # a script's own name: text, never markup
    return table


def run_detail(run: RunInfo, metrics: list[MetricPoint], with_recipe: bool = False,
               named: Mapping[str, tuple[int, float]] | None = None) -> Group:
    """``ftui show``: the summary, the memory table, the metrics (the first and last steps of a long run,
    with a line saying how many were left out), the named metrics' last values, and where the recipe the run
    was launched with is; the whole resolved recipe only ``with_recipe`` (``--recipe``: some 60 lines, which
    buried the metrics)."""
    parts: list[Any] = [run_report(run)]
    if with_recipe and run.recipe_text:
        parts.append(Text("recipe", style="bold"))
        parts.append(Text(run.recipe_text.rstrip()))  # the user's text: never markup
    if metrics:
        table = Table(title="metrics (measured)")
        for col in ("step", "loss", "lr", "grad norm", "tokens/s", "step time (s)"):
            table.add_column(col, justify="right")
        head, tail = (metrics, []) if len(metrics) <= 20 else (metrics[:5], metrics[-15:])
        for m in head:
            table.add_row(*_metric_cells(m))
        if tail:
            left_out = len(metrics) - len(head) - len(tail)
            table.add_row(*["⋮"] * 6)
            table.caption = (f"{left_out} steps not shown (steps {head[-1].step + 1}-{tail[0].step - 1}; "
                             "--format json lists every step)")
            for m in tail:
                table.add_row(*_metric_cells(m))
        parts.append(table)
    if named:
        parts.append(named_table(named))
    parts.append(Text(f"run folder: {run.run_dir}", style="dim"))
    if run.recipe_text and not with_recipe:
        where = f", or {Path(run.run_dir) / RECIPE_FILE}" if run.run_dir else ""
        parts.append(Text(f"recipe: ftui show {run.id} --recipe{where}", style="dim"))
    return Group(*parts)


def _metric_cells(m: MetricPoint) -> list[str]:
    return [str(m.step), _num(m.loss, ".4f"), _num(m.lr, ".2e"), _num(m.grad_norm, ".3f"),
            _num(m.tokens_per_s, ",.0f"), _num(m.step_time, ".3f")]


def run_to_json(run: RunInfo, metrics: list[MetricPoint] | None = None,
                named: list[NamedMetricPoint] | None = None,
                samples: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The scripting contract of ``ftui runs/show --format json``: ``named_metrics`` maps each name to
    its ``[{"step", "value", "time"}]``; ``eval_samples`` lists ``{"step", "samples"}`` per evaluation."""
    data: dict[str, Any] = {
        "id": run.id,
        "name": run.name,
        "status": run.status,
        "strategy": run.strategy,
        "nproc": run.nproc,
        "method": run.method,
        "model": run.model,
        "distributed_type": run.distributed_type,
        "device_type": run.device_type,
        "sweep_id": run.sweep_id,
        "resumed_from": run.resumed_from,
        "host": run.host,
        "run_dir": run.run_dir,
        "created_at": run.created_at.isoformat() + "Z",
        "started_at": run.started_at.isoformat() + "Z" if run.started_at else None,
        "ended_at": run.ended_at.isoformat() + "Z" if run.ended_at else None,
        "exit_code": run.exit_code,
        "error": run.error,
        "total_steps": run.total_steps,
        "steps_done": run.steps_done,
        "summary": {
            **run.summary.to_json(),
            "train_seconds": run.train_seconds,
            "tokens_per_s": run.tokens_per_s,
            "final_loss": run.final_loss,
            "peak_mem_bytes": run.peak_mem_bytes,
            "mean_util": run.mean_util,
        },
        "tags": run.tags,
        "note": run.note,
    }
    if metrics is not None:
        data["recipe"] = run.recipe_text
        data["metrics"] = [
            {"step": m.step, "loss": m.loss, "lr": m.lr, "grad_norm": m.grad_norm, "tokens": m.tokens,
             "step_time": m.step_time, "tokens_per_s": m.tokens_per_s, "time": m.time}
            for m in metrics
        ]
    if named is not None:
        series: dict[str, list[dict[str, Any]]] = {}
        for point in named:
            series.setdefault(point.name, []).append({"step": point.step, "value": point.value, "time": point.time})
        data["named_metrics"] = series
    if samples is not None:
        data["eval_samples"] = samples
    return data
