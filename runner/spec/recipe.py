"""Recipes: the TOML a user writes, validated strictly.

Unknown keys and wrong types are refused (``batch_size = true`` is an error, not 1). Every problem
is reported as one line naming the field path and, where the key appears in the file, its line.
``--set a.b=value`` overrides go through the same validation.
"""

from __future__ import annotations

import difflib
import hashlib
import os
import re
import tomllib
from collections.abc import Iterable, Set
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from runner.spec import kernels, layout, strategies, switches, zero
from runner.spec.builtin import BUILTIN_PREFIX, PYDOC_CORPUS, TINY_LLAMA, known_model_problem
from runner.spec.rendezvous import NodesError, split_endpoint
from runner.spec.toml_text import dump_toml
from runner.spec.units import parse_bytes


class RecipeError(ValueError):
    """A recipe problem, already phrased as one line for the user (field path, file, line).

    ``str(exc)`` is that line; the parts are attributes too, so that a form can put the problem
    next to its field without parsing the line.

    Attributes:
        field: the field path (``train.batch_size``), or None when the problem is the whole file.
        problem: what is wrong, without the file and the field (the whole line when there are none).
        file: the recipe file (or source name such as ``form``); ``"--set"`` for a command-line
            override; None when unknown.
        line: the line of ``file`` the field is on, where known.
    """

    def __init__(self, message: str, *, field: str | None = None, problem: str | None = None,
                 file: str | None = None, line: int | None = None) -> None:
        super().__init__(one_line(message))
        self.field = field
        self.problem = problem if problem is not None else message
        self.file = file
        self.line = line


def one_line(text: str) -> str:
    """``text`` as one line whatever the input held: a character that ends a line (``\\n``, ``\\x1e``,
    ``\\u2028``) or is not printable is shown escaped, as Python writes it."""
    return "".join(c if c.isprintable() or c == "\t" else repr(c)[1:-1] for c in text)


class _Section(BaseModel):
    # TOML has inf and nan literals; no field of a recipe means either.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


PositiveInt = Annotated[int, Field(gt=0)]

LR_MAX = 3.4e37
"""The largest ``train.lr``: AdamW's first step is lr / (1 - beta1) = 10 lr, and a step past float32's
largest value (3.4e38) cannot be applied to a float32 weight at all."""
NonNegInt = Annotated[int, Field(ge=0)]

NAME_MAX = 255
"""Bytes in one name of a path (Linux's NAME_MAX); a longer one can never be opened."""
PATH_MAX = 4096
"""Bytes in a whole path, its end included (Linux's PATH_MAX)."""
RUN_NAME_MAX = 200
"""Characters of a run's name (``runs.name`` holds at most this many)."""


def _path_text(value: str) -> str:
    """A field that may name a file or folder: no NUL, and short enough for the system to open."""
    if "\0" in value:
        raise ValueError("a path cannot hold a NUL character")
    if value.startswith("~") and os.path.expanduser(value).startswith("~"):
        raise ValueError(f"{value.split('/')[0][:60]!r}: no such user to expand")
    size = len(value.encode())
    if size >= PATH_MAX:
        raise ValueError(f"too long for a path ({size} bytes; at most {PATH_MAX - 1})")
    longest = max(len(part.encode()) for part in value.split("/"))
    if longest > NAME_MAX:
        raise ValueError(f"a name in the path is {longest} bytes long (at most {NAME_MAX})")
    return value


PathText = Annotated[str, AfterValidator(_path_text)]
"""A recipe value that may name a local file or folder (:data:`PATH_FIELDS`)."""


class ModelSection(_Section):
    name: PathText = TINY_LLAMA
    """``builtin:tiny-llama``, ``builtin:tiny-mixtral`` or ``builtin:tiny-qwen2-moe`` (mixtures of experts), a
    local folder, or a hub id."""
    dtype: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    """Dtype the weights are loaded in; ``auto`` follows train.precision for LoRA, fp32 for full."""
    trust_remote_code: bool = False
    revision: str | None = None
    attn_implementation: kernels.Attention | None = None
    """The attention kernel transformers runs: ``eager`` (matmul and softmax: keeps each layer's attention
    probabilities for backward), ``sdpa`` (torch's fused kernels), ``flex_attention`` (a CUDA GPU) or
    ``flash_attention_2`` (a CUDA GPU with the flash_attn package, fp16/bf16). None: transformers' choice,
    ``sdpa`` where the model supports it. Sweepable: ``--grid model.attn_implementation=eager,sdpa``."""


