"""Pipeline stages in the estimate (``pp``, ``mp``): what each stage holds, from the split ftui runs
(:func:`runner.spec.layout.stage_bounds`, :mod:`runner.rank.pipeline`) and the schedule's micro-batches in
flight (:func:`runner.spec.layout.in_flight`). The estimate is made per stage and the largest is the
busiest device's (:func:`runner.planner.memory.estimate`).

- Weights: the stage's decoder layers; the first stage also holds the input embedding (and learned
  positions), the last the final norm and the head (a tied head is a second copy there: each stage keeps
  its own tensor).
- Activations: one micro-batch (``micro_batch / m`` rows) per layer of the stage, times the micro-batches in
  flight; only the first stage's first layer can save less (its input needs no gradient when the embedding
  is frozen), only the last stage keeps the head's part and the log-softmax of the loss.
- Receive buffers (``torch.distributed.pipelining`` ``PipelineStage``): one per micro-batch, allocated once,
  for the hidden state a stage receives (every stage but the first, with its gradient, kept until the next
  step) and for the gradient it receives back (every stage but the last).
- Kept outputs: the stage's output of each micro-batch in flight, kept to start its backward from (on the
  last stage the logits, which a whole model frees once the loss has saved its log-softmax).
"""

from __future__ import annotations

from dataclasses import dataclass

from runner.planner.activations import ActivationBytes
from runner.planner.inputs import EstimateInput
from runner.planner.shapes import ModelShape
from runner.spec.layout import in_flight, stage_bounds


@dataclass(frozen=True)
class Stage:
    """One pipeline stage as the estimate sees it.

    Attributes:
        index: 0-based.
        layers: Decoder layers it runs.
        first: It embeds the tokens.
        last: It runs the final norm, the head and the loss.
        rows: Rows of one micro-batch.
        microbatches: Micro-batches per step.
        in_flight: Micro-batches whose activations it holds at once.
    """

    index: int
    layers: int
    first: bool
    last: bool
    rows: int
    microbatches: int
    in_flight: int


def stages(inp: EstimateInput, devices: int) -> list[Stage]:
    """The stages of a layer-split run over ``devices`` (one process each; ``mp`` runs one micro-batch)."""
    n = max(1, min(devices, inp.shape.layers))
    m = max(1, inp.microbatches) if n > 1 else 1
    rows = max(1, inp.micro_batch // m)
    bounds = stage_bounds(inp.shape.layers, n)
    return [Stage(i, hi - lo, i == 0, i == n - 1, rows, m, in_flight(inp.pp_schedule, i, n, m))
            for i, (lo, hi) in enumerate(bounds)]


def stage_weights(sh: ModelShape, stage: Stage) -> int:
    """Weight elements the stage holds (see the module doc)."""
    if stage.first and stage.last:
        return sh.total_params
    vocab_matrix = sh.vocab * sh.hidden
    final_norm = max(0, sh.total_params - sh.embedding_params - sh.position_embedding_params
                     - sh.layers * sh.layer_params)
    held = stage.layers * sh.layer_params
    if stage.first:
        held += vocab_matrix + sh.position_embedding_params
    if stage.last:
        held += final_norm + (vocab_matrix if "lm_head" in sh.linears or sh.tied_embeddings else 0)
    return held


def stage_activations(acts: ActivationBytes, stage: Stage) -> int:
    """What one micro-batch leaves saved on the stage (``acts`` is one micro-batch's on the whole model)."""
    if stage.first and stage.last:
        return acts.stored
    layers = acts.first_layer + (stage.layers - 1) * acts.layer_stored if stage.first else \
        stage.layers * acts.layer_stored
    return acts.rotary + layers + (acts.post if stage.last else 0)


def receive_buffers(inp: EstimateInput, stage: Stage, e: int) -> int:
    """Bytes of the stage's receive buffers (see the module doc), ``e`` bytes per element."""
    if stage.first and stage.last:
        return 0
    hidden = stage.rows * inp.seq_len * inp.shape.hidden * e
    per_microbatch = (0 if stage.first else 2 * hidden) + (0 if stage.last else hidden)
    return stage.microbatches * per_microbatch


def kept_outputs(inp: EstimateInput, stage: Stage, e: int) -> int:
    """Bytes of the outputs the stage keeps for the backward of its micro-batches in flight (``PipelineStage``
    caches each forward's output to start that micro-batch's backward from): the logits on the last stage
    (which the model alone would free once the loss has its log-softmax), the hidden state elsewhere."""
    if stage.first and stage.last:
        return 0
    width = inp.shape.vocab if stage.last else inp.shape.hidden
    return stage.in_flight * stage.rows * inp.seq_len * width * e
