"""The one pre-flight of every launch, for ``ftui run``, ``ftui sweep`` and the TUI's Launch alike.

What cannot run is refused before anything is recorded, so that bad input is one line and exit 2 with
nothing stored, instead of a ``failed`` row seconds after launch: the data (read and parsed), the run
folders, the model folder, the accelerate config, what the host can run (CPU or GPU, the process
count of the strategy), the checkpoint to resume from. Warnings are what a person should see before a
launch: the recipe's inputs and busy or too-small GPUs.
"""

from __future__ import annotations

import ctypes.util
import importlib.util
import os
from pathlib import Path

from runner.data.cache import source_digest
from runner.data.check import check_data
from runner.data.prepare import prefill
from runner.data.rows import DataError, check_source
from runner.hardware import check_gpus_free, visible_mapping
from runner.hardware.disks import filesystem_of
from runner.planner import DEFAULT_RESERVE, checkpoint_bytes, inputs_from_recipe, parse_bytes
from runner.planner.hub import hub_model_problem
from runner.spec import kernels, layout, strategies, switches, zero
from runner.spec.builtin import BUILTIN_PREFIX, MODELS
from runner.spec.checkpoint import CheckpointError, check_resume
from runner.spec.paths import FolderError, check_runs_dir, runs_dir
from runner.spec.recipe import Recipe, RecipeError
from runner.spec.script import check_script
from runner.watch.estimate import estimate_summary
from runner.watch.host import cuda_device_count, nproc_over_host, probe_for, runs_on_cpu


class PreflightError(RecipeError):
    """A problem found before launch; one line naming the field or file."""


class ModelNotHereError(PreflightError):
    """A hub model neither in the Hugging Face cache nor on a reachable hub: a run cannot load it, a dry run
    (which loads nothing) only warns."""


class InputError(RecipeError):
    """A recipe's data or folders are unusable; one line naming the field or file."""


def launch_checks(recipe: Recipe, fake_gpus: int = 0, allow_data_change: bool = False,
                  dry_run: bool = False, force: bool = False) -> list[str]:
    """Check a recipe before launch.

    Args:
        recipe: the validated recipe.
        fake_gpus: scripted GPUs of the demo mode (0: the real NVML).
        allow_data_change: resume from a checkpoint although its data source changed since.
        dry_run: nothing will be loaded (``--dry-run``): a hub model that is not here yet is a warning.
        force: start more processes than this host has devices for (``--force``).

    Returns:
        Warnings, one line each (empty when nothing is worth saying).

    Raises:
        PreflightError: the run cannot start (a RecipeError naming the field).
        InputError: its data or folders are unusable.
    """
    warnings = preflight(recipe, allow_data_change, dry_run, fake_gpus, force)
    return warnings + input_warnings(recipe) + gpu_warnings(recipe, fake_gpus)


def preflight(recipe: Recipe, allow_data_change: bool = False, dry_run: bool = False, fake_gpus: int = 0,
              force: bool = False) -> list[str]:
    """Check what can be checked before launch; raise :class:`PreflightError`, return warnings.
    ``allow_data_change``: a checkpoint to resume from may have been taken on other data; ``dry_run``:
    nothing will be loaded, so a hub model not here yet is a warning; ``fake_gpus``: the demo mode's
    scripted GPUs, which ``launch.gpus`` may name; ``force``: more processes than this host has devices
    for are started anyway."""
    if not force:
        check_host_nproc(recipe)
    if recipe.launch.script is not None:  # a script run: the script owns its model and data
        return _script_preflight(recipe)
    _check_switches(recipe, runs_on_cpu(recipe), fake_gpus)  # before the data step: a refusal costs nothing
    check_kernels(recipe)
    warnings: list[str] = []
    check_files(recipe)
    try:
        _check_model(recipe)  # before the data step, which loads a model folder's tokenizer
    except ModelNotHereError as exc:
        if not dry_run:
            raise
        warnings.append(f"{exc} (a real run is refused until it is)")
    rows = check_inputs(recipe)
    problem = None if rows is None else layout.batch_problem(recipe, rows)
    if problem:
        raise PreflightError(problem, field="train.batch_size", problem=problem.split(": ", 1)[1])
    _check_device(recipe, fake_gpus)
    on_cpu = runs_on_cpu(recipe)
    if recipe.method.type == "qlora" and on_cpu:
        raise PreflightError("method.type: qlora needs a CUDA GPU (bitsandbytes 4-bit); none is visible here")
    if recipe.train.precision == "fp16" and on_cpu:
        raise PreflightError("train.precision: fp16 needs a GPU; use bf16 or fp32 on CPU")
    strategy = strategies.resolve(recipe.launch.strategy, recipe.launch.engine)
    missing = zero.engine_missing(strategy.engine)
    if missing:
        raise PreflightError(missing)
    problem = strategy.nproc_problem(recipe.launch.nproc * (recipe.launch.nnodes or 1), on_cpu=on_cpu)
    if problem:
        raise PreflightError(f"launch.nproc: {problem}")
    if on_cpu and strategy.layer_split and recipe.launch.nproc == 1:
        warnings.append("mp on a CPU-only machine: one device, so this is the single-process run")
    if recipe.train.resume_from is not None:
        _check_resume(recipe, allow_data_change)
    return warnings