class DataSection(_Section):
    source: PathText = PYDOC_CORPUS
    """``builtin:pydoc-topics``, a local .jsonl/.json/.csv/.parquet/.txt file, a Hugging Face dataset
    folder (``save_to_disk``, or a local dataset folder) or a script-free hub id in the local cache
    (read offline; see ``split`` and ``subset``)."""
    format: Literal["auto", "text", "chat", "completion"] = "auto"
    """How rows become tokens: ``chat`` (a ``messages`` list of role/content, rendered with the
    tokenizer's chat template), ``completion`` (``prompt`` + ``completion``), ``text`` (``text_field``
    or ``template``); ``auto`` picks by the first row's fields."""
    messages_field: str = "messages"
    prompt_field: str = "prompt"
    completion_field: str = "completion"
    train_on: Literal["all", "completions"] = "all"
    """``completions``: only assistant turns (chat) or the completion (prompt/completion rows) are
    learned; the labels of system, user and prompt tokens are -100."""
    split: str = "train"
    """The split of a Hugging Face dataset."""
    subset: str | None = None
    """The configuration (subset) of a hub dataset."""
    eval_fraction: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.0
    """Hold out this fraction of the rows (a seeded choice) as the eval set."""
    eval_source: PathText | None = None
    """A separate eval set (same kinds as ``source``); ``eval_split`` picks its split."""
    eval_split: str | None = None
    """The eval set is this split of ``eval_source`` (default: of ``source``)."""
    text_field: str = "text"
    template: str | None = None
    """Format string over the row's fields, e.g. ``"### Q: {prompt}\\n### A: {response}"``."""
    rows: NonNegInt = 0
    """Use at most this many rows (0 = all)."""
    context_length: PositiveInt = 256
    pack: bool = True
    """Concatenate documents and cut blocks of context_length (else pad/truncate each row)."""
    shuffle: bool = True


class LoraSection(_Section):
    r: PositiveInt = 8
    alpha: PositiveInt = 16
    dropout: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.0
    target_modules: Annotated[list[str], Field(min_length=1)] = ["q_proj", "k_proj", "v_proj", "o_proj"]
    """The model's modules (by name) that get LoRA adapters; the pre-flight checks the builtin model's."""


class MethodSection(_Section):
    type: Literal["full", "lora", "qlora"] = "lora"
    lora: LoraSection = LoraSection()


