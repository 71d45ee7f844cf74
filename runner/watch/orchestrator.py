"""Orchestration: prepare a run, start its process group, stream its journal into the store, end it.

:func:`execute` is the one function both ``ftui run`` and the TUI call. Processes are spawned here
and nowhere else, as argv lists (never a shell), in a new session so that the whole group (the
accelerate launcher and every rank) can be signalled together.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from runner.spec import events as ev
from runner.spec import strategies, zero
from runner.spec.flops import run_flops_per_token
from runner.spec.launch import LaunchSpec, build_launch
from runner.spec.paths import runs_dir
from runner.spec.recipe import Recipe, RecipeError
from runner.spec.summary import busiest_peak, trained_bytes
from runner.watch import procs
from runner.watch.inputs import check_inputs
from store import Store

EventCallback = Callable[[dict[str, Any]], None]


class PreflightError(RecipeError):
    """A problem found before launch; one line naming the field or file."""


@dataclass(frozen=True)
class Prepared:
    """A run that is recorded and has its folder written, but is not started."""

    run_id: int | None
    run_dir: Path
    spec: LaunchSpec
    recipe: Recipe
    node: Any = None
    """This machine's :class:`runner.nodes.agent.NodeAgent` when the run spans several machines, else None."""


@dataclass
class Outcome:
    """How a run ended."""

    run_id: int
    status: str
    exit_code: int | None
    error: str | None
    summary: dict[str, Any] = field(default_factory=dict)
    stop_report: str | None = None
    """After a stop: what was signalled, killed and checked (:meth:`runner.watch.procs.StopReport.describe`)."""


# ---------------------------------------------------------------------- pre-flight


def preflight(recipe: Recipe) -> list[str]:
    """Check what can be checked before launch; raise :class:`PreflightError`, return warnings."""
    from runner.data.rows import DataError, check_source

    warnings: list[str] = []
    if recipe.launch.script is not None:  # a script run: the script owns its model and data
        return _script_preflight(recipe)
    check_inputs(recipe)  # data read and parsed, run folders writable (runner/watch/inputs.py)
    try:
        check_source(recipe.data.source)
    except DataError as exc:
        raise PreflightError(str(exc)) from None
    name = recipe.model.name
    if not name.startswith("builtin:") and (name.startswith(("/", ".", "~")) or os.sep in name and Path(name).exists()):
        folder = Path(name).expanduser()
        if not (folder / "config.json").is_file():
            raise PreflightError(f"model.name: {name}: not a model folder (no config.json)")
    config = recipe.launch.accelerate_config
    if config is not None and not Path(config).expanduser().is_file():
        raise PreflightError(f"launch.accelerate_config: {config}: no such file")
    on_cpu = runs_on_cpu(recipe)
    if recipe.method.type == "qlora" and on_cpu:
        raise PreflightError("method.type: qlora needs a CUDA GPU (bitsandbytes 4-bit); none is visible here")
    if recipe.train.precision == "fp16" and on_cpu:
        raise PreflightError("train.precision: fp16 needs a GPU; use bf16 or fp32 on CPU")
    strategy = strategies.resolve(recipe.launch.strategy, recipe.launch.engine)
    missing = zero.engine_missing(strategy.engine)
    if missing:
        raise PreflightError(missing)
    problem = strategy.nproc_problem(recipe.launch.nproc * (recipe.launch.nnodes or 1), on_cpu=on_cpu)
    if problem:
        raise PreflightError(f"launch.nproc: {problem}")
    if on_cpu and strategy.layer_split and recipe.launch.nproc == 1:
        warnings.append("mp on a CPU-only machine: one device, so this is the single-process run")
    if recipe.train.resume_from is not None:
        from runner.spec.checkpoint import CheckpointError, check_resume

        try:
            step = check_resume(recipe.train.resume_from, recipe.launch.nproc, recipe.launch.strategy)["step"]
        except CheckpointError as exc:
            raise PreflightError(str(exc)) from None
        if recipe.train.max_steps and step >= recipe.train.max_steps:
            raise PreflightError(f"train.resume_from: the checkpoint is at step {step} and train.max_steps is "
                                 f"{recipe.train.max_steps}: nothing left to train")
    return warnings


def _script_preflight(recipe: Recipe) -> list[str]:
    """:func:`preflight` of a script run (``runner.spec.script``): the script file, run folders, processes."""
    from runner.spec.paths import FolderError, check_runs_dir
    from runner.spec.script import check_script

    check_script(recipe)
    try:
        check_runs_dir()
    except FolderError as exc:
        raise PreflightError(f"run folders: {exc}") from None
    on_cpu = runs_on_cpu(recipe)
    if recipe.train.precision == "fp16" and on_cpu:
        raise PreflightError("train.precision: fp16 needs a GPU; use bf16 or fp32 on CPU")
    problem = strategies.get(recipe.launch.strategy).nproc_problem(recipe.launch.nproc, on_cpu=on_cpu)
    if problem:
        raise PreflightError(f"launch.nproc: {problem}")
    return []


def runs_on_cpu(recipe: Recipe) -> bool:
    """Whether the ranks will train on CPU (no CUDA device visible, or the recipe asks for CPU)."""
    if recipe.launch.device == "cpu":
        return True
    if recipe.launch.device == "cuda":
        return False
    return cuda_device_count() == 0


def cuda_device_count() -> int:
    """GPUs the trainer will see, through NVML (no torch import: ``ftui run`` stays fast); detected
    once per command (:func:`runner.hardware.hostfacts.current`)."""
    from runner.hardware.hostfacts import current

    return current().visible_gpus


