"""Report metrics from your own training script to ftui: ``from runner import track``.

    from runner import track

    track.start(accelerator)                       # optional: what accelerate has in effect, checked
    for step, batch in enumerate(loader, 1):
        ...
        track.log({"loss": loss.item(), "lr": lr}, step=step)

Under ``ftui run --script`` (the run folder is in ``FTUI_RUN_DIR``, set by ftui), rank 0 appends each
call to the run's journal, ``RUN/events.jsonl``, as the events ftui's own trainer writes, so a script
run fills the same store columns and compares against recipe runs in one table. Anywhere else (no
``FTUI_RUN_DIR``, or a rank other than 0) every function does nothing and costs one attribute check.

This module imports neither torch nor anything of ftui's front end; it reads an Accelerator (or
accelerate's process state) only when the script already imported accelerate.

What is written:

* ``start`` (:func:`start`, or by the first :func:`log`): ``distributed_type`` (accelerate's
  ``DistributedType`` in effect; ``None`` when it cannot be read: "not reported", never guessed),
  ``world_size``, ``device_type``, ``mixed_precision``, ``params``/``trainable_params`` when a model is
  given, ``total_steps`` when given. ftui fails the run when the distributed type is not one the
  asked strategy allows (``runner/spec/strategies.py`` ``expect``), as for recipe runs.
* ``step`` (:func:`log`): ``loss``, ``lr`` (or ``learning_rate``), ``grad_norm``, ``tokens`` (cumulative,
  over all ranks), ``epoch`` go to the store's metric columns; ``step_time`` and ``tokens_per_s`` are
  measured here between consecutive calls. Every other numeric key is a named metric (a ``metrics``
  event, ``runner.spec.events.MetricsEvent``: the store's ``named_metrics``, ``docs/metrics.md``).
* ``metrics`` (:func:`log_eval`): evaluation figures at a step, named ``eval/<name>``.
* ``end`` (written once, by ``runner.rank.script_run`` when the script exits): the status and the figures
  measured here (``train_seconds`` from :func:`start`, or the first :func:`log`, to the last call).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from runner.spec.events import EVENTS_FILE, METRIC_NAME_MAX, JournalWriter, metrics_event
from runner.spec.flops import dims_from_config

RUN_ENV = "FTUI_RUN_DIR"
"""Set by ftui in every process of a run (``runner.watch.procs.RUN_ENV``): the run folder."""

STEP_KEYS = {"loss", "lr", "learning_rate", "grad_norm", "tokens", "epoch", "step"}
"""Keys of :func:`log` that fill the store's metric columns; the rest go under ``metrics``."""


class _Tracker:
    """The state of the client in this process (one per process: :data:`_TRACKER`)."""

    def __init__(self) -> None:
        run_dir = os.environ.get(RUN_ENV)
        rank = int(os.environ.get("RANK", "0") or 0)
        self.run_dir = Path(run_dir) if run_dir else None
        self.enabled = self.run_dir is not None and rank == 0
        self._writer: Any = None
        self.started = False
        self.ended = False
        self.t_begin: float | None = None
        """Start of the measured training window (:func:`start`, or the first log)."""
        self.t_done: float | None = None
        """End of it: :func:`training_done`, else the last step logged."""
        self.tokens_begin = 0
        self.last_time: float | None = None
        self.last_step = 0
        self.last_tokens: int | None = None
        self.final_loss: float | None = None
        self.tokens: int | None = None
        self.summary: dict[str, Any] = {}

    def writer(self) -> Any:
        if self._writer is None:
            assert self.run_dir is not None
            self._writer = JournalWriter(self.run_dir / EVENTS_FILE)
        return self._writer

    def emit(self, type_: str, **payload: Any) -> None:
        self.writer().emit(type_, **payload)


_TRACKER = _Tracker()


def enabled() -> bool:
    """Whether calls are journaled: under ``ftui run`` (``FTUI_RUN_DIR`` set) and on rank 0."""
    return _TRACKER.enabled


def under_ftui() -> bool:
    """Whether this process is part of a run ftui launched (``FTUI_RUN_DIR`` set), whatever its rank.
    Anything that changes what a rank computes (the Trainer's token count is a collective) must
    follow this, never :func:`enabled`, so that every rank does the same."""
    return _TRACKER.run_dir is not None


def _reset() -> None:
    """Read the environment again (tests; a script that sets ``FTUI_RUN_DIR`` itself)."""
    global _TRACKER
    _TRACKER = _Tracker()


