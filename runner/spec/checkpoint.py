"""Resumable checkpoints on disk: their folders, the ``ftui.json`` manifest, finding, checking, pruning.

A run writes its checkpoints into its own folder::

    RUN/checkpoints/step-00000004/
        model.safetensors | pytorch_model_fsdp_0/   model, or only the trainable tensors (LoRA);
                                                    under FSDP a sharded torch distributed checkpoint
        optimizer.bin | optimizer_0/                optimizer state (sharded under FSDP)
        custom_checkpoint_0.pkl                     the lr scheduler
        random_states_{rank}.pkl                    each rank's RNG states
        ftui.json                                   the manifest, written last

The files other than ``ftui.json`` are accelerate's ``save_state``; the trainer writes them
(``runner/rank/trainer.py``). This module only reads and writes the manifest and folders, so the
orchestrator and the CLI can find and check a checkpoint without torch.

The manifest is written twice: ``complete: false`` before any rank writes, and ``complete: true``
with the list of files and their sizes after every rank has finished (a barrier), atomically
(write to a temporary name, fsync, rename). A checkpoint counts as complete only when its manifest
says so and every listed file is there with its size: a save cut short by a crash or a SIGKILL is
never taken for a good one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

CHECKPOINTS_DIR = "checkpoints"
MANIFEST = "ftui.json"
FORMAT = 1
_NAME = re.compile(r"step-(\d+)")


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed from, phrased as one line."""


def checkpoints_root(run_dir: Path) -> Path:
    """The folder holding a run's checkpoints."""
    return run_dir / CHECKPOINTS_DIR


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    """The folder of the checkpoint taken after optimizer step ``step`` (1-based)."""
    return checkpoints_root(run_dir) / f"step-{step:08d}"


def step_of(folder: Path) -> int | None:
    """The step a checkpoint folder's name says, or None for a foreign name."""
    match = _NAME.fullmatch(folder.name)
    return int(match.group(1)) if match else None


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """The manifest of a checkpoint folder, or None when it is missing or unreadable."""
    try:
        data = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_manifest(folder: Path, manifest: dict[str, Any]) -> None:
    """Write the manifest atomically: a reader sees the old one or the new one, never half."""
    tmp = folder / f".{MANIFEST}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(manifest, indent=2, allow_nan=False) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, folder / MANIFEST)


def file_sizes(folder: Path) -> dict[str, int]:
    """Every file under ``folder`` (relative path -> bytes), the manifest itself excluded."""
    sizes: dict[str, int] = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and path.name not in (MANIFEST, f".{MANIFEST}.tmp"):
            sizes[str(path.relative_to(folder))] = path.stat().st_size
    return sizes


def missing_rank_parts(folder: Path, world_size: int, ranks: range | None = None, metadata: bool = True) -> list[str]:
    """The per-rank parts that should be in a checkpoint of ``world_size`` ranks and are not: each
    rank's RNG states, and in every torch distributed checkpoint folder (FSDP) its metadata and one
    data file per rank (``__{rank}_*.distcp``).

    ``ranks``: only these ranks' parts (one machine of a multi-node run checks the parts its own ranks
    wrote into its own folder); ``metadata``: whether the DCP metadata (rank 0's) belongs here."""
    ranks = ranks if ranks is not None else range(world_size)
    missing = [f"random_states_{r}.pkl" for r in ranks if not (folder / f"random_states_{r}.pkl").is_file()]
    for dcp in sorted(p for p in folder.iterdir() if p.is_dir()):
        if metadata and not (dcp / ".metadata").is_file():
            missing.append(f"{dcp.name}/.metadata")
        for r in ranks:
            if not any(dcp.glob(f"__{r}_*.distcp")):
                missing.append(f"{dcp.name}/__{r}_*.distcp")
    return missing


def is_complete(folder: Path) -> bool:
    """Whether ``folder`` holds a complete checkpoint (see :func:`check_complete`)."""
    try:
        check_complete(folder)
    except CheckpointError:
        return False
    return True


def check_complete(folder: Path) -> dict[str, Any]:
    """The manifest of a complete checkpoint.

    Raises:
        CheckpointError: one line: no such folder, no manifest, not marked complete, or a listed file
            missing or of another size.
    """
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: no such checkpoint folder")
    manifest = read_manifest(folder)
    if manifest is None:
        raise CheckpointError(f"{folder}: not a checkpoint (no readable {MANIFEST})")
    if manifest.get("complete") is not True:
        raise CheckpointError(f"{folder}: incomplete checkpoint (its save did not finish)")
    for name, size in (manifest.get("files") or {}).items():
        path = folder / name
        if not path.is_file():
            raise CheckpointError(f"{folder}: incomplete checkpoint ({name} is missing)")
        if path.stat().st_size != size:
            raise CheckpointError(f"{folder}: damaged checkpoint ({name} has {path.stat().st_size} bytes, "
                                  f"{size} were written)")
    return manifest


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """A run's complete checkpoints, oldest first."""
    root = checkpoints_root(run_dir)
    if not root.is_dir():
        return []
    found = [(step, p) for p in root.iterdir() if (step := step_of(p)) is not None and is_complete(p)]
    return [p for _, p in sorted(found)]


def latest_complete(run_dir: Path) -> Path | None:
    """A run's newest complete checkpoint, or None."""
    found = complete_checkpoints(run_dir)
    return found[-1] if found else None


def prune(run_dir: Path, keep: int, current: Path) -> list[str]:
    """Delete all but the newest ``keep`` complete checkpoints, and any incomplete folder older than
    ``current`` (left by a save that never finished). Returns the names removed."""
    root = checkpoints_root(run_dir)
    complete = complete_checkpoints(run_dir)
    doomed = complete[:-keep] if keep > 0 else complete
    current_step = step_of(current) or 0
    for p in root.iterdir():
        step = step_of(p)
        if step is not None and step < current_step and p not in complete:
            doomed.append(p)
    removed = []
    for p in sorted(set(doomed)):
        shutil.rmtree(p, ignore_errors=True)
        removed.append(p.name)
    return removed


def check_resume(path: str, world_size: int, strategy: str) -> dict[str, Any]:
    """The manifest of the checkpoint a run resumes from, checked against the run's shape.

    Raises:
        CheckpointError: one line naming ``train.resume_from``: not a complete checkpoint, or taken
            with another world size or strategy (resharding is not supported).
    """
    try:
        manifest = check_complete(Path(path))
    except CheckpointError as exc:
        raise CheckpointError(f"train.resume_from: {exc}") from None
    if manifest.get("format") != FORMAT:
        raise CheckpointError(f"train.resume_from: {path}: checkpoint format {manifest.get('format')!r}, "
                              f"this ftui reads {FORMAT}")
    if manifest.get("world_size") != world_size or manifest.get("strategy") != strategy:
        raise CheckpointError(
            f"train.resume_from: the checkpoint was taken with strategy {manifest.get('strategy')} on "
            f"{manifest.get('world_size')} process(es), this run is {strategy} on {world_size}; "
            "resume with the same strategy and process count"
        )
    return manifest