def free_port() -> int:
    """A TCP port free right now on this host, for the rendezvous of one run."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cpu_threads(recipe: Recipe) -> int | None:
    """Threads per rank on CPU: the physical cores shared out (accelerate defaults to 1)."""
    if not runs_on_cpu(recipe):
        return None
    from runner.hardware.hostfacts import current

    return max(1, current().cpu_cores // recipe.launch.nproc)


# ---------------------------------------------------------------------- preparing and starting


def prepare(
    store: Store | None,
    recipe: Recipe,
    source: str | None = None,
    sweep_id: str | None = None,
    root: Path | None = None,
    resumed_from: int | None = None,
    nodes: Any = None,
) -> Prepared:
    """Record the run (unless ``store`` is None: a dry run) and write its folder; start nothing.
    ``resumed_from``: the run this one continues (:func:`prepare_resume`). ``nodes``: a
    :class:`runner.spec.rendezvous.NodeSpec` for a dry run of one machine of several (a real one goes through
    :func:`runner.nodes.agent.prepare_node`)."""
    from runner.spec.paths import RunFolderError, claim_run_folder, new_run_uid
    from runner.spec.script import store_method, store_model

    root = root or runs_dir()
    run_id: int | None = None
    # The folder is named by a globally unique id, never by the store's integer id: two stores
    # sharing one data folder would otherwise write into the same folder.
    if store is not None:
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
    else:
        uid = f"dry-run-{new_run_uid()}"
    try:
        run_dir = claim_run_folder(root, uid, recipe.name)
    except (RunFolderError, OSError) as exc:
        if store is not None and run_id is not None:
            store.update_run(run_id, status="failed", error=str(exc), ended_at=_utcnow())
        raise PreflightError(str(exc)) from None
    port = nodes.main_port if nodes is not None else free_port()
    spec = build_launch(recipe, run_dir, port=port, cpu_threads=cpu_threads(recipe), nodes=nodes)
    for name, text in spec.files.items():
        (run_dir / name).write_text(text)
    (run_dir / ev.LAUNCH_FILE).write_text(json.dumps(spec.to_json(), indent=2) + "\n")
    if store is not None and run_id is not None:
        store.update_run(run_id, run_dir=str(run_dir), summary={"uid": uid, "estimate": estimate_summary(recipe)})
    return Prepared(run_id=run_id, run_dir=run_dir, spec=spec, recipe=recipe)


def run_uid(store: Store, run_id: int) -> str:
    """The run's globally unique id: the store's ``runs.uid`` where the schema has it, else a new one
    (kept in the summary). The one place that knows which."""
    from runner.spec.paths import new_run_uid

    run = store.get_run(run_id)
    uid = getattr(run, "uid", None) or run.summary.uid if run is not None else None
    return str(uid) if uid else new_run_uid()
def prepare_resume(store: Store, run_id: int, root: Path | None = None) -> Prepared:
    """Record a new run that continues run ``run_id`` from its newest complete checkpoint: the old
    run's recipe (same strategy and process count) with ``train.resume_from`` set. Starts nothing.

    Raises:
        PreflightError: one line: no such run, no complete checkpoint, or a recipe that no longer loads.
    """
    from runner.spec.checkpoint import checkpoints_root, latest_complete, read_manifest
    from runner.spec.recipe import load_recipe

    old = store.get_run(run_id)
    if old is None:
        raise PreflightError(f"run {run_id}: no such run in {store.url}")
    if (old.nnodes or 1) > 1:  # each machine holds its own part of each checkpoint (docs/multi-node.md)
        raise PreflightError(f"run {run_id}: ran on {old.nnodes} machines; on each of them run `ftui resume "
                             f"{run_id} --node-rank K --main-addr ADDR` (docs/multi-node.md)")
    run_dir = Path(old.run_dir) if old.run_dir else None
    checkpoint = latest_complete(run_dir) if run_dir is not None else None
    if run_dir is None or checkpoint is None:
        where = checkpoints_root(run_dir) if run_dir is not None else "its run folder"
        raise PreflightError(f"run {run_id}: no complete checkpoint in {where} (train.save_every, or a "
                             "graceful stop, writes one)")
    recipe = load_recipe(run_dir / ev.RECIPE_FILE)
    recipe = recipe.model_copy(update={"train": recipe.train.model_copy(update={"resume_from": str(checkpoint)})})
    preflight(recipe)
    prepared = prepare(store, recipe, source=f"resume of run {run_id}", root=root, resumed_from=run_id)
    assert prepared.run_id is not None
    step = (read_manifest(checkpoint) or {}).get("step")
    store.update_run(prepared.run_id, summary={"resumed_from": {"run_id": run_id, "checkpoint": str(checkpoint),
                                                                 "step": step}})
    return prepared


def estimate_summary(recipe: Recipe) -> dict[str, Any]:
    """The memory estimate of one device of this run (``runner.planner``), stored in the run's summary
    at prepare time so that ``ftui show`` can set it against the measured bytes. Never fails a run:
    a model whose shape cannot be had offline gets ``{"error": ...}``."""
    from runner.planner import breakdown_json, estimate, inputs_from_recipe, resolve_model_shape
    from runner.spec.script import described

    if "model" not in described(recipe):
        return {"error": "not reported: the script run's recipe has no model section"}
    try:
        source = resolve_model_shape(recipe.model.name, allow_network=False)
        inp = inputs_from_recipe(recipe, shape=source.shape)
        if runs_on_cpu(recipe):
            from dataclasses import replace

            inp = replace(inp, device="cpu")
            if strategies.get(inp.strategy).layer_split and recipe.launch.nproc == 1:
                inp = replace(inp, n_devices=1)  # one device on CPU: mp is the single-process run
        breakdown = estimate(inp)
        return {
            "per_device_bytes": breakdown_json(breakdown),
            "strategy": inp.strategy,
            "n_devices": inp.n_devices,
            "micro_batch": inp.micro_batch,
            "seq_len": inp.seq_len,
            "model": source.note,
            "precision": inp.precision,
            "param_dtype": inp.param_dtype or "auto",
            "device": inp.device,
            **({"approximate": breakdown.approximate} if breakdown.approximate else {}),
        }
    except Exception as exc:  # noqa: BLE001 (an estimate is informative only)
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}


def spawn(prepared: Prepared) -> subprocess.Popen[bytes]:
    """Start the launch in its own session (process group), every process of it marked with the run
    folder (:func:`runner.watch.procs.spawn`, the only place ftui spawns a run)."""
    return procs.spawn(prepared.spec.argv, prepared.spec.env, prepared.run_dir,
                       prepared.run_dir / ev.LAUNCHER_LOG, run_dir=prepared.run_dir)


signal_group = procs.signal_group  # kept for callers of the old name


# ---------------------------------------------------------------------- watching


class _Watch:
    """Streams one run's journal into the store in batches and tracks its state."""

    FLUSH_S = 0.5

    def __init__(self, store: Store, prepared: Prepared, on_event: EventCallback | None) -> None:
        assert prepared.run_id is not None
        self.store = store
        self.run_id = prepared.run_id
        self.prepared = prepared
        self.on_event = on_event
        self.reader = ev.JournalReader(prepared.run_dir / ev.EVENTS_FILE)
        self.pending: list[dict[str, Any]] = []
        self.last_flush = time.monotonic()
        self.start: ev.StartEvent | None = None
        self.end: ev.EndEvent | None = None
        self.error: str | None = None
        self.mismatch: str | None = None
        self.first_step_time: float | None = None
        self.last_step_time: float | None = None
        self.last_step: int | None = None
        self.store_error: str | None = None

    def poll(self) -> None:
        fresh = self.reader.read_new()
        self.pending.extend(fresh)  # before any callback runs: a callback that raises loses nothing
        for raw in fresh:
            event = ev.typed(raw)
            if event is None:
                continue
            if event["type"] == "start":
                self.start = event
                self._on_start(event)
            elif event["type"] == "step":
                self.first_step_time = self.first_step_time or float(raw["time"]) - (event.get("step_time") or 0.0)
                self.last_step_time = float(raw["time"])
                self.last_step = event.get("step")
            elif event["type"] == "end":
                self.end = event
            elif event["type"] == "error":
                self.error = event.get("message")
            elif event["type"] == "precision":
                self._on_precision(event)
            elif event["type"] == "loss_scale":
                self.loss_scale_drops += 1
                self._update_summary({"loss_scale_drops": self.loss_scale_drops})
        if self.on_event is not None:
            for raw in fresh:
                self.on_event(raw)
        urgent = any(e["type"] not in ("step", "metrics") for e in self.pending)  # both batched
        if self.pending and (urgent or time.monotonic() - self.last_flush >= self.FLUSH_S):
            self.flush()

    def flush(self) -> None:
        # The events are in the journal already. A store that fails (locked, gone for a moment) must
        # not end a 30-hour run: keep them pending and try again at the next flush (ingest skips by
        # seq, so a batch must not be skipped over: the pending list keeps the order).
        self.last_flush = time.monotonic()
        try:
            self.store.ingest(self.run_id, self.pending)
        except Exception as exc:  # noqa: BLE001
            self.store_error = f"{type(exc).__name__}: {exc}"[:300]
            return
        self.pending = []
        self.store_error = None

    loss_scale_drops = 0

    def _update_summary(self, summary: dict[str, Any]) -> None:
        try:  # a figure for the summary; the journal has the event whatever the store does now
            self.store.update_run(self.run_id, summary=summary)
        except Exception:  # noqa: BLE001
            pass

    def _on_precision(self, event: ev.PrecisionEvent) -> None:
        self._update_summary({"precision": {k: v for k, v in event.items() if k != "type"}})

    def _on_start(self, event: ev.StartEvent) -> None:
        launch = self.prepared.recipe.launch
        strategy = strategies.resolve(launch.strategy, launch.engine)
        in_effect = event.get("distributed_type")
        self.store.update_run(
            self.run_id,
            distributed_type=in_effect,
            device_type=event.get("device_type"),
            total_steps=event.get("total_steps"),
            summary={"params": event.get("params"), "trainable_params": event.get("trainable_params"),
                     "local_param_numel": event.get("local_param_numel"), "world_size": event.get("world_size"),
                     "tokens_per_step": event.get("tokens_per_step"), "mixed_precision": event.get("mixed_precision"),
                     "device_map": event.get("device_map"), "pids": event.get("pids"),
                     "threads": event.get("threads"), "model_dims": event.get("model_dims"),
                     # Stored so that compare computes MFU without reading a model config (no transformers).
                     "flops_per_token": run_flops_per_token(self.prepared.recipe.method.type, event.get("params"),
                                                            event.get("trainable_params"), event.get("model_dims")),
                     **({"engine": event["engine"]} if "engine" in event else {}),
                     **({"sharding": event["sharding"]} if "sharding" in event else {}),
                     **({"parallel": event["parallel"]} if "parallel" in event else {})},
        )
        if in_effect is not None and in_effect not in strategy.expect:  # None: a script did not say
            self.mismatch = (
                f"launch.strategy: asked for {strategy.name} ({' or '.join(sorted(strategy.expect))}) but "
                f"accelerate ran {in_effect}; the run was stopped"
            )


