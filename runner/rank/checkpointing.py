"""Checkpoints and the saved adapter or model, on every rank.

With ``train.save_every`` (and at a graceful stop) every rank takes part in accelerate's ``save_state`` into
``RUN/checkpoints/step-N`` (:mod:`runner.spec.checkpoint`); a run whose recipe sets ``train.resume_from`` to
such a folder restores model or adapter, optimizer, scheduler and RNG states after ``prepare``
(:class:`Checkpointer`). Loading runs no code from the folder: every pickled file is read with
``torch.load(weights_only=True)``, and a torch distributed checkpoint's metadata (a plain pickle) only
from a folder whose manifest this ftui home signed (:func:`load_state`). At the end the adapter (LoRA) or model (full) is written to ``RUN/output`` and
read back (:func:`save_accelerated`, :func:`save_gathered`).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from runner.data.cache import source_digest
from runner.spec import checkpoint as ck
from runner.spec import events as ev

if TYPE_CHECKING:
    from runner.rank.context import DataShape, Setup


def check_resume(setup: Setup, shape: DataShape) -> dict[str, Any]:
    """The manifest of ``train.resume_from``, checked against this run (one-line errors)."""
    train = setup.recipe.train
    assert train.resume_from is not None
    # The pre-flight verified every file's hash; each rank checks the manifest and sizes (cheap).
    manifest = ck.check_resume(train.resume_from, setup.accelerator.num_processes, setup.recipe.launch.strategy,
                               content=False)
    data = manifest.get("data") or {}
    here = {"rows": shape.rows, "rows_per_step": shape.rows_per_step, "steps_per_epoch": shape.steps_per_epoch}
    for key, value in here.items():
        if data.get(key) != value:
            raise ck.CheckpointError(
                f"train.resume_from: the checkpoint's data position does not fit this run ({key} "
                f"{data.get(key)} there, {value} here): same data and batch needed"
            )
    if int(manifest["step"]) >= shape.stop_step:
        raise ck.CheckpointError(
            f"train.resume_from: the checkpoint is at step {manifest['step']}, the run stops after step "
            f"{shape.stop_step}: nothing left to train (raise train.max_steps or train.stop_after)"
        )
    return manifest


class Checkpointer:
    """Resumable checkpoints of a model and optimizer that accelerate prepared.

    What save_state writes: under FSDP a sharded torch distributed checkpoint (every rank writes its own
    shard; the full-state-dict path segfaulted under FSDP1 on CPU, docs/cpu-facts.md). Elsewhere, for LoRA,
    only the trainable tensors: the frozen base is rebuilt from the recipe.
    """

    def __init__(self, setup: Setup, model: Any, shape: DataShape) -> None:
        self.setup = setup
        self.model = model
        self.shape = shape
        self.adapter_keys: set[str] | None = None
        self.data_fingerprint = source_digest(setup.recipe.data.source)  # once: the data does not change mid-run
        acc = setup.accelerator
        if acc.distributed_type.value == "FSDP":
            plugin = acc.state.fsdp_plugin
            plugin.state_dict_config = plugin.optim_state_dict_config = None
            plugin.set_state_dict_type("SHARDED_STATE_DICT")
            return
        if setup.recipe.method.type == "full":
            return
        # Names without DDP's "module." prefix: accelerate hands save_state the module's own state dict.
        keys = {plain_name(name) for name, p in model.named_parameters() if p.requires_grad}
        self.adapter_keys = keys

        def only_trainable(models: list[Any], weights: list[dict[str, Any]], output_dir: str) -> None:
            for i, sd in enumerate(weights):
                weights[i] = {k: v for k, v in sd.items() if plain_name(k) in keys}

        acc.register_save_state_pre_hook(only_trainable)

    def save(self, step: int, epoch: int, tokens_done: int, reason: Literal["every", "stop"]) -> str:
        """Write a resumable checkpoint of this step (every rank takes part); return its folder.

        ``ftui.json`` says ``complete: false`` until every rank has written its part (a barrier)
        and rank 0 has checked that each rank's part is there; only then ``complete: true``."""
        setup = self.setup
        acc = setup.accelerator
        recipe, shape = setup.recipe, self.shape
        t0 = time.perf_counter()
        folder = ck.checkpoint_dir(setup.run_dir, step)
        manifest: dict[str, Any] = {
            "format": ck.FORMAT,
            "step": step,
            "epoch": epoch,
            "tokens_done": tokens_done,
            "data": {"rows": shape.rows, "rows_per_step": shape.rows_per_step,
                     "steps_per_epoch": shape.steps_per_epoch, "total_steps": shape.total_steps}
            | {"step_in_epoch": step % shape.steps_per_epoch, "seed": recipe.train.seed,
               "shuffle": recipe.data.shuffle, "fingerprint": self.data_fingerprint},
            "recipe_digest": recipe.model_copy(
                update={"train": recipe.train.model_copy(update={"resume_from": None})}).digest(),
            "world_size": acc.num_processes,
            "strategy": recipe.launch.strategy,
            "distributed_type": acc.distributed_type.value,
            "method": recipe.method.type,
            "reason": reason,
            "complete": False,
        }
        # Several machines: each writes its own ranks' parts into its own run folder, and its first
        # rank checks them and writes that folder's manifest (one machine: the main process).
        nnodes = int(os.environ.get("FTUI_NNODES", "1"))
        here = acc.is_local_main_process if nnodes > 1 else acc.is_main_process
        local = int(os.environ.get("LOCAL_WORLD_SIZE", acc.num_processes))
        node_ranks = range(int(os.environ.get("GROUP_RANK", "0")) * local, (int(os.environ.get("GROUP_RANK", "0")) + 1)
                           * local) if nnodes > 1 else None
        if nnodes > 1:  # model, optimizer and scheduler into every node's folder: each node resumes from its own
            acc.project_configuration.save_on_each_node = True
        if here:
            folder.mkdir(parents=True, exist_ok=True)
            ck.write_manifest(folder, manifest)
        acc.wait_for_everyone()
        acc.save_state(str(folder), safe_serialization=True)
        acc.wait_for_everyone()
        removed: list[str] = []
        size = 0
        if here:
            missing = ck.missing_rank_parts(folder, acc.num_processes, node_ranks, metadata=acc.is_main_process)
            if missing:
                raise RuntimeError(f"checkpoint {folder.name}: parts missing after the save: {', '.join(missing)}")
            sealed = ck.seal(folder, manifest)  # data files fsynced and hashed before the manifest says complete
            size = sealed["bytes"]
            ck.write_manifest(folder, sealed)
            removed = ck.prune(setup.run_dir, recipe.train.keep_checkpoints, folder)
        acc.wait_for_everyone()
        setup.emit(ev.CheckpointEvent(type="checkpoint", step=step, path=str(folder), seconds=time.perf_counter() - t0,
                                     bytes=size, reason=reason, removed=removed))
        return str(folder)

    def load(self, folder: Path) -> None:
        """Restore model (or adapter), optimizer, scheduler and RNG states from ``folder``."""
        kwargs: dict[str, Any] = {}
        if self.adapter_keys is not None:
            from safetensors import safe_open

            with safe_open(str(folder / "model.safetensors"), framework="pt") as fh:
                saved = set(fh.keys())
            if {plain_name(k) for k in saved} != self.adapter_keys:
                raise ck.CheckpointError(
                    f"train.resume_from: the checkpoint's {len(saved)} tensors are not this run's "
                    f"{len(self.adapter_keys)} trainable ones (another method, model or LoRA shape?)"
                )
            kwargs["strict"] = False  # the frozen base is not in the file; the checks here stand in
        load_state(self.setup.accelerator, folder, **kwargs)
        if self.adapter_keys is not None:
            # strict=False would also pass over keys that match nothing: check every tensor arrived.
            from safetensors.torch import load_file

            saved_tensors = load_file(str(folder / "model.safetensors"))
            params = {plain_name(n): p for n, p in self.model.named_parameters()}
            wrong = [k for k, v in saved_tensors.items() if not params[plain_name(k)].detach().cpu().equal(v)]
            if wrong:
                raise ck.CheckpointError(f"train.resume_from: {len(wrong)} tensors did not load, e.g. {wrong[0]}")


