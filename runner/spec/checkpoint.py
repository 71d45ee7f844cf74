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
after every rank has finished (a barrier), atomically (write to a temporary name, fsync, rename). The
complete one lists every file with its size and its content hash (``digests``, blake2b), taken while
each data file is fsynced, before the manifest: a power cut never leaves a complete manifest over data
still in the page cache. It is signed (``signature``: an HMAC with this ftui home's key,
:func:`signing_key`), so a folder that ftui did not write, or whose manifest was edited, is told apart.

Two levels of checking: :func:`check_complete` (the manifest says complete, every file is there with its
size; cheap, for listing and pruning) and :func:`verify` (every file's content matches its hash; at resume).
A save cut short by a crash or a SIGKILL, and a file damaged later, are never taken for a good checkpoint.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from runner.spec.paths import home

CHECKPOINTS_DIR = "checkpoints"
MANIFEST = "ftui.json"
FORMAT = 1
_NAME = re.compile(r"step-(\d+)")
KEY_FILE = "checkpoint.key"
"""The signing key of this ftui home's checkpoints (32 random bytes, only the user may read it)."""
UNSAFE_NAME = ".metadata"
"""The one file of a checkpoint loaded as a plain pickle: a torch distributed checkpoint's (FSDP) metadata
(torch reads it with ``pickle.load``). Unpickling it runs whatever code it names, so it is loaded only
from a checkpoint this ftui home signed (:func:`untrusted`); every other file is read as safetensors or
with ``torch.load(weights_only=True)`` (``runner/rank/checkpointing.py``)."""


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
    tmp = folder / f".{MANIFEST}.{os.getpid()}.tmp"  # (two machines may adopt copies into one folder)
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(manifest, indent=2, allow_nan=False) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, folder / MANIFEST)
    sync_dir(folder)


def signing_key() -> bytes:
    """This ftui home's key for signing checkpoint manifests, created (0600) on first use.

    Every process of a run reads the same file (``FTUI_HOME``); two creating it at once agree, since
    the first link wins and the other reads it."""
    path = home() / KEY_FILE
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{KEY_FILE}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(secrets.token_bytes(32))
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    return path.read_bytes()


def signature(manifest: dict[str, Any], key: bytes) -> str:
    """The HMAC-SHA256 of a manifest's canonical JSON, its own ``signature`` left out."""
    body = json.dumps({k: v for k, v in manifest.items() if k != "signature"}, sort_keys=True,
                      separators=(",", ":"), allow_nan=False)
    return hmac.new(key, body.encode(), hashlib.sha256).hexdigest()


def file_digest(path: Path, sync: bool = False) -> str:
    """The blake2b of a file's content, read in 1 MiB chunks; with ``sync``, the file is fsynced too."""
    digest = hashlib.blake2b(digest_size=32)
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
        if sync:
            os.fsync(fh.fileno())
    return digest.hexdigest()


