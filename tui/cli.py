"""The ``ftui`` command line. With no command it opens the Textual app (imported lazily, so that
``ftui run`` and ``ftui runs`` start fast and never import textual or torch)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class UsageError(Exception):
    """Bad input: printed as one line, exit code 2."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] | None = getattr(args, "handler", None)
    try:
        if handler is None:
            return _open_app(args)
        return handler(args)
    except UsageError as exc:
        print(f"ftui: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ftui",
        description="Plan, launch, watch and compare fine-tuning runs. With no command: the dashboard.",
    )
    _db_option(parser)
    parser.add_argument("--fake-gpus", type=int, default=0, metavar="N", help="show N scripted GPUs (demo mode)")
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")

    run = sub.add_parser("run", help="run a recipe headless", description="Run a recipe headless.")
    run.add_argument("recipe", type=Path, help="recipe TOML file")
    run.add_argument("--strategy", choices=_strategy_names(), help="override launch.strategy")
    run.add_argument("--nproc", type=int, help="override launch.nproc (processes)")
    run.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                     help="override any recipe field, e.g. --set train.max_steps=50 (repeatable)")
    run.add_argument("--name", help="override the recipe's name")
    run.add_argument("--dry-run", action="store_true", help="print the launch (argv, env, config) and run nothing")
    run.add_argument("--format", choices=["text", "json"], default="text")
    run.add_argument("--find-batch-size", action="store_true",
                     help="find the largest micro-batch that fits with short real runs, then stop")
    run.add_argument("--mem-cap", metavar="SIZE", help="with --find-batch-size: budget per rank, e.g. 3GiB")
    run.add_argument("--sample-interval", type=_seconds_at_least(0), default=0.5, metavar="SECONDS",
                     help="telemetry: seconds between device readings (default 0.5; 0 turns telemetry off)")
    run.add_argument("--hang-after", type=_seconds_at_least(1), default=300.0, metavar="SECONDS",
                     help="flag a hang when no step came for this long and every device is idle (default 300)")
    _db_option(run)
    run.set_defaults(handler=cmd_run)

    runs = sub.add_parser("runs", help="list the runs in the store")
    runs.add_argument("--status", choices=["created", "running", "completed", "failed", "stopped"])
    runs.add_argument("--format", choices=["text", "json"], default="text")
    _db_option(runs)
    runs.set_defaults(handler=cmd_runs)

    show = sub.add_parser("show", help="show one run: recipe, status, summary, metrics")
    show.add_argument("run_id", type=int)
    show.add_argument("--format", choices=["text", "json"], default="text")
    _db_option(show)
    show.set_defaults(handler=cmd_show)

    # Further commands live in their own modules, each with ``add_parser(subparsers)``; they import
    # their heavy dependencies inside the handler so that ``ftui --help`` stays fast.
    import importlib

    for module in EXTRA_COMMANDS:
        importlib.import_module(module).add_parser(sub, _db_option)
    return parser


EXTRA_COMMANDS: list[str] = ["tui.cmd_gpus", "tui.cmd_estimate", "tui.cmd_compare"]


def _db_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", default=argparse.SUPPRESS, metavar="URL",
                        help="database URL (default: $FTUI_DB, else SQLite in the ftui data folder)")


