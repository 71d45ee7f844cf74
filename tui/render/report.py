"""Rich renderings of runs for the command line: lists, one run, JSON for scripts.

Every figure says where it comes from: "measured" figures come from the trainer's own events,
memory from getrusage/psutil on CPU and the CUDA allocator on GPU.
"""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from runner.hardware.records import SOURCE_LABELS
from runner.summary import model_state_bytes, rank_peak
from store import MetricPoint, RunInfo
from tui.render.plain import row as text_row


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


def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


STATUS_STYLE = {"completed": "green", "failed": "red", "stopped": "yellow", "running": "cyan", "created": "dim"}


DIST_WORDS = {"NO": "one process", "MULTI_CPU": "DDP (CPU)", "MULTI_GPU": "DDP (GPU)", "FSDP": "FSDP",
              "DEEPSPEED": "DeepSpeed"}
"""accelerate's ``DistributedType`` values in a user's words."""

# The columns of ``ftui runs``, most important first: at a narrow width the last ones are left out
# rather than every cell being cut. (header, justify, cell, most width given)
_RUN_COLUMNS: tuple[tuple[str, str, Any, int], ...] = (
    ("id", "right", lambda r: str(r.id), 8),
    ("name", "left", lambda r: r.name, 28),
    ("status", "left", lambda r: Text(r.status, style=STATUS_STYLE.get(r.status, "")), 9),
    ("strategy", "left", lambda r: f"{r.strategy} x{r.nproc}" if r.nproc > 1 else r.strategy, 10),
    ("tokens/s", "right", lambda r: _num(r.tokens_per_s, ",.0f"), 9),
    ("final loss", "right", lambda r: _num(r.final_loss, ".4f"), 10),
    ("train time", "right", lambda r: fmt_seconds(r.train_seconds), 10),
    ("method", "left", lambda r: r.method, 6),
    ("started", "left", lambda r: r.started_at.strftime("%m-%d %H:%M") if r.started_at else "-", 11),
    ("in effect", "left", lambda r: DIST_WORDS.get(r.distributed_type or "", r.distributed_type or "-"), 12),
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


def run_summary_table(run: RunInfo | None) -> Table:
    """The end-of-run table: time, throughput, loss, peak memory per rank."""
    table = Table(title=f"run {run.id if run else '?'} summary", show_header=True)
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_column("source")
    if run is None:
        return table
    table.add_row("status", Text(run.status, style=STATUS_STYLE.get(run.status, "")), "orchestrator")
    table.add_row(*text_row("distributed type", run.distributed_type or "-", "accelerate (in effect)"))
    table.add_row("steps", f"{run.steps_done or 0}/{run.total_steps or '?'}", "trainer")
    table.add_row("training time", fmt_seconds(run.train_seconds), "measured (first to last step)")
    table.add_row("tokens/s", _num(run.tokens_per_s, ",.0f"), "measured")
    table.add_row("final loss", _num(run.final_loss, ".4f"), "measured (mean over ranks)")
    for rank in run.summary.get("ranks") or []:
        peak, src = rank_peak(rank)
        table.add_row(f"rank {rank['rank']} peak memory", fmt_bytes(peak), src)
        states = model_state_bytes(rank)
        table.add_row(f"rank {rank['rank']} model states", fmt_bytes(states), "measured (tensor bytes)")
    for row in estimate_rows(run.summary):
        table.add_row(*text_row(*row))
    telemetry = run.summary.get("telemetry") or {}
    for key, dev in (telemetry.get("devices") or {}).items():
        if dev["kind"] == "host":
            continue
        stats = dev.get("active") or dev["whole"]
        span = "active" if dev.get("active") else "whole run"
        unit = "% GPU busy" if dev["kind"] == "gpu" else "% of a core"
        threads = dev.get("threads")
        if dev["kind"] == "rank" and threads and stats.get("util_mean") is not None:
            unit += f" ({stats['util_mean'] / threads:.0f}% of its {threads} thread{'s' if threads != 1 else ''})"
        table.add_row(*text_row(
            f"{key} util mean/peak",
            f"{_num(stats.get('util_mean'), '.0f')}/{_num(stats.get('util_peak'), '.0f')}{unit}",
            f"{SOURCE_LABELS.get(dev['source'], dev['source'])}, {span}, {stats['n']} samples",
        ))
        table.add_row(*text_row(f"{key} memory peak", fmt_bytes(stats.get("mem_peak")),
                                SOURCE_LABELS.get(dev["source"], dev["source"])))
    for rank, peak in (telemetry.get("rank_gpu_mem_peak") or {}).items():
        table.add_row(f"rank {rank} GPU memory peak", fmt_bytes(peak), "NVML (the rank's own processes)")
    overall = telemetry.get("active") or telemetry.get("whole")
    if overall and overall.get("util_mean") is not None:
        span = "active window" if telemetry.get("active") else "whole run"
        unit = overall.get("util_unit") or ("GPU busy %" if overall.get("kind") == "gpu" else "CPU % of one core")
        table.add_row(*text_row("mean/peak device util",
                                f"{overall['util_mean']:.0f}/{_num(overall.get('util_peak'), '.0f')}%",
                                f"{unit}, over {overall['devices']} {overall['kind']} device(s), {span}"))
        low, high = overall.get("util_min"), overall.get("util_max")
        if overall.get("devices", 0) > 1 and low is not None and high is not None:
            table.add_row(*text_row("util min-max over devices", f"{low:.0f}-{high:.0f}%",
                                    f"{unit}: the lowest and highest device's mean, {span}"))
    peak = run.summary.get("mfu_peak")
    if isinstance(peak, dict) and peak.get("flops"):
        from runner.mfu import Peak

        stored = Peak.from_json(peak)
        if stored is not None:
            table.add_row(*text_row("MFU peak/device", stored.label(), stored.source))  # "[fingerprint]" is no markup
    if run.error:
        table.add_row("error", Text(run.error, style="red"), "")
    return table


ESTIMATE_KINDS = (("params", "param_bytes"), ("grads", "grad_bytes"), ("optimizer", "optimizer_bytes"),
                  ("activations", "activation_bytes"))


def estimate_vs_measured(summary: dict[str, Any]) -> list[tuple[str, int, float | None, float | None]]:
    """(kind, estimated bytes per device, measured bytes (mean over ranks), error in percent) for params,
    grads, optimizer and activations; empty when the run has no estimate.

    Activations compare like with like: the trainer measures what one forward saves for backward, so the
    estimate's ``activations_stored`` is used (not the peak, which adds the layer checkpointing recomputes);
    estimates stored before that key existed fall back to ``activations``."""
    per_device = (summary.get("estimate") or {}).get("per_device_bytes")
    if not per_device:
        return []
    ranks = summary.get("ranks") or []
    out: list[tuple[str, int, float | None, float | None]] = []
    for kind, key in ESTIMATE_KINDS:
        key_est = "activations_stored" if kind == "activations" and "activations_stored" in per_device else kind
        est = int(per_device.get(key_est) or 0) + (int(per_device.get("master") or 0) if kind == "optimizer" else 0)
        values = [r[key] for r in ranks if r.get(key) is not None]
        measured = sum(values) / len(values) if values else None
        err = (est - measured) / measured * 100 if measured else None
        out.append((kind, est, measured, err))
    return out


def estimate_rows(summary: dict[str, Any]) -> list[tuple[str, str, str]]:
    rows = []
    n = len(summary.get("ranks") or [])
    for kind, est, measured, err in estimate_vs_measured(summary):
        value = f"{fmt_bytes(est)} est. / {fmt_bytes(measured)} meas."
        note = "estimated (runner.planner) vs measured " + (
            "(activations: saved tensors of one forward, both sides)" if kind == "activations" else "(tensor bytes)")
        if n > 1:
            note += f", mean of {n} ranks"
        rows.append((f"{kind} per device", value + ("" if err is None else f" ({err:+.1f}%)"), note))
    return rows


def run_detail(run: RunInfo, metrics: list[MetricPoint]) -> Group:
    parts: list[Any] = [run_summary_table(run)]
    if metrics:
        table = Table(title="metrics (measured)")
        for col in ("step", "loss", "lr", "grad norm", "tokens/s", "step time"):
            table.add_column(col, justify="right")
        shown = metrics if len(metrics) <= 20 else metrics[:5] + metrics[-15:]
        for m in shown:
            table.add_row(str(m.step), _num(m.loss, ".4f"), _num(m.lr, ".2e"), _num(m.grad_norm, ".3f"),
                          _num(m.tokens_per_s, ",.0f"), _num(m.step_time, ".3f"))
        parts.append(table)
    parts.append(Text(f"run folder: {run.run_dir}", style="dim"))
    return Group(*parts)


def run_to_json(run: RunInfo, metrics: list[MetricPoint] | None = None) -> dict[str, Any]:
    """The scripting contract of ``ftui runs/show --format json``."""
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
            **run.summary,
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
    return data
