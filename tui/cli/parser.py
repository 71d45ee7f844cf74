"""What you can type: every command of ``ftui``, its flags and its help, and nothing of what it does.

Each command names its handler as ``handler="module:function"``; :func:`tui.cli.main.main` imports that
module only when the command runs. So building the whole parser (``ftui --help``, a typo's one-line error)
imports argparse-level things only: the strategies table and the planner's defaults for the choices and the
help, never the store, pydantic, torch or textual (tests/unit/test_architecture.py checks it).
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from runner.planner.memory import DEFAULT_RESERVE
from runner.spec import kernels, strategies, watching
from runner.spec.status import STATUSES
from tui.cli.exits import UsageError

COMMANDS: tuple[str, ...] = (
    "tui.cli.run",       # run, resume
    "tui.cli.stop",      # stop
    "tui.cli.runs",      # runs, show
    "tui.cli.gpus",      # gpus
    "tui.cli.estimate",  # estimate
    "tui.cli.compare",   # compare, sweep, report
    "tui.cli.plan",      # plan
    "tui.cli.recover",   # recover
    "tui.cli.db",        # db upgrade, db current, db rebuild
    "tui.cli.slurm",     # slurm
    "tui.cli.queue",     # queue, queue add, queue rm
)
"""The modules that hold the commands' handlers (tests/integration/test_cli.py checks that every handler the parser
names is in one of them and exists)."""

DASHBOARD = "tui.cli.dashboard:cmd_dashboard"
"""The handler of ``ftui`` with no command: the Textual app."""

TABLE_LIMIT = 100
"""Runs the table of ``ftui runs`` shows by default (the newest)."""

SHAPE_FLAGS = ("params", "layers", "hidden", "heads", "kv_heads", "intermediate", "vocab")
"""The flags of ``ftui estimate`` that give a model's shape by hand (with ``--params``)."""

COMPARE_FORMATS = ["text", "md", "csv", "json", "html"]
"""What ``ftui compare`` and ``ftui sweep`` write."""

NODE_FIELDS = ("nnodes", "node_rank", "main_addr", "main_port", "rdzv_endpoint")
"""Multi-node flags that are also recipe fields (``launch.<name>``)."""


def build_parser() -> argparse.ArgumentParser:
    """The whole command line."""
    parser = argparse.ArgumentParser(
        prog="ftui",
        description="Plan, launch, watch and compare fine-tuning runs. With no command: the dashboard.",
    )
    db_option(parser)
    parser.add_argument("--fake-gpus", type=int, default=0, metavar="N", help="show N scripted GPUs (demo mode)")
    parser.add_argument("--notify", action="store_true",
                        help="dashboard: bell and desktop notification when a run ends (b toggles it)")
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")
    for add in (_run, _queue, _stop, _runs, _gpus, _estimate, _compare, _plan, _recover, _db, _slurm):  # as --help lists
        add(sub)
    # Bad arguments of any command are one line (``ftui: ...``) and exit 2, like every other bad input.
    for command in (parser, *sub.choices.values()):
        one_line_errors(command)
    return parser


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Parse ``argv``; for ``ftui run``, what follows ``--`` is the script's own arguments
    (``args.script_args``), never read as ftui's. An unknown flag gets the command's closest one."""
    try:
        return _parse(parser, argv)
    except UsageError as exc:
        raise UsageError(f"{exc}{_did_you_mean(parser, argv, str(exc))}") from None


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    if "--" in argv:
        cut = argv.index("--")
        args = parser.parse_args(argv[:cut])
        if hasattr(args, "script_args"):
            args.script_args = argv[cut + 1:]
            return args
    return parser.parse_args(argv)


def _did_you_mean(parser: argparse.ArgumentParser, argv: list[str], message: str) -> str:
    """`` (did you mean --nproc?)`` for argparse's ``unrecognized arguments: --nprocs 4``: the closest flag
    of the command named in ``argv`` (difflib), else nothing."""
    unknown = [w for w in message.removeprefix("unrecognized arguments: ").split() if w.startswith("--")]
    if not message.startswith("unrecognized arguments: ") or not unknown:
        return ""
    commands = next((a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction)), {})
    command = next((commands[w] for w in argv if w in commands), parser)
    flags = [f for a in command._actions for f in a.option_strings if f.startswith("--")]
    close = difflib.get_close_matches(unknown[0].split("=")[0], flags, n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


# ---------------------------------------------------------------------- argument types and shared options


def one_line_errors(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """argparse prints usage plus the error; ftui's contract is one line and exit 2."""

    def error(message: str) -> NoReturn:
        raise UsageError(message)

    parser.error = error  # type: ignore[method-assign]
    return parser


