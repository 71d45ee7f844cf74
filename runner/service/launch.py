"""Launching runs, the use case ``ftui run``, ``ftui resume`` and the TUI's Launch and Resume share:
check the recipe (the one pre-flight), record the run and write its folder, start it attached (this
process watches it to its end) or detached (a background watcher does, and the run outlives the
caller), and wait for it.

The front ends only parse, call these and render what they return.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from runner.nodes.agent import prepare_node
from runner.nodes.resume import prepare_node_resume
from runner.spec.recipe import Recipe
from runner.spec.rendezvous import NodeSpec
from runner.watch.detached import start_detached
from runner.watch.finish import Outcome
from runner.watch.follow import Stop, WatchOptions, execute
from runner.watch.host import cuda_device_count
from runner.watch.preflight import launch_checks
from runner.watch.prepare import Prepared, prepare, prepare_resume
from runner.watch.stream import EventCallback
from store import Store

PGID_WAIT_S = 10.0
"""How long a detached start waits for its watcher to record the process group (so that a stop works
straight away)."""


@dataclass(frozen=True)
class LaunchRequest:
    """What to launch: a validated recipe, where it came from, and (one machine of several) this
    machine's rendezvous."""

    recipe: Recipe
    source: str | None = None
    nodes: NodeSpec | None = None
    resumed_from: int | None = None
    """The run this one continues, as the store records it (a plan's commit from its trial); None: none."""


@dataclass(frozen=True)
class NodeResumeRequest:
    """This machine's part of resuming a run that ran on several machines (``ftui resume ID --nnodes``)."""

    run_id: int
    nnodes: int | None = None
    node_rank: int | None = None
    main_addr: str | None = None
    main_port: int | None = None
    rdzv_endpoint: str | None = None
    run_key: str | None = None
    force: bool = False
    """Start more processes per machine than this one has devices for (``--force``)."""


@dataclass(frozen=True)
class Launched:
    """A run started detached."""

    run_id: int
    warnings: list[str]
    """The pre-flight's warnings, one line each."""


def default_nproc() -> int:
    """Processes of a multi-process strategy when neither the recipe nor ``--nproc`` says: this host's
    GPUs, and at least 2 (on CPU, two ranks over gloo)."""
    return max(2, cuda_device_count())


def check(recipe: Recipe, fake_gpus: int = 0, allow_data_change: bool = False, dry_run: bool = False,
          force: bool = False) -> list[str]:
    """The pre-flight of every launch (:func:`runner.watch.preflight.launch_checks`); its warnings.
    ``allow_data_change``: a checkpoint to resume from may have been taken on other data; ``dry_run``:
    nothing will be loaded; ``force``: more processes than this host has devices for are started anyway.

    Raises:
        runner.spec.recipe.RecipeError: the run cannot start (one line naming the field or file).
    """
    return launch_checks(recipe, fake_gpus, allow_data_change, dry_run, force)


def dry_run(request: LaunchRequest) -> Prepared:
    """Write the run folder of ``request`` without recording or starting anything (``ftui run --dry-run``)."""
    return prepare(None, request.recipe, source=request.source, nodes=request.nodes)


def record(store: Store, request: LaunchRequest) -> Prepared:
    """Record the run and write its folder; start nothing. One machine of several joins the run of its
    run key (:func:`runner.nodes.agent.prepare_node`).

    Raises:
        runner.watch.preflight.PreflightError: the folder cannot be written, or the run has all its nodes.
    """
    if request.nodes is not None:
        return prepare_node(store, request.recipe, request.nodes, source=request.source)
    return prepare(store, request.recipe, source=request.source, resumed_from=request.resumed_from)


def resume(store: Store, run_id: int, allow_data_change: bool = False, force: bool = False) -> Prepared:
    """Record a new run continuing run ``run_id`` from its newest checkpoint that verifies; start nothing.
    The checkpoints passed over are in the result's ``warnings``.

    Raises:
        runner.watch.preflight.PreflightError: no such run, a run still running, no usable checkpoint,
            changed data without ``allow_data_change`` (one line).
    """
    return prepare_resume(store, run_id, allow_data_change=allow_data_change, force=force)


def resume_node(store: Store, request: NodeResumeRequest, warn: Callable[[str], None] | None = None) -> Prepared:
    """This machine's part of resuming a multi-node run (:mod:`runner.nodes.resume`); start nothing.

    Raises:
        runner.watch.preflight.PreflightError: flags that do not fit the run, or no step every node holds.
    """
    return prepare_node_resume(store, request.run_id, request.nnodes, request.node_rank, request.main_addr,
                               request.main_port, request.rdzv_endpoint, request.run_key, warn=warn,
                               force=request.force)


def run(store: Store, prepared: Prepared, options: WatchOptions | None = None,
        on_event: EventCallback | None = None, stop: Stop | None = None) -> Outcome:
    """Start a recorded run attached and watch it to its end (:func:`runner.watch.follow.execute`)."""
    return execute(store, prepared, options, on_event=on_event, stop=stop)


def start(store: Store, prepared: Prepared, fake_gpus: int = 0) -> int:
    """Start a recorded run detached: a background watcher follows it, and it outlives the caller.
    Waits (briefly) until the watcher has recorded the process group, so that a stop works at once.
    Returns the run id."""
    assert prepared.run_id is not None
    start_detached(store.url, prepared, fake_gpus=fake_gpus)
    deadline = time.monotonic() + PGID_WAIT_S
    while time.monotonic() < deadline:
        run_row = store.get_run(prepared.run_id)
        if run_row is not None and run_row.pgid:
            break
        time.sleep(0.1)
    return prepared.run_id


def launch_detached(store: Store, request: LaunchRequest, fake_gpus: int = 0, force: bool = False) -> Launched:
    """Check, record and start a run detached (the TUI's Launch). Blocking: call from a worker. ``force``:
    more processes than this host has devices for are started anyway (Compose's toggle).

    Raises:
        runner.spec.recipe.RecipeError: the pre-flight refused it (one line naming the field).
    """
    warnings = check(request.recipe, fake_gpus, force=force)
    return Launched(start(store, record(store, request), fake_gpus), warnings)


def resume_detached(store: Store, run_id: int, fake_gpus: int = 0, force: bool = False) -> int:
    """A new run continuing run ``run_id`` from its newest complete checkpoint, started detached (the
    TUI's Resume); the new run's id. Blocking: call from a worker."""
    prepared = resume(store, run_id, force=force)
    start_detached(store.url, prepared, fake_gpus=fake_gpus)
    assert prepared.run_id is not None
    return prepared.run_id
