"""Checkpoints you can trust: every file's hash in a signed manifest, data fsynced before it, verified at
resume, the newest damaged one passed over with a line naming the file, and nothing loaded that can run
code. On checkpoint folders written here (real files); the loading ones on a real accelerate state."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from typing import Any

import pytest

from runner.spec import checkpoint as ck


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A home of its own: the signing key lives there."""
    monkeypatch.setenv("FTUI_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _checkpoint(run_dir: Path, step: int, world: int = 2, dcp: bool = False, data: str = "d" * 64) -> Path:
    """A checkpoint folder as a save writes it: accelerate's files, then the sealed manifest."""
    folder = ck.checkpoint_dir(run_dir, step)
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(os.urandom(256))
    (folder / "optimizer.bin").write_bytes(os.urandom(128))
    for r in range(world):
        (folder / f"random_states_{r}.pkl").write_bytes(pickle.dumps({"rank": r}))
    if dcp:
        (folder / "pytorch_model_fsdp_0").mkdir()
        (folder / "pytorch_model_fsdp_0" / ".metadata").write_bytes(pickle.dumps({"plan": [1, 2]}))
        for r in range(world):
            (folder / "pytorch_model_fsdp_0" / f"__{r}_0.distcp").write_bytes(os.urandom(64))
    manifest = {"format": ck.FORMAT, "step": step, "world_size": world, "strategy": "ddp", "complete": False,
                "data": {"fingerprint": data}}
    ck.write_manifest(folder, manifest)
    ck.write_manifest(folder, ck.seal(folder, manifest))
    return folder


def _zero(path: Path) -> None:
    path.write_bytes(bytes(path.stat().st_size))  # same size, other content: what sizes alone cannot see


def test_a_file_zeroed_at_the_same_size_is_refused_naming_it(tmp_path: Path) -> None:
    folder = _checkpoint(tmp_path, 4)
    assert ck.check_resume(str(folder), 2, "ddp")["step"] == 4
    _zero(folder / "model.safetensors")
    with pytest.raises(ck.CheckpointError) as err:
        ck.check_resume(str(folder), 2, "ddp")
    line = str(err.value)
    assert line.startswith("train.resume_from: ") and "\n" not in line
    assert "damaged checkpoint (model.safetensors's content" in line
    assert ck.check_complete(folder)["step"] == 4  # sizes alone still pass: listing and pruning stay cheap


def test_the_manifest_holds_every_files_hash_and_is_signed(tmp_path: Path) -> None:
    folder = _checkpoint(tmp_path, 2, dcp=True)
    manifest = ck.read_manifest(folder)
    assert manifest is not None and manifest["complete"] is True
    assert set(manifest["digests"]) == set(manifest["files"]) == set(ck.file_sizes(folder))
    assert "pytorch_model_fsdp_0/.metadata" in manifest["digests"]
    assert manifest["digests"]["optimizer.bin"] == ck.file_digest(folder / "optimizer.bin")
    assert ck.signed(manifest)
    assert (ck.signing_key() == (tmp_path / "home" / ck.KEY_FILE).read_bytes())
    assert (tmp_path / "home" / ck.KEY_FILE).stat().st_mode & 0o077 == 0  # only the user reads the key


def test_every_data_file_is_fsynced_before_the_manifest_says_complete(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[str] = []
    real_fsync = os.fsync

    def watching_fsync(fd: int) -> None:  # calls through: the files are really synced
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", watching_fsync)
    folder = _checkpoint(tmp_path, 3, dcp=True)
    manifest_at = max(i for i, p in enumerate(synced) if p.endswith(f".{ck.MANIFEST}.{os.getpid()}.tmp"))
    before = set(synced[:manifest_at])
    for name in ck.file_sizes(folder):
        assert str(folder / name) in before, f"{name} not fsynced before the complete manifest"
    assert str(folder) in before and str(folder / "pytorch_model_fsdp_0") in before  # the names too


def test_a_damaged_newest_checkpoint_is_passed_over_saying_which_file(tmp_path: Path) -> None:
    good = _checkpoint(tmp_path, 2)
    zeroed = _checkpoint(tmp_path, 4)
    _zero(zeroed / "optimizer.bin")
    truncated = _checkpoint(tmp_path, 6)
    (truncated / "model.safetensors").write_bytes(b"x" * 10)
    cut = ck.checkpoint_dir(tmp_path, 8)  # a save cut short
    cut.mkdir()
    ck.write_manifest(cut, {"format": ck.FORMAT, "step": 8, "complete": False})
    found, skipped = ck.newest_verified(tmp_path)
    assert found == good
    assert skipped == [
        "checkpoint step-00000008 skipped: incomplete checkpoint (its save did not finish)",
        "checkpoint step-00000006 skipped: damaged checkpoint (model.safetensors has 10 bytes, 256 were written)",
        "checkpoint step-00000004 skipped: damaged checkpoint (optimizer.bin's content is not what was written: "
        "its hash differs)",
    ]
    _zero(good / "random_states_1.pkl")
    assert ck.newest_verified(tmp_path)[0] is None


def test_only_a_folder_this_home_signed_may_have_its_pickled_metadata_loaded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _checkpoint(tmp_path / "a", 2, dcp=True)
    assert ck.untrusted(folder) is None
    metadata = folder / "pytorch_model_fsdp_0" / ".metadata"

    edited = ck.read_manifest(folder) or {}
    ck.write_manifest(folder, edited | {"step": 3})  # any edit breaks the signature
    assert "not signed by this ftui home" in (ck.untrusted(folder) or "")
    ck.write_manifest(folder, edited)
    assert ck.untrusted(folder) is None

    metadata.write_bytes(pickle.dumps({"plan": [1, 3]}))  # a replaced pickle of the same size
    assert "pytorch_model_fsdp_0/.metadata's content is not what was written" in (ck.untrusted(folder) or "")

    # Written by hand, hashes and all, but not signed with this home's key.
    forged = _checkpoint(tmp_path / "b", 2, dcp=True)
    manifest: dict[str, Any] = json.loads((forged / ck.MANIFEST).read_text())
    manifest["signature"] = "0" * 64
    (forged / ck.MANIFEST).write_text(json.dumps(manifest))
    assert "not signed by this ftui home" in (ck.untrusted(forged) or "")
    # Signed in another home (another machine's key).
    monkeypatch.setenv("FTUI_HOME", str(tmp_path / "other-home"))
    elsewhere = _checkpoint(tmp_path / "c", 2, dcp=True)
    monkeypatch.setenv("FTUI_HOME", str(tmp_path / "home"))
    assert "not signed by this ftui home" in (ck.untrusted(elsewhere) or "")


def test_metadata_copied_from_another_node_is_listed_only_with_the_hash_its_manifest_lists(
        tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each machine has its own home and key: the other node's manifest vouches for the copy by its hash."""
    monkeypatch.setenv("FTUI_HOME", str(tmp_path / "other-machine"))
    theirs = _checkpoint(tmp_path / "node0", 2, dcp=True)
    monkeypatch.setenv("FTUI_HOME", str(home))
    assert not ck.signed(ck.read_manifest(theirs) or {})  # signed by the other machine's key
    mine = _checkpoint(tmp_path / "node1", 2)
    (mine / "pytorch_model_fsdp_0").mkdir()
    name = "pytorch_model_fsdp_0/.metadata"
    (mine / name).write_bytes((theirs / name).read_bytes())
    assert ck.untrusted(mine) == f"{mine}: {name} is not in its signed manifest"
    assert ck.adopt(mine, {name: theirs / name}) == [name]
    assert ck.untrusted(mine) is None and ck.verify(mine)["digests"][name] == ck.file_digest(theirs / name)

    other = _checkpoint(tmp_path / "node2", 2)
    (other / "pytorch_model_fsdp_0").mkdir()
    (other / name).write_bytes(pickle.dumps("something else"))  # not what node 0 wrote
    assert ck.adopt(other, {name: theirs / name}) == []
    assert ck.untrusted(other) is not None


# ---------------------------------------------------------------------- loading runs no code


class _Payload:
    """A pickle that makes a folder when it is unpickled: what a malicious checkpoint file does."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (str(self.marker),))


@pytest.fixture
def accelerated(tmp_path: Path) -> Any:
    """A real accelerate state on CPU: a model, its optimizer and a registered lr scheduler, saved once."""
    torch = pytest.importorskip("torch")
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    acc = Accelerator(cpu=True)
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = acc.prepare(model, optimizer)
    scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.5, total_iters=10)
    acc.register_for_checkpointing(scheduler)
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()
    scheduler.step()
    folder = ck.checkpoint_dir(tmp_path / "run", 1)
    folder.mkdir(parents=True)
    acc.save_state(str(folder), safe_serialization=True)
    ck.write_manifest(folder, ck.seal(folder, {"format": ck.FORMAT, "step": 1, "complete": False}))
    yield acc, scheduler, folder
    AcceleratorState._reset_state(True)


def test_a_malicious_scheduler_pickle_is_refused_and_never_runs(accelerated: Any, tmp_path: Path) -> None:
    from runner.rank.checkpointing import load_state

    acc, scheduler, folder = accelerated
    saved_epoch = scheduler.last_epoch
    scheduler.step()
    load_state(acc, folder)  # ftui's own checkpoint loads, scheduler included
    assert scheduler.last_epoch == saved_epoch

    marker = tmp_path / "ran"
    (folder / "custom_checkpoint_0.pkl").write_bytes(pickle.dumps(_Payload(marker)))
    with pytest.raises(ck.CheckpointError) as err:
        load_state(acc, folder)
    assert not marker.exists()  # accelerate alone unpickles it with weights_only=False: the payload ran
    line = str(err.value)
    assert line.startswith(f"train.resume_from: {folder / 'custom_checkpoint_0.pkl'}: not loadable as plain data")
    assert "\n" not in line


def test_a_corrupt_optimizer_file_fails_naming_it(accelerated: Any) -> None:
    from runner.rank.checkpointing import load_state

    acc, _, folder = accelerated
    _zero(folder / "optimizer.bin")
    with pytest.raises(ck.CheckpointError) as err:
        load_state(acc, folder)
    assert str(err.value) == (f"train.resume_from: {folder}: damaged checkpoint (optimizer.bin's content is not "
                              "what was written: its hash differs)")


def test_an_unsigned_fsdp_checkpoint_is_refused_before_its_metadata_is_unpickled(accelerated: Any,
                                                                                  tmp_path: Path) -> None:
    from runner.rank.checkpointing import load_state

    acc, _, folder = accelerated
    marker = tmp_path / "ran"
    (folder / "pytorch_model_fsdp_0").mkdir()
    (folder / "pytorch_model_fsdp_0" / ".metadata").write_bytes(pickle.dumps(_Payload(marker)))
    with pytest.raises(ck.CheckpointError, match="refused to load its torch distributed checkpoint metadata.*"
                                                 "pytorch_model_fsdp_0/.metadata is not in its signed manifest"):
        load_state(acc, folder)
    assert not marker.exists()
