"""Preparing a run: record it in the store, claim and write its run folder (recipe, accelerate config,
``launch.json``); start nothing. Also a resume (a new run continuing an old one from its newest
complete checkpoint) and a prepared run read back from its folder (the background watcher, recover).
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from runner.hardware.disks import is_no_space, write_problem
from runner.spec import events as ev
from runner.spec.checkpoint import CheckpointError, checkpoints_root, newest_verified, read_manifest, verify
from runner.spec.launch import LaunchSpec, build_launch
from runner.spec.paths import RunFolderError, claim_run_folder, new_run_uid, runs_dir
from runner.spec.recipe import Recipe, load_recipe
from runner.spec.rendezvous import NodeSpec
from runner.spec.run_record import update_record
from runner.spec.script import store_method, store_model
from runner.watch.estimate import estimate_summary, trainable_count
from runner.watch.host import cpu_threads, free_port, run_devices
from runner.watch.identity import record_watcher
from runner.watch.preflight import PreflightError, check_room, preflight
from runner.watch.procs import StopRequest
from store import Store, StoreError
from store.nodes import Settled
from store.store import utcnow


class NodePart(Protocol):
    """This machine's part of a run on several machines, as the watcher calls it
    (:class:`runner.nodes.agent.NodeAgent`)."""

    slot: int
    created: bool
    spec: NodeSpec
    fault_at: float | None

    @property
    def source(self) -> str:
        """The event source of this node's journal in the store."""

    def tick(self, request: StopRequest, run_dir: Path) -> None:
        """Heartbeat, ranks, stop requests both ways; never raises."""

    def finish(self, status: str, error: str | None, exit_code: int | None) -> Settled | None:
        """Record this node's end; the run's end once every node ended (None: another node settles it)."""


@dataclass(frozen=True)
class Prepared:
    """A run that is recorded and has its folder written, but is not started."""

    run_id: int | None
    run_dir: Path
    spec: LaunchSpec
    recipe: Recipe
    node: NodePart | None = None
    """This machine's part when the run spans several machines, else None."""
    warnings: tuple[str, ...] = ()
    """What a person should see before it starts (one line each): checkpoints a resume passed over."""


def prepare(
    store: Store | None,
    recipe: Recipe,
    source: str | None = None,
    sweep_id: str | None = None,
    root: Path | None = None,
    resumed_from: int | None = None,
    nodes: NodeSpec | None = None,
) -> Prepared:
    """Record the run and write its folder; start nothing. A dry run (``store`` None) records nothing and
    leaves the runs folder as it is (:func:`dry_prepare`).

    Args:
        store: where the run is recorded; None: a dry run.
        recipe: the validated recipe.
        source: where the recipe came from (a file), as stored.
        sweep_id: the sweep the run belongs to.
        root: the folder of run folders (default: the data folder's; not for a dry run).
        resumed_from: the run this one continues (:func:`prepare_resume`).
        nodes: the rendezvous of a dry run of one machine of several (a real one goes through
            :func:`runner.nodes.agent.prepare_node`).

    Raises:
        PreflightError: the run folder cannot be claimed or written (the run is recorded failed).
        InputError: the run folders' disk has no room for a checkpoint (nothing is recorded).
    """
    if store is None:
        return dry_prepare(recipe, nodes)
    root = root or runs_dir()
    check_room(recipe, root)  # before anything is recorded
    # The folder is named by a globally unique id, never by the store's integer id: two stores
    # sharing one data folder would otherwise write into the same folder.
    run_id = store.create_run(
        name=recipe.name,
        recipe_text=recipe.to_toml(),
        recipe_hash=recipe.digest(),
        recipe_source=source,
        strategy=recipe.launch.strategy,
        nproc=recipe.launch.nproc,
        method=store_method(recipe),
        model=store_model(recipe),
        run_dir="",
        sweep_id=sweep_id,
        resumed_from=resumed_from,
    )
    record_watcher(store, run_id)  # the preparing process, until a watcher takes over
    uid = run_uid(store, run_id)
    try:
        run_dir = claim_run_folder(root, uid, recipe.name)
        port = nodes.main_port if nodes is not None else free_port()
        spec = write_launch(recipe, run_dir, port, nodes)
    except (RunFolderError, OSError) as exc:
        problem = f"run folder: {write_problem(root, exc)}" if isinstance(exc, OSError) and is_no_space(exc) else str(exc)
        fail_unstarted(store, run_id, problem)
        raise PreflightError(problem) from None
    try:
        store.update_run(run_id, run_dir=str(run_dir))
        _write_record(store, run_id, run_dir)
        record_summary(store, run_id, run_dir, {"uid": uid, "estimate": estimate_summary(recipe),
                                                "devices": run_devices(recipe)})
    except (StoreError, OSError) as exc:  # a disk that filled since the run was created: it does not start
        problem = f"run folder: {write_problem(run_dir, exc)}" if isinstance(exc, OSError) else str(exc)
        fail_unstarted(store, run_id, problem)
        raise PreflightError(problem) from None
    return Prepared(run_id=run_id, run_dir=run_dir, spec=spec, recipe=recipe)