def db_option(parser: argparse.ArgumentParser) -> None:
    """``--db URL`` on a parser (every command takes it, before or after the command name)."""
    parser.add_argument("--db", default=argparse.SUPPRESS, metavar="URL",
                        help="database URL (default: $FTUI_DB, else SQLite in the ftui data folder)")


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive finite number, got {text}")
    return value


def seconds_at_least(low: float) -> Callable[[str], float]:
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


def _refresh_seconds(text: str) -> float:
    """An argparse type: ``ftui gpus --watch`` seconds in [0.05, 1 hour]."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0.05 <= value <= 3600:  # also refuses nan and inf
        raise argparse.ArgumentTypeError(f"expected seconds between 0.05 and 3600, got {text!r}")
    return value


def _watch_options(parser: argparse.ArgumentParser) -> None:
    """How ``ftui run`` and ``ftui resume`` watch a run (telemetry, hang detection, the stop's grace)."""
    parser.add_argument("--sample-interval", type=seconds_at_least(0), default=watching.SAMPLE_INTERVAL_S,
                        metavar="SECONDS", help=f"telemetry: seconds between device readings (default "
                                                f"{watching.SAMPLE_INTERVAL_S:g}; 0 turns telemetry off)")
    parser.add_argument("--hang-after", type=seconds_at_least(1), default=watching.HANG_AFTER_S, metavar="SECONDS",
                        help="flag a hang (and ask every rank for its stacks) when the run made no progress "
                             "for this long: no event from the trainer and every device idle; stop it when "
                             f"it lasts as long again (default {watching.HANG_AFTER_S:g})")


def _grace_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--grace", type=seconds_at_least(0), default=watching.GRACE_S, metavar="SECONDS",
                        help="on Ctrl-C, SIGTERM or SIGHUP: seconds the ranks get to finish their step, save and exit "
                             f"before SIGKILL (default {watching.GRACE_S:g}; a second Ctrl-C kills at once, a second "
                             "SIGTERM or ftui stop waits for the stop in flight)")


def _node_options(parser: argparse.ArgumentParser) -> None:
    """The multi-node flags of ``ftui run`` and ``ftui resume`` (:mod:`tui.cli.nodes` reads them)."""
    group = parser.add_argument_group(
        "more than one machine",
        "Run the same command on every machine (docs/multi-node.md); each starts its own ranks and "
        "writes to the shared store (--db), and one run ties them together.")
    group.add_argument("--nnodes", type=positive_int, metavar="N", help="machines in the run (launch.nnodes)")
    group.add_argument("--node-rank", type=int, metavar="K",
                       help="this machine's node rank, 0..N-1, static rendezvous (launch.node_rank)")
    group.add_argument("--main-addr", metavar="ADDR", help="the main node's address (launch.main_addr)")
    group.add_argument("--main-port", type=int, metavar="PORT", help="its rendezvous port (default 29500)")
    group.add_argument("--rdzv-endpoint", metavar="HOST:PORT",
                       help="c10d rendezvous instead of --main-addr/--node-rank: node ranks assigned by arrival")
    group.add_argument("--run-key", metavar="KEY",
                       help="what the nodes share to find one run in the store (default: derived from the "
                            "rendezvous and the recipe name, or $SLURM_JOB_ID)")