def watcher_identity(pid: int | None = None) -> dict[str, Any]:
    """Who watches a run, as ``update_run`` keyword arguments: the ``watcher_pid``/``watcher_host``
    columns, and the summary fields ``ftui stop`` reads (:func:`runner.watch.procs.watcher_identity`: pid
    and start time, so a reused pid is not taken for the watcher). The one place that knows where."""
    import psutil

    pid = pid if pid is not None else os.getpid()
    try:
        created: float | None = psutil.Process(pid).create_time()
    except psutil.Error:
        created = None
    host = socket.gethostname()
    return {"watcher_pid": pid, "watcher_host": host,
            "summary": {"orchestrator_pid": pid, "orchestrator_create_time": created, "orchestrator_host": host}}


def record_watcher(store: Store, run_id: int, pid: int | None = None, **values: Any) -> None:
    """Record the watcher of a run (and other columns); a store that fails now is not fatal (the
    journal has the launch, and recover uses the watcher lock, not these fields)."""
    fields = watcher_identity(pid)
    try:
        store.update_run(run_id, **{**fields, **values})
    except Exception:  # noqa: BLE001
        pass


class _Launcher:
    """The launch being followed: ftui's own child (its exit code is known), or, for a watcher that
    re-attached after the first one died, a process group of which only the pids are known."""

    def __init__(self, pgid: int, proc: subprocess.Popen[bytes] | None = None) -> None:
        self.pgid = pgid
        self.proc = proc

    def poll(self) -> int | None:
        if self.proc is not None:
            return self.proc.poll()
        return None if _leader_alive(self.pgid) else -1

    def wait(self) -> int | None:
        """The exit code; None when it is not ours to know (a re-attached watcher)."""
        if self.proc is not None:
            try:
                return self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:  # only when SIGKILL did not take (stop report: left)
                self.proc.kill()
                return self.proc.wait()
        deadline = time.monotonic() + 30
        while _leader_alive(self.pgid) and time.monotonic() < deadline:
            time.sleep(0.2)
        return None


