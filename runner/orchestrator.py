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

from runner import events as ev
from runner import strategies
from runner.launch import LaunchSpec, build_launch
from runner.paths import runs_dir
from runner.recipe import Recipe, RecipeError
from runner.summary import busiest_peak, trained_bytes
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


@dataclass
class Outcome:
    """How a run ended."""

    run_id: int
    status: str
    exit_code: int | None
    error: str | None
    summary: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------- pre-flight


def preflight(recipe: Recipe) -> list[str]:
    """Check what can be checked before launch; raise :class:`PreflightError`, return warnings."""
    from runner.data import DataError, check_source

    warnings: list[str] = []
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
    strategy = strategies.get(recipe.launch.strategy)
    problem = strategy.nproc_problem(recipe.launch.nproc, on_cpu=on_cpu)
    if problem:
        raise PreflightError(f"launch.nproc: {problem}")
    if on_cpu and strategy.layer_split:
        warnings.append("mp on a CPU-only machine: one device, so this is the single-process run")
    return warnings


def runs_on_cpu(recipe: Recipe) -> bool:
    """Whether the ranks will train on CPU (no CUDA device visible, or the recipe asks for CPU)."""
    if recipe.launch.device == "cpu":
        return True
    if recipe.launch.device == "cuda":
        return False
    return cuda_device_count() == 0


def cuda_device_count() -> int:
    """GPUs the trainer will see, through NVML (no torch import: ``ftui run`` stays fast)."""
    from runner.hardware import NvmlBackend

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    count = NvmlBackend().device_count()
    if visible is not None:
        return min(count, len([v for v in visible.split(",") if v.strip()]))
    return count