# ---------------------------------------------------------------------- the commands, in the order --help lists


def _run(sub: Any) -> None:
    run = sub.add_parser(
        "run", help="run a recipe (or your own training script) headless",
        usage="ftui run [RECIPE] [--script FILE] [options] [-- SCRIPT_ARGS...]",
        description="Run a recipe headless; or, with --script, your own accelerate / Hugging Face Trainer / "
                    "TRL script, launched with the strategy's accelerate config (arguments after --).")
    _recipe_options(run)
    run.add_argument("--dry-run", action="store_true", help="print the launch (argv, env, config) and run nothing")
    _force_option(run)
    run.add_argument("--format", choices=["text", "json"], default="text")
    run.add_argument("--find-batch-size", action="store_true",
                     help="find the largest micro-batch that fits with short real runs, then stop")
    run.add_argument("--mem-cap", metavar="SIZE", help="with --find-batch-size: budget per rank, e.g. 3GiB")
    _data_change_option(run)
    _watch_options(run)
    _grace_option(run)
    run.add_argument("--notify", action="store_true",
                     help="when the run ends or fails: ring the terminal bell and send a desktop notification "
                          "(notify-send, where it exists)")
    _node_options(run)
    db_option(run)
    run.set_defaults(handler="tui.cli.run:cmd_run")

    resume = sub.add_parser(
        "resume", help="continue a run from its newest complete checkpoint, as a new run",
        description="Continue run ID from the newest checkpoint in its folder whose files verify (train.save_every, "
                    "or a graceful stop, writes them; a damaged newer one is passed over with a warning): a new "
                    "run with the same recipe, strategy and process count, going on at the next step.")
    resume.add_argument("run_id", type=int, metavar="ID", help="the run to continue")
    _data_change_option(resume)
    _force_option(resume)
    _watch_options(resume)
    _grace_option(resume)
    _node_options(resume)  # a multi-node run: the same command on each node (docs/multi-node.md)
    db_option(resume)
    resume.set_defaults(handler="tui.cli.run:cmd_resume")


def _recipe_options(parser: argparse.ArgumentParser) -> None:
    """What makes the recipe of ``ftui run`` and ``ftui queue add``: the file (or a script of one's own) and
    the flags that override its fields (:func:`tui.cli.run.load_run_recipe` reads them)."""
    parser.add_argument("recipe", type=Path, nargs="?", help="recipe TOML file (optional with --script)")
    parser.add_argument("--script", type=Path, metavar="FILE",
                        help="launch this training script instead of ftui's trainer (sets launch.script); "
                             "its arguments follow --")
    parser.set_defaults(script_args=None)
    parser.add_argument("--strategy", choices=strategies.names(launchable=True), help="override launch.strategy")
    parser.add_argument("--nproc", type=int, help="override launch.nproc (processes)")
    parser.add_argument("--engine", choices=strategies.engine_names(),
                        help="override launch.engine: what implements a ZeRO stage (deepspeed or torch)")
    parser.add_argument("--offload", choices=strategies.OFFLOADS,
                        help="override launch.offload: ZeRO state kept in host memory (nvme: on --nvme-path)")
    parser.add_argument("--nvme-path", metavar="DIR",
                        help="override launch.nvme_path: the NVMe folder of offload nvme")
    parser.add_argument("--cp-size", type=int, metavar="N",
                        help="override launch.cp_size: processes each sequence is split over (context parallel, GPUs)")
    parser.add_argument("--replicate", type=int, metavar="R",
                        help="override launch.replicate: hsdp's groups of processes that are replicas of each other")
    parser.add_argument("--shard", type=int, metavar="S",
                        help="override launch.shard: processes each hsdp group shards the model states over")
    _kernel_options(parser, "override model.attn_implementation: the attention kernel (eager keeps the attention "
                            "probabilities; flash_attention_2 and flex_attention need a CUDA GPU)",
                    "compile each decoder layer with torch.compile (train.compile = true; MODE: train.compile_mode, "
                    "default 'default')")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                        help="override any recipe field, e.g. --set train.max_steps=50 (repeatable)")
    parser.add_argument("--name", help="override the recipe's name")


