"""Resuming a multi-node run (issue 15 item 2): each node's record of the checkpoints it holds complete
(``run_nodes.checkpoints``, SQLite and PostgreSQL), the step every node can resume from, the DCP files a
node lacks under FSDP; and a real two-node DDP run over loopback resumed by ``ftui resume`` on both nodes,
whose losses equal the uninterrupted run's, falling back to an older step when one node's part of the
newest is damaged, and refusing in one line naming the node when no step is complete on every node."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from runner.nodes.resume import copy_dcp_parts, node_steps
from runner.spec import checkpoint as ck
from store import Store
from store import nodes as store_nodes

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "recipes" / "quickstart.toml"


def _create(name: str = "x") -> dict[str, Any]:
    return {"name": name, "recipe_text": "", "recipe_hash": "h", "strategy": "ddp", "nproc": 2, "method": "lora",
            "model": "m", "run_dir": ""}


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


# ---------------------------------------------------------------------- the store (SQLite and PostgreSQL)


def test_each_node_records_the_checkpoints_it_holds_complete(db_url: str, tmp_path: Path) -> None:
    from runner.nodes.agent import NodeAgent
    from runner.spec.rendezvous import node_spec

    store = Store(db_url)
    a = store_nodes.join_run(store, "ck", 2, _create(), pid=1, host="a")
    b = store_nodes.join_run(store, "ck", 2, _create(), pid=2, host="b")
    assert [n.checkpoints for n in store_nodes.nodes(store, a.run_id)] == [None, None]  # never recorded
    spec = node_spec(2, 0, "127.0.0.1", 1, None, "ck", "x")
    folders = [tmp_path / "n0", tmp_path / "n1"]
    agents = [NodeAgent(store, j.run_id, j.slot, spec, j.created, nproc=1, run_dir=f)
              for j, f in zip((a, b), folders, strict=True)]
    for step in (2, 4):
        _checkpoint(folders[0], step, range(0, 1))
        _checkpoint(folders[1], step, range(1, 2))
    half = ck.checkpoint_dir(folders[1], 6)  # node 1's save of step 6 was cut short: its manifest says so
    half.mkdir(parents=True)
    ck.write_manifest(half, {"format": ck.FORMAT, "step": 6, "complete": False})
    _checkpoint(folders[0], 6, range(0, 1))
    for agent, folder in zip(agents, folders, strict=True):
        agent.record_checkpoints(folder)
    recorded = store_nodes.nodes(store, a.run_id)
    assert [n.checkpoints for n in recorded] == [[2, 4, 6], [2, 4]]
    assert store_nodes.common_checkpoint(recorded) == 4
    # A record replaces the previous one (pruning, a damaged file): the list is what the disk holds.
    store_nodes.record_checkpoints(store, a.run_id, b.slot, [2])
    assert store_nodes.common_checkpoint(store_nodes.nodes(store, a.run_id)) == 2
    store_nodes.record_checkpoints(store, a.run_id, b.slot, [])
    assert store_nodes.common_checkpoint(store_nodes.nodes(store, a.run_id)) is None
    # finish() records the last checkpoint (written after the last heartbeat) before the node's end.
    _checkpoint(folders[1], 8, range(1, 2))
    agents[1].finish("completed", None, 0, wait_s=0)
    assert store_nodes.nodes(store, a.run_id)[1].checkpoints == [2, 4, 8]


# ---------------------------------------------------------------------- one node's disk


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


# ---------------------------------------------------------------------- ftui resume's flags


def test_ftui_resume_of_a_multi_node_run_refuses_flags_that_cannot_work(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from runner.spec.recipe import load_recipe
    from tui.cli.main import main

    monkeypatch.setenv("FTUI_HOME", str(tmp_path))
    db = f"sqlite:///{tmp_path}/ftui.db"
    store = Store(db)
    create = _create("quickstart") | {"recipe_text": load_recipe(QUICKSTART).to_toml()}
    run_id = store_nodes.join_run(store, "old", 2, create, pid=1, host="a").run_id
    store_nodes.join_run(store, "old", 2, create, pid=2, host="b")
    store.update_run(run_id, status="stopped")
    cases = [
        ([], f"ftui: run {run_id}: ran on 2 machines; on each of them run `ftui resume {run_id} --node-rank K "
             "--main-addr ADDR` (docs/multi-node.md)"),
        (["--nnodes", "3", "--node-rank", "0", "--main-addr", "127.0.0.1"],
         f"ftui: --nnodes: run {run_id} ran on 2 machines; resume it on 2"),
        (["--rdzv-endpoint", "127.0.0.1:29400"],  # c10d: tests/test_c10d_resume.py
         f"ftui: run {run_id}: node #0 never started its ranks: it holds no checkpoint to resume from"),
        (["--node-rank", "1"], "ftui: --main-addr: a multi-node run needs the main node's address"),
        (["--node-rank", "0", "--main-addr", "127.0.0.1"],
         f"ftui: run {run_id}: node #0 never started its ranks: it holds no checkpoint to resume from"),
    ]
    for flags, line in cases:
        assert main(["resume", str(run_id), "--db", db, *flags]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(line), (flags, err)
    assert [r.id for r in store.list_runs()] == [run_id]  # nothing recorded


# ---------------------------------------------------------------------- two nodes on this machine


def _start(tmp_path: Path, db: str, command: list[str], tag: str, nnodes: int = 2) -> list[subprocess.Popen[str]]:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    procs = []
    for k in range(nnodes):
        env = {**os.environ, "FTUI_HOME": str(tmp_path / f"node{k}"), "PYTHONPATH": str(ROOT)}
        argv = [sys.executable, "-m", "tui.cli", *command, "--db", db, "--nnodes", str(nnodes), "--node-rank", str(k),
                "--main-addr", "127.0.0.1", "--main-port", str(port)]
        log = open(tmp_path / f"{tag}{k}.log", "w")  # noqa: SIM115 (closed with the process)
        procs.append(subprocess.Popen(argv, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True,
                                      start_new_session=True))
    return procs


def _wait(procs: list[subprocess.Popen[str]], tmp_path: Path, tag: str, timeout: float = 480) -> list[int]:
    import signal

    try:
        return [p.wait(timeout=timeout) for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            os.killpg(p.pid, signal.SIGKILL)
        raise AssertionError(f"nodes did not finish:\n{_logs(tmp_path, tag, len(procs))}") from None


def _logs(tmp_path: Path, tag: str, n: int = 2) -> str:
    return "\n".join((tmp_path / f"{tag}{k}.log").read_text()[-3000:] for k in range(n))


@pytest.mark.slow
def test_ftui_resume_on_both_nodes_continues_a_two_node_run_with_its_losses(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/ftui.db"
    train = ["run", str(QUICKSTART), "--strategy", "ddp", "--nproc", "1", "--set", "train.max_steps=6",
             "--set", "train.save_every=2", "--set", "train.keep_checkpoints=3", "--sample-interval", "0"]
    assert _wait(_start(tmp_path, db, train, "train"), tmp_path, "train") == [0, 0], _logs(tmp_path, "train")
    store = Store(db)
    (old,) = store.list_runs()
    assert (old.status, old.nnodes) == ("completed", 2)
    uninterrupted = {m.step: m.loss for m in store.metrics(old.id)}
    nodes = {n.node_rank: n for n in store_nodes.nodes(store, old.id)}
    # Each node recorded its own folder's complete checkpoints (model, optimizer, scheduler on each node).
    assert [nodes[0].checkpoints, nodes[1].checkpoints] == [[2, 4, 6], [2, 4, 6]]
    folders = {k: Path(n.run_dir) for k, n in nodes.items()}
    assert folders[0] != folders[1]
    for k in (0, 1):
        files = set(ck.check_complete(ck.checkpoint_dir(folders[k], 4))["files"])
        assert {"model.safetensors", "optimizer.bin", "custom_checkpoint_0.pkl", f"random_states_{k}.pkl"} <= files
    # Node 1's part of the newest checkpoint is damaged: every node falls back to step 4.
    (ck.checkpoint_dir(folders[1], 6) / "random_states_1.pkl").unlink()
    resume = ["resume", str(old.id)]
    codes = _wait(_start(tmp_path, db, resume, "resume"), tmp_path, "resume")
    assert codes == [0, 0], _logs(tmp_path, "resume")
    for k in (0, 1):
        log = (tmp_path / f"resume{k}.log").read_text()
        assert "warning: step 6 is not complete on node 1" in log and "resuming from step 4" in log, log[-3000:]
    new = next(r for r in store.list_runs() if r.id != old.id)
    assert (new.status, new.nnodes, new.resumed_from) == ("completed", 2, old.id)
    assert new.summary.resumed_from["step"] == 4
    resumed = {m.step: m.loss for m in store.metrics(new.id)}
    assert list(resumed) == [5, 6]
    assert resumed == pytest.approx({s: uninterrupted[s] for s in (5, 6)}, abs=1e-6)
    new_nodes = {n.node_rank: n for n in store_nodes.nodes(store, new.id)}
    assert {k: n.status for k, n in new_nodes.items()} == {0: "completed", 1: "completed"}
    # Each node's ranks loaded from their own node's folder of the old run.
    start = next(e for e in _events(Path(new_nodes[0].run_dir)) if e["type"] == "start")  # rank 0's journal
    assert (start["start_step"], start["resumed_from"]) == (4, str(ck.checkpoint_dir(folders[0], 4)))
    for k in (0, 1):
        recipe = (Path(new_nodes[k].run_dir) / "recipe.toml").read_text()
        assert str(ck.checkpoint_dir(folders[k], 4)) in recipe

    # Now node 1 holds no step the other holds: both refuse in one line naming it, nothing trains.
    for step in (2, 4):
        (ck.checkpoint_dir(folders[1], step) / "optimizer.bin").write_bytes(b"damaged")
    procs = _start(tmp_path, db, resume, "refused")
    codes = _wait(procs, tmp_path, "refused", timeout=240)
    assert codes == [2, 2], _logs(tmp_path, "refused")
    for k in (0, 1):
        lines = (tmp_path / f"refused{k}.log").read_text().strip().splitlines()
        last = lines[-1]
        assert last.startswith(f"ftui: run {old.id}: no checkpoint step is complete on every node ("), lines
        assert "node 0 (" in last and "steps 2, 4, 6" in last and "): none" in last, last
        assert "Traceback" not in "\n".join(lines)
    assert "here: " in (tmp_path / "refused1.log").read_text()  # node 1 says what is wrong on its disk
    refused = next(r for r in store.list_runs() if r.id not in (old.id, new.id))
    assert refused.status == "failed" and "no checkpoint step is complete on every node" in (refused.error or "")
    assert store.metrics(refused.id) == []


def _events(run_dir: Path) -> list[dict[str, Any]]:
    import json

    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines() if line.strip()]


@pytest.mark.slow
def test_fsdp_two_nodes_resume_when_their_folders_are_readable_from_each_other(tmp_path: Path) -> None:
    """Both loopback nodes on one disk (a shared filesystem): each node copies in the DCP files written on
    the other (the metadata is only where global rank 0 was) and the losses go on as uninterrupted."""
    db = f"sqlite:///{tmp_path}/ftui.db"
    train = ["run", str(QUICKSTART), "--strategy", "fsdp", "--nproc", "1", "--set", "train.max_steps=4",
             "--set", "train.save_every=2", "--sample-interval", "0"]
    assert _wait(_start(tmp_path, db, train, "train"), tmp_path, "train") == [0, 0], _logs(tmp_path, "train")
    store = Store(db)
    (old,) = store.list_runs()
    assert old.distributed_type == "FSDP"
    uninterrupted = {m.step: m.loss for m in store.metrics(old.id)}
    folders = {n.node_rank: Path(n.run_dir) for n in store_nodes.nodes(store, old.id)}
    assert not (ck.checkpoint_dir(folders[1], 2) / "pytorch_model_fsdp_0" / ".metadata").exists()
    (ck.checkpoint_dir(folders[1], 4) / "random_states_1.pkl").unlink()  # step 4 is not whole: step 2 is
    codes = _wait(_start(tmp_path, db, ["resume", str(old.id)], "resume"), tmp_path, "resume")
    assert codes == [0, 0], _logs(tmp_path, "resume")
    assert "DCP file(s) of step 2 from the other nodes' folders" in (tmp_path / "resume1.log").read_text()
    assert (ck.checkpoint_dir(folders[1], 2) / "pytorch_model_fsdp_0" / ".metadata").is_file()
    new = next(r for r in store.list_runs() if r.id != old.id)
    assert (new.status, new.resumed_from, new.distributed_type) == ("completed", old.id, "FSDP")
    resumed = {m.step: m.loss for m in store.metrics(new.id)}
    assert resumed == pytest.approx({s: uninterrupted[s] for s in (3, 4)}, abs=1e-6)