def distributed_type(accelerator: Any = None) -> str | None:
    """accelerate's ``DistributedType`` in effect, as text (``NO``, ``MULTI_CPU``, ``MULTI_GPU``,
    ``FSDP``, ...): from ``accelerator``, else from accelerate's process state when the script has
    initialised it; None when neither can be read (then ftui says "not reported")."""
    if accelerator is not None:
        value = getattr(getattr(accelerator, "distributed_type", None), "value", None)
        return str(value) if value is not None else None
    if "accelerate" not in sys.modules:
        return None
    try:
        from accelerate.state import PartialState

        if not PartialState._shared_state:  # not initialised: reading it would initialise it
            return None
        return str(PartialState().distributed_type.value)
    except Exception:  # noqa: BLE001 (an accelerate without this state: not reported)
        return None


def _count_params(model: Any) -> tuple[int, int] | None:
    try:
        total = trainable = 0
        for p in model.parameters():
            n = int(p.numel())
            total += n
            trainable += n if p.requires_grad else 0
        return total, trainable
    except Exception:  # noqa: BLE001 (not a torch module: not reported)
        return None


def start(
    accelerator: Any = None,
    *,
    model: Any = None,
    total_steps: int | None = None,
    distributed: str | None = None,
    world_size: int | None = None,
    device_type: str | None = None,
    mixed_precision: str | None = None,
    context_length: int | None = None,
    reporter: str = "runner.track",
) -> None:
    """Report what is in effect as training starts (once; later calls do nothing).

    Args:
        accelerator: the script's ``accelerate.Accelerator``: its distributed type, process count,
            device and mixed precision are reported. Without it, accelerate's process state is read
            when the script initialised one.
        model: the model, to report its parameter counts (all and trainable).
        total_steps: optimizer steps the script will run, for ftui's progress and ETA.
        distributed: the distributed type, when the caller read it itself (the Trainer callback).
        world_size: processes; default the accelerator's, else ``WORLD_SIZE`` of the launch, else 1.
        device_type: ``cpu``, ``cuda``...; default the accelerator's device type.
        mixed_precision: ``no``, ``bf16``, ``fp16``; default the accelerator's.
        context_length: tokens per sequence; with a model that has a transformers config, the
            dimensions MFU needs are reported (``model_dims``), else compare shows MFU as '-'.
        reporter: what reported (shown by ``ftui show``).
    """
    t = _TRACKER
    if not t.enabled or t.started:
        return
    t.started = True
    now = time.time()
    t.t_begin = t.last_time = now
    kind = distributed if distributed is not None else distributed_type(accelerator)
    if world_size is None:
        world_size = getattr(accelerator, "num_processes", None) or int(os.environ.get("WORLD_SIZE", "1") or 1)
    if device_type is None and accelerator is not None:
        device_type = getattr(getattr(accelerator, "device", None), "type", None)
    if mixed_precision is None and accelerator is not None:
        mixed_precision = getattr(accelerator, "mixed_precision", None)
    counts = _count_params(model) if model is not None else None
    threads = None
    if "torch" in sys.modules:
        threads = int(sys.modules["torch"].get_num_threads())
    payload: dict[str, Any] = {
        "world_size": int(world_size),
        "distributed_type": kind,
        "device_type": device_type,
        "mixed_precision": mixed_precision,
        "threads": threads,
        "total_steps": total_steps,
        "pids": [os.getpid()],
        "start_step": 0,
        "reporter": reporter,
    }
    if counts is not None:
        payload["params"], payload["trainable_params"] = counts
    config = getattr(getattr(model, "module", model), "config", None)  # DDP wraps the model
    if config is not None and context_length:
        payload["model_dims"] = dims_from_config(config, int(context_length))
    t.emit("start", **payload)