def _leader_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, or a pid reused by a process of another group, does not)."""
    import psutil

    try:
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE and os.getpgid(pid) == pid
    except (psutil.Error, OSError):
        return False


class _Recorder:
    """The orchestrator's events: to ``RUN/orchestrator.jsonl`` first, then to the store."""

    def __init__(self, store: Store, run_id: int, run_dir: Path, source: str = "orchestrator") -> None:
        from runner.watch.journal import OrchestratorJournal

        self.store = store
        self.run_id = run_id
        self.source = source  # each node of a multi-node run numbers its own events
        self.journal = OrchestratorJournal(run_dir)

    def emit(self, type_: str, **payload: Any) -> dict[str, Any]:
        record = self.journal.emit(type_, **payload)
        try:
            self.store.ingest(self.run_id, [record], source=self.source)
        except Exception:  # noqa: BLE001 (the journal has it; recover re-ingests it)
            pass
        return record


FAULT_GRACE_S = 60.0
"""A rank that vanished with no step and no end event since, while the launcher lives on: the group
is stopped after this long (torch elastic normally tears it down within a second or two)."""


def execute(
    store: Store,
    prepared: Prepared,
    on_event: EventCallback | None = None,
    stop: threading.Event | procs.StopRequest | None = None,
    poll_s: float = 0.25,
    probe: Any | None = None,
    sample_interval_s: float = 0.5,
    hang_after_s: float = 300.0,
    grace_s: float = procs.DEFAULT_GRACE_S,
) -> Outcome:
    """Start a prepared run and follow it to the end, writing everything to the run folder and then
    to the store.

    Args:
        store: the store (this function is the run's only writer: samples from the telemetry
            thread are queued and written here, in batches).
        prepared: from :func:`prepare`.
        on_event: called with every journal event as it arrives (progress bars), and with the
            orchestrator's own ``hang`` and ``rank_exit`` events.
        stop: set it (or :meth:`runner.watch.procs.StopRequest.request`) to stop the run gracefully: what
            Ctrl-C, SIGTERM and SIGHUP do for ``ftui run``. A second request kills what is left at
            once; a kill request records ``failed`` ("killed by user").
        poll_s: how often the journal is read.
        probe: the telemetry probe (:class:`runner.hardware.Probe`); default: NVML + psutil.
        sample_interval_s: seconds between telemetry readings; 0 turns telemetry off.
        hang_after_s: flag a hang when no step came for this long and a device is idle; stop the
            run (failed, "hang: ...") when it is still hung ``hang_after_s`` after the flag.
        grace_s: after a stop request, seconds the ranks get to finish their step, save and exit
            before whatever is left of the run is SIGKILLed (then checked: none left).

    Returns:
        The outcome; the run's row holds the same status, exit code, error and summary.
    """
    from runner.watch.journal import WatcherLock

    assert prepared.run_id is not None, "a dry run cannot be executed"
    run_id = prepared.run_id
    lock = WatcherLock(prepared.run_dir)
    if not lock.acquire(wait_s=5.0):  # a recover check elsewhere may hold it for a moment
        raise PreflightError(f"run {run_id}: another process watches {prepared.run_dir}")
    recorder = _Recorder(store, run_id, prepared.run_dir,
                         source=prepared.node.source if prepared.node is not None else "orchestrator")
    proc = spawn(prepared)
    pgid = proc.pid  # start_new_session: the launcher leads its own group (the ranks may not: procs)
    launched = time.time()
    recorder.emit("launch", argv=prepared.spec.argv, pgid=pgid, watcher_pid=os.getpid())
    record_watcher(store, run_id, status="running", started_at=_utcnow(), pgid=pgid)
    return follow(store, prepared, _Launcher(pgid, proc), recorder, lock, on_event=on_event, stop=stop,
                  poll_s=poll_s, probe=probe, sample_interval_s=sample_interval_s, hang_after_s=hang_after_s,
                  launched=launched, grace_s=grace_s)


def attach(store: Store, prepared: Prepared, pgid: int, probe: Any | None = None,
           sample_interval_s: float = 0.5, hang_after_s: float = 300.0,
           stop: threading.Event | procs.StopRequest | None = None, lock_fd: int | None = None,
           grace_s: float = procs.DEFAULT_GRACE_S) -> Outcome:
    """Follow a run whose watcher died while its ranks train on: re-read its journals from the start
    (idempotent ingest), then watch it to the end like :func:`execute` (see :mod:`runner.watch.recover`).

    Raises:
        PreflightError: another process already watches the run.
    """
    from runner.watch.journal import WatcherLock

    assert prepared.run_id is not None
    lock = WatcherLock.adopt(prepared.run_dir, lock_fd) if lock_fd is not None else WatcherLock(prepared.run_dir)
    if not lock.acquire():
        raise PreflightError(f"run {prepared.run_id}: another process watches {prepared.run_dir}")
    recorder = _Recorder(store, prepared.run_id, prepared.run_dir)
    recorder.emit("attach", pgid=pgid, watcher_pid=os.getpid())
    record_watcher(store, prepared.run_id)
    return follow(store, prepared, _Launcher(pgid), recorder, lock, stop=stop, probe=probe,
                  sample_interval_s=sample_interval_s, hang_after_s=hang_after_s, launched=time.time(),
                  grace_s=grace_s)


