"""``ftui slurm RECIPE --nodes N --gpus-per-node G``: write the sbatch script of a multi-node run
(:mod:`runner.nodes.slurm`), and with ``--submit`` submit it and record the run with its job id."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from tui.cli.common import ExitCode, UsageError, console, db_option, positive_int


def add_parser(sub: Any) -> None:
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
    slurm.add_argument("--resume", type=int, metavar="ID",
                       help="resume run ID with its own recipe (read from the store; no RECIPE): the nodes run "
                            "ftui resume ID --rdzv-endpoint, the run folders on a shared filesystem")
    db_option(slurm)
    slurm.set_defaults(handler=cmd_slurm)


def cmd_slurm(args: argparse.Namespace) -> int:
    from runner.nodes.slurm import SlurmError, SlurmJob, sbatch_script, submit
    from runner.spec.paths import default_db_url
    from runner.spec.recipe import RecipeError, load_recipe

    if args.gpus_per_node < 0:
        raise UsageError(f"--gpus-per-node: must be 0 or more, got {args.gpus_per_node}")
    if not 0 < args.port < 65536:
        raise UsageError(f"--port: {args.port} is not a TCP port")
    overrides = list(args.overrides)
    if args.strategy:
        overrides.append(f"launch.strategy={args.strategy}")
    nproc = args.nproc_per_node or max(1, args.gpus_per_node)
    if args.resume is not None:
        recipe = _resumed_recipe(args, overrides, nproc)
    elif args.recipe is None:
        raise UsageError("RECIPE: required (or --resume ID: a run to resume with its own recipe)")
    else:
        try:  # checked here, before anything is submitted: the nodes would all fail alike
            recipe = load_recipe(args.recipe, [*overrides, f"launch.nproc={nproc}", f"launch.nnodes={args.nodes}"])
        except RecipeError as exc:
            raise UsageError(str(exc)) from None
    db_url = getattr(args, "db", None) or os.environ.get("FTUI_DB") or default_db_url()
    job = SlurmJob(recipe=(args.recipe or Path(recipe.name)).resolve(), nodes=args.nodes, gpus_per_node=args.gpus_per_node, db_url=db_url,
                   nproc_per_node=args.nproc_per_node, partition=args.partition, time=args.time, account=args.account,
                   overrides=tuple(overrides), workdir=Path.cwd(), name=f"ftui-{recipe.name}", port=args.port,
                   ftui_home=os.environ.get("FTUI_HOME"), resume=args.resume)
    path = args.output or Path(f"ftui-{recipe.name}.sbatch")
    try:
        path.write_text(sbatch_script(job))
    except OSError as exc:
        raise UsageError(f"--output {path}: {exc.strerror or exc}") from None
    out = console()
    out.print(f"wrote {path}", markup=False)
    if db_url.startswith("sqlite"):
        out.print("note: the store is SQLite: every node must see that file (a shared disk); PostgreSQL is the "
                  "store for several machines (README: More than one machine)", markup=False)
    if not args.submit:
        out.print(f"submit it with: sbatch {path}   (or ftui slurm ... --submit)", markup=False)
        return ExitCode.OK
    from store.nodes import open_slurm_run
    from tui.cli.common import open_store

    store = open_store(args, create=True)
    try:
        job_id = submit(path)
    except SlurmError as exc:
        raise UsageError(str(exc)) from None
    create = {"name": recipe.name, "recipe_text": recipe.to_toml(), "recipe_hash": recipe.digest(),
              "recipe_source": str(args.recipe) if args.recipe else f"resume of run {args.resume}", "strategy": recipe.launch.strategy, "nproc": nproc * args.nodes,
              "method": recipe.method.type, "model": recipe.model.name, "run_dir": "", "resumed_from": args.resume}
    run_id = open_slurm_run(store, f"slurm-{job_id}", args.nodes, create, job_id)
    out.print(f"submitted job {job_id}: run {run_id} (ftui runs shows the job's state; ftui stop {run_id} "
              "cancels it with SIGTERM, the ranks checkpoint first)", markup=False)
    return ExitCode.OK


def _resumed_recipe(args: argparse.Namespace, overrides: list[str], nproc: int) -> Any:
    """The recipe of the run ``--resume`` names, from the store (the job's name and the recorded row; the
    nodes read it again, with the checkpoint, in ``ftui resume``). A resume keeps that recipe: no RECIPE,
    no ``--set``/``--strategy``, and the old run's ranks per node."""
    from runner.spec.recipe import RecipeError, parse_recipe
    from tui.cli.common import open_store

    if args.recipe is not None:
        raise UsageError(f"RECIPE: not with --resume (run {args.resume} is resumed with its own recipe)")
    if overrides:
        raise UsageError(f"--set/--strategy: not with --resume (run {args.resume} is resumed with its own recipe)")
    store = open_store(args, create=False)
    try:
        old = store.get_run(args.resume)
    finally:
        store.close()
    if old is None:
        raise UsageError(f"--resume {args.resume}: no such run in {store.url}")
    try:
        recipe = parse_recipe(old.recipe_text, source=f"run {args.resume}'s recipe")
    except RecipeError as exc:
        raise UsageError(str(exc)) from None
    if args.nodes != (old.nnodes or 1):
        raise UsageError(f"--nodes: run {args.resume} ran on {old.nnodes or 1} machine(s); its resume needs as many "
                         f"(each holds its part of the checkpoints), got {args.nodes}")
    if recipe.launch.nproc != nproc:  # launch.nproc is per machine
        raise UsageError(f"--nproc-per-node/--gpus-per-node: run {args.resume} ran {recipe.launch.nproc} rank(s) per "
                         f"machine; its resume needs as many, got {nproc}")
    return recipe