def _kernel_options(parser: argparse.ArgumentParser, attn_help: str, compile_help: str) -> None:
    """``--attn IMPL`` and ``--compile [MODE]``: the kernels of ``ftui run`` (and ``queue add``) and of
    ``ftui estimate``."""
    parser.add_argument("--attn", choices=kernels.ATTENTION, help=attn_help)
    parser.add_argument("--compile", nargs="?", const="default", choices=kernels.COMPILE_MODES, metavar="MODE",
                        help=compile_help)


def _force_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--force", action="store_true",
                        help="start more processes per machine than it has GPUs (on CPU: cores x 2); refused "
                             "without it")


def _data_change_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--allow-data-change", action="store_true",
                        help="resume although the data source changed since the checkpoint was taken")


def _queue(sub: Any) -> None:
    queue = sub.add_parser(
        "queue", help="runs that start one after another, unattended (add, rm; alone: the list)",
        description="The run queue of this store (docs/running.md, \"Queue\"). Alone: every entry, its place in "
                    "line and its state: queued, running (run ID), done (run ID, status) or failed to start "
                    "(reason). One queue runner per host starts each entry as a normal run when the devices it "
                    "takes are free (on CPU: one run at a time), outlives the terminal and the dashboard, and "
                    "exits when the queue is empty; ftui stop of the running entry's run stops it, and the "
                    "runner then starts the next.")
    queue.add_argument("--format", choices=["text", "json"], default="text")
    db_option(queue)
    queue.set_defaults(handler="tui.cli.queue:cmd_queue")
    actions = queue.add_subparsers(title="actions", metavar="ACTION")
    add = actions.add_parser(
        "add", help="put a run at the end of the queue (the flags of ftui run)",
        usage="ftui queue add [RECIPE] [--script FILE] [options] [-- SCRIPT_ARGS...]",
        description="Check the run as ftui run does (bad input: one line, exit 2, nothing queued), record it with "
                    "its flags, this shell's CUDA_VISIBLE_DEVICES and folder, and start this host's queue runner "
                    "if none is alive. The recipe is kept as it is now: editing its file later changes nothing "
                    "queued. A run over several machines is not queued.")
    _recipe_options(add)
    _force_option(add)
    _data_change_option(add)
    _watch_options(add)
    _grace_option(add)
    db_option(add)
    add.set_defaults(handler="tui.cli.queue:cmd_queue_add")
    rm = actions.add_parser(
        "rm", help="take an entry out of the queue (the running one: stop its run with ftui stop)",
        description="Take entry ID out of the queue: one waiting, or one that ended. The running entry is "
                    "refused: stop its run with ftui stop RUN_ID (the queue then starts the next).")
    rm.add_argument("entry_id", type=positive_int, metavar="ID", help="the entry (ftui queue lists them)")
    db_option(rm)
    rm.set_defaults(handler="tui.cli.queue:cmd_queue_rm")
    for action in (add, rm):
        one_line_errors(action)