def follow(
    store: Store,
    prepared: Prepared,
    launcher: _Launcher,
    recorder: _Recorder,
    lock: Any,
    on_event: EventCallback | None = None,
    stop: threading.Event | procs.StopRequest | None = None,
    poll_s: float = 0.25,
    probe: Any | None = None,
    sample_interval_s: float = 0.5,
    hang_after_s: float = 300.0,
    launched: float | None = None,
    grace_s: float = procs.DEFAULT_GRACE_S,
) -> Outcome:
    """Watch a started run to its end. Whatever goes wrong while watching (an exception in a
    callback, the database), the ``finally`` below stops and reaps every process of the run, writes
    what was read, and records a true status and reason: journal first, then the store."""
    from runner.watch.crash import RankWatch, describe

    pgid = launcher.pgid
    run_dir = prepared.run_dir
    request = stop if isinstance(stop, procs.StopRequest) else procs.StopRequest(stop)
    watch = _Watch(store, prepared, on_event)
    telemetry: _Telemetry | None = None
    ranks = RankWatch(run_dir)
    stopper = _Stopper(run_dir, pgid, request)
    forced_error: str | None = None
    exit_code: int | None = None
    try:
        telemetry = _Telemetry(store, prepared, probe, sample_interval_s, hang_after_s, launched or time.time())
        while True:
            try:
                watch.poll()
                telemetry.poll(watch, recorder)
                if watch.mismatch and not stopper.started:
                    stopper.start(grace_s=5.0)
                if request.is_set() and not stopper.started:
                    stopper.start(grace_s=grace_s, kill=request.kill)
                    recorder.emit("stop_requested", kill=request.kill, grace_s=grace_s)
                for rank, pid in ranks.poll():
                    # (not one we ended; a node without rank 0 sees no end event: its launcher's exit says)
                    if watch.end is None and not stopper.started and (prepared.node is None or watch.start):
                        event = recorder.emit("rank_exit", rank=rank, pid=pid)
                        if on_event is not None:
                            on_event(event)
                now = time.time()
                if (ranks.first_vanished_at is not None and watch.end is None and not stopper.started
                        and now - ranks.first_vanished_at >= FAULT_GRACE_S
                        and (watch.last_step_time or 0.0) < ranks.first_vanished_at):
                    forced_error = describe(run_dir, ranks.vanished, list(telemetry.recent), watch.error)
                    stopper.start(grace_s=5.0)
                if not stopper.started and telemetry.hang_stop(watch):
                    forced_error = telemetry.hang_reason
                    recorder.emit("hang_stop", reason=forced_error)
                    procs.signal_group(pgid, signal.SIGCONT)  # a stopped (SIGSTOP) rank cannot take SIGTERM
                    stopper.start(grace_s=10.0)
                if prepared.node is not None:  # several machines: heartbeat, stop requests both ways
                    prepared.node.tick(request, run_dir)
                if stopper.started and stopper.done:
                    break
                if not stopper.started and launcher.poll() is not None:
                    break
                time.sleep(poll_s)
            except KeyboardInterrupt:  # a caller without handlers (procs.StopRequest.install) in the main thread
                request.request()
    except BaseException as exc:  # noqa: BLE001 (any fault of the watcher: reap and record it below)
        forced_error = f"watcher error: {type(exc).__name__}: {exc}"[:500]
        _quietly(recorder.emit, "watcher_error", message=forced_error)
        if not stopper.started:
            stopper.start(grace_s=5.0)
        if stopper.thread is not None:
            stopper.thread.join(timeout=60)
    finally:
        watch.on_event = None  # the caller's callbacks may be what failed; the rest is bookkeeping
        exit_code = _quietly(launcher.wait)
        if not stopper.started:
            # The launcher can exit before its ranks: wait for every process of the run (ranks
            # included, in sessions of their own), then kill and check whatever is left.
            deadline = time.monotonic() + 20.0
            while procs.find_processes(run_dir, pgid) and time.monotonic() < deadline:
                _quietly(watch.poll)
                time.sleep(poll_s)
            _quietly(procs.kill_all, run_dir, pgid)
        if telemetry is not None:
            _quietly(telemetry.close)
        _quietly(watch.poll)
        _quietly(watch.flush)
        try:
            report = stopper.report
            if report is not None:
                _quietly(recorder.emit, "stop", graceful=report.graceful, killed=report.killed, left=report.left,
                         gpu=report.gpu_note, processes={str(k): v for k, v in report.seen.items()})
            recent = list(telemetry.recent) if telemetry is not None else []
            if prepared.node is not None:
                prepared.node.fault_at = ranks.first_vanished_at or time.time()
            outcome = _finish(store, watch, exit_code, request.is_set() and not request.kill, recorder,
                              forced_error, ranks.vanished, recent, killed_by_user=request.kill)
            if report is not None:
                outcome.stop_report = report.describe()
                _quietly(store.update_run, watch.run_id, summary={"stop": outcome.stop_report})
        finally:
            recorder.journal.close()
            lock.release()
    return outcome


