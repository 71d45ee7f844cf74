"""The end of a watched run: which status and reason it ended with (:func:`finish`), and what of it the
store keeps (:func:`project_end`: the end event's figures, the telemetry summary, the MFU peak)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from runner.analysis import cpu_peak, ledger
from runner.analysis.utilisation import summarise
from runner.hardware.disks import no_space
from runner.spec import checkpoint as ckpt
from runner.spec import events as ev
from runner.spec.events import ENERGY_COUNTER
from runner.spec.run_record import from_epoch
from runner.spec.status import ENDED_BY_USER, ended_words
from runner.spec.summary import busiest_peak
from runner.watch.crash import describe
from runner.watch.stream import Recorder, RunStream, quietly, store_problem
from store import Store
from store.store import utcnow


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
    notes: list[str] = field(default_factory=list)
    """What of the run could not be recorded (a full disk under the run folder or the database), one line each."""


@dataclass(frozen=True)
class Ending:
    """What the watch saw at the end, for :func:`finish`."""

    exit_code: int | None
    stopped_by_user: bool = False
    killed_by_user: bool = False
    forced_error: str | None = None
    """A reason the watcher stopped the run for (a hang, a rank that vanished, its own fault)."""
    vanished: list[tuple[int, int]] | None = None
    recent: list[Any] | None = None
    """The last telemetry readings (which rank was killed, by what)."""
    launcher_pid: int | None = None
    """The launcher's pid (one process: the rank's too), to name the signal that ended it."""
    sigkilled: str | None = None
    """Why a stop SIGKILLed processes of the run, when it did (a second Ctrl-C, the grace ran out)."""
    unrecorded: tuple[str, ...] = ()
    """What the run folder did not take by the end (its disk full), one line each."""


def end_status(stream: RunStream, ending: Ending) -> tuple[str, str | None]:
    """The run's status and reason, from what the watch saw."""
    ended = stream.end.get("status") if stream.end is not None else None
    if stream.mismatch:
        return "failed", stream.mismatch
    if ending.forced_error is not None:
        return "failed", ending.forced_error
    if ending.killed_by_user:
        return "killed", "killed by user"
    if ending.stopped_by_user and ended is None and ending.sigkilled is not None:
        # the ranks never journaled their end: whatever they were saving was cut off
        return "killed", f"stopped, but SIGKILLed before the ranks ended ({ending.sigkilled})"
    if ending.stopped_by_user or ended == "stopped":
        return "stopped", None
    exit_code = ending.exit_code
    if exit_code in (0, None) and (ended == "completed" or (
            stream.prepared.node is not None and stream.start is None and exit_code == 0)):
        # (a node without rank 0 has no trainer journal: its launcher's exit code says how it ended)
        return "completed", None
    run_dir = stream.prepared.run_dir
    launcher = (ending.launcher_pid, exit_code) if ending.launcher_pid is not None else None
    error = (describe(run_dir, ending.vanished, ending.recent, stream.error, launcher)
             or stream.error or error_from_logs(run_dir)
             or (f"launcher exited with code {exit_code}" if exit_code is not None else
                 f"watcher and ranks gone; last step {stream.last_step or 0}"))
    if exit_code == ev.EXIT_NO_SPACE and "no space left" not in error:  # one process: the rank is the launcher
        error = f"{error}: {no_space(run_dir)}"
    return "failed", error