class TrainSection(_Section):
    batch_size: PositiveInt = 4
    """Micro-batch per device (per process)."""
    grad_accum: PositiveInt = 1
    lr: Annotated[float, Field(gt=0.0)] = 1e-3
    """AdamW's learning rate; at most :data:`LR_MAX`, whose first step still fits a float32 weight (a
    larger lr that diverges is ``train.on_nan``'s to handle)."""
    schedule: Literal["constant", "linear", "cosine"] = "cosine"
    warmup_steps: NonNegInt = 0
    max_steps: NonNegInt = 0
    """Optimizer steps; 0 means train for ``epochs``."""
    stop_after: NonNegInt = 0
    """Stop after this many steps (0: never) of the lr schedule, which still spans ``max_steps`` (or ``epochs``):
    the whole run's first steps, which a checkpoint then (``save_every``) lets a later run continue."""
    epochs: Annotated[float, Field(gt=0.0)] = 1.0
    precision: Literal["fp32", "bf16", "fp16", "fp8"] = "fp32"
    """``fp8``: torchao's float8 training (the decoder's Linear layers as ``Float8Linear``) inside bf16
    autocast; CUDA GPUs of compute capability 8.9 or above only (docs/recipes.md)."""
    gradient_checkpointing: bool = False
    activation_offload: bool = False
    """GPU only: what the forward saves for backward goes to pinned host memory
    (``torch.autograd.graph.save_on_cpu``) and comes back in the backward."""
    max_grad_norm: Annotated[float, Field(ge=0.0)] = 1.0
    """0 disables clipping."""
    weight_decay: Annotated[float, Field(ge=0.0)] = 0.0
    seed: Annotated[int, Field(ge=0, lt=2**32)] = 0
    """numpy's and torch's seeds take 0 <= seed < 2**32."""
    log_every: PositiveInt = 1
    save: bool = True
    """Save the adapter (LoRA) or the model (full) into the run folder at the end."""
    save_every: NonNegInt = 0
    """Write a resumable checkpoint (``RUN/checkpoints/step-NNNNNNNN/``) every this many optimizer
    steps; 0 = none. A graceful stop (SIGTERM/SIGINT, ``s`` in the Monitor) always writes one."""
    keep_checkpoints: PositiveInt = 2
    """Keep only the newest this many complete checkpoints of the run."""
    resume_from: PathText | None = None
    """A checkpoint folder (``.../checkpoints/step-NNNNNNNN``, complete) to continue from: model or
    adapter, optimizer, scheduler, RNG and data position; the run goes on at the next step. Same world
    size and strategy as the checkpoint's. ``ftui resume ID`` fills it in."""
    on_nan: Literal["stop", "skip"] = "stop"
    """A non-finite loss (or gradient norm): ``stop`` fails the run (nothing saved), ``skip`` drops that
    optimizer step (no update) and goes on."""
    max_skipped_steps: NonNegInt = 10
    """With ``on_nan = "skip"``: fail the run once more steps than this were skipped."""
    eval_every: NonNegInt = 0
    """Evaluate on the held-out set (``data.eval_fraction`` or ``data.eval_source``) every this many
    optimizer steps; with an eval set the run is always evaluated at its end too."""
    compile: bool = False
    """Compile each decoder layer with ``torch.compile`` (inductor; on CPU through its C++ back end). The first
    step compiles (the ``compiling`` phase) and is left out of the steady-state tokens/s."""
    compile_mode: kernels.CompileMode = "default"
    """``torch.compile``'s ``mode`` with ``compile = true``: ``default``, ``reduce-overhead`` (CUDA graphs on
    GPU) or ``max-autotune`` (autotuned kernels: a longer compile)."""

    @field_validator("lr")
    @classmethod
    def _check_lr(cls, value: float) -> float:
        if value > LR_MAX:
            raise ValueError(f"{value:g} is above {LR_MAX:g}: AdamW's first step (10 x lr) would not fit a float32 "
                             "weight")
        return value

    @property
    def accelerate_mixed_precision(self) -> str:
        """``precision`` in accelerate's words (``mixed_precision``: no, bf16, fp16); fp8's layers run in
        float8 by torchao's conversion, everything else under bf16 autocast."""
        return {"fp32": "no", "fp8": "bf16"}.get(self.precision, self.precision)

class EvalSection(_Section):
    prompts: list[str] = []
    """At each evaluation rank 0 generates a short greedy completion for each (stored, shown per run)."""
    max_new_tokens: Annotated[int, Field(gt=0, le=256)] = 24
    batch_size: PositiveInt = 8
    """Rows per forward pass of the evaluation, per rank."""