def _quietly(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call ``fn``; an exception is swallowed (the finally of :func:`follow` must run to its end)."""
    try:
        return fn(*args, **kwargs)
    except Exception:  # noqa: BLE001
        return None


class _Stopper:
    """Stops a run in a thread (:func:`runner.watch.procs.stop_run`) while the orchestrator keeps reading
    its journal, so that the ranks' last steps and ``end`` events are recorded."""

    def __init__(self, run_dir: Path, pgid: int, request: procs.StopRequest) -> None:
        self.run_dir = run_dir
        self.pgid = pgid
        self.request = request
        self.thread: threading.Thread | None = None
        self.report: procs.StopReport | None = None

    @property
    def started(self) -> bool:
        return self.thread is not None

    @property
    def done(self) -> bool:
        return self.thread is not None and not self.thread.is_alive()

    def start(self, grace_s: float, kill: bool = False) -> None:
        def run() -> None:
            self.report = procs.stop_run(self.run_dir, self.pgid, grace_s=grace_s, kill_now=self.request.now,
                                         kill=kill)

        self.thread = threading.Thread(target=run, name="ftui-stop", daemon=True)
        self.thread.start()


class _Telemetry:
    """The sampler of one run, its queue to the writer (this thread) and the hang detector."""

    def __init__(self, store: Store, prepared: Prepared, probe: Any | None, interval_s: float,
                 hang_after_s: float, launched: float) -> None:
        from collections import deque
        from queue import SimpleQueue

        self.store = store
        self.run_id = prepared.run_id
        self.run_dir = prepared.run_dir
        self.node = prepared.node
        self.queue: SimpleQueue[tuple[list[Any], list[Any]]] = SimpleQueue()
        self.recent: deque[Any] = deque(maxlen=2000)
        self.sampler = None
        self.last_write = 0.0
        self.last_hang_check = 0.0
        self.hang_after_s = hang_after_s
        self.hang_flagged: dict[str, Any] | None = None
        self.hang_reason: str | None = None
        self.unsaved: tuple[list[Any], list[Any]] = ([], [])
        if interval_s <= 0:
            return
        from runner.hardware import Probe
        from runner.watch.telemetry import HangDetector, Sampler

        self.hang = HangDetector(hang_after_s=hang_after_s, window_s=min(30.0, hang_after_s), started_at=launched)
        self.sampler = Sampler(
            probe if probe is not None else Probe(),
            lambda: ev.read_rank_pids(self.run_dir),
            lambda samples, procs: self.queue.put((samples, procs)),
            interval_s=interval_s,
            flush_every_s=1.0,
        )
        self.sampler.start()

    def poll(self, watch: _Watch, recorder: _Recorder) -> None:
        if self.sampler is None:
            return
        now = time.time()
        self._write()
        if self.hang_flagged is not None and watch.last_step_time != self.hang_flagged.get("last_step_time"):
            self.hang_flagged = None  # a step came: the episode is over
        if now - self.last_hang_check >= 1.0 and watch.end is None:
            self.last_hang_check = now
            event = self.hang.check(now, watch.last_step_time, self.recent)
            if event is not None:
                record = recorder.emit("hang", **event)
                self.hang_flagged = {**event, "flagged_at": now, "last_step_time": watch.last_step_time}
                if watch.on_event is not None:
                    watch.on_event(record)

    def hang_stop(self, watch: _Watch) -> bool:
        """The documented rule: a hang still there ``hang_after_s`` after it was flagged (no step,
        devices idle the whole time, so ``2 x hang_after_s`` without a step) stops the run."""
        flagged = self.hang_flagged
        if flagged is None or watch.end is not None or self.hang_reason is not None:
            return False
        now = time.time()
        if now - flagged["flagged_at"] < self.hang_after_s:
            return False
        reference = watch.last_step_time if watch.last_step_time is not None else self.hang.started_at
        since = now - (reference or flagged["flagged_at"])
        self.hang_reason = f"hang: no step for {since:.0f} s, devices idle"
        return True

    def _write(self) -> None:
        from runner.watch.journal import append_samples

        samples: list[Any] = []
        procs: list[Any] = []
        while not self.queue.empty():
            more, more_procs = self.queue.get()
            samples.extend(more)
            procs.extend(more_procs)
        if (samples or procs) and self.run_id is not None:
            append_samples(self.run_dir, samples, procs)  # the run folder first: the store is a projection
            self.recent.extend(samples)
            self.unsaved[0].extend(samples)
            self.unsaved[1].extend(procs)
        if (self.unsaved[0] or self.unsaved[1]) and self.run_id is not None:
            try:  # idempotent by time, so a batch that failed is simply offered again
                if self.node is not None:  # several machines: each node's readings under its own number
                    from store.nodes import ingest_node_samples

                    ingest_node_samples(self.store, self.run_id, self.node.slot, *self.unsaved)
                else:
                    self.store.ingest_samples(self.run_id, *self.unsaved)
            except Exception:  # noqa: BLE001 (samples.jsonl has them; see _Watch.flush)
                return
            self.unsaved = ([], [])

    def close(self) -> None:
        if self.sampler is None:
            return
        self.sampler.stop()
        self._write()


def _finish(store: Store, watch: _Watch, exit_code: int | None, stopped_by_user: bool,
            recorder: _Recorder | None = None, forced_error: str | None = None,
            vanished: list[tuple[int, int]] | None = None, recent: list[Any] | None = None,
            killed_by_user: bool = False) -> Outcome:
    from runner.watch.crash import describe

    end = watch.end
    ended = end.get("status") if end is not None else None
    error: str | None = None
    if watch.mismatch:
        status, error = "failed", watch.mismatch
    elif forced_error is not None:
        status, error = "failed", forced_error
    elif killed_by_user:
        status, error = "failed", "killed by user"
    elif stopped_by_user or ended == "stopped":
        status = "stopped"
    elif exit_code in (0, None) and (ended == "completed" or (
            watch.prepared.node is not None and watch.start is None and exit_code == 0)):
        # (a node without rank 0 has no trainer journal: its launcher's exit code says how it ended)
        status = "completed"
    else:
        status = "failed"
        error = (describe(watch.prepared.run_dir, vanished, recent, watch.error)
                 or watch.error or _error_from_logs(watch.prepared.run_dir)
                 or (f"launcher exited with code {exit_code}" if exit_code is not None else
                     f"watcher and ranks gone; last step {watch.last_step or 0}"))
    # Journal first: should the store fail now, recover reads the status from here.
    if recorder is not None:
        _quietly(recorder.emit, "exit", exit_code=exit_code, status=status, error=error)
    node = watch.prepared.node
    if node is None:
        return _project_end(store, watch, status, exit_code, error)
    # One machine of several (runner/nodes/agent.py): the node with the trainer's journal writes the figures;
    # the run's status is settled from every node's row once they all ended.
    outcome = (_project_end(store, watch, status, exit_code, error, final=False) if watch.start is not None
               else Outcome(run_id=watch.run_id, status=status, exit_code=exit_code, error=error))
    settled = node.finish(status, error, exit_code)
    if settled is not None:
        outcome.status, outcome.error = settled.status, settled.error
    return outcome


def _project_end(store: Store, watch: _Watch, status: str, exit_code: int | None, error: str | None,
                 final: bool = True) -> Outcome:
    """Write the end of a run (status, reason, figures of the end event, telemetry summary) to the store;
    ``final=False``: the figures only (one node of several: the run's status is settled from all)."""
    end = watch.end
    summary: dict[str, Any] = {}
    columns: dict[str, Any] = {}
    if end is not None:
        ranks = end.get("ranks") or []
        summary = {
            "train_seconds": end.get("train_seconds"),
            "tokens_per_s": end.get("tokens_per_s"),
            "final_loss": end.get("final_loss"),
            "tokens": end.get("tokens"),
            "steps": end.get("steps"),
            "ranks": ranks,
            "saved": end.get("saved"),
            "skipped": end.get("skipped"),
            "checkpoint": end.get("checkpoint"),
            "first_step_time": watch.first_step_time,
            "last_step_time": watch.last_step_time,
        }
        columns = {
            "train_seconds": end.get("train_seconds"),
            "tokens_per_s": end.get("tokens_per_s"),
            "final_loss": end.get("final_loss"),
            "steps_done": end.get("steps"),
            "peak_mem_bytes": busiest_peak(ranks)[0],
        }
    telemetry = _quietly(_telemetry_summary, store, watch)
    if telemetry is not None:
        summary["telemetry"] = telemetry
        overall = telemetry.get("active") or telemetry.get("whole") or {}
        columns["mean_util"] = overall.get("util_mean")
    if status == "completed":  # after the run, never during it: the peak its MFU is measured against
        summary["mfu_peak"] = _mfu_peak(watch, telemetry)
    if final:
        columns |= {"status": status, "ended_at": _utcnow(), "exit_code": exit_code, "error": error}
    store.update_run(watch.run_id, summary=summary, **columns)
    return Outcome(run_id=watch.run_id, status=status, exit_code=exit_code, error=error, summary=summary)


def _mfu_peak(watch: _Watch, telemetry: dict[str, Any] | None) -> dict[str, Any] | None:
    """The peak FLOP/s of one device of the run (:func:`runner.analysis.cpu_peak.peak_for_run`), stored with it so
    that compare never benchmarks; None when unknown. Never fails a run."""
    from runner.analysis import cpu_peak

    start = watch.start
    device_type = start.get("device_type") if start is not None else None
    threads = start.get("threads") if start is not None else None
    gpus = [d["name"] for d in ((telemetry or {}).get("devices") or {}).values() if d.get("kind") == "gpu"]
    try:
        peak = cpu_peak.peak_for_run(device_type, watch.prepared.recipe.train.precision, threads, gpus)
    except Exception as exc:  # noqa: BLE001 (a peak is informative only)
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}
    return peak.to_json() if peak is not None else None