def seal(folder: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """The complete manifest of a written checkpoint: every file's size and hash, signed. Every data
    file and folder is fsynced here, so the manifest that :func:`write_manifest` then writes never
    promises data that a power cut could still lose."""
    files = file_sizes(folder)
    digests = {name: file_digest(folder / name, sync=True) for name in files}
    for sub in {(folder / name).parent for name in files} | {folder}:
        sync_dir(sub)
    sealed = manifest | {"files": files, "digests": digests, "bytes": sum(files.values()), "complete": True}
    return sealed | {"signature": signature(sealed, signing_key())}


def sync_dir(folder: Path) -> None:
    """fsync a folder, so the names of the files in it survive a power cut."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def file_sizes(folder: Path) -> dict[str, int]:
    """Every file under ``folder`` (relative path -> bytes), the manifest itself excluded."""
    sizes: dict[str, int] = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and path.name != MANIFEST and not path.name.startswith(f".{MANIFEST}."):
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


def verify(folder: Path, only: Iterable[str] | None = None) -> dict[str, Any]:
    """The manifest of a complete checkpoint whose files hold what was written: each listed file's
    content matches its hash (``only``: these files' alone). A manifest without hashes (written by an
    older ftui) is checked by sizes only.

    Raises:
        CheckpointError: one line naming the folder and the first file that does not match.
    """
    manifest = check_complete(folder)
    digests = manifest.get("digests") or {}
    names = sorted(digests) if only is None else [n for n in only if n in digests]
    for name in names:
        if file_digest(folder / name) != digests[name]:
            raise CheckpointError(f"{folder}: damaged checkpoint ({name}'s content is not what was written: "
                                  "its hash differs)")
    return manifest


def untrusted(folder: Path) -> str | None:
    """Why ``folder``'s pickled metadata (:data:`UNSAFE_NAME`) may not be unpickled, or None when it may:
    the manifest is signed with this ftui home's key and lists every such file with a matching hash."""
    manifest = read_manifest(folder) or {}
    if not signed(manifest):
        return f"{folder}: its manifest is not signed by this ftui home (written elsewhere, by hand or edited)"
    pickled = sorted(str(p.relative_to(folder)) for p in folder.rglob(UNSAFE_NAME))
    unlisted = [name for name in pickled if name not in (manifest.get("digests") or {})]
    if unlisted:
        return f"{folder}: {unlisted[0]} is not in its signed manifest"
    try:
        verify(folder, only=pickled)
    except CheckpointError as exc:
        return str(exc)
    return None


def signed(manifest: dict[str, Any]) -> bool:
    """Whether a manifest carries this ftui home's valid signature."""
    sign = manifest.get("signature")
    return isinstance(sign, str) and hmac.compare_digest(sign, signature(manifest, signing_key()))


def adopt(folder: Path, copied: dict[str, Path]) -> list[str]:
    """List in ``folder``'s signed manifest the files copied into it from another machine's folder of the
    same checkpoint (name here -> source file), each only when the copy's hash is the one the source's
    manifest lists; re-sign. Returns the names listed: a copy left out is never unpickled
    (:func:`untrusted`).

    The sources are the run's own node folders, found through the store (never a path a user gave), so
    their manifests vouch for the copies' content although another machine's ftui home signed them (each
    machine has its own key)."""
    manifest = read_manifest(folder) or {}
    if not signed(manifest):
        return []
    added: list[str] = []
    for name, src in sorted(copied.items()):
        src_folder = src.parents[len(Path(name).parts) - 1]
        theirs = read_manifest(src_folder) or {}
        digest = (theirs.get("digests") or {}).get(name)
        if theirs.get("complete") and digest is not None and file_digest(folder / name, sync=True) == digest:
            manifest["files"][name] = (folder / name).stat().st_size
            manifest["digests"][name] = digest
            added.append(name)
    if added:
        write_manifest(folder, manifest | {"signature": signature(manifest, signing_key())})
    return added


def newest_verified(run_dir: Path) -> tuple[Path | None, list[str]]:
    """A run's newest checkpoint that :func:`verify` passes, and one line for each newer folder passed
    over and why (a save cut short, a damaged file): nothing is skipped without saying so."""
    root = checkpoints_root(run_dir)
    folders = sorted(((step, p) for p in root.iterdir() if (step := step_of(p)) is not None),
                     reverse=True) if root.is_dir() else []
    skipped: list[str] = []
    for _, folder in folders:
        try:
            verify(folder)
        except CheckpointError as exc:
            skipped.append(f"checkpoint {folder.name} skipped: {str(exc).removeprefix(f'{folder}: ')}")
            continue
        return folder, skipped
    return None, skipped


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


def check_resume(path: str, world_size: int, strategy: str, content: bool = True) -> dict[str, Any]:
    """The manifest of the checkpoint a run resumes from, checked against the run's shape; with
    ``content``, every file's hash too (:func:`verify`; the pre-flight does, once, and the ranks do not).

    Raises:
        CheckpointError: one line naming ``train.resume_from``: not a complete checkpoint, a file whose
            content is not what was written, or taken with another world size or strategy (resharding is
            not supported).
    """
    try:
        manifest = verify(Path(path)) if content else check_complete(Path(path))
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