def finish(store: Store, stream: RunStream, ending: Ending, recorder: Recorder | None = None) -> Outcome:
    """Decide how the run ended and record it: the journal first (should the store fail now, recover
    reads the status from there), then the store."""
    status, error = end_status(stream, ending)
    exit_code = ending.exit_code
    record = quietly(recorder.emit, "exit", exit_code=exit_code, status=status, error=error) if recorder else None
    ended = from_epoch(record["time"]) if record is not None else None  # the journal's time, as a rebuild reads it
    node = stream.prepared.node
    if node is None:
        return stored_end(store, stream, status, exit_code, error, ending.unrecorded, ended_at=ended)
    # One machine of several (runner/nodes/agent.py): the node with the trainer's journal writes the figures;
    # the run's status is settled from every node's row once they all ended.
    outcome = (stored_end(store, stream, status, exit_code, error, ending.unrecorded, final=False)
               if stream.start is not None else Outcome(run_id=stream.run_id, status=status, exit_code=exit_code,
                                                        error=error, notes=list(ending.unrecorded)))
    settled = node.finish(status, error, exit_code)
    if settled is not None:
        outcome.status, outcome.error = settled.status, settled.error
    return outcome


def stored_end(store: Store, stream: RunStream, status: str, exit_code: int | None, error: str | None,
               unrecorded: tuple[str, ...] = (), final: bool = True, ended_at: datetime | None = None) -> Outcome:
    """:func:`project_end`, or (the store cannot take it: its disk full) the outcome with a note that says
    so; the journal has the end already, and recover records it."""
    try:
        outcome = project_end(store, stream, status, exit_code, error, final=final, ended_at=ended_at)
    except Exception as exc:  # noqa: BLE001
        outcome = Outcome(run_id=stream.run_id, status=status, exit_code=exit_code, error=error)
        outcome.notes.append(not_stored(store_problem(store, exc)))
    outcome.notes[:0] = unrecorded
    return outcome


def not_stored(problem: str) -> str:
    """The line that says the store missed the end of a run, and how it gets it."""
    return (f"the store was not written ({problem}); the run folder's journals hold the run: `ftui recover` "
            "records it once the database can be written")


def project_end(store: Store, stream: RunStream, status: str, exit_code: int | None, error: str | None,
                final: bool = True, ended_at: datetime | None = None) -> Outcome:
    """Write the end of a run (status, reason, figures of the end event, telemetry summary) to the store;
    ``final=False``: the figures only (one node of several: the run's status is settled from all).
    ``ended_at``: the time of the journal's ``exit`` event (default now)."""
    end = stream.end
    summary: dict[str, Any] = {}
    columns: dict[str, Any] = {}
    if end is not None:
        ranks = end.get("ranks") or []
        summary = {
            "train_seconds": end.get("train_seconds"),
            "tokens_per_s": end.get("tokens_per_s"),
            "window_tokens_per_s": end.get("window_tokens_per_s"),
            "steady_steps": end.get("steady_steps"),
            "steady_seconds": end.get("steady_seconds"),
            "steady_cpu_seconds": end.get("steady_cpu_seconds"),
            "final_loss": end.get("final_loss"),
            "tokens": end.get("tokens"),
            "steps": end.get("steps"),
            "ranks": ranks,
            "saved": end.get("saved"),
            "skipped": end.get("skipped"),
            "checkpoint": end.get("checkpoint"),
            "first_step_time": stream.first_step_time,
            "last_step_time": stream.last_step_time,
        }
        columns = {
            "train_seconds": end.get("train_seconds"),
            "tokens_per_s": end.get("tokens_per_s"),
            "final_loss": end.get("final_loss"),
            "steps_done": end.get("steps"),
            "peak_mem_bytes": busiest_peak(ranks)[0],
        }
    telemetry = quietly(telemetry_summary, store, stream)
    if telemetry is not None:
        summary["telemetry"] = telemetry
        overall = telemetry.get("active") or telemetry.get("whole") or {}
        columns["mean_util"] = overall.get("util_mean")
    if final:
        summary["ledger"] = quietly(ledger_summary, store, stream, telemetry, ended_at or utcnow())
    if status == "completed":  # the peak its MFU is measured against
        summary["mfu_peak"] = mfu_peak(stream, telemetry)
    if status in ENDED_BY_USER:
        summary["ended"] = quietly(ended_line, stream, status)
    if final:
        columns |= {"status": status, "ended_at": ended_at or utcnow(), "exit_code": exit_code, "error": error}
    store.update_run(stream.run_id, summary=summary, **columns)
    return Outcome(run_id=stream.run_id, status=status, exit_code=exit_code, error=error, summary=summary)