def free_port() -> int:
    """A TCP port free right now on this host, for the rendezvous of one run."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cpu_threads(recipe: Recipe) -> int | None:
    """Threads per rank on CPU: the physical cores shared out (accelerate defaults to 1)."""
    if not runs_on_cpu(recipe):
        return None
    import psutil

    cores = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    return max(1, cores // recipe.launch.nproc)


# ---------------------------------------------------------------------- preparing and starting


def prepare(
    store: Store | None,
    recipe: Recipe,
    source: str | None = None,
    sweep_id: str | None = None,
    root: Path | None = None,
) -> Prepared:
    """Record the run (unless ``store`` is None: a dry run) and write its folder; start nothing."""
    root = root or runs_dir()
    run_id: int | None = None
    if store is not None:
        run_id = store.create_run(
            name=recipe.name,
            recipe_text=recipe.to_toml(),
            recipe_hash=recipe.digest(),
            recipe_source=source,
            strategy=recipe.launch.strategy,
            nproc=recipe.launch.nproc,
            method=recipe.method.type,
            model=recipe.model.name,
            run_dir="",
            sweep_id=sweep_id,
        )
        run_dir = root / f"{run_id:05d}-{_slug(recipe.name)}"
    else:
        run_dir = root / f"dry-run-{datetime.now():%Y%m%d-%H%M%S}-{os.getpid()}"
    run_dir = run_dir.resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    spec = build_launch(recipe, run_dir, port=free_port(), cpu_threads=cpu_threads(recipe))
    for name, text in spec.files.items():
        (run_dir / name).write_text(text)
    (run_dir / ev.LAUNCH_FILE).write_text(json.dumps(spec.to_json(), indent=2) + "\n")
    if store is not None and run_id is not None:
        store.update_run(run_id, run_dir=str(run_dir), summary={"estimate": estimate_summary(recipe)})
    return Prepared(run_id=run_id, run_dir=run_dir, spec=spec, recipe=recipe)


def estimate_summary(recipe: Recipe) -> dict[str, Any]:
    """The memory estimate of one device of this run (``runner.planner``), stored in the run's summary
    at prepare time so that ``ftui show`` can set it against the measured bytes. Never fails a run:
    a model whose shape cannot be had offline gets ``{"error": ...}``."""
    from runner.planner import breakdown_json, estimate, inputs_from_recipe, resolve_model_shape

    try:
        source = resolve_model_shape(recipe.model.name, allow_network=False)
        inp = inputs_from_recipe(recipe, shape=source.shape)
        if runs_on_cpu(recipe):
            from dataclasses import replace

            inp = replace(inp, device="cpu")
            if strategies.get(inp.strategy).layer_split:
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
    """Start the launch in its own session (process group). The only place ftui spawns a run."""
    log = open(prepared.run_dir / ev.LAUNCHER_LOG, "ab")  # noqa: SIM115 (the child keeps it)
    try:
        return subprocess.Popen(
            prepared.spec.argv,
            env={**os.environ, **prepared.spec.env},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=prepared.run_dir,
            start_new_session=True,
        )
    finally:
        log.close()


def signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to a run's process group; False when the group is gone."""
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def stop_group(pgid: int, proc: subprocess.Popen[bytes] | None = None, grace: float = 15.0) -> None:
    """SIGTERM every process of the run (ranks stop together after their current step), then
    SIGKILL what is left after ``grace`` seconds."""
    signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            break
        if proc is None and not _group_alive(pgid):
            break
        time.sleep(0.1)
    signal_group(pgid, signal.SIGKILL)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


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
        self.start: dict[str, Any] | None = None
        self.end: dict[str, Any] | None = None
        self.error: str | None = None
        self.mismatch: str | None = None
        self.first_step_time: float | None = None
        self.last_step_time: float | None = None

    def poll(self) -> None:
        for event in self.reader.read_new():
            self.pending.append(event)
            kind = event["type"]
            if kind == "start":
                self.start = event
                self._on_start(event)
            elif kind == "step":
                self.first_step_time = self.first_step_time or event["time"] - (event.get("step_time") or 0.0)
                self.last_step_time = event["time"]
            elif kind == "end":
                self.end = event
            elif kind == "error":
                self.error = event.get("message")
            if self.on_event is not None:
                self.on_event(event)
        urgent = any(e["type"] != "step" for e in self.pending)
        if self.pending and (urgent or time.monotonic() - self.last_flush >= self.FLUSH_S):
            self.flush()

    def flush(self) -> None:
        self.store.ingest(self.run_id, self.pending)
        self.pending = []
        self.last_flush = time.monotonic()

    def _on_start(self, event: dict[str, Any]) -> None:
        strategy = strategies.get(self.prepared.recipe.launch.strategy)
        in_effect = event.get("distributed_type")
        self.store.update_run(
            self.run_id,
            distributed_type=in_effect,
            device_type=event.get("device_type"),
            total_steps=event.get("total_steps"),
            summary={k: event.get(k) for k in ("params", "trainable_params", "local_param_numel", "world_size",
                                                 "tokens_per_step", "mixed_precision", "device_map", "pids")},
        )
        if in_effect not in strategy.expect:
            self.mismatch = (
                f"launch.strategy: asked for {strategy.name} ({' or '.join(sorted(strategy.expect))}) but "
                f"accelerate ran {in_effect}; the run was stopped"
            )


def execute(
    store: Store,
    prepared: Prepared,
    on_event: EventCallback | None = None,
    stop: threading.Event | None = None,
    poll_s: float = 0.25,
    probe: Any | None = None,
    sample_interval_s: float = 0.5,
    hang_after_s: float = 300.0,
) -> Outcome:
    """Start a prepared run and follow it to the end, writing everything to the store.

    Args:
        store: the store (this function is the run's only writer: samples from the telemetry
            thread are queued and written here, in batches).
        prepared: from :func:`prepare`.
        on_event: called with every journal event as it arrives (progress bars), and with the
            orchestrator's own ``hang`` events.
        stop: set it to stop the run gracefully (what Ctrl-C does for ``ftui run``).
        poll_s: how often the journal is read.
        probe: the telemetry probe (:class:`runner.hardware.Probe`); default: NVML + psutil.
        sample_interval_s: seconds between telemetry readings; 0 turns telemetry off.
        hang_after_s: flag a hang when no step came for this long and a device is idle.

    Returns:
        The outcome; the run's row holds the same status, exit code, error and summary.
    """
    assert prepared.run_id is not None, "a dry run cannot be executed"
    run_id = prepared.run_id
    proc = spawn(prepared)
    pgid = proc.pid  # start_new_session: the launcher leads its own group
    launched = time.time()
    store.update_run(run_id, status="running", started_at=_utcnow(), pgid=pgid,
                     summary={"orchestrator_pid": os.getpid()})
    store.add_event(run_id, "launch", launched, {"argv": prepared.spec.argv, "pgid": pgid})
    watch = _Watch(store, prepared, on_event)
    telemetry = _Telemetry(store, prepared, probe, sample_interval_s, hang_after_s, launched)
    stopped_by_user = False
    try:
        while True:
            watch.poll()
            telemetry.poll(watch)
            if watch.mismatch:
                stop_group(pgid, proc, grace=5.0)
                break
            if stop is not None and stop.is_set() and not stopped_by_user:
                stopped_by_user = True
                threading.Thread(target=stop_group, args=(pgid, proc), daemon=True).start()
            if proc.poll() is not None:
                break
            time.sleep(poll_s)
    except KeyboardInterrupt:
        stopped_by_user = True
        stop_group(pgid, proc)
    exit_code = proc.wait()
    # The launcher can exit before its ranks (a SIGTERM to the group kills accelerate's launcher at
    # once while each rank finishes its step and journals "stopped"): let the group drain first.
    deadline = time.monotonic() + 20.0
    while _group_alive(pgid) and time.monotonic() < deadline:
        watch.poll()
        time.sleep(poll_s)
    signal_group(pgid, signal.SIGKILL)
    telemetry.close()
    watch.poll()
    watch.flush()
    return _finish(store, watch, exit_code, stopped_by_user)


