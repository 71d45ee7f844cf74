"""The memory model's accuracy grid: tiny models of each architecture the planner knows, built offline from
transformers' config classes, trained for two steps by the real trainer, with the estimate beside the
independent measurement (runner/rank/memtrack.py).

Used by ``bench/bench_memory_grid.py`` (the whole grid, its table is in docs/memory-model.md) and by
``tests/e2e/test_estimate_vs_measured.py`` (a subset). Nothing is downloaded: the weights are a seeded random init
saved to a local folder with the builtin tokenizer.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from runner.planner import estimate, inputs_from_recipe, resolve_model_shape
from runner.spec import builtin
from runner.spec import events as ev
from runner.spec.paths import cache_dir
from runner.spec.recipe import parse_recipe
from runner.spec.summary import busiest_peak, error_pct
from runner.watch.follow import execute
from runner.watch.prepare import prepare

ARCHS: tuple[str, ...] = ("llama", "mistral", "mistral-sw", "qwen2", "gemma", "gemma-mqa", "phi3", "phi", "gpt2",
                          "gpt_neox", "opt", "falcon", "falcon-gqa", "mixtral", "llama-deep")
"""Architectures with a tiny config here (``tiny_config``)."""

LORA_TARGETS: dict[str, list[str]] = {
    "llama": ["q_proj", "v_proj"],
    "llama-deep": ["q_proj", "v_proj"],
    "mistral": ["q_proj", "v_proj"],
    "qwen2": ["q_proj", "v_proj"],
    "gemma": ["q_proj", "v_proj"],
    "phi3": ["qkv_proj", "o_proj"],
    "phi": ["q_proj", "v_proj"],
    "gpt2": ["c_attn"],
    "gpt_neox": ["query_key_value"],
    "falcon": ["query_key_value"],
    "falcon-gqa": ["query_key_value"],
    "mixtral": ["q_proj", "v_proj"],
    "opt": ["q_proj", "v_proj"],
}


def tiny_config(arch: str, vocab: int) -> Any:
    """A small config of ``arch`` (hidden 256, 4 layers, 4 heads; GQA with 2 kv heads where the family has
    it), built with transformers' config class: no download."""
    import transformers as tf

    common: dict[str, Any] = {"vocab_size": vocab, "max_position_embeddings": 2048}
    llama_like = {"hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4, "num_attention_heads": 4,
                  "num_key_value_heads": 2, **common}
    if arch == "llama":
        return tf.LlamaConfig(**llama_like)
    if arch == "mistral":
        return tf.MistralConfig(**llama_like, sliding_window=None)
    if arch == "qwen2":
        return tf.Qwen2Config(**llama_like, tie_word_embeddings=False)
    if arch == "gemma":
        return tf.GemmaConfig(**llama_like, head_dim=64)
    if arch == "phi3":
        return tf.Phi3Config(**llama_like, pad_token_id=0, bos_token_id=1, eos_token_id=1)
    if arch == "phi":
        return tf.PhiConfig(hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=4,
                            **common)
    if arch == "gpt2":
        return tf.GPT2Config(n_embd=256, n_layer=4, n_head=4, n_positions=2048, vocab_size=vocab,
                             bos_token_id=0, eos_token_id=0)
    if arch == "mistral-sw":  # a sliding window below the context (the grid's sequences are 64-256)
        return tf.MistralConfig(**llama_like, sliding_window=48)
    if arch == "gemma-mqa":  # one key/value head (Gemma 2B's multi-query attention)
        return tf.GemmaConfig(**{**llama_like, "num_key_value_heads": 1}, head_dim=64)
    if arch == "gpt_neox":  # parallel residual, fused query_key_value, a quarter of each head rotated
        return tf.GPTNeoXConfig(hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=4,
                                **common, bos_token_id=0, eos_token_id=0)
    if arch == "opt":  # learned positions, ReLU MLP, dropout 0.1 on the residual branches
        return tf.OPTConfig(hidden_size=256, ffn_dim=1024, num_hidden_layers=4, num_attention_heads=4,
                            word_embed_proj_dim=256, **common, pad_token_id=1, bos_token_id=0, eos_token_id=0)
    if arch == "falcon":  # multi-query attention, attention and MLP in parallel on one LayerNorm
        return tf.FalconConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, vocab_size=vocab,
                               bos_token_id=0, eos_token_id=0)
    if arch == "falcon-gqa":  # Falcon's new decoder: grouped kv heads, two LayerNorms, parallel
        return tf.FalconConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_kv_heads=2,
                               new_decoder_architecture=True, vocab_size=vocab, bos_token_id=0, eos_token_id=0)
    if arch == "llama-deep":  # deep and narrow: 9 layers of hidden 128 (cut 5 + 4 by the pipeline)
        return tf.LlamaConfig(**{**llama_like, "hidden_size": 128, "intermediate_size": 344, "num_hidden_layers": 9})
    if arch == "mixtral":  # 4 experts, 2 routed per token
        return tf.MixtralConfig(**llama_like, num_local_experts=4, num_experts_per_tok=2)
    raise ValueError(f"unknown architecture {arch!r} (have {', '.join(ARCHS)})")