def _telemetry_summary(store: Store, watch: _Watch) -> dict[str, Any] | None:
    """Per-device and overall utilisation of the run (definitions: :func:`runner.analysis.utilisation.summarise`);
    the active window runs from the start of the first step to the end of the last."""
    samples = store.samples(watch.run_id)
    if not samples:
        return None
    from runner.analysis.utilisation import summarise

    window = None
    if watch.first_step_time is not None and watch.last_step_time is not None:
        window = (watch.first_step_time, watch.last_step_time)
    result = summarise(samples, window, threads=watch.start.get("threads") if watch.start is not None else None)
    plain: dict[str, Any] = json.loads(json.dumps(result))  # tuples -> lists, as stored
    # Each rank's own GPU memory (NVML's per-process figure, summed over the GPUs it touches in one
    # reading), peak over the run: what a rank really held, beside the device-wide peaks above.
    per_reading: dict[tuple[int, float], int] = {}
    for p in store.process_samples(watch.run_id):
        if p.rank is not None and p.used_bytes is not None:
            per_reading[(p.rank, p.time)] = per_reading.get((p.rank, p.time), 0) + p.used_bytes
    peaks: dict[str, int] = {}
    for (rank, _), used in per_reading.items():
        peaks[str(rank)] = max(peaks.get(str(rank), 0), used)
    if peaks:
        plain["rank_gpu_mem_peak"] = dict(sorted(peaks.items(), key=lambda kv: int(kv[0])))
    return plain


def _error_from_logs(run_dir: Path) -> str | None:
    """The last exception line of any rank log (or of the launcher's), for a one-line reason."""
    logs = sorted((run_dir / "logs").glob("rank*.log")) + [run_dir / ev.LAUNCHER_LOG]
    for log in logs:
        try:
            lines = log.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in reversed(lines):
            text = line.strip()
            head = text.split(":", 1)[0]
            if head.endswith(("Error", "Exception")) and " " not in head:
                return f"{log.name}: {text}"[:500]
    return None


def _utcnow() -> datetime:
    from store.store import utcnow

    return utcnow()


# ---------------------------------------------------------------------- batch-size finder


@dataclass(frozen=True)
class BatchTrial:
    """One short real run of the batch-size finder."""

    batch_size: int
    run_id: int
    status: str
    measured_bytes: int | None
    """Busiest rank's measured peak: CUDA peak allocated on GPU, the live-tensor peak on CPU."""
    fits: bool
    error: str | None = None


def trial_bytes(ranks: list[dict[str, Any]]) -> int | None:
    """The memory a run needed on its busiest rank, as the finder compares it with the budget: the
    independent measurement (:func:`runner.spec.summary.trained_bytes`: CUDA peak allocated on GPU, the
    live-tensor peak on CPU), never the planner's estimate."""
    values = [v for r in ranks if (v := trained_bytes(r)) is not None]
    return max(values) if values else None


