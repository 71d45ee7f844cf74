"""``ftui slurm RECIPE --nodes N --gpus-per-node G``: write the sbatch script of a multi-node run
(:mod:`runner.nodes.slurm`), and with ``--submit`` submit it and record the run with its job id."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from runner.nodes.slurm import SlurmError, SlurmJob, sbatch_script, submit
from runner.spec.layout import host_nproc_limit
from runner.spec.paths import default_db_url
from runner.spec.recipe import Recipe, RecipeError, load_recipe, parse_recipe
from store.nodes import open_slurm_run
from tui.cli.common import console, open_store
from tui.cli.exits import ExitCode, UsageError


def cmd_slurm(args: argparse.Namespace) -> int:
    if args.gpus_per_node < 0:
        raise UsageError(f"--gpus-per-node: must be 0 or more, got {args.gpus_per_node}")
    if not 0 < args.port < 65536:
        raise UsageError(f"--port: {args.port} is not a TCP port")
    overrides = list(args.overrides)
    if args.strategy:
        overrides.append(f"launch.strategy={args.strategy}")
    nproc = args.nproc_per_node or max(1, args.gpus_per_node)
    # The job's own request says too many ranks per node; else each node's pre-flight decides (the login
    # node's devices are not the compute nodes').
    if args.gpus_per_node and nproc > host_nproc_limit(on_cpu=False, gpus=args.gpus_per_node, cpu_cores=0) \
            and not args.force:
        raise UsageError(f"--nproc-per-node: {nproc} ranks per machine, but --gpus-per-node {args.gpus_per_node} "
                         f"(one process per GPU); lower it, or pass --force to start them anyway")
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
                   ftui_home=os.environ.get("FTUI_HOME"), resume=args.resume, force=args.force)
    path = args.output or Path(f"ftui-{recipe.name}.sbatch")
    try:
        path.write_text(sbatch_script(job))
    except OSError as exc:
        raise UsageError(f"--output {path}: {exc.strerror or exc}") from None
    out = console()
    out.print(f"wrote {path}", markup=False)
    if db_url.startswith("sqlite"):
        out.print("note: the store is SQLite: every node must see that file (a shared disk); PostgreSQL is the "
                  "store for several machines (docs/multi-node.md)", markup=False)
    if not args.submit:
        out.print(f"submit it with: sbatch {path}   (or ftui slurm ... --submit)", markup=False)
        return ExitCode.OK
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


def _resumed_recipe(args: argparse.Namespace, overrides: list[str], nproc: int) -> Recipe:
    """The recipe of the run ``--resume`` names, from the store (the job's name and the recorded row; the
    nodes read it again, with the checkpoint, in ``ftui resume``). A resume keeps that recipe: no RECIPE,
    no ``--set``/``--strategy``, and the old run's ranks per node."""
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
