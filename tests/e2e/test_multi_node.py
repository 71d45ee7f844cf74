"""Real multi-node runs on this machine over loopback: two ``ftui run --nnodes 2`` processes (node agents),
each with its own data folder, one store.

One two-node DDP run, trained once for the module, is read by several tests: it trains as one world with
the one-node losses, each node records the checkpoints of its own folder, and both resumes continue it
with its losses: ``ftui resume`` on both nodes with the static rendezvous, and again with c10d (each rank
picking its old node's folder from the node rank c10d gave it). Node 1's part of the newest checkpoint is
damaged first, so both resumes fall back to the step every node holds complete.

The other behaviours each need their own run: FSDP nodes resuming from folders readable from each other
(a shared filesystem), ``ftui stop`` from a third process stopping two nodes of two FSDP ranks, and a
node that dies failing the run with its reason (with a small heartbeat and death timeout, so that the
surviving node notices at once).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from runner.spec import checkpoint as ck
from store import Store
from store import nodes as store_nodes

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "recipes" / "quickstart.toml"
STEPS = 6
"""The shared run's steps: checkpoints at 2, 4 and 6; a resume from 4 logs steps 5 and 6."""

SMALL = {"FTUI_NODE_HEARTBEAT_S": "0.5", "FTUI_NODE_POLL_S": "0.2"}
"""Node agents that report and poll often: stops and joins reach every node within half a second."""


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start(folder: Path, db: str, command: list[str], tag: str, c10d: bool = False,
           env: dict[str, str] | None = None) -> list[subprocess.Popen[str]]:
    """``ftui COMMAND`` on two node processes at once (static rendezvous at node 0, or c10d), logging to
    ``TAG0.log`` and ``TAG1.log``."""
    port = _port()
    procs = []
    for k in range(2):
        node_env = {**os.environ, **SMALL, **(env or {}), "FTUI_HOME": str(folder / f"node{k}"),
                    "PYTHONPATH": str(ROOT)}
        node_env.pop("SLURM_JOB_ID", None)
        rendezvous = (["--rdzv-endpoint", f"127.0.0.1:{port}"] if c10d else
                      ["--node-rank", str(k), "--main-addr", "127.0.0.1", "--main-port", str(port)])
        argv = [sys.executable, "-m", "tui.cli", *command, "--db", db, "--nnodes", "2", *rendezvous]
        log = open(folder / f"{tag}{k}.log", "w")  # noqa: SIM115 (closed with the process)
        procs.append(subprocess.Popen(argv, env=node_env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True,
                                      start_new_session=True))
    return procs


def _logs(folder: Path, tag: str) -> str:
    return "\n".join((folder / f"{tag}{k}.log").read_text()[-3000:] for k in range(2))


