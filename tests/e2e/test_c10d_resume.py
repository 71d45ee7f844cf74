"""Resuming a multi-node run under a c10d rendezvous (issue 15 item 2: a SLURM job's rendezvous): c10d gives
each node its node rank only at the rendezvous, so every agent checks every old node's folder (a shared
filesystem; loopback nodes share one disk) and the ranks pick their node's folder from ``GROUP_RANK``. A
real two-node DDP run over loopback with c10d, resumed by ``ftui resume ID --rdzv-endpoint`` on both nodes
with the uninterrupted run's losses; and a one-line refusal when an old node's folder is not readable."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from runner.nodes.c10d_resume import unreadable
from runner.rank.resume_map import node_rank, recipe_for_node, write_map
from runner.spec import checkpoint as ck
from store import Store
from store import nodes as store_nodes

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "recipes" / "quickstart.toml"


def test_each_rank_takes_its_folder_from_the_node_rank_torchrun_gave_it(tmp_path: Path) -> None:
    from runner.spec.recipe import load_recipe

    recipe = load_recipe(QUICKSTART, ["train.resume_from=\"/old/n0/checkpoints/step-4\""])
    assert recipe_for_node(recipe, tmp_path, {}) is recipe  # no map: a static resume or none, unchanged
    write_map(tmp_path, 4, {1: "/old/n1/checkpoints/step-4", 0: "/old/n0/checkpoints/step-4"})
    picked = recipe_for_node(recipe, tmp_path, {"GROUP_RANK": "1", "RANK": "0", "LOCAL_WORLD_SIZE": "1"})
    assert picked.train.resume_from == "/old/n1/checkpoints/step-4"
    assert node_rank({"RANK": "5", "LOCAL_WORLD_SIZE": "2"}) == 2  # no GROUP_RANK: RANK // LOCAL_WORLD_SIZE
    with pytest.raises(ValueError, match="GROUP_RANK"):
        node_rank({})
    with pytest.raises(ValueError, match="no folder for node rank 3"):
        recipe_for_node(recipe, tmp_path, {"GROUP_RANK": "3"})
    one = tmp_path / "one"
    one.mkdir()
    write_map(one, 4, {0: "/old/n0/checkpoints/step-4"})  # one machine: one process, torchrun may set nothing
    assert recipe_for_node(recipe, one, {}).train.resume_from == "/old/n0/checkpoints/step-4"
    (tmp_path / "shared").mkdir()
    assert unreadable({0: ("a", str(tmp_path / "shared")), 1: ("b", str(tmp_path / "gone")), 2: ("c", "")}) == [
        f"node 1 (b): {tmp_path / 'gone'}", "node 2 (c): (no folder recorded)"]


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start(tmp_path: Path, db: str, command: list[str], tag: str, nnodes: int = 2) -> list[subprocess.Popen[str]]:
    endpoint = f"127.0.0.1:{_port()}"
    procs = []
    for k in range(nnodes):
        env = {**os.environ, "FTUI_HOME": str(tmp_path / f"node{k}"), "PYTHONPATH": str(ROOT)}
        env.pop("SLURM_JOB_ID", None)
        argv = [sys.executable, "-m", "tui.cli", *command, "--db", db, "--nnodes", str(nnodes),
                "--rdzv-endpoint", endpoint]
        log = open(tmp_path / f"{tag}{k}.log", "w")  # noqa: SIM115 (closed with the process)
        procs.append(subprocess.Popen(argv, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True,
                                      start_new_session=True))
    return procs


def _logs(tmp_path: Path, tag: str, n: int = 2) -> str:
    return "\n".join((tmp_path / f"{tag}{k}.log").read_text()[-3000:] for k in range(n))


def _wait(procs: list[subprocess.Popen[str]], tmp_path: Path, tag: str, timeout: float = 480) -> list[int]:
    try:
        return [p.wait(timeout=timeout) for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            os.killpg(p.pid, signal.SIGKILL)
        raise AssertionError(f"nodes did not finish:\n{_logs(tmp_path, tag, len(procs))}") from None


def _events(run_dir: Path) -> list[dict[str, Any]]:
    import json

    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines() if line.strip()]


@pytest.mark.slow
def test_ftui_resume_with_c10d_on_both_nodes_continues_with_the_losses(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/ftui.db"
    train = ["run", str(QUICKSTART), "--strategy", "ddp", "--nproc", "1", "--set", "train.max_steps=6",
             "--set", "train.save_every=2", "--set", "train.keep_checkpoints=3", "--sample-interval", "0"]
    assert _wait(_start(tmp_path, db, train, "train"), tmp_path, "train") == [0, 0], _logs(tmp_path, "train")
    store = Store(db)
    (old,) = store.list_runs()
    assert (old.status, old.nnodes) == ("completed", 2)
    uninterrupted = {m.step: m.loss for m in store.metrics(old.id)}
    folders = {n.node_rank: Path(n.run_dir) for n in store_nodes.nodes(store, old.id)}
    assert set(folders) == {0, 1} and folders[0] != folders[1]
    # Old node 1's part of the newest checkpoint is damaged: every node falls back to step 4. Whichever
    # node c10d now makes node 1 must load old node 1's folder (its random_states_1.pkl): a wrong folder fails.
    (ck.checkpoint_dir(folders[1], 6) / "random_states_1.pkl").unlink()
    resume = ["resume", str(old.id)]
    codes = _wait(_start(tmp_path, db, resume, "resume"), tmp_path, "resume")
    assert codes == [0, 0], _logs(tmp_path, "resume")
    for k in (0, 1):
        log = (tmp_path / f"resume{k}.log").read_text()
        assert "warning: step 6 is not complete on node 1" in log and "resuming from step 4" in log, log[-3000:]
        assert "node rank from c10d" in log
    new = next(r for r in store.list_runs() if r.id != old.id)
    assert (new.status, new.nnodes, new.resumed_from) == ("completed", 2, old.id), _logs(tmp_path, "resume")
    assert new.summary.resumed_from["step"] == 4
    resumed = {m.step: m.loss for m in store.metrics(new.id)}
    assert list(resumed) == [5, 6]
    assert resumed == pytest.approx({s: uninterrupted[s] for s in (5, 6)}, abs=1e-6)
    new_nodes = {n.node_rank: n for n in store_nodes.nodes(store, new.id)}
    assert {k: (n.status, n.ranks) for k, n in new_nodes.items()} == {0: ("completed", [0]), 1: ("completed", [1])}
    expected = {str(k): str(ck.checkpoint_dir(folders[k], 4)) for k in (0, 1)}
    for n in new_nodes.values():  # every node was handed the whole map; its ranks chose by GROUP_RANK
        import json

        assert json.loads((Path(n.run_dir) / "resume_nodes.json").read_text())["by_node_rank"] == expected
    start = next(e for e in _events(Path(new_nodes[0].run_dir)) if e["type"] == "start")  # rank 0's journal
    assert (start["start_step"], start["resumed_from"]) == (4, expected["0"])

    # Old node 1's folder is not readable here (not on a shared filesystem): both refuse, nothing trains.
    shutil.move(folders[1], tmp_path / "elsewhere")
    codes = _wait(_start(tmp_path, db, resume, "refused"), tmp_path, "refused", timeout=240)
    assert codes == [2, 2], _logs(tmp_path, "refused")
    for k in (0, 1):
        lines = (tmp_path / f"refused{k}.log").read_text().strip().splitlines()
        assert len(lines) == 1, lines
        assert lines[0].startswith("ftui: --rdzv-endpoint: a c10d resume needs the old run's folders on a shared "
                                   "filesystem"), lines
        assert lines[0].endswith(f"not readable here: node 1 ({store_nodes.nodes(store, old.id)[0].host}): "
                                 f"{folders[1]}"), lines
    assert {r.id for r in store.list_runs()} == {old.id, new.id}  # nothing recorded, nothing trained