def _seconds_at_least(low: float) -> Callable[[str], float]:
    """An argparse type: seconds in [low, 1 day]; nan, inf and words are refused."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if not low <= value <= 86400:
            raise argparse.ArgumentTypeError(f"expected seconds between {low:g} and 86400, got {text!r}")
        return value

    return parse


def _strategy_names() -> list[str]:
    from runner.strategies import STRATEGIES

    return list(STRATEGIES)


def _store(args: argparse.Namespace) -> Any:
    from runner.paths import default_db_url
    from store import Store, StoreError

    try:
        return Store(getattr(args, "db", None) or default_db_url())
    except StoreError as exc:
        raise UsageError(str(exc)) from None


def _open_app(args: argparse.Namespace) -> int:
    from tui.app import run_app

    return run_app(db_url=getattr(args, "db", None), fake_gpus=args.fake_gpus)


# ---------------------------------------------------------------------- run


def load_run_recipe(args: argparse.Namespace) -> Any:
    """The recipe of ``ftui run`` with its flags applied, validated (UsageError on any problem).

    ``--strategy ddp|fsdp`` without ``--nproc`` on a one-process recipe takes one process per
    visible GPU (at least 2); ``--strategy single|mp`` takes one process.
    """
    from runner.recipe import RecipeError, load_recipe

    overrides = list(args.overrides)
    if args.name:
        overrides.append(f"name={json.dumps(args.name)}")
    nproc = args.nproc
    try:
        if args.strategy:
            overrides.append(f"launch.strategy={args.strategy}")
            if nproc is None and args.strategy in ("single", "mp"):
                nproc = 1
            elif nproc is None:
                base = load_recipe(args.recipe, [o for o in overrides if not o.startswith("launch.")])
                if base.launch.nproc == 1:
                    from runner.orchestrator import cuda_device_count

                    nproc = max(2, cuda_device_count())
        if nproc is not None:
            overrides.append(f"launch.nproc={nproc}")
        return load_recipe(args.recipe, overrides)
    except RecipeError as exc:
        raise UsageError(str(exc)) from None


def cmd_run(args: argparse.Namespace) -> int:
    from runner import orchestrator
    from runner.recipe import RecipeError

    recipe = load_run_recipe(args)
    try:
        warnings = orchestrator.preflight(recipe)
    except RecipeError as exc:
        raise UsageError(f"{args.recipe}: {exc}") from None
    out = _console(stderr=args.format == "json")
    warnings += _gpu_warnings(recipe, args.fake_gpus)
    for warning in warnings:
        out.print(f"[yellow]warning:[/] {warning}")
    if args.find_batch_size:
        from tui.cmd_estimate import run_finder

        return run_finder(args, recipe, args.mem_cap, str(args.recipe))
    if args.dry_run:
        prepared = orchestrator.prepare(None, recipe, source=str(args.recipe))
        if args.format == "json":
            print(json.dumps(prepared.spec.to_json(), indent=2))
        else:
            import shlex

            out.print("[bold]argv[/]  " + shlex.join(prepared.spec.argv), soft_wrap=True)
            out.print("[bold]env[/]   " + " ".join(f"{k}={v}" for k, v in prepared.spec.env.items()))
            out.print(f"[bold]accelerate config[/] {prepared.spec.accelerate_config}")
            if prepared.spec.accelerate_config_text:
                out.print(prepared.spec.accelerate_config_text, markup=False, highlight=False)
        return EXIT_OK

    store = _store(args)
    prepared = orchestrator.prepare(store, recipe, source=str(args.recipe))
    from tui.progress import RunProgress

    out.print(f"run [bold]{prepared.run_id}[/] · {recipe.launch.strategy} × {recipe.launch.nproc} · {prepared.run_dir}")
    with RunProgress(out) as progress:
        outcome = orchestrator.execute(store, prepared, on_event=progress.on_event,
                                       probe=orchestrator.probe_for(args.fake_gpus),
                                       sample_interval_s=args.sample_interval, hang_after_s=args.hang_after)
    run = store.get_run(outcome.run_id)
    from tui.report import run_summary_table

    out.print(run_summary_table(run))
    if outcome.status == "completed":
        return EXIT_OK
    if outcome.status == "stopped":
        out.print("[yellow]stopped[/]")
        return EXIT_INTERRUPTED
    from rich.markup import escape

    out.print(f"[red]failed:[/] {escape(outcome.error or '')}")
    return EXIT_FAILED


def _gpu_warnings(recipe: Any, fake_gpus: int = 0) -> list[str]:
    """Busy GPUs, and GPUs with less free memory than the plan needs per device (the estimate), among
    those the run will use; and the CUDA_VISIBLE_DEVICES mapping."""
    import os

    from runner.hardware import check_gpus_free, visible_mapping
    from runner.orchestrator import estimate_summary, probe_for

    probe = probe_for(fake_gpus)
    count = probe.nvml.device_count()
    if count == 0 or recipe.launch.device == "cpu":
        return []
    need = estimate_summary(recipe).get("per_device_bytes", {}).get("total")
    if need is not None:  # plus what ftui estimate reserves per GPU (CUDA context, NCCL, allocator slack)
        from runner.estimate import parse_bytes
        from tui.cmd_estimate import DEFAULT_RESERVE

        need += parse_bytes(DEFAULT_RESERVE)
    visible = ",".join(map(str, recipe.launch.gpus)) if recipe.launch.gpus is not None else os.environ.get("CUDA_VISIBLE_DEVICES")
    mapping = visible_mapping(visible, count)[: recipe.launch.nproc if recipe.launch.strategy != "mp" else None]
    notes = ["GPUs (CUDA index -> physical): " + ", ".join(f"cuda:{lo} -> GPU {phys}" for lo, phys in mapping)]
    return notes + check_gpus_free(probe, [phys for _, phys in mapping], need_bytes=need)


# ---------------------------------------------------------------------- runs, show


def cmd_runs(args: argparse.Namespace) -> int:
    store = _store(args)
    runs = store.list_runs(status=args.status)
    if args.format == "json":
        from tui.report import run_to_json

        print(json.dumps([run_to_json(r) for r in runs], indent=2))
        return EXIT_OK
    from tui.report import runs_table

    _console().print(runs_table(runs))
    return EXIT_OK


def cmd_show(args: argparse.Namespace) -> int:
    store = _store(args)
    run = store.get_run(args.run_id)
    if run is None:
        raise UsageError(f"run {args.run_id}: no such run in {store.url}")
    from tui.report import run_detail, run_to_json

    metrics = store.metrics(run.id)
    if args.format == "json":
        print(json.dumps(run_to_json(run, metrics), indent=2))
        return EXIT_OK
    _console().print(run_detail(run, metrics))
    return EXIT_OK


def _console(stderr: bool = False) -> Any:
    from rich.console import Console

    return Console(stderr=stderr, highlight=False)


if __name__ == "__main__":
    # Run the imported module's main, not this __main__ copy: command modules raise
    # tui.cli.UsageError, which must be the class main() catches.
    from tui.cli import main as _main

    sys.exit(_main())