def dry_prepare(recipe: Recipe, nodes: NodeSpec | None = None) -> Prepared:
    """The launch of ``recipe`` (``--dry-run``), its files written into a private folder of the system's
    temporary folder, never the runs folder: nothing is recorded and no run is listed, yet the printed argv,
    run by hand with its env, trains what ``ftui run`` would.

    Raises:
        PreflightError: the temporary folder cannot be written.
    """
    try:
        root = Path(tempfile.mkdtemp(prefix="ftui-dry-run-"))  # mode 0700
        run_dir = claim_run_folder(root, new_run_uid(), recipe.name)
        port = nodes.main_port if nodes is not None else free_port()
        spec = write_launch(recipe, run_dir, port, nodes)
    except (RunFolderError, OSError) as exc:
        raise PreflightError(f"dry run: {exc}") from None
    return Prepared(run_id=None, run_dir=run_dir, spec=spec, recipe=recipe)


def fail_unstarted(store: Store, run_id: int, problem: str) -> None:
    """Record a run that will not start as failed (never left ``created``); a store that cannot take it
    now leaves it to recover, which fails a ``created`` run without a launch."""
    try:
        store.update_run(run_id, status="failed", error=problem, ended_at=utcnow())
    except Exception:  # noqa: BLE001 (the problem is what the caller reports)
        pass


def _write_record(store: Store, run_id: int, run_dir: Path) -> None:
    """The run's row, as no journal holds it, into ``RUN/run.json`` (:mod:`runner.spec.run_record`)."""
    run = store.get_run(run_id)
    assert run is not None  # recorded just now
    old = store.get_run(run.resumed_from) if run.resumed_from is not None else None
    update_record(run_dir, {"uid": run.uid, "name": run.name, "created_at": run.created_at.isoformat(),
                            "host": run.host, "recipe_source": run.recipe_source, "sweep_id": run.sweep_id,
                            "resumed_from": old.uid if old is not None else None})


def record_summary(store: Store, run_id: int, run_dir: Path, summary: dict[str, Any]) -> None:
    """Merge summary figures that no journal holds into the run's row and its ``RUN/run.json``."""
    store.update_run(run_id, summary=summary)
    update_record(run_dir, {}, summary)


def write_launch(recipe: Recipe, run_dir: Path, port: int, nodes: NodeSpec | None) -> LaunchSpec:
    """Build the launch of ``recipe`` and write its files and ``launch.json`` into ``run_dir``."""
    spec = build_launch(recipe, run_dir, port=port, cpu_threads=cpu_threads(recipe), nodes=nodes,
                        trainable=trainable_count(recipe), environ=os.environ)
    for name, text in spec.files.items():
        (run_dir / name).write_text(text)
    (run_dir / ev.LAUNCH_FILE).write_text(json.dumps(spec.to_json(), indent=2) + "\n")
    return spec


def run_uid(store: Store, run_id: int) -> str:
    """The run's globally unique id: the store's ``runs.uid`` where the schema has it, else a new one
    (kept in the summary). The one place that knows which."""
    run = store.get_run(run_id)
    uid = getattr(run, "uid", None) or run.summary.uid if run is not None else None
    return str(uid) if uid else new_run_uid()