class _Telemetry:
    """The sampler of one run, its queue to the writer (this thread) and the hang detector."""

    def __init__(self, store: Store, prepared: Prepared, probe: Any | None, interval_s: float,
                 hang_after_s: float, launched: float) -> None:
        from collections import deque
        from queue import SimpleQueue

        self.store = store
        self.run_id = prepared.run_id
        self.run_dir = prepared.run_dir
        self.queue: SimpleQueue[tuple[list[Any], list[Any]]] = SimpleQueue()
        self.recent: deque[Any] = deque(maxlen=2000)
        self.sampler = None
        self.last_write = 0.0
        self.last_hang_check = 0.0
        if interval_s <= 0:
            return
        from runner.hardware import Probe
        from runner.telemetry import HangDetector, Sampler

        self.hang = HangDetector(hang_after_s=hang_after_s, window_s=min(30.0, hang_after_s), started_at=launched)
        self.sampler = Sampler(
            probe if probe is not None else Probe(),
            lambda: ev.read_rank_pids(self.run_dir),
            lambda samples, procs: self.queue.put((samples, procs)),
            interval_s=interval_s,
            flush_every_s=1.0,
        )
        self.sampler.start()

    def poll(self, watch: _Watch) -> None:
        if self.sampler is None:
            return
        now = time.time()
        self._write()
        if now - self.last_hang_check >= 1.0 and watch.end is None:
            self.last_hang_check = now
            event = self.hang.check(now, watch.last_step_time, self.recent)
            if event is not None:
                assert self.run_id is not None
                self.store.add_event(self.run_id, "hang", now, event)
                if watch.on_event is not None:
                    watch.on_event({"type": "hang", **event})

    def _write(self) -> None:
        samples: list[Any] = []
        procs: list[Any] = []
        while not self.queue.empty():
            more, more_procs = self.queue.get()
            samples.extend(more)
            procs.extend(more_procs)
        if (samples or procs) and self.run_id is not None:
            self.store.add_samples(self.run_id, samples, procs)
            self.recent.extend(samples)

    def close(self) -> None:
        if self.sampler is None:
            return
        self.sampler.stop()
        self._write()


