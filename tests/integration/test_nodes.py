"""Multi-node runs (issue 15 items 1 and 4): the rendezvous settings, the run row every node joins, stop
requests through the store, the run's end settled from every node; and real two-node runs on this
machine over loopback (two ``ftui run --nnodes 2`` processes, each with its own data folder, one store)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from runner.spec.launch import accelerate_config, build_launch
from runner.spec.recipe import load_recipe
from runner.spec.rendezvous import NodesError, node_spec
from store import Store
from store import nodes as store_nodes
from store.store import utcnow

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "recipes" / "quickstart.toml"


def _create(name: str = "x") -> dict[str, Any]:
    return {"name": name, "recipe_text": "", "recipe_hash": "h", "strategy": "ddp", "nproc": 2, "method": "lora",
            "model": "m", "run_dir": ""}


# ---------------------------------------------------------------------- settings and launch (pure)


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"nnodes": 1, "node_rank": 0, "main_addr": "a"}, "--nnodes"),
    ({"nnodes": 2, "node_rank": None, "main_addr": "a"}, "--node-rank"),
    ({"nnodes": 2, "node_rank": 2, "main_addr": "a"}, "--node-rank"),
    ({"nnodes": 2, "node_rank": 0, "main_addr": None}, "--main-addr"),
    ({"nnodes": 2, "node_rank": 0, "main_addr": None, "rdzv_endpoint": "h:1"}, "--node-rank"),
    ({"nnodes": 2, "node_rank": None, "main_addr": None, "rdzv_endpoint": "h:port"}, "--rdzv-endpoint"),
])
def test_bad_multinode_settings_name_the_field(kwargs: dict[str, Any], field: str) -> None:
    args = {"main_port": None, "rdzv_endpoint": None, "run_key": None, "recipe_name": "r"} | kwargs
    with pytest.raises(NodesError) as err:
        node_spec(**args)
    assert str(err.value).startswith(field)


def test_static_and_c10d_launches_are_accelerate_multi_machine_configs(tmp_path: Path) -> None:
    recipe = load_recipe(QUICKSTART, ["launch.strategy=ddp", "launch.nproc=2", "launch.nnodes=2"])
    static = node_spec(2, 1, "10.0.0.5", None, None, None, recipe.name)
    config = accelerate_config(recipe, static.main_port, static)
    assert {k: config[k] for k in ("num_machines", "machine_rank", "num_processes", "main_process_ip",
                                   "main_process_port", "rdzv_backend", "same_network")} == {
        "num_machines": 2, "machine_rank": 1, "num_processes": 4, "main_process_ip": "10.0.0.5",
        "main_process_port": 29500, "rdzv_backend": "static", "same_network": True}
    spec = build_launch(recipe, tmp_path, port=static.main_port, nodes=static)
    assert spec.env["MASTER_ADDR"] == "10.0.0.5"
    assert "GLOO_SOCKET_IFNAME" not in spec.env  # another machine: not the loopback interface
    c10d = node_spec(2, None, None, None, "head:29400", "job-7", recipe.name)
    config = accelerate_config(recipe, c10d.main_port, c10d)
    assert (config["rdzv_backend"], config["same_network"], config["main_process_ip"], c10d.run_key) == (
        "c10d", False, "head", "job-7")
    # Every node derives the same key from what it is given alike.
    assert node_spec(2, 0, "h", 1, None, None, "r").run_key == node_spec(2, 1, "h", 1, None, None, "r").run_key


def test_ftui_run_refuses_bad_multinode_flags_in_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "FTUI_HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "tui.cli", "run", str(QUICKSTART), "--strategy", "ddp", "--nproc", "1",
                           "--nnodes", "2", "--main-addr", "127.0.0.1", "--dry-run"],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "ftui: --node-rank: this machine's node rank (0 to nnodes-1) is needed with --main-addr"]
    proc = subprocess.run([sys.executable, "-m", "tui.cli", "run", str(QUICKSTART), "--strategy", "ddp", "--nproc", "1",
                           "--nnodes", "2", "--node-rank", "1", "--main-addr", "127.0.0.1", "--dry-run",
                           "--format", "json"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    launch = json.loads(proc.stdout)
    assert launch["env"]["MASTER_ADDR"] == "127.0.0.1" and launch["env"]["GLOO_SOCKET_IFNAME"] == "lo"
    assert launch["argv"][1:3] == ["-m", "runner.rank.loopback_launch"]


# ---------------------------------------------------------------------- the store (SQLite and PostgreSQL)


def test_nodes_join_one_run_and_a_finished_key_starts_a_new_one(db_url: str) -> None:
    store = Store(db_url)
    first = store_nodes.join_run(store, "k", 2, _create(), pid=1, host="a")
    second = store_nodes.join_run(store, "k", 2, _create(), pid=2, host="b")
    assert (first.run_id, first.slot, first.created) == (second.run_id, 0, True)
    assert (second.slot, second.created) == (1, False)
    with pytest.raises(store_nodes.JoinRefused, match="already has its 2 nodes"):
        store_nodes.join_run(store, "k", 2, _create(), pid=3, host="c")
    assert [n.host for n in store_nodes.nodes(store, first.run_id)] == ["a", "b"]
    store.update_run(first.run_id, status="completed")
    again = store_nodes.join_run(store, "k", 2, _create(), pid=4, host="a")
    assert again.run_id != first.run_id and again.slot == 0
    assert store.get_run(first.run_id).run_key == f"k#{first.run_id}"  # type: ignore[union-attr]


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


def test_the_run_fails_with_the_reason_of_the_node_that_failed_first(db_url: str) -> None:
    store = Store(db_url)
    a = store_nodes.join_run(store, "f", 2, _create(), pid=1, host="a")
    store_nodes.join_run(store, "f", 2, _create(), pid=2, host="b")
    store_nodes.update_node(store, a.run_id, 1, node_rank=1, status="failed", error="rank 1 killed by SIGKILL",
                            fault_at=100.0)
    assert store_nodes.settle(store, a.run_id) is None  # node 0 still runs
    store_nodes.update_node(store, a.run_id, 0, node_rank=0, status="failed", error="gloo: connection closed",
                            fault_at=101.0)
    settled = store_nodes.settle(store, a.run_id)
    assert settled is not None and settled.status == "failed"
    assert settled.error == "node 1 (b): rank 1 killed by SIGKILL"
    run = store.get_run(a.run_id)
    assert run is not None and (run.status, run.error) == ("failed", settled.error)


def test_a_node_that_stopped_reporting_is_taken_for_dead(db_url: str) -> None:
    store = Store(db_url)
    a = store_nodes.join_run(store, "d", 2, _create(), pid=1, host="a")
    store_nodes.join_run(store, "d", 2, _create(), pid=2, host="b")
    store_nodes.update_node(store, a.run_id, 0, status="completed")
    assert store_nodes.settle(store, a.run_id) is None
    with store._write() as s:  # node 1's agent last reported a minute ago
        from sqlalchemy import update

        from store.models import RunNode

        s.execute(update(RunNode).where(RunNode.slot == 1).values(heartbeat_at=utcnow() - timedelta(seconds=60)))
    settled = store_nodes.settle(store, a.run_id)
    assert settled is not None and settled.status == "failed"
    assert settled.error is not None and settled.error.startswith("node #1 (b): node died: its agent on b stopped")


def test_stop_requests_reach_every_node_agent(db_url: str, tmp_path: Path) -> None:
    from runner.nodes.agent import NodeAgent
    from runner.spec.rendezvous import node_spec
    from runner.watch.procs import StopRequest

    store = Store(db_url)
    a = store_nodes.join_run(store, "s", 2, _create(), pid=1, host="a")
    b = store_nodes.join_run(store, "s", 2, _create(), pid=2, host="b")
    spec = node_spec(2, 0, "127.0.0.1", 1, None, "s", "x")
    agents = [NodeAgent(store, j.run_id, j.slot, spec, j.created, nproc=1) for j in (a, b)]
    requests = [StopRequest(), StopRequest()]
    requests[1].request()  # Ctrl-C on node 1
    agents[1].tick(requests[1], tmp_path)
    assert [r.by for r in store_nodes.stop_requests(store, a.run_id)] == ["node #1 (" + agents[1].host + ")"]
    agents[0].tick(requests[0], tmp_path)
    assert requests[0].is_set() and not requests[0].kill
    store_nodes.post_stop(store, a.run_id, kill=True, by="the dashboard")
    agents[0]._last_beat = 0.0
    agents[0].tick(requests[0], tmp_path)
    assert requests[0].kill  # a kill after a graceful stop escalates


def test_samples_are_kept_per_node(db_url: str) -> None:
    from runner.hardware.records import DeviceSample

    store = Store(db_url)
    a = store_nodes.join_run(store, "t", 2, _create(), pid=1, host="a")

    def sample(t: float) -> DeviceSample:
        return DeviceSample(t, "h", "rank", 0, "rank 0", 50.0, 1, 2, None, None, None, "psutil", 9)

    assert store_nodes.ingest_node_samples(store, a.run_id, 0, [sample(10.0), sample(11.0)], []) == 2
    # Node 1's clock is behind: its readings are still its own, not dropped as old.
    assert store_nodes.ingest_node_samples(store, a.run_id, 1, [sample(5.0), sample(10.5)], []) == 2
    assert store_nodes.ingest_node_samples(store, a.run_id, 1, [sample(10.5)], []) == 0
    assert store_nodes.samples_per_node(store, a.run_id) == {0: 2, 1: 2}


# ---------------------------------------------------------------------- two nodes on this machine


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start_nodes(tmp_path: Path, db: str, extra: list[str], nnodes: int = 2) -> list[subprocess.Popen[str]]:
    port = _free_port()
    procs = []
    for k in range(nnodes):
        env = {**os.environ, "FTUI_HOME": str(tmp_path / f"node{k}"), "PYTHONPATH": str(ROOT)}
        argv = [sys.executable, "-m", "tui.cli", "run", str(QUICKSTART), "--db", db, "--nnodes", str(nnodes),
                "--node-rank", str(k), "--main-addr", "127.0.0.1", "--main-port", str(port), *extra]
        log = open(tmp_path / f"node{k}.log", "w")  # noqa: SIM115 (closed with the process)
        procs.append(subprocess.Popen(argv, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True,
                                      start_new_session=True))
    return procs


def _wait(procs: list[subprocess.Popen[str]], tmp_path: Path, timeout: float = 480) -> list[int]:
    try:
        return [p.wait(timeout=timeout) for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            os.killpg(p.pid, signal.SIGKILL)
        logs = "\n".join((tmp_path / f"node{k}.log").read_text()[-2000:] for k in range(len(procs)))
        raise AssertionError(f"nodes did not finish:\n{logs}") from None


def _logs(tmp_path: Path, n: int = 2) -> str:
    return "\n".join((tmp_path / f"node{k}.log").read_text()[-3000:] for k in range(n))


@pytest.mark.slow
def test_two_nodes_ddp_train_as_one_world_with_the_one_node_losses(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/ftui.db"
    steps = ["--set", "train.max_steps=3", "--sample-interval", "0.5"]
    procs = _start_nodes(tmp_path, db, ["--strategy", "ddp", "--nproc", "1", *steps])
    assert _wait(procs, tmp_path) == [0, 0], _logs(tmp_path)
    store = Store(db)
    (run,) = store.list_runs()
    assert (run.status, run.nnodes, run.nproc, run.distributed_type) == ("completed", 2, 2, "MULTI_CPU")
    nodes = store_nodes.nodes(store, run.id)
    assert sorted((n.node_rank, tuple(n.ranks), n.status) for n in nodes) == [(0, (0,), "completed"),
                                                                             (1, (1,), "completed")]
    per_node = store_nodes.samples_per_node(store, run.id)
    assert set(per_node) == {0, 1} and min(per_node.values()) > 0, per_node  # both nodes' telemetry, one run
    two_nodes = [m.loss for m in store.metrics(run.id)]
    # The same global batch on one machine (ddp x 2): the same losses.
    env = {**os.environ, "FTUI_HOME": str(tmp_path / "one"), "PYTHONPATH": str(ROOT)}
    one = subprocess.run([sys.executable, "-m", "tui.cli", "run", str(QUICKSTART), "--db", db, "--strategy", "ddp",
                          "--nproc", "2", *steps], env=env, cwd=ROOT, capture_output=True, text=True, timeout=480)
    assert one.returncode == 0, one.stdout[-3000:]
    single = store.list_runs()[0]
    assert len(two_nodes) == 3 and two_nodes == pytest.approx([m.loss for m in store.metrics(single.id)], abs=1e-5)


@pytest.mark.slow
def test_two_nodes_of_two_fsdp_ranks_stop_together_from_ftui_stop(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/ftui.db"
    procs = _start_nodes(tmp_path, db, ["--strategy", "fsdp", "--nproc", "2", "--set", "train.max_steps=200",
                                        "--grace", "120"])
    store = Store(db)
    deadline = time.monotonic() + 400
    run = None
    while time.monotonic() < deadline:  # the first step, then stop from a third process (any terminal)
        runs = store.list_runs()
        if runs and store.metrics(runs[0].id):
            run = runs[0]
            break
        assert all(p.poll() is None for p in procs), _logs(tmp_path)
        time.sleep(1)
    assert run is not None, _logs(tmp_path)
    env = {**os.environ, "FTUI_HOME": str(tmp_path / "elsewhere"), "PYTHONPATH": str(ROOT)}
    stop = subprocess.run([sys.executable, "-m", "tui.cli", "stop", str(run.id), "--db", db], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=400)
    assert _wait(procs, tmp_path) == [130, 130], _logs(tmp_path)
    assert stop.returncode == 0 and f"run {run.id}: stopped" in stop.stdout, stop.stdout + stop.stderr
    after = store.get_run(run.id)
    assert after is not None and (after.status, after.distributed_type) == ("stopped", "FSDP")
    nodes = store_nodes.nodes(store, run.id)
    assert sorted((n.node_rank, tuple(n.ranks), n.status) for n in nodes) == [(0, (0, 1), "stopped"),
                                                                             (1, (2, 3), "stopped")]
    assert set(store_nodes.samples_per_node(store, run.id)) == {0, 1}


@pytest.mark.slow
def test_a_node_that_dies_fails_the_run_with_its_reason(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/ftui.db"
    procs = _start_nodes(tmp_path, db, ["--strategy", "ddp", "--nproc", "1", "--set", "train.max_steps=200"])
    store = Store(db)
    deadline = time.monotonic() + 400
    while time.monotonic() < deadline and not (store.list_runs() and store.metrics(store.list_runs()[0].id)):
        assert all(p.poll() is None for p in procs), _logs(tmp_path)
        time.sleep(1)
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
    codes = _wait(procs, tmp_path, timeout=300)
    assert codes[1 - procs.index(next(p for p in procs if p.pid == victim.pid))] == 1, _logs(tmp_path)
    after = store.get_run(run.id)
    assert after is not None and after.status == "failed", after
    assert after.error is not None and after.error.startswith(f"node 1 ({victim.host}): node died"), after.error


# ---------------------------------------------------------------------- the TUI watches runs elsewhere


def _remote_run(store: Store) -> int:
    """A two-node run on two other machines, as their agents wrote it: nothing of it runs here."""
    from runner.hardware.records import DeviceSample

    run_id = store_nodes.join_run(store, "far", 2, _create("far"), pid=4_000_001, host="gpu-a").run_id
    store_nodes.join_run(store, "far", 2, _create("far"), pid=4_000_002, host="gpu-b")
    store.update_run(run_id, status="running", total_steps=10)
    store.ingest(run_id, [{"seq": 0, "type": "start", "time": 1.0},
                          {"seq": 1, "type": "step", "time": 2.0, "step": 1, "loss": 5.0, "tokens_per_s": 10.0}])
    for node, host in ((0, "gpu-a"), (1, "gpu-b")):
        samples = [DeviceSample(3.0, host, "gpu", 0, "NVIDIA H100", 90.0 + node, 1 << 30, 80 << 30, 500.0, 60.0, 1980,
                                "nvml", None),
                   DeviceSample(3.0, host, "host", -1, "host CPU (64 cores)", 10.0, 1, 2, None, None, None, "psutil",
                                None)]
        store_nodes.ingest_node_samples(store, run_id, node, samples, [])
    return run_id


def test_the_monitor_shows_a_run_on_other_machines_from_the_store_alone(db_url: str) -> None:
    from tui.app.poll import MonitorFeed

    store = Store(db_url)
    run_id = _remote_run(store)
    snap = MonitorFeed(store, run_id).poll()
    assert (snap.step, snap.last_loss) == (1, 5.0)
    labels = sorted(d.label for d in snap.devices)
    assert labels == ["node #0 GPU 0 H100", "node #1 GPU 0 H100", "node #1 host CPU (64 cores)"], labels
    assert snap.host is not None and snap.host.label == "node #0 host CPU (64 cores)"
    assert sorted(d.util for d in snap.devices if "GPU" in d.label) == [90.0, 91.0]
    nodes_line = snap.extra["nodes"]
    assert nodes_line.startswith("2/2 nodes (store) · node #0 gpu-a: running, last report ")
    assert "node #1 gpu-b: running, last report " in nodes_line and nodes_line.endswith(" s ago, 2 samples")


def test_stop_of_a_run_on_other_machines_goes_through_the_store(db_url: str) -> None:
    from runner.service.stop import request_stop

    store = Store(db_url)
    run_id = _remote_run(store)
    result = request_stop(store, run_id, wait=False)  # what the Monitor's s does (and ftui stop, waiting)
    assert result.status == "running" and "store" in result.how
    (request,) = store_nodes.stop_requests(store, run_id)
    assert not request.kill and request.by.startswith("stop on ")
    run = store.get_run(run_id)
    assert run is not None and run.stop_requested_at is not None


def test_ftui_runs_and_show_list_each_node_of_a_run_elsewhere(db_url: str, capsys: pytest.CaptureFixture[str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from tui.cli.main import main

    monkeypatch.setenv("COLUMNS", "160")
    store = Store(db_url)
    run_id = _remote_run(store)
    assert main(["runs", "--db", db_url, "--format", "json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert [(n["host"], n["status"], n["samples"]) for n in row["nodes"]] == [("gpu-a", "running", 2),
                                                                           ("gpu-b", "running", 2)]
    assert main(["show", str(run_id), "--db", db_url]) == 0
    text = capsys.readouterr().out
    assert "nodes (from the store" in text and "gpu-b" in text
    assert main(["runs", "--db", db_url]) == 0
    assert "far · 2/2 nodes" in capsys.readouterr().out