def load_state(acc: Any, folder: Path, **kwargs: Any) -> None:
    """accelerate's ``load_state`` of ``folder``, loading nothing that can run code: the registered
    objects (the lr scheduler, ``custom_checkpoint_N.pkl``, which accelerate reads with
    ``weights_only=False``) are read with ``weights_only=True`` (:func:`load_plain_state`), and a torch
    distributed checkpoint (whose metadata torch unpickles) only from a folder this ftui home signed.

    Raises:
        CheckpointError: one line naming ``train.resume_from`` and the file that could not be loaded.
    """
    import accelerate.accelerator  # deferred: torch

    if any(folder.glob(f"*/{ck.UNSAFE_NAME}")) and (reason := ck.untrusted(folder)) is not None:
        raise ck.CheckpointError(f"train.resume_from: refused to load its torch distributed checkpoint metadata "
                                 f"(a pickle, which can run code): {reason}")
    # accelerate's load_state calls this module-level name for each registered object; it is ours for the call.
    accelerates = accelerate.accelerator.load_custom_state
    accelerate.accelerator.load_custom_state = load_plain_state
    try:
        acc.load_state(str(folder), **kwargs)
    except ck.CheckpointError:
        raise
    except Exception as exc:  # noqa: BLE001 (any failure of a load is this one line)
        raise ck.CheckpointError(f"train.resume_from: {load_failure(folder, exc)}") from None
    finally:
        accelerate.accelerator.load_custom_state = accelerates