class LaunchSection(_Section):
    strategy: str = "single"
    """A launchable strategy of ``runner/spec/strategies.py`` (``ftui run --help`` lists them)."""
    nproc: PositiveInt = 1
    """Processes (ranks). On a GPU box, one per GPU."""
    gpus: list[Annotated[int, Field(ge=0)]] | None = None
    """Physical GPU indices to use (CUDA_VISIBLE_DEVICES); None = all visible."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    fsdp_version: Literal[1, 2] = 2
    engine: str = "auto"
    """What implements the strategy: ``auto`` (the strategy's default: ``deepspeed`` for the ZeRO stages),
    ``deepspeed`` or ``torch`` (PyTorch alone: ZeroRedundancyOptimizer or FSDP2; docs/zero.md). The table in
    ``runner/spec/strategies.py`` says which engines each strategy takes."""
    offload: Literal["none", "optimizer", "optimizer+params", "nvme"] = "none"
    """ZeRO only: keep the optimizer state (and fp32 master), or also the weights, in host memory; ``nvme``:
    DeepSpeed ZeRO-3's ZeRO-Infinity, both on the NVMe folder ``nvme_path``."""
    nvme_path: PathText | None = None
    """``offload = "nvme"``: a folder on a fast local NVMe drive DeepSpeed swaps into."""
    cp_size: PositiveInt = 1
    """Context parallelism: processes each sequence is split over (ring attention, FSDP2; CUDA GPUs)."""
    accelerate_config: PathText | None = None
    """An accelerate config file to use as is, instead of the generated one."""
    peak_tflops: Annotated[float, Field(gt=0.0)] | None = None
    """Peak TFLOP/s of one device for MFU, instead of the datasheet table (GPU) or the measured matmul
    peak (CPU); ``--peak-tflops`` on the command line wins."""
    mem_cap: str | None = None
    """Memory budget per rank for the batch-size finder, e.g. ``"3GiB"`` (on CPU there is no device
    memory to find); ``--mem-cap`` on the command line wins."""
    nnodes: Annotated[int, Field(ge=1)] | None = None
    """Machines the run spans (``ftui run --nnodes``); None or 1: this machine only. ``nproc`` is per machine."""
    node_rank: Annotated[int, Field(ge=0)] | None = None
    """This machine's node rank under a static rendezvous (``--node-rank``); left out under c10d."""
    main_addr: str | None = None
    """The main node's address, static rendezvous (``--main-addr``)."""
    main_port: Annotated[int, Field(gt=0, lt=65536)] | None = None
    """The main node's rendezvous port (``--main-port``; default 29500)."""
    rdzv_endpoint: str | None = None
    """``HOST:PORT`` of a c10d rendezvous (``--rdzv-endpoint``): node ranks assigned by arrival."""
    script: PathText | None = None
    """Your own training script (accelerate, Hugging Face Trainer, TRL) to launch instead of ftui's
    trainer, with the accelerate config of ``strategy`` (:mod:`runner.spec.script`). The model, data and
    method sections are then optional: they only describe the run."""
    script_args: list[str] = []
    """Arguments passed to ``script`` as its ``sys.argv[1:]`` (argv, never a shell)."""
    microbatches: PositiveInt | None = None
    """``pp``: micro-batches the batch of each pipeline step is cut into (must divide
    ``train.batch_size``; more shrink the bubble); None: ``train.batch_size`` (one row each). ``mp``
    over processes is always one micro-batch. Other strategies ignore it."""
    pp_schedule: Literal["gpipe", "1f1b"] = "1f1b"
    """``pp``: GPipe (every forward, then every backward) or 1F1B (one forward, one backward: fewer
    micro-batches' activations alive; needs micro-batches >= stages)."""
    tp_size: PositiveInt | None = None
    """``tp``: processes each weight matrix is split over; None: ``nproc``. Smaller (it must divide
    ``nproc``): ``nproc / tp_size`` tensor-parallel groups train as data parallel replicas, each on its
    own ``batch_size`` rows (a 2-D device mesh, gradients averaged over the replicas)."""
    replicate: PositiveInt | None = None
    """``hsdp``: groups of processes that are replicas of each other (``--replicate``); ``replicate`` x
    ``shard`` = every process over every machine. None: ``nnodes`` on several machines, else 2, or what
    ``shard`` leaves. Other strategies ignore it (:func:`runner.spec.layout.hsdp_mesh`)."""
    shard: PositiveInt | None = None
    """``hsdp``: processes each group shards the parameters, gradients and optimizer state over
    (``--shard``); None: what ``replicate`` leaves (on several machines: ``nproc``, one group per machine)."""
    ep_size: PositiveInt | None = None
    """Expert parallelism (processes a mixture of experts' experts are spread over): only 1 (None) is taken,
    :func:`runner.spec.layout.expert_parallel_problem` says why."""

    @field_validator("strategy")
    @classmethod
    def _check_strategy(cls, value: str) -> str:
        launchable = strategies.names(launchable=True)
        if value not in launchable:
            known = strategies.STRATEGIES.get(value)
            why = f" ({known.not_launchable})" if known is not None and known.not_launchable else ""
            raise ValueError(f"Input should be {strategies.choices_text(launchable)}{why}")
        return value

    @field_validator("mem_cap")
    @classmethod
    def _check_mem_cap(cls, value: str | None) -> str | None:
        if value is not None:
            parse_bytes(value)  # ValueError: reported as launch.mem_cap
        return value

    @field_validator("rdzv_endpoint")
    @classmethod
    def _check_rdzv_endpoint(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                split_endpoint(value)
            except NodesError:  # its words name the flag; the recipe's field is named by the caller
                raise ValueError(f"expected HOST:PORT (a port 1-65535), got {value!r}") from None
        return value


class Recipe(_Section):
    """A whole recipe. Field docstrings are the reference for the TOML keys."""

    name: Annotated[str, Field(max_length=RUN_NAME_MAX)] = "run"
    description: str = ""
    model: ModelSection = ModelSection()
    data: DataSection = DataSection()
    method: MethodSection = MethodSection()
    train: TrainSection = TrainSection()
    eval: EvalSection = EvalSection()
    launch: LaunchSection = LaunchSection()

    @model_validator(mode="after")
    def _check_consistency(self) -> Recipe:
        launch = self.launch
        if self.model.name.startswith(BUILTIN_PREFIX) and (unknown := known_model_problem(self.model.name)):
            raise ValueError(f"model.name: {unknown}")
        strategy = strategies.get(launch.strategy)
        problem = strategy.nproc_problem(launch.nproc * (launch.nnodes or 1))  # the world, over every machine
        if problem:
            raise ValueError(f"launch.nproc: {problem}")
        if launch.gpus is not None and not strategy.layer_split and len(launch.gpus) < launch.nproc:
            raise ValueError(f"launch.gpus: {len(launch.gpus)} GPUs listed for nproc = {launch.nproc}")
        if launch.script_args and launch.script is None:
            raise ValueError("launch.script_args: script arguments without launch.script")
        problem = layout.recipe_problem(self) or layout.stop_problem(self.train)  # pp / mp / tp; train.stop_after
        if problem:
            raise ValueError(problem)
        if self.method.type == "qlora" and launch.device == "cpu":
            raise ValueError("method.type: qlora needs a CUDA GPU (bitsandbytes 4-bit); launch.device is 'cpu'")
        # The ZeRO engines and offload; context parallel, fp8, activation and NVMe offload; attention and compile.
        problem = zero.recipe_problem(self) or switches.recipe_problem(self) or kernels.recipe_problem(self)
        if problem:
            raise ValueError(problem)
        problem = self._eval_problem()
        if problem:
            raise ValueError(problem)
        return self

    def _eval_problem(self) -> str | None:
        """An evaluation asked for (``train.eval_every``, ``eval.prompts``) with no eval set to run it on:
        the rank would never evaluate. A script run's data section only describes the run."""
        data = self.data
        if self.launch.script is not None or data.eval_fraction > 0 or data.eval_source or data.eval_split:
            return None
        fix = "(set data.eval_fraction, data.eval_source or data.eval_split)"
        if self.train.eval_every:
            return f"train.eval_every: {self.train.eval_every} but the recipe has no eval set {fix}"
        if self.eval.prompts:
            return f"eval.prompts: they are sampled at each evaluation, and the recipe has no eval set {fix}"
        return None

    def to_toml(self) -> str:
        """The recipe as TOML text (every field, defaults included), loadable by :func:`parse_recipe`.

        A script run (``launch.script``) keeps only what was written: its model, data and method
        sections describe the run only when given, and defaults written out would read as given."""
        return dump_toml(self.model_dump(mode="json", exclude_unset=self.launch.script is not None))

    def digest(self) -> str:
        """A stable hash of the resolved recipe (sha256 of its canonical TOML, 16 hex digits)."""
        return hashlib.sha256(self.to_toml().encode()).hexdigest()[:16]


# --------------------------------------------------------------------------- loading


def load_recipe(path: str | Path, overrides: Iterable[str] = ()) -> Recipe:
    """Read, override and validate a recipe file.

    Args:
        path: the TOML file.
        overrides: ``"a.b=value"`` strings; the value is parsed as a TOML value (bare words are
            taken as strings), then validated like the file.

    Raises:
        RecipeError: one line naming the file, the field path and, where known, the line.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise RecipeError(f"{path}: cannot read recipe: {exc.strerror or exc}", file=str(path),
                          problem=f"cannot read recipe: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise RecipeError(f"{path}: not a TOML recipe (TOML is UTF-8 text)", file=str(path),
                          problem="not a TOML recipe (TOML is UTF-8 text)") from None
    return parse_recipe(text, source=str(path), overrides=overrides, base_dir=path.parent, allow_empty=False)


PATH_FIELDS = ("data.source", "data.eval_source", "model.name", "launch.accelerate_config", "launch.script",
               "launch.nvme_path")
"""Fields that may name a local file or folder; a relative one is made absolute at load time."""


def parse_recipe(
    text: str,
    source: str = "<recipe>",
    overrides: Iterable[str] = (),
    base_dir: str | Path | None = None,
    allow_empty: bool = True,
) -> Recipe:
    """Validate recipe text; see :func:`load_recipe`.

    Args:
        text: the TOML text.
        source: the name errors give the text (a file name, ``form``).
        overrides: ``"a.b=value"`` strings, see :func:`load_recipe`.
        base_dir: the folder relative paths of the text (``data.source``, a ``model.name`` folder,
            ``launch.accelerate_config``) are taken from: the recipe file's folder. Default: the
            current folder. Relative paths given as overrides are always taken from the current
            folder (they were typed there).
        allow_empty: whether a text with no keys at all (empty, blank or only comments) is a recipe
            of defaults; a recipe *file* never is (it is an error: nothing to run).
    """
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise RecipeError(f"{source}: invalid TOML: {exc}", file=source, problem=f"invalid TOML: {exc}",
                          line=getattr(exc, "lineno", None)) from None
    if not data and not allow_empty:
        raise RecipeError(f"{source}: empty recipe (nothing to run)", file=source,
                          problem="empty recipe (nothing to run)")
    overridden = {apply_override(data, item) for item in overrides}
    _resolve_paths(data, Path(base_dir) if base_dir is not None else Path.cwd(), overridden)
    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        raise _first_error(exc, text, source, overridden) from None


def _resolve_paths(data: dict[str, Any], base_dir: Path, overridden: Set[str]) -> None:
    """Make the relative local paths of ``data`` absolute, in place (see :func:`parse_recipe`).

    The trainer runs inside the run folder, so a path left relative would be looked up there;
    the run folder's recipe.toml records the absolute path instead. A ``model.name`` is a hub id
    (``org/model``) unless it starts with ``.``/``~`` or the folder exists, so only those are touched.
    """
    for dotted in PATH_FIELDS:
        section, key = dotted.split(".")
        table = data.get(section)
        if not isinstance(table, dict):
            continue
        value = table.get(key)
        if not isinstance(value, str) or not value or value.startswith((BUILTIN_PREFIX, "hf:")) or "\0" in value:
            continue
        base = Path.cwd() if dotted in overridden else base_dir
        try:
            path = Path(value).expanduser()
            if path.is_absolute():
                resolved = path
            elif dotted == "model.name" and not value.startswith(".") and not (base / path).exists():
                continue  # a hub id
            elif dotted != "model.name" and not value.startswith(".") and not (base / path).exists() \
                    and _hub_id_like(value):
                continue  # a hub dataset id
            else:
                resolved = base / path
            table[key] = os.path.abspath(resolved)
        except (OSError, RuntimeError, ValueError):
            continue  # left as written: the pre-flight reports it naming the field


def _hub_id_like(value: str) -> bool:
    """``org/name``: one slash, no suffix a local data file has (``data/x.jsonl`` stays a path)."""
    return value.count("/") == 1 and not value.lower().endswith((".jsonl", ".json", ".csv", ".parquet", ".txt"))


def apply_override(data: dict[str, Any], item: str) -> str:
    """Apply one ``a.b=value`` override to raw recipe data, in place; return the field path."""
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key or not re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*", key):
        raise RecipeError(f"--set {item!r}: expected FIELD.PATH=VALUE, e.g. train.max_steps=50", file="--set",
                          problem="expected FIELD.PATH=VALUE, e.g. train.max_steps=50")
    value = _parse_value(raw.strip())
    *parents, leaf = key.split(".")
    node = data
    for part in parents:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise RecipeError(f"--set {key}: {part!r} is not a section", field=key, file="--set",
                              problem=f"{part!r} is not a section")
        node = child
    node[leaf] = value
    return key


def _parse_value(raw: str) -> Any:
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw  # a bare word: a string


def _first_error(exc: ValidationError, text: str, source: str, overridden: Set[str] = frozenset()) -> RecipeError:
    errors = exc.errors()
    err = errors[0]
    loc = [str(p) for p in err["loc"] if not isinstance(p, int)]
    path = ".".join(loc) or "recipe"
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        msg = "unknown field" + _did_you_mean(loc)
    elif err["type"] == "value_error":
        # Our own consistency checks already name their field: "launch.nproc: ..."
        msg = msg.removeprefix("Value error, ")
        field, sep, rest = msg.partition(": ")
        if sep and "." in field and " " not in field:
            path, msg = field, rest
    elif "input" in err and err["type"] not in ("missing",):
        msg = f"{msg} (got {_shown(err['input'])})"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    if path in overridden:  # the value came from the command line, not from the file's line
        return RecipeError(f"--set {path}: {msg}{more}", field=path, problem=msg + more, file="--set")
    line = _find_line(text, path)
    made_by = min((key for key in overridden if key.startswith(f"{path}.")), default=None)
    if made_by and line is None:  # a section only an override made (``--set lunch.nproc=2``): name that --set
        return RecipeError(f"--set {made_by}: {path}: {msg}{more}", field=path, problem=msg + more, file="--set")
    where = f"{source}:{line}" if line else source
    return RecipeError(f"{where}: {path}: {msg}{more}", field=path, problem=msg + more, file=source, line=line)


def _did_you_mean(loc: list[str]) -> str:
    """`` (did you mean train.batch_size?)`` for the unknown field at ``loc`` when a field of its section is
    spelled closely enough (difflib), else nothing."""
    *section, key = loc or [""]
    model: Any = Recipe
    for part in section:
        field = model.model_fields.get(part)
        model = next((t for t in (field.annotation, *get_args(field.annotation)) if isinstance(t, type)
                      and issubclass(t, BaseModel)), None) if field is not None else None
        if model is None:
            return ""
    close = difflib.get_close_matches(key, list(model.model_fields), n=1, cutoff=0.6)
    return f" (did you mean {'.'.join([*section, close[0]])}?)" if close else ""


def _shown(value: Any, limit: int = 60) -> str:
    """A value as an error shows it: its repr, cut to ``limit`` characters with its full length said."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _find_line(text: str, path: str) -> int | None:
    """Best-effort line of ``path`` in the TOML text (section headers and ``key =`` lines)."""
    *section, key = path.split(".")
    want = ".".join(section)
    current = ""
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        header = re.fullmatch(r"\[\s*([\w.\-]+)\s*\]", stripped)
        if header:
            current = header.group(1)
            if current == path:
                return number
            continue
        match = re.match(r"([\w.\-]+)\s*=", stripped)
        if not match:
            continue
        full = ".".join(p for p in (current, match.group(1)) if p)
        if full == path or (current == want and match.group(1) == key):
            return number
    return None