def _check_switches(recipe: Recipe, on_cpu: bool, fake_gpus: int = 0) -> None:
    """Context parallel, fp8, activation and NVMe offload need what this host may lack: CUDA, a GPU's compute
    capability, torchao, DeepSpeed's async_io op (:func:`runner.spec.switches.host_problems`)."""
    problems = switch_host_problems(recipe, on_cpu, fake_gpus)
    if problems:
        field, _, problem = problems[0].partition(": ")
        raise PreflightError(problems[0], field=field, problem=problem)


def switch_host_problems(recipe: Recipe, on_cpu: bool, fake_gpus: int = 0) -> list[str]:
    """Why this host cannot run the recipe's context parallel, fp8, activation or NVMe offload, one line each
    (:func:`runner.spec.switches.host_problems` with this host's facts); empty when it can."""
    launch, train = recipe.launch, recipe.train
    if launch.cp_size == 1 and train.precision != "fp8" and not train.activation_offload and launch.offload != "nvme":
        return []
    infos = probe_for(fake_gpus).nvml.gpu_infos() if not on_cpu and train.precision == "fp8" else []
    used = [i for i in infos if launch.gpus is None or i.index in launch.gpus]
    host = switches.HostFacts(
        cuda=not on_cpu, capabilities=[i.compute_capability for i in used],
        torchao=importlib.util.find_spec("torchao") is not None,
        async_io=async_io_problem() if launch.offload == "nvme" else None)
    return switches.host_problems(recipe, host)


def host_problem(recipe: Recipe, fake_gpus: int = 0) -> str | None:
    """The first thing this host lacks for the recipe's efficiency switches and kernels (one line naming the
    field), or None: what :func:`preflight` refuses them for, without raising (``ftui estimate`` and Compose
    ask it of each switch)."""
    on_cpu = runs_on_cpu(recipe)
    found = switch_host_problems(recipe, on_cpu, fake_gpus)
    return found[0] if found else kernels.host_problem(recipe, on_cpu)


def async_io_problem() -> str | None:
    """Why DeepSpeed's ``async_io`` op (ZeRO-Infinity's NVMe swapping) cannot run here, or None. libaio is
    looked for first (a library lookup); only with it does DeepSpeed's own check compile its test program."""
    if ctypes.util.find_library("aio") is None:
        return "libaio is not installed (Debian: apt-get install libaio-dev)"
    if importlib.util.find_spec("deepspeed") is None:
        return "deepspeed is not installed (pip install -e '.[deepspeed]')"
    from deepspeed.ops.op_builder import AsyncIOBuilder  # deferred: deepspeed imports torch

    if not AsyncIOBuilder().is_compatible(verbose=False):
        return "AsyncIOBuilder().is_compatible() is false (libaio's headers, libaio-dev, or a compiler missing)"
    return None


def check_files(recipe: Recipe) -> None:
    """The files and folders the recipe names exist: the data (and eval data) file, a model folder with
    its ``config.json``, the accelerate config. Cheap (a few stats, nothing read): Compose asks it on
    every change, so that "valid recipe" means what the pre-flight will find; :func:`preflight` reads the
    data itself after this.

    Raises:
        PreflightError: one line naming the field and the missing file or folder.
    """
    if recipe.launch.script is not None:
        return  # a script run: check_script owns its files
    try:
        check_source(recipe.data.source)
        if recipe.data.eval_source is not None:
            check_source(recipe.data.eval_source, "data.eval_source")
    except DataError as exc:
        field, _, problem = str(exc).partition(": ")
        raise PreflightError(str(exc), field=field, problem=problem) from None
    name = recipe.model.name
    if _is_local_model(name) and not (Path(name).expanduser() / "config.json").is_file():
        problem = f"{name}: not a model folder (no config.json)"
        raise PreflightError(f"model.name: {problem}", field="model.name", problem=problem)
    config = recipe.launch.accelerate_config
    if config is not None and not Path(config).expanduser().is_file():
        raise PreflightError(f"launch.accelerate_config: {config}: no such file", field="launch.accelerate_config",
                             problem=f"{config}: no such file")