def _stop(sub: Any) -> None:
    stop = sub.add_parser(
        "stop", help="stop a running run (graceful; --kill: at once)",
        description="Stop a run on this host: its ranks finish their step, save and exit; after the grace period "
                    "whatever is left gets SIGKILL. Afterwards no process of the run is left (checked). Stopping a "
                    "run that is already stopping waits for that stop; only --kill kills at once. The status says "
                    "what happened: stopped (with its checkpoint, or none) or killed.")
    stop.add_argument("run_id", type=positive_int, metavar="ID", help="the run (ftui runs lists them)")
    stop.add_argument("--kill", action="store_true", help="SIGKILL every process of the run now (status killed)")
    stop.add_argument("--grace", type=seconds_at_least(0), default=watching.GRACE_S, metavar="SECONDS",
                      help="seconds the ranks get before SIGKILL when no watcher of the run is alive (a live "
                           f"watcher keeps the grace it was started with) (default {watching.GRACE_S:g})")
    db_option(stop)
    stop.set_defaults(handler="tui.cli.stop:cmd_stop")


def _runs(sub: Any) -> None:
    runs = sub.add_parser("runs", help="list the runs in the store")
    runs.add_argument("--status", choices=STATUSES)
    runs.add_argument("--format", choices=["text", "json"], default="text")
    shown = runs.add_mutually_exclusive_group()
    shown.add_argument("--limit", type=positive_int, metavar="N",
                       help=f"the newest N runs (default: {TABLE_LIMIT} in the table, every run in --format json)")
    shown.add_argument("--all", action="store_true", help="every run in the table too")
    db_option(runs)
    runs.set_defaults(handler="tui.cli.runs:cmd_runs")

    show = sub.add_parser("show", help="show one run: status, summary, metrics (--recipe: its recipe too)")
    show.add_argument("run_id", type=int)
    show.add_argument("--recipe", action="store_true",
                      help="print the whole resolved recipe the run was launched with (else: where it is)")
    show.add_argument("--format", choices=["text", "json"], default="text")
    db_option(show)
    show.set_defaults(handler="tui.cli.runs:cmd_show")


def _gpus(sub: Any) -> None:
    gpus = sub.add_parser("gpus", help="show the GPUs now (or the host's CPU/memory without NVML)")
    gpus.add_argument("--watch", nargs="?", const=1.0, type=_refresh_seconds, metavar="SECONDS",
                      help="refresh every SECONDS (default 1) until Ctrl-C")
    db_option(gpus)  # unused, but every command takes --db (scripts pass it everywhere)
    gpus.set_defaults(handler="tui.cli.gpus:cmd_gpus")


