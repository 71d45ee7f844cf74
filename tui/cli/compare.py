"""``ftui compare`` (runs side by side) and ``ftui sweep`` (one recipe under several strategies)."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.text import Text

from runner.analysis.compare import Comparison, load_comparison, sweep_run_ids
from runner.analysis.repeats import by_strategy, repeated
from runner.analysis.report_data import load_report
from runner.service import sweep as sw
from runner.spec.recipe import RecipeError
from runner.spec.status import ENDED_BY_USER
from runner.watch.procs import StopRequest
from store import Store
from tui.cli.common import open_store, settle_abandoned
from tui.cli.exits import ExitCode, UsageError
from tui.cli.progress import SweepProgress
from tui.render import compare as rep

REPORT_FILE = "report.html"
"""Where ``ftui report`` writes without ``-o``."""


def _output(args: argparse.Namespace, html_default: str = "compare.html") -> Path | None:
    """Where the comparison goes (None: stdout); refused up front when its folder is missing, so that a
    sweep does not train for minutes and then fail to write."""
    out: Path | None = args.output
    if args.format == "html" and out is None:
        out = Path(html_default)
    if out is not None and not out.parent.is_dir():
        raise UsageError(f"-o/--output {out}: folder {out.parent} does not exist")
    if out is not None and out.is_dir():
        raise UsageError(f"-o/--output {out}: is a folder; give a file name")
    return out


def _emit(args: argparse.Namespace, cmp: Comparison, html_default: str = "compare.html") -> None:
    console = Console(highlight=False)
    out = _output(args, html_default)
    try:
        if args.format == "text":
            if out is not None:
                with out.open("w") as fh:
                    Console(file=fh, width=160, highlight=False).print(rep.rich_table(cmp))
            else:
                console.print(rep.rich_table(cmp))
        else:
            text = rep.RENDERERS[args.format](cmp)
            if out is not None:
                out.write_text(text)
                console.print(f"wrote {out}", markup=False)
            else:
                print(text)
    except OSError as exc:
        raise UsageError(f"-o/--output {out}: cannot write ({exc.strerror or exc})") from None
    grouped = by_strategy(cmp)
    if args.format == "text" and out is None and repeated(grouped):  # the spread the verdict was drawn against
        console.print(rep.repeats_table(grouped))
    if args.plot:
        console.print(rep.loss_plot(cmp, width=max(20, min(100, console.width - 12))))


def _run_ids(args: argparse.Namespace, store: Store) -> list[int]:
    """The runs named on the command line, after those of ``--sweep``; refused in one line when none."""
    ids = list(args.run_ids)
    if args.sweep:
        in_sweep = sweep_run_ids(store, args.sweep)
        ids = in_sweep + [i for i in ids if i not in in_sweep]
        if not ids:
            raise UsageError(f"--sweep {args.sweep}: no runs with that sweep id in {store.url}")
    if not ids:
        raise UsageError(f"{getattr(args, 'command', 'compare')}: give RUN_IDs or --sweep SWEEP_ID")
    if args.baseline is not None and args.baseline not in ids:
        raise UsageError(f"--baseline {args.baseline}: not one of the compared runs ({', '.join(map(str, ids))})")
    return ids


def cmd_compare(args: argparse.Namespace) -> int:
    _output(args)
    store = open_store(args, create=False)
    settle_abandoned(store)
    ids = _run_ids(args, store)
    try:
        if args.format == "html":
            cmp = load_report(store, ids, baseline_id=args.baseline, peak_tflops=args.peak_tflops, sweep_id=args.sweep)
        else:
            cmp = load_comparison(store, ids, baseline_id=args.baseline, peak_tflops=args.peak_tflops,
                                  sweep_id=args.sweep)
    except KeyError as exc:
        raise UsageError(f"run {exc.args[0]}: no such run in {store.url}") from None
    _emit(args, cmp)
    return ExitCode.OK


def cmd_report(args: argparse.Namespace) -> int:
    """``ftui report RUN... [--sweep ID] [-o FILE]``: the HTML report (as ``ftui compare --format html``)."""
    _output(args, REPORT_FILE)
    store = open_store(args, create=False)
    settle_abandoned(store)
    ids = _run_ids(args, store)
    try:
        cmp = load_report(store, ids, baseline_id=args.baseline, peak_tflops=args.peak_tflops, sweep_id=args.sweep)
    except KeyError as exc:
        raise UsageError(f"run {exc.args[0]}: no such run in {store.url}") from None
    _emit(args, cmp, REPORT_FILE)
    return ExitCode.OK


def cmd_sweep(args: argparse.Namespace) -> int:
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    if not strategies:
        raise UsageError(f"--strategies: no strategy named in {args.strategies!r} (e.g. single,ddp)")
    _output(args)
    try:
        items = sw.plan_checked(args.recipe, strategies, args.nproc, args.overrides, args.grid, repeat=args.repeat,
                                force=args.force)
    except RecipeError as exc:
        raise UsageError(str(exc)) from None
    if args.dry_run:  # checked like a real sweep; nothing recorded, no run folder
        for n, item in enumerate(items, 1):
            grid = f" [{item.grid}]" if item.grid else ""
            print(f"{n}. {item.label}{grid} · {item.note}")
        return ExitCode.OK
    store = open_store(args, create=True)
    console = Console(highlight=False, stderr=args.format != "text" and args.output is None)
    sweep_id = sw.new_sweep_id()
    console.print(Text.assemble("sweep ", (sweep_id, "bold"), f": {len(items)} runs, one after another"))

    live = SweepProgress(console)  # the running run's phase, step/total, loss, elapsed: no silent minutes

    # Grid values, notes and failure reasons are the user's or a run's text: printed as text.
    def on_start(item: sw.SweepItem, run_id: int) -> None:
        grid = f" [{item.grid}]" if item.grid else ""
        console.print(f"run {run_id} · {item.label}{grid} · {item.note}", markup=False)
        live.begin(f"run {run_id} {item.strategy}")

    def on_done(item: sw.SweepItem, result: sw.SweepResult) -> None:
        live.end()
        style = {"completed": "green", "failed": "red"}.get(result.status, "yellow")
        reason = f": {result.reason}" if result.reason else ""
        console.print(Text.assemble(f"  run {result.run_id} {item.strategy}: ", (result.status, style), reason),
                      soft_wrap=True)

    stop = StopRequest()
    restore = stop.install()  # Ctrl-C/SIGTERM/SIGHUP stop the current run as in ftui run, and end the sweep
    try:
        _, results = sw.run_sweep(store, args.recipe, items, sweep_id=sweep_id, on_start=on_start, on_done=on_done,
                                  on_event=live.on_event, stop=stop, force=args.force)
    finally:
        live.end()
        restore()
    ran = [r.run_id for r in results]
    cmp = (load_report(store, ran, peak_tflops=args.peak_tflops, sweep_id=sweep_id) if args.format == "html"
           else load_comparison(store, ran, peak_tflops=args.peak_tflops, sweep_id=sweep_id))
    _emit(args, cmp)
    console.print(f"reopen with: ftui compare --sweep {sweep_id}", markup=False)
    if stop.is_set() or any(r.status in ENDED_BY_USER for r in results):
        return ExitCode.INTERRUPTED
    return ExitCode.OK if any(r.status == "completed" for r in results) else ExitCode.FAILED