def find_batch_size(
    store: Store,
    recipe: Recipe,
    cap_bytes: int,
    source: str | None = None,
    on_trial: Callable[[BatchTrial], None] | None = None,
    max_trials: int = 6,
    max_batch: int = 64,
    steps: int = 2,
) -> dict[str, Any]:
    """The largest micro-batch (``train.batch_size``) that fits ``cap_bytes`` per rank, found with short
    real runs: start at 1, double while it fits, then bisect between the last fit and the first miss.

    Each trial is a normal run (``steps`` steps, ``train.save = false``) of the recipe's strategy and
    process count, recorded in the store with a shared sweep id ``find-batch-...``. A trial misses when it
    fails (out of memory, or anything else: its error is kept) or when its measured bytes
    (:func:`trial_bytes`) exceed the cap. The result is also stored on the last trial: a
    ``batch_size_found`` event and ``summary["find_batch"]``.

    Returns:
        ``{"sweep_id", "chosen" (None when batch 1 misses), "cap_bytes", "trials": [...]}``.
    """
    sweep_id = f"find-batch-{datetime.now():%Y%m%d-%H%M%S}-{os.getpid()}"
    trials: list[BatchTrial] = []
    good, bad, b = 0, None, 1
    while len(trials) < max_trials:
        train = recipe.train.model_copy(update={"batch_size": b, "max_steps": steps, "save": False})
        trial_recipe = recipe.model_copy(update={"train": train, "name": f"{recipe.name}-find-bs{b}"})
        prepared = prepare(store, trial_recipe, source=source, sweep_id=sweep_id)
        outcome = execute(store, prepared)
        ranks = outcome.summary.get("ranks") or []
        used = trial_bytes(ranks)
        fits = outcome.status == "completed" and used is not None and used <= cap_bytes
        trial = BatchTrial(b, outcome.run_id, outcome.status, used, fits, outcome.error)
        trials.append(trial)
        if on_trial is not None:
            on_trial(trial)
        if outcome.status == "stopped":
            break
        if fits:
            good = b
        else:
            bad = b
        if bad is not None and good == 0:
            break
        if bad is None:
            if b >= max_batch:
                break
            b = min(2 * b, max_batch)
        else:
            if bad - good <= 1:
                break
            b = (good + bad) // 2
    result: dict[str, Any] = {
        "sweep_id": sweep_id,
        "chosen": good or None,
        "cap_bytes": cap_bytes,
        "strategy": recipe.launch.strategy,
        "nproc": recipe.launch.nproc,
        "trials": [t.__dict__ for t in trials],
    }
    last = trials[-1].run_id
    last_run = store.get_run(last)
    if last_run is not None:  # journal first, like every orchestrator event
        recorder = _Recorder(store, last, Path(last_run.run_dir))
        recorder.emit("batch_size_found", **result)
        recorder.journal.close()
    store.update_run(last, summary={"find_batch": result})
    return result


# ---------------------------------------------------------------------- detached runs


def load_prepared(run_id: int, run_dir: Path) -> Prepared:
    """A prepared run read back from its folder (recipe.toml and launch.json)."""
    from runner.spec.recipe import load_recipe

    launch = json.loads((run_dir / ev.LAUNCH_FILE).read_text())
    spec = LaunchSpec(argv=launch["argv"], env=launch["env"], accelerate_config=launch["accelerate_config"])
    return Prepared(run_id=run_id, run_dir=run_dir, spec=spec, recipe=load_recipe(run_dir / ev.RECIPE_FILE))


def start_detached(db_url: str, prepared: Prepared, fake_gpus: int = 0) -> subprocess.Popen[bytes]:
    """Follow a prepared run from a background orchestrator in a session of its own, so that the
    run and its recording outlive the caller (the TUI). Stop it with :func:`runner.watch.procs.request_stop`
    (SIGTERM to that process: a graceful stop; SIGUSR1: a kill)."""
    import sys

    assert prepared.run_id is not None
    argv = [sys.executable, "-m", "runner.watch.orchestrator", "--db", db_url, "--run-id", str(prepared.run_id),
            "--fake-gpus", str(fake_gpus)]
    child = procs.spawn(argv, {}, prepared.run_dir, prepared.run_dir / "orchestrator.log")
    # The watcher is the child from now on (the caller may exit at once): recover must not take the
    # run for abandoned in the second before the child records itself.
    record_watcher(Store(db_url), prepared.run_id, child.pid)
    return child


def probe_for(fake_gpus: int = 0) -> Any:
    """The telemetry probe: real NVML + psutil, or ``fake_gpus`` scripted GPUs (demo mode)."""
    from runner.hardware import Probe

    return Probe.fake(fake_gpus) if fake_gpus else Probe()


def main(argv: list[str] | None = None) -> int:
    """``python -m runner.watch.orchestrator --db URL --run-id N``: follow a prepared run to its end."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m runner.watch.orchestrator")
    parser.add_argument("--db", required=True)
    parser.add_argument("--run-id", type=int, required=True)
    parser.add_argument("--fake-gpus", type=int, default=0)
    parser.add_argument("--grace", type=float, default=procs.DEFAULT_GRACE_S)
    parser.add_argument("--attach", type=int, metavar="PGID",
                        help="follow a run already started (process group PGID) whose watcher died")
    parser.add_argument("--hang-after", type=float, default=300.0)
    parser.add_argument("--lock-fd", type=int, help="with --attach: the inherited hold on RUN/watcher.lock")
    args = parser.parse_args(argv)
    store = Store(args.db)
    run = store.get_run(args.run_id)
    if run is None:
        print(f"run {args.run_id}: no such run in {args.db}")
        return 2
    stop = procs.StopRequest()
    stop.install()  # SIGTERM/SIGINT/SIGHUP: graceful stop; again: kill now; SIGUSR1: kill (ftui stop --kill)
    prepared = load_prepared(run.id, Path(run.run_dir))
    try:
        if args.attach:
            outcome = attach(store, prepared, args.attach, probe=probe_for(args.fake_gpus), stop=stop,
                             hang_after_s=args.hang_after, lock_fd=args.lock_fd, grace_s=args.grace)
        else:
            outcome = execute(store, prepared, stop=stop, probe=probe_for(args.fake_gpus),
                              hang_after_s=args.hang_after, grace_s=args.grace)
    except PreflightError as exc:
        print(exc)
        return 2
    return 0 if outcome.status == "completed" else 1


if __name__ == "__main__":
    raise SystemExit(main())