def _estimate(sub: Any) -> None:
    p = sub.add_parser(
        "estimate",
        help="estimate GPU memory per device for every strategy, and recommend one",
        description="Estimate the memory of a fine-tuning run per device (weights, grads, optimizer, "
        "fp32 master, activations, buffers, reserve) under every strategy, and recommend one. From a recipe, "
        "a model (--model), or a raw size (--params). Every figure is an estimate; --probe measures with "
        "short real runs.",
    )
    p.add_argument("recipe", nargs="?", type=Path, help="recipe TOML file (or give --model or --params)")
    p.add_argument("--model", metavar="NAME",
                   help="a model instead of a recipe: builtin:tiny-llama, a local folder or a hub id")
    p.add_argument("--params", type=positive_float, help="total parameters, e.g. 7.5e9 (instead of a recipe)")
    p.add_argument("--layers", type=positive_int, help="decoder layers (with --params)")
    p.add_argument("--hidden", type=positive_int, help="hidden size (with --params)")
    p.add_argument("--heads", type=positive_int, help="attention heads (with --params)")
    p.add_argument("--kv-heads", type=positive_int, help="key/value heads (with --params; default: --heads)")
    p.add_argument("--intermediate", type=positive_int, help="MLP intermediate size (with --params)")
    p.add_argument("--vocab", type=positive_int, help="vocabulary size (with --params)")
    p.add_argument("--method", choices=["full", "lora", "qlora"], help="default: the recipe's, else full")
    p.add_argument("--precision", choices=["fp32", "bf16", "fp16"], help="default: the recipe's, else bf16")
    p.add_argument("--strategy", choices=strategies.names(), action="append",
                   help="strategies to show (repeatable; default: all)")
    p.add_argument("--gpus", type=positive_int,
                   help="GPUs available (default: NVML count, else the recipe's nproc, else 1)")
    p.add_argument("--gpu-mem", metavar="SIZE", help="memory of one GPU, e.g. 48GiB (default: NVML)")
    p.add_argument("--reserve", metavar="SIZE",
                   help=f"per GPU, for the CUDA context and allocator (default {DEFAULT_RESERVE}; 0 for none)")
    p.add_argument("--micro-batch", type=positive_int, help="sequences per device per step")
    p.add_argument("--seq", type=positive_int, help="tokens per sequence")
    p.add_argument("--grad-ckpt", action="store_true", default=None, help="gradient checkpointing")
    p.add_argument("--offload-optimizer", action="store_true", help="optimizer states on the host")
    p.add_argument("--offload-params", action="store_true", help="weights on the host (zero3/fsdp offload)")
    p.add_argument("--engine", choices=strategies.engine_names(),
                   help="what implements the ZeRO stages: deepspeed (default) or torch (launch.engine)")
    p.add_argument("--lora-r", type=positive_int, help="LoRA rank (default: the recipe's, else 8)")
    _kernel_options(p, "the attention implementation (default: the recipe's, else sdpa): eager keeps each layer's "
                       "attention probabilities", "estimate compiled decoder layers (default: the recipe's)")
    p.add_argument("--format", choices=["text", "json"], default="text")
    p.add_argument("--probe", action="store_true",
                   help="find the largest micro-batch with short real runs of the recipe (batch-size finder)")
    p.add_argument("--mem-cap", metavar="SIZE", help="with --probe: memory budget per rank (required on CPU)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                   help="override a recipe field, e.g. --set train.precision='\"bf16\"' (repeatable)")
    p.add_argument("--library", action="store_true",
                   help="measure the maths library's memory beyond tensors for this recipe on this host with a "
                        "probe process (two real steps of the model, random weights; once per shape set, cached)")
    db_option(p)
    p.set_defaults(handler="tui.cli.estimate:cmd_estimate")


def _compare(sub: Any) -> None:
    cmp = sub.add_parser("compare", help="compare runs side by side (or a sweep)",
                         description="Compare runs: throughput, utilisation, MFU, memory, loss, recipe diff.")
    cmp.add_argument("run_ids", type=int, nargs="*", metavar="RUN_ID")
    cmp.add_argument("--sweep", metavar="SWEEP_ID", help="compare the runs of a sweep")
    cmp.add_argument("--baseline", type=int, metavar="ID", help="speed-ups against this run (default: the first)")
    _comparison_options(cmp)
    db_option(cmp)
    cmp.set_defaults(handler="tui.cli.compare:cmd_compare")

    rep = sub.add_parser("report", help="write the HTML comparison report of runs (or a sweep)",
                         description="Write one self-contained HTML file: the verdict, the figures, the runs "
                                     "overlaid on shared axes, bars per run, the provenance.")
    rep.add_argument("run_ids", type=int, nargs="*", metavar="RUN_ID")
    rep.add_argument("--sweep", metavar="SWEEP_ID", help="report the runs of a sweep")
    rep.add_argument("--baseline", type=int, metavar="ID", help="speed-ups against this run (default: the first)")
    rep.add_argument("-o", "--output", type=Path, metavar="FILE", help="write the report here (default report.html)")
    rep.add_argument("--peak-tflops", type=positive_float, metavar="T",
                     help="peak TFLOP/s per device for MFU (overrides the table)")
    db_option(rep)
    rep.set_defaults(handler="tui.cli.compare:cmd_report", format="html", plot=False, command="report")

    sweep = sub.add_parser("sweep", help="run one recipe under several strategies and compare",
                           description="Run a recipe under each strategy one after another (and over a grid of "
                                       "field values), stored under one sweep id, then compare. For data-parallel "
                                       "strategies with N processes the micro-batch is divided by N when it "
                                       "divides evenly (pp, mp and tp keep it: their processes share one "
                                       "batch), so that every run trains the same global batch.")
    sweep.add_argument("recipe", type=Path)
    sweep.add_argument("--strategies", default=",".join(strategies.names()),
                       help="comma-separated (default: every strategy of runner/spec/strategies.py; one that "
                            "cannot run here is a row with its reason)")
    sweep.add_argument("--nproc", type=positive_int,
                       help="processes for the multi-process strategies (default: GPUs visible, at least 2)")
    sweep.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                       help="override a recipe field for every run (repeatable)")
    sweep.add_argument("--grid", action="append", default=[], metavar="FIELD=V1,V2",
                       help="sweep a field over values too (repeatable: the product)")
    sweep.add_argument("--repeat", type=positive_int, default=1, metavar="N",
                       help="run each strategy N times and report medians and spread (min-max)")
    _force_option(sweep)
    sweep.add_argument("--dry-run", action="store_true",
                       help="check the recipe and print the runs the sweep would make; run and record nothing")
    _comparison_options(sweep)
    db_option(sweep)
    sweep.set_defaults(handler="tui.cli.compare:cmd_sweep")