def load_plain_state(obj: Any, path: str, index: int = 0) -> None:
    """Restore a registered object from ``custom_checkpoint_{index}.pkl`` in ``path``, read as plain data
    (``weights_only=True``: tensors, numbers, strings, containers; a pickle naming anything else is refused).

    Raises:
        CheckpointError: one line naming the file.
    """
    import torch  # deferred: torch

    file = Path(path) / f"custom_checkpoint_{index}.pkl"
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 (an unpickling error names the global it refused)
        raise ck.CheckpointError(f"train.resume_from: {file}: not loadable as plain data, refused: "
                                 f"{one_line(exc)}") from None
    obj.load_state_dict(state)


def load_failure(folder: Path, exc: BaseException) -> str:
    """Why loading ``folder`` failed, naming the file: the first whose content is not what was written
    (the files are hashed only now, after a failure), else the loader's own error."""
    try:
        ck.verify(folder)
    except ck.CheckpointError as damaged:
        return str(damaged)
    return f"{folder}: loading failed: {one_line(exc)}"


def one_line(exc: BaseException) -> str:
    """An exception as one short line: its type and the first line of its message."""
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first[:300]}"


def save_accelerated(setup: Setup, model: Any) -> str:
    """Save the adapter (LoRA) or model (full) of an accelerate-prepared model to RUN/output; verify that
    something was written."""
    acc = setup.accelerator
    out = setup.run_dir / ev.OUTPUT_DIR
    lora = setup.recipe.method.type != "full"
    state_dict = full_state_dict(model, acc, trainable_only=lora)
    if acc.is_main_process:
        unwrapped = acc.unwrap_model(model)
        if state_dict is not None and lora:
            save_adapter(unwrapped, state_dict, out)
        else:
            unwrapped.save_pretrained(str(out), state_dict=state_dict, safe_serialization=True)
        setup.tokenizer.save_pretrained(str(out))
        verify_saved(out)
    acc.wait_for_everyone()
    return str(out)