def model_folder(arch: str, root: Path) -> Path:
    """A local model folder of the tiny ``arch`` (seeded random weights, the builtin tokenizer), made once."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = root / f"tiny-{arch}"
    if (folder / "config.json").is_file():
        return folder
    tok = AutoTokenizer.from_pretrained(str(builtin.ensure_tokenizer(cache_dir())))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config(arch, len(tok)))  # type: ignore[no-untyped-call]
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    model.save_pretrained(str(tmp))
    tok.save_pretrained(str(tmp))
    tmp.rename(folder)
    return folder


@dataclass(frozen=True)
class GridPoint:
    """One configuration of the grid. ``strategy`` may name its engine: ``zero3@torch`` (``launch.engine``;
    the strategy alone: its default engine)."""

    arch: str
    method: str = "lora"
    precision: str = "fp32"
    strategy: str = "single"
    ckpt: bool = False
    seq: int = 128
    batch: int = 2
    dtype: str = "auto"
    lora_dropout: float = 0.0

    @property
    def nproc(self) -> int:
        return 1 if self.strategy == "single" else 2

    @property
    def label(self) -> str:
        parts = [self.arch, self.method, self.precision, self.strategy, "ckpt" if self.ckpt else "no-ckpt",
                 f"seq{self.seq}"]
        if self.dtype != "auto":
            parts.append(f"dtype={self.dtype}")
        if self.lora_dropout:
            parts.append(f"dropout={self.lora_dropout:g}")
        return " ".join(parts)


def point_from_label(label: str) -> GridPoint:
    """The grid point a :attr:`GridPoint.label` names (to re-estimate stored measurements)."""
    p = label.split()
    extra = dict(x.split("=", 1) for x in p[6:])
    return GridPoint(p[0], p[1], p[2], p[3], p[4] == "ckpt", int(p[5].removeprefix("seq")),
                     dtype=extra.get("dtype", "auto"), lora_dropout=float(extra.get("dropout", 0.0)))


def recipe_for(point: GridPoint, folder: Path | str) -> Any:
    """The recipe of a grid point: two steps, no save, the builtin corpus at the point's sequence length."""

    strategy, _, engine = point.strategy.partition("@")
    engine = engine or "auto"
    targets = json.dumps(LORA_TARGETS.get(point.arch, ["q_proj", "v_proj"]))
    text = f"""
name = "memgrid"
[model]
name = {json.dumps(str(folder))}
dtype = "{point.dtype}"
[data]
source = "builtin:pydoc-topics"
context_length = {point.seq}
[method]
type = "{point.method}"
[method.lora]
r = 8
alpha = 16
dropout = {point.lora_dropout}
target_modules = {targets}
[train]
batch_size = {point.batch}
max_steps = 2
precision = "{point.precision}"
gradient_checkpointing = {str(point.ckpt).lower()}
save = false
log_every = 1
[launch]
strategy = "{strategy}"
engine = "{engine}"
nproc = {point.nproc}
device = "cpu"
"""
    return parse_recipe(text, source="memgrid")


def estimate_for(recipe: Any) -> Any:
    """The planner's estimate for one device of the recipe (what ``ftui run`` stores), and its shape note."""

    source = resolve_model_shape(recipe.model.name, allow_network=False)
    inp = replace(inputs_from_recipe(recipe, shape=source.shape), device="cpu")
    return estimate(inp), source


def measure_in_process(recipe: Any, run_dir: Path) -> list[dict[str, Any]]:
    """Run the real trainer in this process (one rank) and return its ``ranks`` figures."""
    from accelerate.state import AcceleratorState

    from runner.rank.run import Trainer  # deferred: torch (imported at the top of runner.rank.run)

    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / ev.RECIPE_FILE).write_text(recipe.to_toml())
    AcceleratorState._reset_state(reset_partial_state=True)  # each run builds its own state
    journal = ev.JournalWriter(run_dir / ev.EVENTS_FILE)
    try:
        Trainer(run_dir, 0, journal).run()
    finally:
        journal.close()
        AcceleratorState._reset_state(reset_partial_state=True)
    for line in (run_dir / ev.EVENTS_FILE).read_text().splitlines():
        event = json.loads(line)
        if event.get("type") == "end":
            return list(event.get("ranks") or event.get("payload", {}).get("ranks") or [])
    raise RuntimeError(f"{run_dir}: no end event")


def measure_launched(store: Any, recipe: Any, root: Path | None = None) -> tuple[str, list[dict[str, Any]]]:
    """Run the recipe as ``ftui run`` does (``accelerate launch``, real processes); (status, ranks). ``root``:
    the folder of the run folders (default: the ftui data folder's)."""

    outcome = execute(store, prepare(store, recipe, source="memgrid", root=root))
    return outcome.status, list(outcome.summary.get("ranks") or [])


def reestimate(rows: list[dict[str, Any]], models: Path) -> list[dict[str, Any]]:
    """Stored grid measurements beside the CURRENT estimate of each point (the estimate is a pure function of
    the recipe, so a changed formula is checked against the same measurements without training again);
    ``models`` holds the tiny model folders the recipes name."""
    out = []
    for row in rows:
        if row.get("measured") is None:
            out.append(row)
            continue
        point = point_from_label(row["config"])
        breakdown, _ = estimate_for(recipe_for(point, model_folder(point.arch, models)))
        est = int(breakdown.total - breakdown.reserve)
        out.append({**row, "estimated": est, "error_pct": error_pct(est, row["measured"]),
                    "peak_phase": breakdown.peak_phase, "estimated_phases": dict(breakdown.phases)})
    return out


def compare(point: GridPoint, ranks: list[dict[str, Any]], breakdown: Any) -> dict[str, Any]:
    """One row of the grid's table: estimated vs measured peak (busiest rank), error in percent."""

    measured, source = busiest_peak(ranks)
    est = int(breakdown.total - breakdown.reserve)
    err = error_pct(est, measured)
    phases: dict[str, int] = {}
    for r in ranks:
        for k, v in (r.get("phase_peaks") or {}).items():
            phases[k] = max(phases.get(k, 0), int(v))
    return {"config": point.label, "estimated": est, "measured": measured, "source": source, "error_pct": err,
            "measured_phases": phases, "estimated_phases": dict(breakdown.phases)}