def _is_local_model(name: str) -> bool:
    """A model folder rather than a hub id: a path-like name, or one that exists here."""
    return name.startswith(("/", ".", "~")) or os.sep in name and Path(name).exists()


def check_kernels(recipe: Recipe) -> None:
    """This host can run the recipe's attention implementation and compile (:func:`runner.spec.kernels.host_problem`:
    a CUDA GPU, the flash_attn or triton package, a C++ compiler)."""
    problem = kernels.host_problem(recipe, runs_on_cpu(recipe))
    if problem:
        field, _, what = problem.partition(": ")
        raise PreflightError(problem, field=field, problem=what)


FORCE_HINT = "lower it, or pass --force to start them anyway"
"""How the command line goes on past :func:`check_host_nproc` (Compose has a toggle of its own)."""


def check_host_nproc(recipe: Recipe) -> None:
    """Refuse more processes per machine than this host has GPUs (on CPU: cores x 2): each rank holds the
    model, so they only fill memory and share the devices (:func:`runner.watch.host.nproc_over_host`)."""
    problem = nproc_over_host(recipe)
    if problem:
        raise PreflightError(f"{problem}; {FORCE_HINT}", field="launch.nproc", problem=problem.split(": ", 1)[1])


def _check_device(recipe: Recipe, fake_gpus: int = 0) -> None:
    """``launch.device = "cuda"`` and ``launch.gpus`` need a CUDA GPU here (without one the ranks would
    train on the CPU); the demo mode's scripted GPUs (``fake_gpus``) may be listed."""
    launch = recipe.launch
    if launch.device == "cuda" and cuda_device_count() == 0:
        raise PreflightError('launch.device: "cuda" but no CUDA GPU is visible here (use "auto" or "cpu")',
                             field="launch.device", problem='"cuda" but no CUDA GPU is visible here')
    if launch.gpus is not None and not fake_gpus and cuda_device_count() == 0:
        problem = f"GPUs {launch.gpus} listed but no CUDA GPU is visible here (leave it out to run on the CPU)"
        raise PreflightError(f"launch.gpus: {problem}", field="launch.gpus", problem=problem)


def _check_model(recipe: Recipe) -> None:
    """The model is there to load: the builtin one, a model folder, or a hub id in the Hugging Face cache or
    on a reachable hub; and the builtin model has the LoRA target modules named."""
    name = recipe.model.name
    local = _is_local_model(name)
    if recipe.model.revision is not None and (local or name.startswith(BUILTIN_PREFIX)):
        raise PreflightError(f"model.revision: {name[:200]} is not a hub model; a revision pins a hub id only")
    if name.startswith(BUILTIN_PREFIX):
        linear = MODELS.get(name, ())
        unknown = sorted(set(recipe.method.lora.target_modules) - set(linear))
        if recipe.method.type != "full" and unknown:
            raise PreflightError(f"method.lora.target_modules: {name} has no module {unknown[0]!r} "
                                 f"(its linear layers: {', '.join(linear)})")
        return
    if local:
        return  # check_files found its config.json
    problem = hub_model_problem(name, recipe.model.revision)
    if problem:
        raise ModelNotHereError(f"model.name: {name}: {problem}", field="model.name", problem=problem)


def _check_resume(recipe: Recipe, allow_data_change: bool) -> None:
    """The checkpoint of ``train.resume_from`` is whole (every file's hash), fits this run, was taken on
    the same data (unless ``allow_data_change``) and leaves steps to train."""
    assert recipe.train.resume_from is not None
    try:
        manifest = check_resume(recipe.train.resume_from, recipe.launch.nproc, recipe.launch.strategy)
    except CheckpointError as exc:
        raise PreflightError(str(exc)) from None
    step = manifest["step"]
    saved = (manifest.get("data") or {}).get("fingerprint")
    if saved is not None and not allow_data_change and source_digest(recipe.data.source) != saved:
        raise PreflightError(f"train.resume_from: data.source {recipe.data.source} changed since the checkpoint "
                             "was taken (its content differs); resume with --allow-data-change to go on with the "
                             "new data")
    if recipe.train.max_steps and step >= recipe.train.max_steps:
        raise PreflightError(f"train.resume_from: the checkpoint is at step {step} and train.max_steps is "
                             f"{recipe.train.max_steps}: nothing left to train")


