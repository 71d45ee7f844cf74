"""``ftui run``: run a recipe headless, with live progress, and print what happened; ``ftui resume``."""

from __future__ import annotations

import argparse
import json
import shlex
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.text import Text

from runner.service import launch
from runner.spec import strategies
from runner.spec.recipe import Recipe, RecipeError, load_recipe, parse_recipe
from runner.spec.status import ENDED_BY_USER
from runner.watch.follow import WatchOptions
from runner.watch.prepare import Prepared
from runner.watch.procs import StopRequest
from runner.watch.stream import quietly
from store import Store, StoreError
from tui.cli import nodes
from tui.cli.common import console, open_store
from tui.cli.estimate import run_finder
from tui.cli.exits import ExitCode, UsageError
from tui.cli.progress import RunProgress
from tui.cli.recover import recover_quietly
from tui.notify import run_ended, run_hung
from tui.render.report import run_report


def load_run_recipe(args: argparse.Namespace) -> Recipe:
    """The recipe of ``ftui run`` with its flags applied, validated (UsageError on any problem).

    ``--strategy ddp|fsdp`` without ``--nproc`` on a one-process recipe takes one process per
    visible GPU (at least 2; ``hsdp``: at least 4); ``--strategy single|mp`` takes one process (``mp --nproc N``: N pipeline stages).
    """
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
                if base.launch.nproc == 1:  # one per visible GPU, at least what the strategy needs
                    nproc = strategies.get(args.strategy).procs(None, launch.default_nproc())
        if nproc is not None:
            overrides.append(f"launch.nproc={nproc}")
        for field in ("engine", "offload", "replicate", "shard", "cp_size", "nvme_path"):
            if getattr(args, field, None) is not None:
                overrides.append(f"launch.{field}={json.dumps(getattr(args, field))}")
        if args.attn:
            overrides.append(f"model.attn_implementation={json.dumps(args.attn)}")
        if args.compile:
            overrides += ["train.compile=true", f"train.compile_mode={json.dumps(args.compile)}"]
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


def _load(args: argparse.Namespace, overrides: list[str]) -> Recipe:
    """The recipe file with ``overrides``, or (``--script`` without a recipe) a recipe of them alone."""
    if args.recipe is None:
        return parse_recipe("", source="--script", overrides=overrides)
    return load_recipe(args.recipe, overrides)


def cmd_run(args: argparse.Namespace) -> int:
    recipe = load_run_recipe(args)
    node_spec = nodes.spec_for(args, recipe)  # several machines: this one's rendezvous
    source = str(args.recipe) if args.recipe is not None else str(recipe.launch.script)
    try:
        # the same pre-flight as the TUI's Launch
        warnings = launch.check(recipe, args.fake_gpus, getattr(args, "allow_data_change", False),
                                dry_run=bool(getattr(args, "dry_run", False)), force=args.force)
    except RecipeError as exc:
        raise UsageError(f"{args.recipe}: {exc}" if args.recipe is not None else str(exc)) from None
    out = console(stderr=args.format == "json")
    for warning in warnings:
        out.print(Text.assemble(("warning:", "yellow"), f" {warning}"), soft_wrap=True)
    if args.find_batch_size:
        return run_finder(args, recipe, args.mem_cap, source)
    request = launch.LaunchRequest(recipe, source, node_spec)
    if args.dry_run:
        prepared = launch.dry_run(request)
        if args.format == "json":
            print(json.dumps(prepared.spec.to_json(), indent=2))
        else:
            # Paths and values in the launch are the user's text: never markup.
            out.print(Text.assemble(("argv", "bold"), "  " + shlex.join(prepared.spec.argv)), soft_wrap=True)
            out.print(Text.assemble(("env", "bold"), "   " + " ".join(f"{k}={v}" for k, v in prepared.spec.env.items())))
            out.print(Text.assemble(("accelerate config", "bold"), f" {prepared.spec.accelerate_config}"))
            if prepared.spec.accelerate_config_text:
                out.print(prepared.spec.accelerate_config_text, markup=False, highlight=False)
        return ExitCode.OK

    store = open_store(args, create=True)
    recover_quietly(store, out)  # runs whose watcher died (runner.service.recover): cheap when there are none
    try:
        prepared = launch.record(store, request)
        if prepared.node is not None and node_spec is not None:
            out.print(f"node #{prepared.node.slot} of {node_spec.nnodes} ({node_spec.backend} rendezvous at "
                      f"{node_spec.main_addr}:{node_spec.main_port}, run key {node_spec.run_key}); the progress "
                      "shows on the node that gets rank 0", markup=False, soft_wrap=True)
    except (RecipeError, StoreError) as exc:  # StoreError: the database cannot take the run (its disk full)
        raise UsageError(str(exc)) from None
    return follow(args, store, prepared, out)