def _plan(sub: Any) -> None:
    p = sub.add_parser(
        "plan", help="race the strategies this host can run a recipe under, and say which to use",
        description="Every launchable strategy and engine at one global batch (the recipe's), pruned by the "
                    "memory estimate with its error band, raced for a few steps each (each trial a run in the "
                    "store, under the plan's id), ranked by steady-state tokens/s; the winner is named only "
                    "when it leads beyond the measured spread. The same command again continues an unfinished "
                    "plan (docs/plan.md).")
    p.add_argument("recipe", type=Path)
    p.add_argument("--nproc", type=positive_int,
                   help="processes of the multi-process strategies (default: GPUs visible, at least 2)")
    p.add_argument("--steps", type=positive_int, metavar="K",
                   help="optimizer steps per trial, at least 3: the first 2 are memory-metered (default 8)")
    p.add_argument("--repeat", type=positive_int, default=1, metavar="R",
                   help="trials per candidate where the budget allows (medians and spread)")
    p.add_argument("--budget", type=positive_float, metavar="MIN",
                   help="minutes: no trial starts that would end past it, as the trials so far measure")
    p.add_argument("--strategies", metavar="LIST",
                   help="comma-separated strategies to consider (default: every launchable one)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                   help="override a recipe field for every trial (repeatable)")
    p.add_argument("--commit", action="store_true",
                   help="then run the winner for real, to the recipe's train.max_steps (only when the plan "
                        "names one: a tie launches nothing)")
    p.add_argument("--format", choices=["text", "json", "md"], default="text")
    db_option(p)
    p.set_defaults(handler="tui.cli.plan:cmd_plan")


def _comparison_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--format", choices=COMPARE_FORMATS, default="text")
    p.add_argument("-o", "--output", type=Path, metavar="FILE", help="write the comparison here (html: default compare.html)")
    p.add_argument("--plot", action="store_true", help="draw the loss curves in the terminal")
    p.add_argument("--peak-tflops", type=positive_float, metavar="T", help="peak TFLOP/s per device for MFU (overrides the table)")


def _recover(sub: Any) -> None:
    rec = sub.add_parser(
        "recover", help="re-attach or finish runs whose watcher died",
        description="Runs left 'running' by a watcher that died (ftui killed, a reboot): re-read their run "
                    "folders into the store, then re-attach a watcher if the ranks still train, else set the "
                    "status the journal and the processes say; start this host's queue runner when queued runs "
                    "wait without one (after a reboot). Safe to run any time, and twice.")
    rec.add_argument("--no-attach", action="store_true",
                     help="do not start a watcher for runs still training, nor the queue runner for queued runs")
    rec.add_argument("--format", choices=["text", "json"], default="text")
    db_option(rec)
    rec.set_defaults(handler="tui.cli.recover:cmd_recover")


def _db(sub: Any) -> None:
    db = sub.add_parser("db", help="the store's schema version (upgrade, current); rebuild it from the run folders")
    db_option(db)
    db.set_defaults(handler="tui.cli.db:cmd_no_action")
    actions = db.add_subparsers(title="actions", metavar="ACTION")
    upgrade = actions.add_parser("upgrade", help="upgrade the database to this ftui's schema (creates it if missing)")
    db_option(upgrade)
    upgrade.set_defaults(handler="tui.cli.db:cmd_upgrade")
    current = actions.add_parser("current", help="print the database's schema revision")
    db_option(current)
    current.set_defaults(handler="tui.cli.db:cmd_current")
    rebuild = actions.add_parser(
        "rebuild", help="record the runs of the run folders that the database lacks (a lost or deleted one)",
        description="Rebuild the store from the run folders: every run folder whose run the database lacks is "
                    "recorded again from its journals (recipe, steps, metrics, telemetry, launch, end); runs "
                    "already there are left as they are. Creates the database if missing. Safe to run twice.")
    rebuild.add_argument("--runs-dir", type=Path, default=None, metavar="DIR",
                         help="the folder of run folders (default: the runs folder of FTUI_HOME)")
    rebuild.add_argument("--format", choices=["text", "json"], default="text")
    db_option(rebuild)
    rebuild.set_defaults(handler="tui.cli.db:cmd_rebuild")


def _slurm(sub: Any) -> None:
    slurm = sub.add_parser(
        "slurm", help="write (and --submit) the sbatch script of a multi-node run",
        description="Write an sbatch script that runs RECIPE on N nodes: one srun task per node runs the node agent "
                    "(ftui run --nnodes N --rdzv-endpoint HEAD:PORT), the rendezvous at the job's first node, every "
                    "node writing to the store (--db, passed through as FTUI_DB). --submit submits it with sbatch "
                    "and records the run with its job id; ftui runs shows the job's state, ftui stop cancels it "
                    "with SIGTERM so the ranks checkpoint first.")
    slurm.add_argument("recipe", type=Path, nargs="?",
                       help="recipe TOML file (on a disk the nodes share); not with --resume")
    slurm.add_argument("--nodes", type=positive_int, required=True, metavar="N", help="machines")
    slurm.add_argument("--gpus-per-node", type=int, default=0, metavar="G", help="GPUs per machine (0: CPU)")
    slurm.add_argument("--nproc-per-node", type=positive_int, metavar="P",
                       help="ranks per machine (default: one per GPU, else 1)")
    slurm.add_argument("--strategy", help="override launch.strategy")
    slurm.add_argument("--partition", metavar="P")
    slurm.add_argument("--time", metavar="T", help="time limit, as sbatch takes it (e.g. 04:00:00)")
    slurm.add_argument("--account", metavar="A")
    slurm.add_argument("--port", type=int, default=29500, help="the rendezvous port on the first node")
    slurm.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                       help="override a recipe field on every node (repeatable)")
    slurm.add_argument("--output", "-o", type=Path, metavar="FILE",
                       help="where to write the script (default: ftui-<recipe name>.sbatch here)")
    slurm.add_argument("--submit", action="store_true", help="submit it (sbatch) and record the run")
    _force_option(slurm)  # passed on to each node's ftui run / ftui resume
    slurm.add_argument("--resume", type=int, metavar="ID",
                       help="resume run ID with its own recipe (read from the store; no RECIPE): the nodes run "
                            "ftui resume ID --rdzv-endpoint, the run folders on a shared filesystem")
    db_option(slurm)
    slurm.set_defaults(handler="tui.cli.slurm:cmd_slurm")