def _wait(procs: list[subprocess.Popen[str]], folder: Path, tag: str, timeout: float = 480) -> list[int]:
    try:
        return [p.wait(timeout=timeout) for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            os.killpg(p.pid, signal.SIGKILL)
        raise AssertionError(f"nodes did not finish:\n{_logs(folder, tag)}") from None


def _until(condition: Callable[[], bool], procs: list[subprocess.Popen[str]], folder: Path, tag: str,
           timeout: float = 400) -> None:
    """Read the store until ``condition`` holds, failing at once should a node exit meanwhile."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert all(p.poll() is None for p in procs), _logs(folder, tag)
        assert time.monotonic() < deadline, f"not within {timeout:.0f} s:\n{_logs(folder, tag)}"
        time.sleep(0.2)


def _first_step(store: Store) -> Callable[[], bool]:
    def seen() -> bool:
        runs = store.list_runs()
        return bool(runs and store.metrics(runs[0].id))

    return seen


def _events(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines() if line.strip()]


def _new_run(store: Store, before: set[int]) -> Any:
    (run,) = [r for r in store.list_runs() if r.id not in before]
    return run


# ---------------------------------------------------------------------- the shared two-node DDP run


@dataclass(frozen=True)
class TwoNodes:
    folder: Path
    db: str
    run_id: int
    losses: dict[int, float]
    folders: dict[int, Path]
    """Each node rank's run folder."""
    recorded: dict[int, list[int] | None]
    """The checkpoint steps each node rank recorded as its run ended (a resume records them again)."""

    @property
    def store(self) -> Store:
        return Store(self.db)


ROWS = ["--set", "data.context_length=64", "--set", "train.batch_size=2"]
"""Every run here: a quarter of quickstart's rows per step, each a quarter as long (the point is the nodes)."""
TRAIN = ["run", str(QUICKSTART), *ROWS, "--strategy", "ddp", "--nproc", "1", "--set", f"train.max_steps={STEPS}",
         "--set", "train.save_every=2", "--set", "train.keep_checkpoints=3", "--sample-interval", "0.5"]


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory) -> TwoNodes:
    folder = tmp_path_factory.mktemp("two-nodes")
    db = f"sqlite:///{folder}/ftui.db"
    assert _wait(_start(folder, db, TRAIN, "train"), folder, "train") == [0, 0], _logs(folder, "train")
    store = Store(db)
    (run,) = store.list_runs()
    nodes = [n for n in store_nodes.nodes(store, run.id) if n.node_rank is not None]
    return TwoNodes(folder, db, run.id, {m.step: m.loss for m in store.metrics(run.id)},
                    {n.node_rank: Path(n.run_dir) for n in nodes}, {n.node_rank: n.checkpoints for n in nodes})


@pytest.fixture(scope="module")
def damaged(two_nodes: TwoNodes) -> TwoNodes:
    """The shared run with node 1's part of its newest checkpoint damaged: a resume falls back to step 4.
    Whichever node a resume makes node 1 must load old node 1's folder (its random_states_1.pkl)."""
    (ck.checkpoint_dir(two_nodes.folders[1], STEPS) / "random_states_1.pkl").unlink(missing_ok=True)
    return two_nodes


def test_two_nodes_ddp_train_as_one_world_with_the_one_node_losses(two_nodes: TwoNodes) -> None:
    store = two_nodes.store
    run = store.get_run(two_nodes.run_id)
    assert run is not None
    assert (run.status, run.nnodes, run.nproc, run.distributed_type) == ("completed", 2, 2, "MULTI_CPU")
    nodes = store_nodes.nodes(store, run.id)
    assert sorted((n.node_rank, tuple(n.ranks), n.status) for n in nodes) == [(0, (0,), "completed"),
                                                                             (1, (1,), "completed")]
    per_node = store_nodes.samples_per_node(store, run.id)
    assert set(per_node) == {0, 1} and min(per_node.values()) > 0, per_node  # both nodes' telemetry, one run
    # The same global batch on one machine (ddp x 2): the same losses.
    env = {**os.environ, "FTUI_HOME": str(two_nodes.folder / "one"), "PYTHONPATH": str(ROOT)}
    one_machine = [*TRAIN[:TRAIN.index("--nproc")], "--nproc", "2", *TRAIN[TRAIN.index("--nproc") + 2:]]
    before = {r.id for r in store.list_runs()}
    one = subprocess.run([sys.executable, "-m", "tui.cli", *one_machine, "--db", two_nodes.db],
                         env=env, cwd=ROOT, capture_output=True, text=True, timeout=480)
    assert one.returncode == 0, one.stdout[-3000:] + one.stderr[-3000:]
    single = _new_run(store, before)
    assert (single.nnodes or 1, single.nproc) == (1, 2)
    assert len(two_nodes.losses) == STEPS
    assert list(two_nodes.losses.values()) == pytest.approx([m.loss for m in store.metrics(single.id)], abs=1e-5)


