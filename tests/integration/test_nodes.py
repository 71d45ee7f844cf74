"""Multi-node commands as real processes that train nothing: ``ftui run --nnodes`` refusing bad flags in
one line, node agents of separate processes racing for one run key, and ``ftui resume`` on both nodes of
a run refusing, in one line each, to resume what cannot be resumed (no checkpoint step complete on every
node; under c10d, an old node's folder not readable here). The old runs are written as their agents
write them: node rows in the store, each node's checkpoint parts in its own folder."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

from runner.spec import checkpoint as ck
from runner.spec.recipe import load_recipe
from store import Store
from store import nodes as store_nodes
from tests.support import new_home

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "recipes" / "quickstart.toml"
FAST = {"FTUI_NODE_HEARTBEAT_S": "0.25", "FTUI_NODE_POLL_S": "0.1"}
"""The waiting agents read the store often: each refusal below comes as soon as both nodes are there."""


def test_ftui_run_refuses_bad_multinode_flags_in_one_line(tmp_path: Path) -> None:
    """Dry runs, through ``main`` in this process (``Ftui.call``)."""
    ftui = new_home(tmp_path)
    proc = ftui.call("run", str(QUICKSTART), "--strategy", "ddp", "--nproc", "1", "--nnodes", "2", "--main-addr",
                     "127.0.0.1", "--dry-run")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "ftui: --node-rank: this machine's node rank (0 to nnodes-1) is needed with --main-addr"]
    proc = ftui.call("run", str(QUICKSTART), "--strategy", "ddp", "--nproc", "1", "--nnodes", "2", "--node-rank", "1",
                     "--main-addr", "127.0.0.1", "--dry-run", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    launch = json.loads(proc.stdout)
    assert launch["env"]["MASTER_ADDR"] == "127.0.0.1" and launch["env"]["GLOO_SOCKET_IFNAME"] == "lo"
    assert launch["argv"][1:3] == ["-m", "runner.rank.loopback_launch"]


def test_nodes_racing_for_one_key_make_one_run(db_url: str) -> None:
    code = ("import sys, os\nfrom store import Store\nfrom store.nodes import join_run\n"
            "j = join_run(Store(sys.argv[1]), 'race', 4, dict(name='x', recipe_text='', recipe_hash='h', "
            "strategy='ddp', nproc=4, method='lora', model='m', run_dir=''), pid=os.getpid())\n"
            "print(j.run_id, j.slot)\n")
    Store(db_url)  # schema first: the racers then only race for the key
    procs = [subprocess.Popen([sys.executable, "-c", code, db_url], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}) for _ in range(4)]
    results = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), results
    pairs = sorted(tuple(map(int, out.split())) for out, _ in results)
    assert len({run for run, _ in pairs}) == 1, pairs
    assert [slot for _, slot in pairs] == [0, 1, 2, 3]
    assert len(Store(db_url).list_runs()) == 1


# ---------------------------------------------------------------------- resumes that both nodes refuse


def _checkpoint(run_dir: Path, step: int, rank: int) -> Path:
    """Node ``rank``'s part of a two-rank DDP checkpoint, as the trainer writes it (manifest last)."""
    folder = ck.checkpoint_dir(run_dir, step)
    folder.mkdir(parents=True)
    (folder / f"random_states_{rank}.pkl").write_bytes(b"x" * (10 + rank))
    for name in ("model.safetensors", "optimizer.bin", "custom_checkpoint_0.pkl"):
        (folder / name).write_bytes(b"w" * 100)
    ck.write_manifest(folder, {"format": ck.FORMAT, "step": step, "world_size": 2, "strategy": "ddp",
                               "complete": True, "files": ck.file_sizes(folder)})
    return folder