def cmd_resume(args: argparse.Namespace) -> int:
    """``ftui resume ID``: a new run continuing run ID from its newest complete checkpoint."""
    store = open_store(args, create=False)
    out = console()
    recover_quietly(store, out)  # a run whose watcher died is settled first: only a live run is refused
    try:
        if nodes.given(args):
            prepared = nodes.prepare_resume(args, store, out)
        else:
            prepared = launch.resume(store, args.run_id, args.allow_data_change, force=args.force)
    except RecipeError as exc:
        raise UsageError(str(exc)) from None
    for warning in prepared.warnings:  # checkpoints passed over: run text, never markup
        out.print(Text.assemble(("warning:", "yellow"), f" {warning}"), soft_wrap=True)
    out.print(f"resuming run {args.run_id} from {prepared.recipe.train.resume_from}", markup=False, highlight=False,
              soft_wrap=True)
    return follow(args, store, prepared, out)


def watch_options(args: argparse.Namespace) -> WatchOptions:
    """How ``ftui run`` and ``ftui resume`` watch a run, from their flags."""
    return WatchOptions(sample_interval_s=args.sample_interval, hang_after_s=args.hang_after, grace_s=args.grace,
                        fake_gpus=args.fake_gpus)


def notify_hang(on_event: Callable[[dict[str, Any]], None], store: Store,
                run_id: int | None) -> Callable[[dict[str, Any]], None]:
    """``on_event``, and the bell and a desktop notification when a hang's stacks come (``--notify``)."""
    def call(event: dict[str, Any]) -> None:
        on_event(event)
        if event.get("type") == "stacks" and run_id is not None:
            run = store.get_run(run_id)
            run_hung(run_id, run.name if run is not None else "", str(event.get("summary")))

    return call


def follow(args: argparse.Namespace, store: Store, prepared: Prepared, out: Console) -> int:
    """Run a prepared run with live progress, print its summary; the exit code of ``ftui run``."""
    recipe = prepared.recipe
    out.print(Text.assemble("run ", (str(prepared.run_id), "bold"),
                            f" · {recipe.launch.strategy} × {recipe.launch.nproc} · {prepared.run_dir}"))
    stop = StopRequest()
    restore = stop.install()  # Ctrl-C, SIGTERM, SIGHUP: graceful stop, recorded; a second one: kill now
    try:
        with RunProgress(out) as progress:
            on_event: Callable[[dict[str, Any]], None] = progress.on_event
            if getattr(args, "notify", False):
                on_event = notify_hang(progress.on_event, store, prepared.run_id)
            outcome = launch.run(store, prepared, watch_options(args), on_event=on_event, stop=stop)
    finally:
        restore()
    run = quietly(store.get_run, outcome.run_id)  # a database gone bad meanwhile: the notes below say it
    if getattr(args, "notify", False):
        run_ended(outcome.run_id, run.name if run is not None else recipe.name, outcome.status, outcome.error)
    if run is not None:
        out.print(run_report(run))
    if outcome.stop_report:
        out.print(f"stop: {outcome.stop_report}", markup=False)
    for note in outcome.notes:
        out.print(Text.assemble(("warning:", "yellow"), f" {note}"), soft_wrap=True)
    if outcome.status == "completed":
        return ExitCode.OK
    if outcome.status in ENDED_BY_USER:  # by the user: Ctrl-C, SIGTERM, ftui stop
        out.print(Text(run.summary.ended or outcome.status, style="yellow"))
        return ExitCode.INTERRUPTED
    out.print(Text.assemble(("failed:", "red"), f" {outcome.error or ''}"))
    return ExitCode.FAILED
