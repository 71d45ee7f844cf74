"""Which checkpoint steps one node of a multi-node run can resume from, read from its own disk: a step
counts only when this node's part is complete (manifest, files at their sizes, this world size and
strategy, this node's ranks' parts); under FSDP the DCP files written on another node are copied in when
that node's folder is readable here."""

from __future__ import annotations

from pathlib import Path

from runner.nodes.steps import copy_dcp_parts, node_steps
from runner.spec import checkpoint as ck


def _checkpoint(run_dir: Path, step: int, ranks: range, world: int = 2, strategy: str = "ddp",
                dcp: dict[str, bytes] | None = None) -> Path:
    """One node's part of a checkpoint: its ranks' RNG states, the replicated files, DCP files given."""
    folder = ck.checkpoint_dir(run_dir, step)
    folder.mkdir(parents=True)
    for r in ranks:
        (folder / f"random_states_{r}.pkl").write_bytes(b"x" * (10 + r))
    (folder / "optimizer.bin").write_bytes(b"o" * 100)
    for name, data in (dcp or {}).items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    ck.write_manifest(folder, {"format": ck.FORMAT, "step": step, "world_size": world, "strategy": strategy,
                               "complete": True, "files": ck.file_sizes(folder)})
    return folder


def test_a_node_counts_only_steps_whose_own_part_is_complete(tmp_path: Path) -> None:
    n1 = tmp_path / "n1"
    _checkpoint(n1, 2, range(1, 2))
    _checkpoint(n1, 4, range(1, 2))
    _checkpoint(n1, 6, range(1, 2), strategy="fsdp")  # another strategy: not this run's
    (_checkpoint(n1, 8, range(1, 2)) / "optimizer.bin").write_bytes(b"short")  # damaged after its save
    _checkpoint(n1, 10, range(0, 1))  # node 0's ranks' parts: the wrong folder for node rank 1
    steps, reasons = node_steps(n1, 2, "ddp", range(1, 2), [])
    assert steps == [2, 4]
    assert "strategy fsdp" in reasons[6] and "damaged checkpoint (optimizer.bin has 5 bytes" in reasons[8]
    assert "random_states_1.pkl" in reasons[10]
    assert all("\n" not in r for r in reasons.values())


def test_fsdp_dcp_files_of_other_nodes_are_copied_in_when_readable(tmp_path: Path) -> None:
    # DCP writes the metadata where global rank 0 is only, and a replicated entry in one rank's file.
    n0, n1 = tmp_path / "n0", tmp_path / "n1"
    _checkpoint(n0, 4, range(0, 1), strategy="fsdp",
                dcp={"optimizer_0/.metadata": b"m" * 30, "optimizer_0/__0_0.distcp": b"a" * 40})
    mine = _checkpoint(n1, 4, range(1, 2), strategy="fsdp", dcp={"optimizer_0/__1_0.distcp": b"b" * 40})
    assert node_steps(n1, 2, "fsdp", range(1, 2), [n0]) == ([4], {})
    steps, reasons = node_steps(n1, 2, "fsdp", range(1, 2), [tmp_path / "elsewhere"])  # node 0's disk not here
    assert steps == [] and "optimizer_0 lacks the DCP metadata" in reasons[4] and "shared filesystem" in reasons[4]
    assert copy_dcp_parts(mine, 2, [n0]) == ["optimizer_0/.metadata", "optimizer_0/__0_0.distcp"]
    assert (mine / "optimizer_0" / ".metadata").read_bytes() == b"m" * 30
    assert ck.is_complete(mine) and copy_dcp_parts(mine, 2, []) == []  # whole now: nothing more to copy