def _ended_two_node_run(tmp_path: Path) -> tuple[str, int, dict[int, Path]]:
    """A completed two-node DDP run (one rank per node) whose nodes each hold steps 2, 4 and 6 in their own
    folders. Returns the store's URL, the run's id and each node rank's folder."""
    db = f"sqlite:///{tmp_path}/ftui.db"
    store = Store(db)
    recipe = load_recipe(QUICKSTART, ["launch.strategy=\"ddp\"", "launch.nproc=1", "launch.nnodes=2"])
    create = {"name": recipe.name, "recipe_text": recipe.to_toml(), "recipe_hash": recipe.digest(),
              "strategy": "ddp", "nproc": 2, "method": recipe.method.type, "model": recipe.model.name, "run_dir": ""}
    folders = {k: tmp_path / "old" / f"n{k}" for k in (0, 1)}
    run_id = 0
    for k, folder in folders.items():
        joined = store_nodes.join_run(store, "old-run", 2, create, pid=os.getpid(), host=f"host{k}")
        run_id = joined.run_id
        for step in (2, 4, 6):
            _checkpoint(folder, step, k)
        store_nodes.update_node(store, run_id, joined.slot, node_rank=k, ranks=[k], run_dir=str(folder),
                                status="completed", checkpoints=[2, 4, 6])
    store.update_run(run_id, status="completed", run_dir=str(folders[0]))
    return db, run_id, folders


def _resume_on_both_nodes(tmp_path: Path, db: str, flags: list[str]) -> list[tuple[int, str]]:
    """``ftui resume`` with ``flags`` on two node processes at once; each one's exit code and output."""
    procs = []
    for k in range(2):
        env = {**os.environ, **FAST, "FTUI_HOME": str(tmp_path / f"node{k}"), "PYTHONPATH": str(ROOT)}
        env.pop("SLURM_JOB_ID", None)
        node_flags = [arg.replace("{K}", str(k)) for arg in flags]
        procs.append(subprocess.Popen([sys.executable, "-m", "tui.cli", "resume", *node_flags, "--db", db], env=env,
                                      cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      start_new_session=True))
    try:
        return [(p.wait(timeout=240), p.stdout.read() if p.stdout else "") for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            os.killpg(p.pid, signal.SIGKILL)
        raise AssertionError("ftui resume did not end on both nodes") from None


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_both_nodes_refuse_a_resume_when_no_step_is_complete_on_every_node(tmp_path: Path) -> None:
    db, old, folders = _ended_two_node_run(tmp_path)
    (ck.checkpoint_dir(folders[1], 6) / "random_states_1.pkl").unlink()  # node 1's part of step 6 is gone
    for step in (2, 4):
        (ck.checkpoint_dir(folders[1], step) / "optimizer.bin").write_bytes(b"damaged")
    port = str(_port())
    ended = _resume_on_both_nodes(tmp_path, db, [str(old), "--nnodes", "2", "--node-rank", "{K}",
                                                 "--main-addr", "127.0.0.1", "--main-port", port])
    assert [code for code, _ in ended] == [2, 2], ended
    for _, out in ended:
        lines = out.strip().splitlines()
        last = lines[-1]
        assert last.startswith(f"ftui: run {old}: no checkpoint step is complete on every node ("), lines
        assert "node 0 (host0): steps 2, 4, 6" in last and "node 1 (host1): none" in last, last
        assert "Traceback" not in out
    # Node 1 says what is wrong on its disk (its newest step: its rank's part is missing).
    assert "); here: " in ended[1][1] and "random_states_1.pkl is missing" in ended[1][1], ended[1][1]
    store = Store(db)
    (refused,) = [r for r in store.list_runs() if r.id != old]
    assert (refused.status, refused.resumed_from) == ("failed", old)
    assert "no checkpoint step is complete on every node" in (refused.error or "")
    assert store.metrics(refused.id) == []
    # Each node recorded what its disk holds now, replacing what the old run recorded.
    assert [n.checkpoints for n in store_nodes.nodes(store, old)] == [[2, 4, 6], []]


def test_a_c10d_resume_refuses_when_an_old_nodes_folder_is_not_readable_here(tmp_path: Path) -> None:
    db, old, folders = _ended_two_node_run(tmp_path)
    shutil.move(folders[1], tmp_path / "elsewhere")  # old node 1's folder is not on a shared filesystem
    ended = _resume_on_both_nodes(tmp_path, db, [str(old), "--nnodes", "2", "--rdzv-endpoint",
                                                 f"127.0.0.1:{_port()}"])
    assert [code for code, _ in ended] == [2, 2], ended
    for _, out in ended:
        lines = out.strip().splitlines()
        assert len(lines) == 1, lines
        assert lines[0].startswith("ftui: --rdzv-endpoint: a c10d resume needs the old run's folders on a shared "
                                   "filesystem"), lines
        assert lines[0].endswith(f"not readable here: node 1 (host1): {folders[1]}"), lines
    assert [r.id for r in Store(db).list_runs()] == [old]  # nothing recorded, nothing trained