def test_each_node_records_the_complete_checkpoints_of_its_own_folder(two_nodes: TwoNodes) -> None:
    assert two_nodes.recorded == {0: [2, 4, 6], 1: [2, 4, 6]}
    assert two_nodes.folders[0] != two_nodes.folders[1]
    for k in (0, 1):  # model, optimizer, scheduler and this node's rank's RNG state on each node
        files = set(ck.check_complete(ck.checkpoint_dir(two_nodes.folders[k], 4))["files"])
        assert {"model.safetensors", "optimizer.bin", "custom_checkpoint_0.pkl", f"random_states_{k}.pkl"} <= files


def test_ftui_resume_on_both_nodes_continues_a_two_node_run_with_its_losses(damaged: TwoNodes) -> None:
    store, folder, folders = damaged.store, damaged.folder, damaged.folders
    before = {r.id for r in store.list_runs()}
    codes = _wait(_start(folder, damaged.db, ["resume", str(damaged.run_id)], "resume"), folder, "resume")
    assert codes == [0, 0], _logs(folder, "resume")
    for k in (0, 1):
        log = (folder / f"resume{k}.log").read_text()
        assert "warning: step 6 is not complete on node 1" in log and "resuming from step 4" in log, log[-3000:]
    new = _new_run(store, before)
    assert (new.status, new.nnodes, new.resumed_from) == ("completed", 2, damaged.run_id)
    assert new.summary.resumed_from["step"] == 4
    resumed = {m.step: m.loss for m in store.metrics(new.id)}
    assert list(resumed) == [5, 6]
    assert resumed == pytest.approx({s: damaged.losses[s] for s in (5, 6)}, abs=1e-6)
    new_nodes = {n.node_rank: n for n in store_nodes.nodes(store, new.id)}
    assert {k: n.status for k, n in new_nodes.items()} == {0: "completed", 1: "completed"}
    # Each node's ranks loaded from their own node's folder of the old run.
    start = next(e for e in _events(Path(new_nodes[0].run_dir)) if e["type"] == "start")  # rank 0's journal
    assert (start["start_step"], start["resumed_from"]) == (4, str(ck.checkpoint_dir(folders[0], 4)))
    for k in (0, 1):
        recipe = (Path(new_nodes[k].run_dir) / "recipe.toml").read_text()
        assert str(ck.checkpoint_dir(folders[k], 4)) in recipe


def test_ftui_resume_with_c10d_on_both_nodes_continues_with_the_losses(damaged: TwoNodes) -> None:
    store, folder, folders = damaged.store, damaged.folder, damaged.folders
    before = {r.id for r in store.list_runs()}
    procs = _start(folder, damaged.db, ["resume", str(damaged.run_id)], "c10d", c10d=True)
    assert _wait(procs, folder, "c10d") == [0, 0], _logs(folder, "c10d")
    for k in (0, 1):
        log = (folder / f"c10d{k}.log").read_text()
        assert "warning: step 6 is not complete on node 1" in log and "resuming from step 4" in log, log[-3000:]
        assert "node rank from c10d" in log
    new = _new_run(store, before)
    assert (new.status, new.nnodes, new.resumed_from) == ("completed", 2, damaged.run_id), _logs(folder, "c10d")
    assert new.summary.resumed_from["step"] == 4 and new.summary.resumed_from["rendezvous"] == "c10d"
    resumed = {m.step: m.loss for m in store.metrics(new.id)}
    assert list(resumed) == [5, 6]
    assert resumed == pytest.approx({s: damaged.losses[s] for s in (5, 6)}, abs=1e-6)
    new_nodes = {n.node_rank: n for n in store_nodes.nodes(store, new.id)}
    assert {k: (n.status, n.ranks) for k, n in new_nodes.items()} == {0: ("completed", [0]), 1: ("completed", [1])}
    expected = {str(k): str(ck.checkpoint_dir(folders[k], 4)) for k in (0, 1)}
    for n in new_nodes.values():  # every node was handed the whole map; its ranks chose by GROUP_RANK
        assert json.loads((Path(n.run_dir) / "resume_nodes.json").read_text())["by_node_rank"] == expected
    start = next(e for e in _events(Path(new_nodes[0].run_dir)) if e["type"] == "start")  # rank 0's journal
    assert (start["start_step"], start["resumed_from"]) == (4, expected["0"])