def _finish(store: Store, watch: _Watch, exit_code: int, stopped_by_user: bool) -> Outcome:
    end = watch.end or {}
    error: str | None = None
    if watch.mismatch:
        status, error = "failed", watch.mismatch
    elif stopped_by_user or end.get("status") == "stopped":
        status = "stopped"
    elif exit_code == 0 and end.get("status") == "completed":
        status = "completed"
    else:
        status = "failed"
        error = watch.error or _error_from_logs(watch.prepared.run_dir) or f"launcher exited with code {exit_code}"
    summary: dict[str, Any] = {}
    columns: dict[str, Any] = {}
    if end:
        ranks = end.get("ranks") or []
        summary = {
            "train_seconds": end.get("train_seconds"),
            "tokens_per_s": end.get("tokens_per_s"),
            "final_loss": end.get("final_loss"),
            "tokens": end.get("tokens"),
            "steps": end.get("steps"),
            "ranks": ranks,
            "saved": end.get("saved"),
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
    telemetry = _telemetry_summary(store, watch)
    if telemetry is not None:
        summary["telemetry"] = telemetry
        overall = telemetry.get("active") or telemetry.get("whole") or {}
        columns["mean_util"] = overall.get("util_mean")
    store.update_run(
        watch.run_id,
        status=status,
        ended_at=_utcnow(),
        exit_code=exit_code,
        error=error,
        summary=summary,
        **columns,
    )
    store.add_event(watch.run_id, "exit", time.time(), {"exit_code": exit_code, "status": status})
    return Outcome(run_id=watch.run_id, status=status, exit_code=exit_code, error=error, summary=summary)


def _telemetry_summary(store: Store, watch: _Watch) -> dict[str, Any] | None:
    """Per-device and overall utilisation of the run (definitions: :func:`runner.telemetry.summarise`);
    the active window runs from the start of the first step to the end of the last."""
    samples = store.samples(watch.run_id)
    if not samples:
        return None
    from runner.telemetry import summarise

    window = None
    if watch.first_step_time is not None and watch.last_step_time is not None:
        window = (watch.first_step_time, watch.last_step_time)
    result = summarise(samples, window)
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


def _slug(name: str) -> str:
    keep = "".join(c if c.isalnum() or c in "-_" else "-" for c in name.strip())
    return keep.strip("-")[:40] or "run"


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
    independent measurement (:func:`runner.summary.trained_bytes`: CUDA peak allocated on GPU, the
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
    store.add_event(last, "batch_size_found", time.time(), result)
    store.update_run(last, summary={"find_batch": result})
    return result


# ---------------------------------------------------------------------- detached runs


def load_prepared(run_id: int, run_dir: Path) -> Prepared:
    """A prepared run read back from its folder (recipe.toml and launch.json)."""
    from runner.recipe import load_recipe

    launch = json.loads((run_dir / ev.LAUNCH_FILE).read_text())
    spec = LaunchSpec(argv=launch["argv"], env=launch["env"], accelerate_config=launch["accelerate_config"])
    return Prepared(run_id=run_id, run_dir=run_dir, spec=spec, recipe=load_recipe(run_dir / ev.RECIPE_FILE))


def start_detached(db_url: str, prepared: Prepared, fake_gpus: int = 0) -> subprocess.Popen[bytes]:
    """Follow a prepared run from a background orchestrator in a session of its own, so that the
    run and its recording outlive the caller (the TUI). Stop it with SIGTERM to that process, or
    to the run's process group (``pgid`` in the store)."""
    import sys

    assert prepared.run_id is not None
    argv = [sys.executable, "-m", "runner.orchestrator", "--db", db_url, "--run-id", str(prepared.run_id),
            "--fake-gpus", str(fake_gpus)]
    log = open(prepared.run_dir / "orchestrator.log", "ab")  # noqa: SIM115
    try:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                cwd=prepared.run_dir, start_new_session=True)
    finally:
        log.close()


def probe_for(fake_gpus: int = 0) -> Any:
    """The telemetry probe: real NVML + psutil, or ``fake_gpus`` scripted GPUs (demo mode)."""
    from runner.hardware import Probe

    return Probe.fake(fake_gpus) if fake_gpus else Probe()


def main(argv: list[str] | None = None) -> int:
    """``python -m runner.orchestrator --db URL --run-id N``: follow a prepared run to its end."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m runner.orchestrator")
    parser.add_argument("--db", required=True)
    parser.add_argument("--run-id", type=int, required=True)
    parser.add_argument("--fake-gpus", type=int, default=0)
    args = parser.parse_args(argv)
    store = Store(args.db)
    run = store.get_run(args.run_id)
    if run is None:
        print(f"run {args.run_id}: no such run in {args.db}")
        return 2
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    outcome = execute(store, load_prepared(run.id, Path(run.run_dir)), stop=stop, probe=probe_for(args.fake_gpus))
    return 0 if outcome.status == "completed" else 1


if __name__ == "__main__":
    raise SystemExit(main())
