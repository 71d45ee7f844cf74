"""``ftui run``: run a recipe headless, with live progress, and print what happened."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.text import Text

from runner.spec import strategies
from tui.cli.common import ExitCode, UsageError, console, db_option, open_store, seconds_at_least

if TYPE_CHECKING:
    from runner.watch.follow import WatchOptions


def add_parser(sub: Any) -> None:
    run = sub.add_parser(
        "run", help="run a recipe (or your own training script) headless",
        usage="ftui run [RECIPE] [--script FILE] [options] [-- SCRIPT_ARGS...]",
        description="Run a recipe headless; or, with --script, your own accelerate / Hugging Face Trainer / "
                    "TRL script, launched with the strategy's accelerate config (arguments after --).")
    run.add_argument("recipe", type=Path, nargs="?", help="recipe TOML file (optional with --script)")
    run.add_argument("--script", type=Path, metavar="FILE",
                     help="launch this training script instead of ftui's trainer (sets launch.script); "
                          "its arguments follow --")
    run.set_defaults(script_args=None)
    run.add_argument("--strategy", choices=strategies.names(launchable=True), help="override launch.strategy")
    run.add_argument("--nproc", type=int, help="override launch.nproc (processes)")
    run.add_argument("--engine", choices=strategies.engine_names(),
                     help="override launch.engine: what implements a ZeRO stage (deepspeed or torch)")
    run.add_argument("--offload", choices=strategies.OFFLOADS,
                     help="override launch.offload: ZeRO state kept in host memory")
    run.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                     help="override any recipe field, e.g. --set train.max_steps=50 (repeatable)")
    run.add_argument("--name", help="override the recipe's name")
    run.add_argument("--dry-run", action="store_true", help="print the launch (argv, env, config) and run nothing")
    run.add_argument("--format", choices=["text", "json"], default="text")
    run.add_argument("--find-batch-size", action="store_true",
                     help="find the largest micro-batch that fits with short real runs, then stop")
    run.add_argument("--mem-cap", metavar="SIZE", help="with --find-batch-size: budget per rank, e.g. 3GiB")
    run.add_argument("--sample-interval", type=seconds_at_least(0), default=0.5, metavar="SECONDS",
                     help="telemetry: seconds between device readings (default 0.5; 0 turns telemetry off)")
    run.add_argument("--hang-after", type=seconds_at_least(1), default=300.0, metavar="SECONDS",
                     help="flag a hang when no step came for this long and every device is idle (default 300)")
    run.add_argument("--grace", type=seconds_at_least(0), default=30.0, metavar="SECONDS",
                     help="on Ctrl-C, SIGTERM or SIGHUP: seconds the ranks get to finish their step, save and exit "
                          "before SIGKILL (default 30; a second Ctrl-C kills at once)")
    run.add_argument("--notify", action="store_true",
                     help="when the run ends or fails: ring the terminal bell and send a desktop notification "
                          "(notify-send, where it exists)")
    from tui.cli import nodes

    nodes.add_arguments(run)
    db_option(run)
    run.set_defaults(handler=cmd_run)

    resume = sub.add_parser(
        "resume", help="continue a run from its newest complete checkpoint, as a new run",
        description="Continue run ID from the newest complete checkpoint in its folder (train.save_every, "
                    "or a graceful stop, writes them): a new run with the same recipe, strategy and process "
                    "count, going on at the next step.")
    resume.add_argument("run_id", type=int, metavar="ID", help="the run to continue")
    resume.add_argument("--sample-interval", type=seconds_at_least(0), default=0.5, metavar="SECONDS",
                        help="telemetry: seconds between device readings (default 0.5; 0 turns telemetry off)")
    resume.add_argument("--hang-after", type=seconds_at_least(1), default=300.0, metavar="SECONDS",
                        help="flag a hang when no step came for this long and every device is idle (default 300)")
    resume.add_argument("--grace", type=seconds_at_least(0), default=30.0, metavar="SECONDS",
                        help="on Ctrl-C, SIGTERM or SIGHUP: seconds the ranks get to finish their step, save "
                             "and exit before SIGKILL (default 30; a second Ctrl-C kills at once)")
    nodes.add_arguments(resume)  # a multi-node run: the same command on each node (README: More than one machine)
    db_option(resume)
    resume.set_defaults(handler=cmd_resume)



def load_run_recipe(args: argparse.Namespace) -> Any:
    """The recipe of ``ftui run`` with its flags applied, validated (UsageError on any problem).

    ``--strategy ddp|fsdp`` without ``--nproc`` on a one-process recipe takes one process per
    visible GPU (at least 2); ``--strategy single|mp`` takes one process (``mp --nproc N``: N pipeline stages).
    """
    from runner.spec.recipe import RecipeError
    from tui.cli import nodes

    overrides = list(args.overrides) + nodes.overrides(args)
    if args.name:
        overrides.append(f"name={json.dumps(args.name)}")
    overrides += script_overrides(args)
    nproc = args.nproc
    try:
        if args.strategy:
            overrides.append(f"launch.strategy={args.strategy}")
            default = strategies.get(args.strategy).default_nproc  # single, mp: one process
            if nproc is None and default is not None:
                nproc = default
            elif nproc is None:
                base = _load(args, [o for o in overrides if not o.startswith("launch.")])
                if base.launch.nproc == 1:
                    from runner.watch.host import cuda_device_count

                    nproc = max(2, cuda_device_count())
        if nproc is not None:
            overrides.append(f"launch.nproc={nproc}")
        for field in ("engine", "offload"):
            if getattr(args, field, None):
                overrides.append(f"launch.{field}={json.dumps(getattr(args, field))}")
        return _load(args, overrides)
    except RecipeError as exc:
        if exc.field == "launch.script_args" and args.script_args is not None:  # ftui run RECIPE -- ARGS
            raise UsageError(f"script arguments ({' '.join(args.script_args) or 'after --'}) without a script: "
                             "give --script FILE or launch.script in the recipe") from None
        raise UsageError(str(exc)) from None


def script_overrides(args: argparse.Namespace) -> list[str]:
    """``--script FILE`` and the arguments after ``--`` as recipe overrides (``launch.script``,
    ``launch.script_args``); a run of ``--script`` alone is named after the script."""
    if args.recipe is None and args.script is None:
        raise UsageError("run: give a recipe file, or --script FILE (your own training script)")
    out = []
    if args.script is not None:
        out.append(f"launch.script={json.dumps(str(args.script))}")
        if args.recipe is None and not args.name:
            out.append(f"name={json.dumps(args.script.stem)}")
    if args.script_args is not None and (args.script is not None or args.recipe is not None):
        out.append(f"launch.script_args={json.dumps(list(args.script_args))}")
    return out


def _load(args: argparse.Namespace, overrides: list[str]) -> Any:
    """The recipe file with ``overrides``, or (``--script`` without a recipe) a recipe of them alone."""
    from runner.spec.recipe import load_recipe, parse_recipe

    if args.recipe is None:
        return parse_recipe("", source="--script", overrides=overrides)
    return load_recipe(args.recipe, overrides)


def cmd_run(args: argparse.Namespace) -> int:
    from runner.service import launch
    from runner.spec.recipe import RecipeError
    from tui.cli import nodes

    recipe = load_run_recipe(args)
    node_spec = nodes.spec_for(args, recipe)  # several machines: this one's rendezvous
    source = str(args.recipe) if args.recipe is not None else str(recipe.launch.script)
    try:
        warnings = launch.check(recipe, args.fake_gpus)  # the same pre-flight as the TUI's Launch
    except RecipeError as exc:
        raise UsageError(f"{args.recipe}: {exc}" if args.recipe is not None else str(exc)) from None
    out = console(stderr=args.format == "json")
    for warning in warnings:
        out.print(Text.assemble(("warning:", "yellow"), f" {warning}"), soft_wrap=True)
    if args.find_batch_size:
        from tui.cli.estimate import run_finder

        return run_finder(args, recipe, args.mem_cap, source)
    request = launch.LaunchRequest(recipe, source, node_spec)
    if args.dry_run:
        prepared = launch.dry_run(request)
        if args.format == "json":
            print(json.dumps(prepared.spec.to_json(), indent=2))
        else:
            import shlex

            # Paths and values in the launch are the user's text: never markup.
            out.print(Text.assemble(("argv", "bold"), "  " + shlex.join(prepared.spec.argv)), soft_wrap=True)
            out.print(Text.assemble(("env", "bold"), "   " + " ".join(f"{k}={v}" for k, v in prepared.spec.env.items())))
            out.print(Text.assemble(("accelerate config", "bold"), f" {prepared.spec.accelerate_config}"))
            if prepared.spec.accelerate_config_text:
                out.print(prepared.spec.accelerate_config_text, markup=False, highlight=False)
        return ExitCode.OK

    store = open_store(args, create=True)
    from tui.cli.recover import recover_quietly

    recover_quietly(store, out)  # runs whose watcher died (runner.service.recover): cheap when there are none
    try:
        prepared = launch.record(store, request)
        if prepared.node is not None and node_spec is not None:
            out.print(f"node #{prepared.node.slot} of {node_spec.nnodes} ({node_spec.backend} rendezvous at "
                      f"{node_spec.main_addr}:{node_spec.main_port}, run key {node_spec.run_key}); the progress "
                      "shows on the node that gets rank 0", markup=False, soft_wrap=True)
    except RecipeError as exc:
        raise UsageError(str(exc)) from None
    return follow(args, store, prepared, out)


def cmd_resume(args: argparse.Namespace) -> int:
    """``ftui resume ID``: a new run continuing run ID from its newest complete checkpoint."""
    from runner.service import launch
    from runner.spec.recipe import RecipeError
    from tui.cli import nodes

    store = open_store(args, create=False)
    out = console()
    try:
        if nodes.given(args):
            prepared = nodes.prepare_resume(args, store, out)
        else:
            prepared = launch.resume(store, args.run_id)
    except RecipeError as exc:
        raise UsageError(str(exc)) from None
    out.print(f"resuming run {args.run_id} from {prepared.recipe.train.resume_from}", markup=False, highlight=False,
              soft_wrap=True)
    return follow(args, store, prepared, out)


def watch_options(args: argparse.Namespace) -> WatchOptions:
    """How ``ftui run`` and ``ftui resume`` watch a run, from their flags."""
    from runner.watch.follow import WatchOptions

    return WatchOptions(sample_interval_s=args.sample_interval, hang_after_s=args.hang_after, grace_s=args.grace,
                        fake_gpus=args.fake_gpus)


def follow(args: argparse.Namespace, store: Any, prepared: Any, out: Any) -> int:
    """Run a prepared run with live progress, print its summary; the exit code of ``ftui run``."""
    from runner.service import launch
    from runner.watch.procs import StopRequest
    from tui.cli.progress import RunProgress

    recipe = prepared.recipe
    out.print(Text.assemble("run ", (str(prepared.run_id), "bold"),
                            f" · {recipe.launch.strategy} × {recipe.launch.nproc} · {prepared.run_dir}"))
    stop = StopRequest()
    restore = stop.install()  # Ctrl-C, SIGTERM, SIGHUP: graceful stop, recorded; a second one: kill now
    try:
        with RunProgress(out) as progress:
            outcome = launch.run(store, prepared, watch_options(args), on_event=progress.on_event, stop=stop)
    finally:
        restore()
    run = store.get_run(outcome.run_id)
    if getattr(args, "notify", False):
        from tui.notify import run_ended

        run_ended(outcome.run_id, run.name if run else recipe.name, outcome.status, outcome.error)
    from tui.render.report import run_report

    out.print(run_report(run))
    if outcome.stop_report:
        out.print(f"stop: {outcome.stop_report}", markup=False)
    if outcome.status == "completed":
        return ExitCode.OK
    if outcome.status == "stopped":
        out.print("[yellow]stopped[/]")
        return ExitCode.INTERRUPTED
    out.print(Text.assemble(("failed:", "red"), f" {outcome.error or ''}"))
    return ExitCode.FAILED
