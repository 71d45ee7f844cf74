"""``python -m runner.rank.lib_probe RECIPE --threads N --device cpu|cuda [--set KEY=VALUE ...]``: what the maths
library holds beyond tensors over a run's measured steps, measured in a process of its own before the run.

The probe builds the recipe's model from its config with random weights (:func:`runner.rank.model_load.random_model`,
as the trainer builds the builtin models; a hub model's config is read from the hub cache, its weights are not
loaded), applies the recipe's LoRA and gradient checkpointing (:func:`runner.rank.model_load.for_training`),
and runs :data:`runner.rank.memtrack.MEASURED_STEPS` optimizer steps of rank 0's micro-batches (the run's own
rows in the trainer's order, so that a mixture of experts routes them as the run will; random tokens of the
same shape where the data does not load) under the trainer's own meter
(:func:`runner.rank.memtrack.meter_for`), with the rank's thread count and accelerate's autocast. What the
meter reads beyond tensors is the figure:

* CPU: glibc's heap growth minus the live tensors' growth (``heap_check``): oneDNN's primitive cache, MKL's
  buffers.
* GPU: CUDA context and libraries outside the allocator plus the allocator's reserve (``gpu_library``).

It prints one JSON line (:class:`runner.spec.library.ProbeResult`); anything it cannot do goes to stderr
with exit status 1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from typing import Any

import torch

from runner.data.cache import local_tokenizer_digest
from runner.data.chat import ensure_chat_template
from runner.data.prepare import load_data
from runner.rank import memtrack
from runner.rank.loop import epoch_order
from runner.rank.model_load import attention, for_training, load_dtype, random_model
from runner.spec import builtin, layout
from runner.spec.library import ProbeResult
from runner.spec.paths import cache_dir
from runner.spec.recipe import Recipe, RecipeError, load_recipe


def _config_and_tokenizer(recipe: Recipe) -> tuple[Any, Any]:
    """The model's config (the recipe's attention applied) and the run's tokenizer (None where a hub model's
    cannot be had here: its config's vocabulary stands)."""
    from transformers import AutoConfig, AutoTokenizer  # deferred: transformers is slow to import

    model_cfg = recipe.model
    if model_cfg.name.startswith(builtin.BUILTIN_PREFIX):
        tok = AutoTokenizer.from_pretrained(str(builtin.ensure_tokenizer(cache_dir())))
        ensure_chat_template(tok, builtin=True)  # the rank's tokenizer: its length is the model's vocabulary
        return attention(builtin.model_config(model_cfg.name, len(tok)), model_cfg), tok
    config = AutoConfig.from_pretrained(model_cfg.name, revision=model_cfg.revision,
                                        trust_remote_code=model_cfg.trust_remote_code)
    try:
        tok = AutoTokenizer.from_pretrained(model_cfg.name, revision=model_cfg.revision,
                                            trust_remote_code=model_cfg.trust_remote_code)
    except (OSError, ValueError):
        return attention(config, model_cfg), None
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    ensure_chat_template(tok, builtin=False)
    return attention(config, model_cfg), tok


def measure(recipe: Recipe, device: str) -> tuple[dict[str, Any], str]:
    """The meter's figures over the measured steps of ``recipe``'s micro-batches on ``device``, and what the
    inputs were."""
    config, tokenizer = _config_and_tokenizer(recipe)
    vocab = len(tokenizer) if tokenizer is not None else int(config.vocab_size)
    dtype = load_dtype(recipe.model.dtype, recipe.method.type, recipe.train.precision)
    model = for_training(recipe, random_model(recipe, config, dtype)).to(device)
    train = recipe.train
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=train.lr,
                                  weight_decay=train.weight_decay)
    cuda = device == "cuda"
    if cuda:  # the CUDA context and cuBLAS come up before the meter, as in a rank (accelerate's prepare)
        torch.cuda.init()  # type: ignore[no-untyped-call]
        torch.cuda.synchronize()
    batches, inputs = micro_batches(recipe, tokenizer, vocab)
    meter = memtrack.meter_for(cuda, model, optimizer)
    model.train()
    for step in range(memtrack.MEASURED_STEPS):
        for micro in batches[step]:
            micro = {k: v.to(device) for k, v in micro.items()}
            with meter.phase("forward"), _autocast(train.precision, device):
                loss = model(**micro).loss / train.grad_accum
            with meter.phase("backward"):
                loss.backward()
        with meter.phase("optimizer"):
            if train.max_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), train.max_grad_norm)
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return meter.result(), inputs