def save_gathered(setup: Setup, parts: list[dict[str, Any]], full_model: Any, core: Any) -> str:
    """Save every process's ``parts`` (``full name -> CPU tensor``) as the adapter (LoRA, in ``full_model``'s
    format) or the model (full, ``core``'s ``save_pretrained``) on rank 0."""
    acc = setup.accelerator
    out = setup.run_dir / ev.OUTPUT_DIR
    if acc.is_main_process:
        merged: dict[str, Any] = {}
        for part in parts:
            merged.update(part)
        if setup.recipe.method.type != "full":
            save_adapter(full_model, merged, out)
        else:
            core.save_pretrained(str(out), state_dict=merged, safe_serialization=True)
        setup.tokenizer.save_pretrained(str(out))
        verify_saved(out)
    acc.wait_for_everyone()
    return str(out)


def plain_name(name: str) -> str:
    """A parameter or state-dict key without DDP's ``module.`` prefix."""
    return name.removeprefix("module.")


def full_state_dict(model: Any, acc: Any, trainable_only: bool) -> Any:
    """A full (unsharded) state dict on rank 0 for FSDP, None otherwise (save_pretrained reads the
    model). Uses torch's distributed-checkpoint API: accelerate's FSDP1 full-state-dict path
    segfaulted on CPU (docs/cpu-facts.md)."""
    if acc.distributed_type.value == "DEEPSPEED" and model.zero_optimization_stage() == 3:
        # ZeRO-3's weights are partitions: DeepSpeed gathers them onto rank 0 (every rank takes part;
        # stage3_gather_16bit_weights_on_model_save in runner/spec/deepspeed_config.py). The adapter's keys are
        # picked by save_adapter.
        gathered = acc.get_state_dict(model)
        return {clean_fqn(k): v for k, v in (gathered or {}).items()} if acc.is_main_process else None
    if acc.distributed_type.value != "FSDP":
        return None
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if getattr(getattr(acc.state, "fsdp_plugin", None), "fsdp_version", 2) == 1:
        # torch's state-dict hooks segfaulted under FSDP1 on CPU (cloning an unsharded parameter);
        # summoning the full parameters and copying them ourselves works on CPU and GPU alike.
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        wanted = {clean_fqn(n) for n, p in model.named_parameters() if p.requires_grad or not trainable_only}
        with FSDP.summon_full_params(model, writeback=False):
            sd = {
                clean_fqn(n): p.detach().to("cpu", copy=True)
                for n, p in model.named_parameters()
                if clean_fqn(n) in wanted
            }
    else:
        # An adapter needs only the trainable tensors; gathering the frozen base too costs memory.
        options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=trainable_only)
        sd = get_model_state_dict(model, options=options)
    return {clean_fqn(k): v for k, v in sd.items()}


def save_adapter(peft_model: Any, state_dict: dict[str, Any], out: Path) -> None:
    """Write a gathered LoRA state dict in peft's adapter format. peft's own save_pretrained matches
    keys against the module tree, which under FSDP1 still holds the FSDP wrappers, and silently
    writes an empty adapter (docs/cpu-facts.md); the gathered keys are already clean."""
    from safetensors.torch import save_file

    adapter = next(iter(peft_model.peft_config))
    tensors = {k.replace(f".{adapter}.", "."): v.contiguous() for k, v in state_dict.items() if "lora_" in k}
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    peft_model.peft_config[adapter].save_pretrained(str(out))


def clean_fqn(name: str) -> str:
    """A parameter name without FSDP1's and activation checkpointing's wrapper prefixes."""
    return name.replace("_fsdp_wrapped_module.", "").replace("_checkpoint_wrapped_module.", "")


def verify_saved(out: Path) -> None:
    """PEFT writes an EMPTY adapter under FSDP without complaint (docs/cpu-facts.md): check the tensors."""
    from safetensors import safe_open

    files = list(out.glob("*.safetensors"))
    if not files:
        raise RuntimeError(f"save: no .safetensors file written in {out}")
    count = 0
    for file in files:
        with safe_open(str(file), framework="pt") as fh:
            count += len(list(fh.keys()))
    if count == 0:
        raise RuntimeError(f"save: {files[0].name} holds no tensors (an empty adapter)")
