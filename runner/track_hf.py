"""Hugging Face Trainer and TRL runs reported to ftui: one line in the script,

    trainer = Trainer(..., callbacks=[FtuiCallback()])      # or SFTTrainer(..., callbacks=[...])

and the run fills the columns a recipe run does (loss, lr, grad norm, tokens, tokens/s, train time,
final loss, parameters) and carries the distributed type the Trainer really ran with, which ftui checks
against the strategy asked for. Under ``ftui run --script`` it journals through :mod:`runner.track`
(rank 0); anywhere else it does nothing.

What it reads, and when:

* ``on_init_end``: turns on the Trainer's token count (``include_num_input_tokens_seen =
  "non_padding"``, real tokens over all ranks, as ftui's trainer counts them) unless the script chose a
  mode, or ``count_tokens=False``. That count gathers one number per micro-batch across ranks.
* ``on_train_begin``: ``start``: accelerate's ``DistributedType`` from the Trainer's process state
  (``args.distributed_state``), ``args.world_size``, the device type, mixed precision (``bf16``/``fp16``
  flags), ``state.max_steps`` and the model's parameter counts.
* ``on_log``: a training log (``loss`` in it) is a ``step`` (``learning_rate`` -> lr, ``grad_norm``,
  ``epoch``, ``state.num_input_tokens_seen`` -> tokens; other keys: named metrics ``train/<key>``);
  ``eval_*`` logs are named metrics ``eval/<name>``; the final summary (``train_runtime``...) is kept
  for the end event.
* ``on_train_end``: closes the measured training window.
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from runner import track


class FtuiCallback(TrainerCallback):
    """Reports a ``transformers.Trainer`` (or TRL trainer) run to ftui; see the module docstring.

    Args:
        count_tokens: turn on the Trainer's non-padding token count when the script left it off.
        context_length: tokens per sequence, for MFU (default: TRL's ``max_length`` when set).
    """

    def __init__(self, count_tokens: bool = True, context_length: int | None = None) -> None:
        self.count_tokens = count_tokens
        self.context_length = context_length

    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # Every rank alike (track.under_ftui, not track.enabled): the count is a gather across ranks.
        if track.under_ftui() and self.count_tokens and args.include_num_input_tokens_seen in ("no", False):
            args.include_num_input_tokens_seen = "non_padding"

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if not track.enabled():
            return
        dist_state = getattr(args, "distributed_state", None)
        kind = getattr(getattr(dist_state, "distributed_type", None), "value", None)
        device = getattr(args, "device", None)
        precision = "bf16" if getattr(args, "bf16", False) else "fp16" if getattr(args, "fp16", False) else "no"
        track.start(
            model=model,
            total_steps=int(state.max_steps) if getattr(state, "max_steps", 0) else None,
            distributed=str(kind) if kind is not None else track.distributed_type(),
            world_size=int(getattr(args, "world_size", 1) or 1),
            device_type=getattr(device, "type", None),
            mixed_precision=precision,
            context_length=self.context_length or getattr(args, "max_length", None),
            reporter="runner.track_hf.FtuiCallback",
        )

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
               **kwargs: Any) -> None:
        if not track.enabled() or not logs:
            return
        step = int(state.global_step)
        if "loss" in logs:
            tokens = getattr(state, "num_input_tokens_seen", 0) or None
            # Standard keys fill the step's columns; the rest are named metrics train/<key>.
            metrics = {k if k in track.STEP_KEYS else f"train/{k.removeprefix('train_')}": v for k, v in logs.items()
                       if k not in ("learning_rate", "num_input_tokens_seen")}
            metrics["lr"] = logs.get("learning_rate")
            metrics["tokens"] = tokens
            track.log(metrics, step=step)
        elif any(k.startswith("eval_") for k in logs):
            track.log_eval({k: v for k, v in logs.items() if k.startswith("eval_")}, step=step)
        else:  # the Trainer's closing summary: train_runtime, train_loss, ...
            track.training_done(**logs)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if track.enabled() and track._TRACKER.t_done is None:
            track.training_done()