def _script_preflight(recipe: Recipe) -> list[str]:
    """:func:`preflight` of a script run (``runner.spec.script``): the script file, run folders, processes."""
    check_script(recipe)
    _check_device(recipe)
    try:
        check_runs_dir()
    except FolderError as exc:
        raise PreflightError(f"run folders: {exc}") from None
    on_cpu = runs_on_cpu(recipe)
    if recipe.train.precision == "fp16" and on_cpu:
        raise PreflightError("train.precision: fp16 needs a GPU; use bf16 or fp32 on CPU")
    row = strategies.get(recipe.launch.strategy)
    problem = row.nproc_problem(recipe.launch.nproc, on_cpu=on_cpu)
    if problem:
        raise PreflightError(f"launch.nproc: {problem}")
    if row.hybrid and on_cpu:  # accelerate's own check, refused here before anything starts
        raise PreflightError("launch.strategy: hsdp in your own script needs GPUs: accelerate's ParallelismConfig "
                             "refuses CPU processes (ftui's own trainer builds its mesh on CPU)")
    return []


def check_inputs(recipe: Recipe) -> int | None:
    """Check the recipe's data (read and parsed: :func:`runner.data.check.check_data`) and that run
    folders can be written (:func:`runner.spec.paths.check_runs_dir`). ``ftui sweep`` calls it once for
    the sweep's recipe before the first run.

    Returns:
        The train rows (blocks) the ranks will read, where the pre-flight tokenized or found them cached
        (:func:`runner.data.prepare.prefill`); None where the ranks tokenize. Whether they fill one
        optimizer step is each run's own check (its strategy and processes), in :func:`preflight`.

    Raises:
        InputError: one line naming the field, file or folder.
    """
    try:
        check_data(recipe.data)
        # The data is tokenized here, every row checked and the blocks counted, into the cache the ranks
        # read (runner/data/prepare.py): a bad row anywhere is one line before anything is recorded.
        rows = prefill(recipe)
    except DataError as exc:
        head = str(exc).split(":", 1)[0]
        field = head if head.startswith(("data.", "model.")) else "data.source"
        raise InputError(str(exc), field=field, problem=str(exc)) from None
    try:
        check_runs_dir()
    except FolderError as exc:
        raise InputError(f"run folders: {exc}") from None
    return rows


def check_room(recipe: Recipe, root: Path | None = None) -> None:
    """The run folders' filesystem has room for one checkpoint of this run (the planner's
    :func:`runner.planner.checkpoint_bytes`; a graceful stop writes one even without ``train.save_every``).
    Checked as a run is recorded (:func:`runner.watch.prepare.prepare`), not for a dry run, which writes
    nothing. A script run (its model is its own) and a model whose shape cannot be had offline are not checked.

    Raises:
        InputError: one line naming the device, the folder and both sizes.
    """
    if recipe.launch.script is not None:
        return
    root = root or runs_dir()
    try:
        need = checkpoint_bytes(inputs_from_recipe(recipe, allow_network=False))
    except Exception:  # noqa: BLE001 (no shape offline: nothing to check against)
        return
    fs = filesystem_of(root)
    if fs.free_bytes < need:
        raise InputError(f"run folders: no room for a checkpoint on {fs.name} ({root}): {_mib(need)} needed, "
                         f"{_mib(fs.free_bytes)} free (free some space, or set FTUI_HOME to a bigger disk)")


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def input_warnings(recipe: Recipe) -> list[str]:
    """What the user should know before launch about the recipe's inputs (one line each)."""
    warnings = []
    if recipe.model.trust_remote_code:
        warnings.append(f"model.trust_remote_code = true: {recipe.model.name}'s own Python code from the model "
                        "folder or the hub will run in every rank")
    return warnings


def gpu_warnings(recipe: Recipe, fake_gpus: int = 0) -> list[str]:
    """Busy GPUs, and GPUs with less free memory than the plan needs per device (the estimate), among
    those the run will use; and the CUDA_VISIBLE_DEVICES mapping.

    Args:
        recipe: the validated recipe.
        fake_gpus: scripted GPUs of the demo mode (0: the real NVML).

    Returns:
        One line each; empty on a CPU run or a machine without GPUs.
    """
    probe = probe_for(fake_gpus)
    count = probe.nvml.device_count()
    if count == 0 or recipe.launch.device == "cpu":
        return []
    need = estimate_summary(recipe).get("per_device_bytes", {}).get("total")
    if need is not None:  # plus what ftui estimate reserves per GPU (CUDA context, NCCL, allocator slack)
        need += parse_bytes(DEFAULT_RESERVE)
    visible = (",".join(map(str, recipe.launch.gpus)) if recipe.launch.gpus is not None
               else os.environ.get("CUDA_VISIBLE_DEVICES"))
    layer_split = strategies.get(recipe.launch.strategy).layer_split
    mapping = visible_mapping(visible, count)[: None if layer_split else recipe.launch.nproc]
    notes = ["GPUs (CUDA index -> physical): " + ", ".join(f"cuda:{lo} -> GPU {phys}" for lo, phys in mapping)]
    return notes + list(check_gpus_free(probe, [phys for _, phys in mapping], need_bytes=need))