def log(metrics: Mapping[str, Any], step: int | None = None) -> None:
    """Report one optimizer step's figures (rank 0 under ftui; otherwise nothing).

    Args:
        metrics: ``loss``, ``lr`` (or ``learning_rate``), ``grad_norm``, ``tokens`` (cumulative over all
            ranks), ``epoch``; any other number is a named metric of that step (its name as given).
        step: the global step, 1-based; default the previous step + 1. One step event per step: a
            second call for the same step is written as evaluation figures (:func:`log_eval`).
    """
    t = _TRACKER
    if not t.enabled:
        return
    if not t.started:
        start()
        t.t_begin = t.last_time = None  # no start() before the loop: the window opens at this first log
    now = time.time()
    step = int(step) if step is not None else t.last_step + 1
    if step <= t.last_step:
        log_eval(metrics, step=step)
        return
    loss = _number(metrics.get("loss"))
    lr = _number(metrics.get("lr", metrics.get("learning_rate")))
    tokens_raw = metrics.get("tokens")
    tokens = int(tokens_raw) if isinstance(tokens_raw, int | float) and not isinstance(tokens_raw, bool) else None
    step_time = tokens_per_s = None
    if t.last_time is not None and now > t.last_time:
        step_time = (now - t.last_time) / max(1, step - t.last_step)
        if tokens is not None and t.last_tokens is not None:
            tokens_per_s = (tokens - t.last_tokens) / (now - t.last_time)
    if t.t_begin is None:
        t.t_begin = now
        t.tokens_begin = tokens or 0
    elif t.last_tokens is None and tokens is not None and t.last_time is not None:
        tokens_per_s = tokens / (now - t.last_time) if now > t.last_time else None
    extra = {k: v for k, v in metrics.items() if k not in STEP_KEYS and _number(v) is not None}
    payload: dict[str, Any] = {
        "step": step,
        "epoch": _number(metrics.get("epoch")),
        "loss": loss,
        "lr": lr,
        "grad_norm": _number(metrics.get("grad_norm")),
        "tokens": tokens,
        "step_time": step_time,
        "tokens_per_s": tokens_per_s,
    }
    t.emit("step", **payload)
    if extra:
        _named(step, extra)
    t.last_time = now
    t.last_step = step
    if tokens is not None:
        t.last_tokens = t.tokens = tokens
    if loss is not None:
        t.final_loss = loss


def log_eval(metrics: Mapping[str, Any], step: int | None = None) -> None:
    """Report evaluation figures at ``step`` (default the last step logged) as named metrics
    ``eval/<name>`` (``eval_loss`` and ``loss`` both become ``eval/loss``)."""
    t = _TRACKER
    if not t.enabled:
        return
    values = {_eval_name(k): v for k, v in metrics.items() if _number(v) is not None}
    if values:
        _named(int(step) if step is not None else t.last_step, values)


def _eval_name(name: str) -> str:
    """``eval_loss`` (the Trainer's) or ``loss`` -> ``eval/loss``; a name with a ``/`` is kept."""
    if "/" in name:
        return name
    return "eval/" + name.removeprefix("eval_")


def _named(step: int, values: Mapping[str, Any]) -> None:
    """One ``metrics`` event (``runner.spec.events.MetricsEvent``: the store's named metrics) at ``step``;
    a name the store cannot keep (empty, over 200 characters) is left out rather than failing the script."""
    keep = {str(k): _number(v) for k, v in values.items()
            if isinstance(k, str) and k.strip() and len(k) <= METRIC_NAME_MAX}
    if keep:
        _TRACKER.writer().write(metrics_event(step, keep))


def training_done(**summary: Any) -> None:
    """Close the measured training window now (the Trainer callback, at ``on_train_end``); ``summary``
    (numbers such as the Trainer's ``train_runtime``) is kept in the end event under ``reported``."""
    t = _TRACKER
    if not t.enabled:
        return
    t.t_done = time.time()
    t.summary.update({k: v for k, v in summary.items() if _number(v) is not None})


def error(message: str) -> None:
    """Report why the script failed (one line); ``runner.rank.script_run`` calls it for an exception."""
    t = _TRACKER
    if t.enabled:
        t.emit("error", message=" ".join(message.split())[:2000], rank=0)


def finish(status: str = "completed") -> None:
    """Write the ``end`` event (once): ``runner.rank.script_run`` calls it when the script exits."""
    t = _TRACKER
    if not t.enabled or t.ended:
        return
    t.ended = True
    done = t.t_done if t.t_done is not None else t.last_time
    seconds = done - t.t_begin if done is not None and t.t_begin is not None and t.last_step else None
    run_tokens = (t.tokens - t.tokens_begin) if t.tokens is not None else None
    t.emit(
        "end",
        status=status,
        steps=t.last_step or None,
        train_seconds=seconds,
        tokens=t.tokens,
        tokens_per_s=run_tokens / seconds if run_tokens and seconds else None,
        final_loss=t.final_loss,
        saved=None,
        ranks=[],
        skipped=0,
        checkpoint=None,
        **({"reported": t.summary} if t.summary else {}),
    )
    t.writer().close()


def _number(value: Any) -> float | None:
    """A float for ints and floats (tensors of one element too), None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    item = getattr(value, "item", None)
    if callable(item):
        try:
            out = item()
        except Exception:  # noqa: BLE001 (a tensor of several elements: not a number)
            return None
        return float(out) if isinstance(out, int | float) and not isinstance(out, bool) else None
    return None
