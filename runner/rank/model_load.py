"""Loading the tokenizer and the model of a recipe on one rank (LoRA and QLoRA applied here)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from runner.data.chat import ensure_chat_template
from runner.spec import builtin
from runner.spec.paths import cache_dir

if TYPE_CHECKING:
    from runner.rank.context import Setup
    from runner.spec.recipe import ModelSection, Recipe


@dataclass
class LoadedModel:
    """The model as loaded (PEFT-wrapped for LoRA), with its parameter counts."""

    model: Any
    total_params: int
    trainable_params: int


def load_tokenizer(setup: Setup) -> Any:
    """The recipe's tokenizer (the builtin one is built into the cache by the first rank)."""
    from transformers import AutoTokenizer  # deferred: transformers is slow to import

    model = setup.recipe.model
    if model.name.startswith(builtin.BUILTIN_PREFIX):
        with setup.accelerator.main_process_first():
            folder = builtin.ensure_tokenizer(cache_dir())
        tok = AutoTokenizer.from_pretrained(str(folder))
        ensure_chat_template(tok, builtin=True)
        return tok
    tok = AutoTokenizer.from_pretrained(model.name, trust_remote_code=model.trust_remote_code, revision=model.revision)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    ensure_chat_template(tok, builtin=False)
    return tok


def load_model(setup: Setup) -> LoadedModel:
    """The recipe's model in its load dtype, spread over the GPUs where the strategy says so, with
    gradient checkpointing and LoRA/QLoRA applied."""
    recipe = setup.recipe
    model_cfg, method = recipe.model, recipe.method
    dtype = load_dtype(model_cfg.dtype, method.type, recipe.train.precision)
    spread = setup.strategy.loads_over_devices
    if model_cfg.name.startswith(builtin.BUILTIN_PREFIX):
        config = attention(builtin.model_config(model_cfg.name, len(setup.tokenizer)), model_cfg)
        model: Any = random_model(recipe, config, dtype)
        if spread and not setup.on_cpu:
            model = _dispatch_over_gpus(model)
    else:
        model = _from_pretrained(setup, dtype, spread)
    total = param_count(model.parameters())
    model = for_training(recipe, model)
    trainable = param_count(p for p in model.parameters() if p.requires_grad)
    return LoadedModel(model=model, total_params=total, trainable_params=trainable)


def random_model(recipe: Recipe, config: Any, dtype: Any) -> Any:
    """A model of ``config`` in ``dtype`` with random weights, seeded by the recipe (the builtin models, and the
    library probe's stand-in for a hub model: :mod:`runner.rank.lib_probe`)."""
    from transformers import (  # deferred: transformers is slow to import
        AutoModelForCausalLM,
        LlamaForCausalLM,
    )

    torch.manual_seed(recipe.train.seed)  # the init is part of the recipe
    if recipe.model.name == builtin.TINY_LLAMA:
        return LlamaForCausalLM(config).to(dtype)
    return AutoModelForCausalLM.from_config(config, dtype=dtype)  # type: ignore[no-untyped-call]


def for_training(recipe: Recipe, model: Any) -> Any:
    """``model`` with the recipe's gradient checkpointing and LoRA/QLoRA adapters."""
    if recipe.train.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    if recipe.method.type in ("lora", "qlora"):
        model = _with_lora(recipe, model)
    return model


def attention(config: Any, model_cfg: ModelSection) -> Any:
    """``config`` with the recipe's ``model.attn_implementation`` (None leaves transformers' choice: sdpa)."""
    if model_cfg.attn_implementation is not None:
        config._attn_implementation = model_cfg.attn_implementation
    return config


def param_count(params: Iterable[Any]) -> int:
    """Elements of ``params`` as declared, not as held here: a parameter DeepSpeed ZeRO-3 has already
    partitioned (``zero.Init`` at load) holds an empty tensor and keeps its whole size in ``ds_numel``."""
    return int(sum(getattr(p, "ds_numel", None) or p.numel() for p in params))


def _from_pretrained(setup: Setup, dtype: Any, spread: bool) -> Any:
    from transformers import AutoModelForCausalLM  # deferred: transformers is slow to import

    recipe = setup.recipe
    model_cfg = recipe.model
    kwargs: dict[str, Any] = {
        "dtype": dtype,
        "trust_remote_code": model_cfg.trust_remote_code,
        "revision": model_cfg.revision,
    }
    if model_cfg.attn_implementation is not None:  # None: transformers' choice (sdpa where the model has it)
        kwargs["attn_implementation"] = model_cfg.attn_implementation
    if recipe.method.type == "qlora":
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(  # type: ignore[no-untyped-call]
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.bfloat16 if recipe.train.precision == "bf16" else torch.float16,
        )
        kwargs["device_map"] = {"": setup.accelerator.local_process_index} if not spread else "auto"
    elif spread:
        kwargs["device_map"] = "auto"
    return AutoModelForCausalLM.from_pretrained(model_cfg.name, **kwargs)


def _with_lora(recipe: Recipe, model: Any) -> Any:
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training  # deferred: peft is slow

    if recipe.method.type == "qlora":
        model = prepare_model_for_kbit_training(  # type: ignore[no-untyped-call]
            model, use_gradient_checkpointing=recipe.train.gradient_checkpointing
        )
    elif recipe.train.gradient_checkpointing:
        model.enable_input_require_grads()
    lora = recipe.method.lora
    return get_peft_model(
        model,
        LoraConfig(
            r=lora.r,
            lora_alpha=lora.alpha,
            lora_dropout=lora.dropout,
            target_modules=list(lora.target_modules),
            task_type="CAUSAL_LM",
        ),
    )


def load_dtype(dtype: str, method: str, precision: str) -> Any:
    """The dtype the weights are loaded in: the recipe's, or by method and precision for ``auto``."""
    table = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    if dtype != "auto":
        return table[dtype]
    precision = "bf16" if precision == "fp8" else precision  # torchao's float8 layers: bf16 around them
    # Full fine-tuning keeps fp32 master weights (accelerate autocasts the compute); LoRA's frozen
    # base can live in the compute dtype, which halves its memory.
    if method in ("lora", "qlora") and precision != "fp32":
        return table[precision]
    return torch.float32


def _dispatch_over_gpus(model: Any) -> Any:
    from accelerate import dispatch_model, infer_auto_device_map
    from accelerate.utils import get_balanced_memory

    no_split = list(getattr(model, "_no_split_modules", None) or [])
    max_memory = get_balanced_memory(model, no_split_module_classes=no_split)
    device_map = infer_auto_device_map(model, max_memory=max_memory, no_split_module_classes=no_split)
    return dispatch_model(model, device_map=device_map)


def device_map(model: Any) -> dict[str, str] | None:
    """The ``hf_device_map`` of a model spread over devices (under PEFT's wrappers), or None."""
    base = model
    for attr in ("base_model", "model"):
        if hasattr(base, "hf_device_map"):
            break
        base = getattr(base, attr, base)
    dm = getattr(base, "hf_device_map", None)
    return {k: str(v) for k, v in dm.items()} if dm else None


def input_device(model: Any) -> Any:
    """Where a spread model takes its inputs: the device of its first module."""
    dm = device_map(model)
    if dm:
        first = next(iter(dm.values()))
        return torch.device(f"cuda:{first}" if first.isdigit() else first)
    return next(model.parameters()).device