# ---------------------------------------------------------------------- runs of their own


def test_fsdp_two_nodes_resume_when_their_folders_are_readable_from_each_other(tmp_path: Path) -> None:
    """Both loopback nodes on one disk (a shared filesystem): each node copies in the DCP files written on
    the other (the metadata is only where global rank 0 was) and the losses go on as uninterrupted."""
    db = f"sqlite:///{tmp_path}/ftui.db"
    train = ["run", str(QUICKSTART), *ROWS, "--strategy", "fsdp", "--nproc", "1", "--set", "train.max_steps=4",
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
    new = _new_run(store, {old.id})
    assert (new.status, new.resumed_from, new.distributed_type) == ("completed", old.id, "FSDP")
    resumed = {m.step: m.loss for m in store.metrics(new.id)}
    assert resumed == pytest.approx({s: uninterrupted[s] for s in (3, 4)}, abs=1e-6)


def test_two_nodes_of_two_fsdp_ranks_stop_together_from_ftui_stop(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/ftui.db"
    procs = _start(tmp_path, db, ["run", str(QUICKSTART), *ROWS, "--strategy", "fsdp", "--nproc", "2", "--set",
                                  "train.max_steps=200", "--grace", "120"], "node")
    store = Store(db)
    _until(_first_step(store), procs, tmp_path, "node")  # the first step, then stop from a third process
    (run,) = store.list_runs()
    env = {**os.environ, "FTUI_HOME": str(tmp_path / "elsewhere"), "PYTHONPATH": str(ROOT)}
    stop = subprocess.run([sys.executable, "-m", "tui.cli", "stop", str(run.id), "--db", db], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=400)
    assert _wait(procs, tmp_path, "node") == [130, 130], _logs(tmp_path, "node")
    assert stop.returncode == 0 and f"run {run.id}: stopped" in stop.stdout, stop.stdout + stop.stderr
    after = store.get_run(run.id)
    assert after is not None and (after.status, after.distributed_type) == ("stopped", "FSDP")
    nodes = store_nodes.nodes(store, run.id)
    assert sorted((n.node_rank, tuple(n.ranks), n.status) for n in nodes) == [(0, (0, 1), "stopped"),
                                                                             (1, (2, 3), "stopped")]
    assert set(store_nodes.samples_per_node(store, run.id)) == {0, 1}


def test_a_node_that_dies_fails_the_run_with_its_reason(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/ftui.db"
    procs = _start(tmp_path, db, ["run", str(QUICKSTART), *ROWS, "--strategy", "ddp", "--nproc", "1", "--set",
                                  "train.max_steps=200"], "node", env={"FTUI_NODE_DEAD_AFTER_S": "3"})
    store = Store(db)
    _until(_first_step(store), procs, tmp_path, "node")
    (run,) = store.list_runs()
    victim = next(n for n in store_nodes.nodes(store, run.id) if n.node_rank == 1)
    # The machine goes away: its agent and every rank of it, at once.
    import psutil

    agent = psutil.Process(victim.pid)
    for proc in [agent, *agent.children(recursive=True)]:
        proc.kill()
    for rank_pid in (Path(victim.run_dir) / "ranks").glob("*.pid"):
        try:
            os.kill(int(rank_pid.read_text()), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    codes = _wait(procs, tmp_path, "node", timeout=300)
    survivor = 1 - procs.index(next(p for p in procs if p.pid == victim.pid))
    assert codes[survivor] == 1, _logs(tmp_path, "node")
    after = store.get_run(run.id)
    assert after is not None and after.status == "failed", after
    assert after.error is not None and after.error.startswith(f"node 1 ({victim.host}): node died"), after.error
    assert "stopped reporting" in after.error