def ended_line(stream: RunStream, status: str) -> str:
    """What a stopped or killed run left (:func:`runner.spec.status.ended_words`): its last step and the
    newest checkpoint on disk that is complete (its manifest checked), the one a resume would take."""
    newest = ckpt.latest_complete(stream.prepared.run_dir)
    return ended_words(status, stream.last_step, ckpt.step_of(newest) if newest is not None else None,
                       str(newest) if newest is not None else None)


def mfu_peak(stream: RunStream, telemetry: dict[str, Any] | None) -> dict[str, Any] | None:
    """The peak FLOP/s of one device of the run (:func:`runner.analysis.cpu_peak.peak_for_run`: the GPU's
    datasheet, or on CPU the matmul probe its ranks took beside it), stored with it so that compare never
    benchmarks; None when unknown, ``{"error": ...}`` when the probe measured nothing. Never fails a run."""
    start, end = stream.start, stream.end
    device_type = start.get("device_type") if start is not None else None
    probe = end.get("peak_probe") if end is not None else None
    gpus = [d["name"] for d in ((telemetry or {}).get("devices") or {}).values() if d.get("kind") == "gpu"]
    try:
        peak = cpu_peak.peak_for_run(device_type, probe, stream.prepared.recipe.train.precision, gpus)
    except Exception as exc:  # noqa: BLE001 (a peak is informative only)
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}
    return peak.to_json() if peak is not None else None


def telemetry_summary(store: Store, stream: RunStream) -> dict[str, Any] | None:
    """Per-device and overall utilisation of the run (definitions: :func:`runner.analysis.utilisation.summarise`);
    the active window runs from the start of the first step to the end of the last."""
    samples = store.samples(stream.run_id)
    if not samples:
        return None
    window = None
    if stream.first_step_time is not None and stream.last_step_time is not None:
        window = (stream.first_step_time, stream.last_step_time)
    result = summarise(samples, window, threads=stream.start.get("threads") if stream.start is not None else None)
    plain: dict[str, Any] = json.loads(json.dumps(result))  # tuples -> lists, as stored
    # Each rank's own GPU memory (NVML's per-process figure, summed over the GPUs it touches in one
    # reading), peak over the run: what a rank really held, beside the device-wide peaks above.
    per_reading: dict[tuple[int, float], int] = {}
    for p in store.process_samples(stream.run_id):
        if p.rank is not None and p.used_bytes is not None:
            per_reading[(p.rank, p.time)] = per_reading.get((p.rank, p.time), 0) + p.used_bytes
    peaks: dict[str, int] = {}
    for (rank, _), used in per_reading.items():
        peaks[str(rank)] = max(peaks.get(str(rank), 0), used)
    if peaks:
        plain["rank_gpu_mem_peak"] = dict(sorted(peaks.items(), key=lambda kv: int(kv[0])))
    return plain


def ledger_summary(store: Store, stream: RunStream, telemetry: dict[str, Any] | None,
                   ended_at: datetime) -> dict[str, Any]:
    """The run's device-hours and energy (:func:`runner.analysis.ledger.account`) from the store's samples,
    the watcher's launch (the run's ``started_at``) to ``ended_at``, and its journaled RAPL readings."""
    run = store.get_run(stream.run_id)
    started = run.started_at if run is not None else None
    wall_s = (ended_at - started).total_seconds() if started is not None else None
    counters = [e.payload for e in store.events(stream.run_id, ENERGY_COUNTER)]
    result = ledger.account(store.samples(stream.run_id), wall_s, telemetry, counters,
                            stream.prepared.recipe.launch.nproc)
    return dict(result)


def error_from_logs(run_dir: Path) -> str | None:
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
