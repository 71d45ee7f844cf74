"""``python -m runner.rank.lib_probe RECIPE --threads N --device cpu|cuda [--set KEY=VALUE ...]``: what the maths
library holds beyond tensors over a run's measured steps, measured in a process of its own before the run.

The probe builds the recipe's model from its config with random weights (:func:`runner.rank.model_load.random_model`,
as the trainer builds the builtin models; a hub model's config is read from the hub cache, its weights are not
loaded), applies the recipe's LoRA and gradient checkpointing (:func:`runner.rank.model_load.for_training`),
and runs :data:`runner.rank.memtrack.MEASURED_STEPS` optimizer steps of the recipe's micro-batch (random
tokens: the shapes and dtypes of every GEMM are the run's) under the trainer's own meter
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

from runner.data.chat import ensure_chat_template
from runner.rank import memtrack
from runner.rank.model_load import attention, for_training, load_dtype, random_model
from runner.spec import builtin
from runner.spec.library import ProbeResult
from runner.spec.paths import cache_dir
from runner.spec.recipe import Recipe, RecipeError, load_recipe


def _config_and_vocab(recipe: Recipe) -> tuple[Any, int]:
    """The model's config (the recipe's attention applied) and the vocabulary its inputs take."""
    model_cfg = recipe.model
    if model_cfg.name.startswith(builtin.BUILTIN_PREFIX):
        from transformers import AutoTokenizer  # deferred: transformers is slow to import

        tok = AutoTokenizer.from_pretrained(str(builtin.ensure_tokenizer(cache_dir())))
        ensure_chat_template(tok, builtin=True)  # the rank's tokenizer: its length is the model's vocabulary
        vocab = len(tok)
        return attention(builtin.model_config(model_cfg.name, vocab), model_cfg), vocab
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_cfg.name, revision=model_cfg.revision,
                                        trust_remote_code=model_cfg.trust_remote_code)
    return attention(config, model_cfg), int(config.vocab_size)


def measure(recipe: Recipe, device: str) -> dict[str, Any]:
    """The meter's figures over the measured steps of ``recipe``'s micro-batch on ``device``."""
    config, vocab = _config_and_vocab(recipe)
    dtype = load_dtype(recipe.model.dtype, recipe.method.type, recipe.train.precision)
    model = for_training(recipe, random_model(recipe, config, dtype)).to(device)
    train = recipe.train
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=train.lr,
                                  weight_decay=train.weight_decay)
    cuda = device == "cuda"
    if cuda:  # the CUDA context and cuBLAS come up before the meter, as in a rank (accelerate's prepare)
        torch.cuda.init()  # type: ignore[no-untyped-call]
        torch.cuda.synchronize()
    meter = memtrack.meter_for(cuda, model, optimizer)
    model.train()
    tokens = torch.Generator().manual_seed(train.seed)
    for _ in range(memtrack.MEASURED_STEPS):
        ids = torch.randint(0, vocab, (train.batch_size, recipe.data.context_length), generator=tokens).to(device)
        with meter.phase("forward"), _autocast(train.precision, device):
            loss = model(input_ids=ids, labels=ids).loss
        with meter.phase("backward"):
            loss.backward()
        with meter.phase("optimizer"):
            if train.max_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), train.max_grad_norm)
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return meter.result()


def _autocast(precision: str, device: str) -> contextlib.AbstractContextManager[Any]:
    """accelerate's autocast for the run's mixed precision (``accelerator.autocast()``); none under fp32."""
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16}
    if precision not in dtypes:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device, dtype=dtypes[precision])


def result(figures: dict[str, Any], device: str) -> ProbeResult:
    """The probe's record from the meter's figures."""
    check = figures.get("gpu_library") if device == "cuda" else figures.get("heap_check")
    if not check:
        raise RuntimeError(f"the meter read no library figure on {device} (glibc's mallinfo2 or NVML missing)")
    return ProbeResult(beyond_tensors_bytes=int(check["beyond_tensors_bytes"]), threads=torch.get_num_threads(),
                       device=device, torch=str(torch.__version__), detail=dict(check))


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
    print(json.dumps(result(measure(recipe, args.device), args.device)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