def micro_batches(recipe: Recipe, tokenizer: Any, vocab: int) -> tuple[list[list[dict[str, Any]]], str]:
    """Rank 0's micro-batches of the measured steps: the run's own rows where its data loads (the trainer's
    order, :func:`runner.rank.loop.epoch_order`: a mixture of experts routes them as the run will), else random
    tokens of the same shape; and which they are."""
    train, B, T = recipe.train, recipe.train.batch_size, recipe.data.context_length
    try:
        data = load_data(recipe.data, tokenizer, train.seed, tokenizer_id=local_tokenizer_digest(recipe.model)).train
    except Exception as exc:  # noqa: BLE001 (the shapes stand without the rows; the note says so)
        gen = torch.Generator().manual_seed(train.seed)
        steps = [[_inputs(torch.randint(0, vocab, (B, T), generator=gen), None, None) for _ in range(train.grad_accum)]
                 for _ in range(memtrack.MEASURED_STEPS)]
        return steps, f"random tokens (the data did not load: {str(exc).splitlines()[0][:120]})"
    rows_per_step = layout.rows_per_step(recipe)
    replicas = rows_per_step // (B * train.grad_accum)
    order = epoch_order(len(data.input_ids), train.seed, 0, recipe.data.shuffle)
    steps = []
    for step in range(memtrack.MEASURED_STEPS):
        micros = []
        for micro in range(train.grad_accum):
            start = step * rows_per_step + micro * replicas * B
            rows = order[start : start + B]
            mask = None if data.attention_mask is None else data.attention_mask[rows]
            labels = None if data.labels is None else data.labels[rows]
            micros.append(_inputs(data.input_ids[rows], mask, labels))
        steps.append(micros)
    return steps, "the run's first rows (rank 0)"


def _inputs(ids: Any, mask: Any, labels: Any) -> dict[str, Any]:
    """A micro-batch as the trainer passes it: unlearned and padded tokens labelled -100."""
    targets = ids if labels is None else labels
    if mask is None:
        return {"input_ids": ids, "labels": targets}
    return {"input_ids": ids, "attention_mask": mask, "labels": targets.masked_fill(mask == 0, -100)}


def _autocast(precision: str, device: str) -> contextlib.AbstractContextManager[Any]:
    """accelerate's autocast for the run's mixed precision (``accelerator.autocast()``); none under fp32."""
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16}
    if precision not in dtypes:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device, dtype=dtypes[precision])


def result(figures: dict[str, Any], device: str, inputs: str) -> ProbeResult:
    """The probe's record from the meter's figures."""
    check = figures.get("gpu_library") if device == "cuda" else figures.get("heap_check")
    if not check:
        raise RuntimeError(f"the meter read no library figure on {device} (glibc's mallinfo2 or NVML missing)")
    return ProbeResult(beyond_tensors_bytes=int(check["beyond_tensors_bytes"]), threads=torch.get_num_threads(),
                       device=device, torch=str(torch.__version__), detail={**check, "inputs": inputs})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runner.rank.lib_probe")
    parser.add_argument("recipe")
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    try:
        recipe = load_recipe(args.recipe, args.set)
    except (RecipeError, OSError) as exc:
        print(str(exc), file=sys.stderr)
        return 1
    torch.set_num_threads(args.threads)
    figures, inputs = measure(recipe, args.device)
    print(json.dumps(result(figures, args.device, inputs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