RUNNING = ("created", "running")
"""The statuses of a run that may still train: it is not resumed (a second training of it would start)."""


def prepare_resume(store: Store, run_id: int, root: Path | None = None, allow_data_change: bool = False,
                   force: bool = False) -> Prepared:
    """Record a new run that continues run ``run_id`` from its newest checkpoint whose files verify: the
    old run's recipe (same strategy and process count) with ``train.resume_from`` set. Starts nothing.
    Newer checkpoints passed over (damaged, cut short) are in the result's warnings; a run that has none
    of its own (a resumed run that failed or stopped before its first save) continues from the one it started
    from.

    Raises:
        PreflightError: one line: no such run, a run still running, no usable checkpoint, a recipe that no
            longer loads, or data that changed (unless ``allow_data_change``).
    """
    old = store.get_run(run_id)
    if old is None:
        raise PreflightError(f"run {run_id}: no such run in {store.url}")
    if old.status in RUNNING:
        raise PreflightError(f"run {run_id}: still {old.status}; resuming it would train it twice (stop it first: "
                             f"`ftui stop {run_id}`)")
    if (old.nnodes or 1) > 1:  # each machine holds its own part of each checkpoint (docs/multi-node.md)
        raise PreflightError(f"run {run_id}: ran on {old.nnodes} machines; on each of them run `ftui resume "
                             f"{run_id} --node-rank K --main-addr ADDR` (docs/multi-node.md)")
    if not old.run_dir:
        raise PreflightError(f"run {run_id}: no complete checkpoint in its run folder (train.save_every, or a "
                             "graceful stop, writes one)")
    run_dir = Path(old.run_dir)
    # A completed run trained every step: the checkpoint it started from would only train them again.
    parent = old.summary.resumed_from if old.status != "completed" else None
    checkpoint, warnings = resume_checkpoint(run_id, run_dir, parent)
    recipe = load_recipe(run_dir / ev.RECIPE_FILE)
    recipe = recipe.model_copy(update={"train": recipe.train.model_copy(update={"resume_from": str(checkpoint)})})
    preflight(recipe, allow_data_change, force=force)
    prepared = prepare(store, recipe, source=f"resume of run {run_id}", root=root, resumed_from=run_id)
    assert prepared.run_id is not None
    step = (read_manifest(checkpoint) or {}).get("step")
    resumed: dict[str, Any] = {"run_id": run_id, "checkpoint": str(checkpoint), "step": step}
    record_summary(store, prepared.run_id, prepared.run_dir, {"resumed_from": resumed})
    return replace(prepared, warnings=tuple(warnings))


def resume_checkpoint(run_id: int, run_dir: Path, parent: dict[str, Any] | None) -> tuple[Path, list[str]]:
    """The checkpoint a resume of run ``run_id`` starts from, and what it passed over (one line each): the
    run's newest that verifies, else the one it was itself resumed from (its parent's), if that verifies.

    Raises:
        PreflightError: one line: no checkpoint to resume from, with what was passed over.
    """
    checkpoint, warnings = newest_verified(run_dir)
    if checkpoint is not None:
        return checkpoint, warnings
    inherited = (parent or {}).get("checkpoint")
    if inherited:
        try:
            verify(Path(inherited))
        except CheckpointError as exc:
            warnings.append(f"its parent's checkpoint skipped: {exc}")
        else:
            warnings.append(f"run {run_id} wrote no checkpoint; resuming from the one it started from, {inherited}")
            return Path(inherited), warnings
    why = f" ({'; '.join(warnings)})" if warnings else ""
    raise PreflightError(f"run {run_id}: no complete checkpoint in {checkpoints_root(run_dir)} (train.save_every, "
                         f"or a graceful stop, writes one){why}")


def load_prepared(run_id: int, run_dir: Path) -> Prepared:
    """A prepared run read back from its folder (recipe.toml and launch.json)."""
    launch = json.loads((run_dir / ev.LAUNCH_FILE).read_text())
    spec = LaunchSpec(argv=launch["argv"], env=launch["env"], accelerate_config=launch["accelerate_config"])
    return Prepared(run_id=run_id, run_dir=run_dir, spec=spec, recipe=load_recipe(run_dir / ev.RECIPE_FILE))
