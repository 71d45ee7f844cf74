"""Multi-node runs in the store, in-process: nodes joining one run, the run's end settled from every
node (the first failure's reason, a node that stopped reporting taken for dead), stop requests reaching
every node agent, samples and checkpoints per node, and the monitor, ``ftui stop``, ``ftui runs``/``show``
and ``ftui resume``'s flags reading a run on other machines from the store alone.

Every test takes ``db_url`` (a SQLite file here; tests/system runs store modules again on PostgreSQL).
Time is driven: the agents and ``settle`` take their clocks and sleep as parameters, so a 30 s death
timeout or a heartbeat's pace is tested without waiting.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from datetime import UTC
from pathlib import Path
from typing import Any

import pytest

from runner.nodes.agent import NodeAgent
from runner.nodes.timings import NodeTimings
from runner.spec import checkpoint as ck
from runner.spec.rendezvous import node_spec
from runner.watch.procs import StopRequest
from store import Store
from store import nodes as store_nodes

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "recipes" / "quickstart.toml"
DEAD_AFTER_S = NodeTimings().dead_after_s


def _create(name: str = "x") -> dict[str, Any]:
    return {"name": name, "recipe_text": "", "recipe_hash": "h", "strategy": "ddp", "nproc": 2, "method": "lora",
            "model": "m", "run_dir": ""}


class DrivenClock:
    """A clock that moves only when slept on: ``monotonic`` and ``time`` (seconds since the epoch, started
    at the real time so that the store's real heartbeats compare with it) and ``sleep``, which advances
    both and calls ``on_sleep`` (what the other nodes do meanwhile)."""

    def __init__(self, on_sleep: Callable[[float], None] | None = None) -> None:
        self.start = time.time()
        self.elapsed = 0.0
        self.sleeps = 0
        self.on_sleep = on_sleep

    def monotonic(self) -> float:
        return self.elapsed

    def time(self) -> float:
        return self.start + self.elapsed

    def sleep(self, seconds: float) -> None:
        self.elapsed += seconds
        self.sleeps += 1
        if self.on_sleep is not None:
            self.on_sleep(self.elapsed)


def _agent(store: Store, joined: store_nodes.Joined, clock: DrivenClock, timings: NodeTimings | None = None,
           **kwargs: Any) -> NodeAgent:
    spec = node_spec(2, joined.slot, "127.0.0.1", 1, None, "k", "x")
    return NodeAgent(store, joined.run_id, joined.slot, spec, joined.created, nproc=1, host=f"h{joined.slot}",
                     timings=timings or NodeTimings(), clock=clock.monotonic, wall_clock=clock.time,
                     sleep=clock.sleep, **kwargs)


# ---------------------------------------------------------------------- joining


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


# ---------------------------------------------------------------------- the run's end


def test_the_run_fails_with_the_reason_of_the_node_that_failed_first(db_url: str) -> None:
    store = Store(db_url)
    a = store_nodes.join_run(store, "f", 2, _create(), pid=1, host="a")
    store_nodes.join_run(store, "f", 2, _create(), pid=2, host="b")
    store_nodes.update_node(store, a.run_id, 1, node_rank=1, status="failed", error="rank 1 killed by SIGKILL",
                            fault_at=100.0)
    assert store_nodes.settle(store, a.run_id, DEAD_AFTER_S) is None  # node 0 still runs
    store_nodes.update_node(store, a.run_id, 0, node_rank=0, status="failed", error="gloo: connection closed",
                            fault_at=101.0)
    settled = store_nodes.settle(store, a.run_id, DEAD_AFTER_S)
    assert settled is not None and settled.status == "failed"
    assert settled.error == "node 1 (b): rank 1 killed by SIGKILL"
    run = store.get_run(a.run_id)
    assert run is not None and (run.status, run.error) == ("failed", settled.error)


def test_a_node_that_stopped_reporting_is_taken_for_dead(db_url: str) -> None:
    store = Store(db_url)
    a = store_nodes.join_run(store, "d", 2, _create(), pid=1, host="a")
    store_nodes.join_run(store, "d", 2, _create(), pid=2, host="b")
    store_nodes.update_node(store, a.run_id, 0, status="completed")
    now = time.time()  # node 1's agent last reported before this
    silent = store_nodes.nodes(store, a.run_id)[1]
    assert store_nodes.settle(store, a.run_id, 30.0, clock=lambda: now + 29.0) is None  # quiet, not dead yet
    settled = store_nodes.settle(store, a.run_id, 30.0, clock=lambda: now + 31.0)
    assert settled is not None and settled.status == "failed"
    assert settled.error is not None
    assert re.fullmatch(r"node #1 \(b\): node died: its agent on b stopped reporting 3[12] s ago", settled.error)
    dead = store_nodes.nodes(store, a.run_id)[1]
    # It failed when it last reported: that is what makes it the first failure, before its peers' losses.
    assert dead.status == "failed" and dead.fault_at == pytest.approx(silent.heartbeat_at.replace(tzinfo=UTC)
                                                                       .timestamp())
    # The run's status is written once: a later settle with another clock leaves it as it is.
    again = store_nodes.settle(store, a.run_id, 30.0, clock=lambda: now + 3600.0)
    assert again is not None and (again.status, again.error) == ("failed", settled.error)


def test_a_node_that_ended_waits_for_a_silent_node_to_be_taken_for_dead(db_url: str) -> None:
    store = Store(db_url)
    a = store_nodes.join_run(store, "w", 2, _create(), pid=1, host="h0")
    store_nodes.join_run(store, "w", 2, _create(), pid=2, host="h1")
    clock = DrivenClock()
    timings = NodeTimings(heartbeat_s=2.0, dead_after_s=30.0, poll_s=1.0)
    agent = _agent(store, a, clock, timings, fault_at=clock.time() + 5.0)  # its rank saw the peer go after
    settled = agent.finish("failed", "gloo: connection closed", 1)
    assert settled is not None and settled.status == "failed"
    assert settled.error is not None and settled.error.startswith("node #1 (h1): node died: its agent on h1 stopped")
    # It waited, by its own clock, until node 1 had been silent for longer than the death timeout.
    assert timings.dead_after_s <= clock.elapsed <= timings.dead_after_s + timings.poll_s
    assert clock.sleeps == round(clock.elapsed / timings.poll_s)
    run = store.get_run(a.run_id)
    assert run is not None and (run.status, run.error) == ("failed", settled.error)


def test_a_node_that_ended_leaves_a_node_still_reporting_to_settle_the_run(db_url: str) -> None:
    store = Store(db_url)
    a = store_nodes.join_run(store, "r", 2, _create(), pid=1, host="h0")
    b = store_nodes.join_run(store, "r", 2, _create(), pid=2, host="h1")
    clock = DrivenClock(on_sleep=lambda _: store_nodes.heartbeat(store, b.run_id, b.slot, clock=clock.time))
    timings = NodeTimings(heartbeat_s=0.5, dead_after_s=3.0, poll_s=0.25)
    # Node 1 reports on meanwhile: node 0 waits settle_wait_s, then leaves the run to it.
    assert _agent(store, a, clock, timings).finish("completed", None, 0) is None
    assert clock.elapsed == pytest.approx(timings.settle_wait_s)
    assert [n.status for n in store_nodes.nodes(store, a.run_id)] == ["completed", "running"]
    # Node 1 ends: it settles the run itself, at once.
    later = _agent(store, b, DrivenClock(), timings).finish("completed", None, 0)
    assert later is not None and later.status == "completed"


def test_a_resuming_node_waits_for_the_others_renewing_its_heartbeat(db_url: str) -> None:
    from runner.nodes.steps import wait_for_nodes
    from runner.watch.preflight import PreflightError

    store = Store(db_url)
    a = store_nodes.join_run(store, "j", 2, _create(), pid=1, host="h0")
    beats: list[float] = []

    def node_one_joins_late(elapsed: float) -> None:
        beats.append(store_nodes.nodes(store, a.run_id)[0].heartbeat_at.timestamp())
        if elapsed >= 5.0 and len(store_nodes.nodes(store, a.run_id)) < 2:
            store_nodes.join_run(store, "j", 2, _create(), pid=2, host="h1")

    clock = DrivenClock(on_sleep=node_one_joins_late)
    timings = NodeTimings(poll_s=1.0, join_wait_s=60.0)
    assert _agent(store, a, clock, timings).wait_for_nodes(2) == 2
    assert clock.elapsed == 5.0 and len(beats) == 5 and beats == sorted(beats)  # a heartbeat before each poll
    # Nobody else comes: after join_wait_s, one line naming the command to run on every node.
    lone = store_nodes.join_run(store, "alone", 2, _create(), pid=3, host="h2")
    clock = DrivenClock()
    with pytest.raises(PreflightError) as err:
        wait_for_nodes(_agent(store, lone, clock, timings), 2, 7, "ftui resume 7 --node-rank K --main-addr ADDR")
    assert str(err.value) == ("run 7: only 1 of 2 nodes joined the resume within 60 s: run `ftui resume 7 "
                              "--node-rank K --main-addr ADDR` on every node")
    assert clock.elapsed == 60.0


# ---------------------------------------------------------------------- stop requests


def test_stop_requests_reach_every_node_agent(db_url: str, tmp_path: Path) -> None:
    store = Store(db_url)
    a = store_nodes.join_run(store, "s", 2, _create(), pid=1, host="a")
    b = store_nodes.join_run(store, "s", 2, _create(), pid=2, host="b")
    clock = DrivenClock()
    timings = NodeTimings(heartbeat_s=2.0)
    agents = [_agent(store, j, clock, timings) for j in (a, b)]
    requests = [StopRequest(), StopRequest()]
    requests[1].request()  # Ctrl-C on node 1
    agents[1].tick(requests[1], tmp_path)
    assert [r.by for r in store_nodes.stop_requests(store, a.run_id)] == ["node #1 (h1)"]
    agents[0].tick(requests[0], tmp_path)
    assert requests[0].is_set() and not requests[0].kill
    store_nodes.post_stop(store, a.run_id, kill=True, by="the dashboard")
    clock.sleep(timings.heartbeat_s / 2)
    agents[0].tick(requests[0], tmp_path)
    assert not requests[0].kill  # the store is read once a heartbeat, not on every tick of the watcher
    clock.sleep(timings.heartbeat_s / 2)
    agents[0].tick(requests[0], tmp_path)
    assert requests[0].kill  # a kill after a graceful stop escalates


# ---------------------------------------------------------------------- telemetry and checkpoints per node


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


def _checkpoint(run_dir: Path, step: int, ranks: range, world: int = 2, strategy: str = "ddp") -> Path:
    """One node's part of a checkpoint: its ranks' RNG states and the replicated files, with a manifest."""
    folder = ck.checkpoint_dir(run_dir, step)
    folder.mkdir(parents=True)
    for r in ranks:
        (folder / f"random_states_{r}.pkl").write_bytes(b"x" * (10 + r))
    (folder / "optimizer.bin").write_bytes(b"o" * 100)
    ck.write_manifest(folder, {"format": ck.FORMAT, "step": step, "world_size": world, "strategy": strategy,
                               "complete": True, "files": ck.file_sizes(folder)})
    return folder


def test_each_node_records_the_checkpoints_it_holds_complete(db_url: str, tmp_path: Path) -> None:
    store = Store(db_url)
    a = store_nodes.join_run(store, "ck", 2, _create(), pid=1, host="a")
    b = store_nodes.join_run(store, "ck", 2, _create(), pid=2, host="b")
    assert [n.checkpoints for n in store_nodes.nodes(store, a.run_id)] == [None, None]  # never recorded
    folders = [tmp_path / "n0", tmp_path / "n1"]
    agents = [_agent(store, j, DrivenClock(), run_dir=f) for j, f in zip((a, b), folders, strict=True)]
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


# ---------------------------------------------------------------------- a run on other machines, from the store


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


def test_ftui_resume_of_a_multi_node_run_refuses_flags_that_cannot_work(
        db_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from runner.spec.recipe import load_recipe
    from tui.cli.main import main

    monkeypatch.setenv("FTUI_HOME", str(tmp_path))
    store = Store(db_url)
    create = _create("quickstart") | {"recipe_text": load_recipe(QUICKSTART).to_toml()}
    run_id = store_nodes.join_run(store, "old", 2, create, pid=1, host="a").run_id
    store_nodes.join_run(store, "old", 2, create, pid=2, host="b")
    store.update_run(run_id, status="stopped")
    cases = [
        ([], f"ftui: run {run_id}: ran on 2 machines; on each of them run `ftui resume {run_id} --node-rank K "
             "--main-addr ADDR` (docs/multi-node.md)"),
        (["--nnodes", "3", "--node-rank", "0", "--main-addr", "127.0.0.1"],
         f"ftui: --nnodes: run {run_id} ran on 2 machines; resume it on 2"),
        (["--rdzv-endpoint", "127.0.0.1:29400"],  # c10d: tests/integration/test_nodes.py
         f"ftui: run {run_id}: node #0 never started its ranks: it holds no checkpoint to resume from"),
        (["--node-rank", "1"], "ftui: --main-addr: a multi-node run needs the main node's address"),
        (["--node-rank", "0", "--main-addr", "127.0.0.1"],
         f"ftui: run {run_id}: node #0 never started its ranks: it holds no checkpoint to resume from"),
    ]
    for flags, line in cases:
        assert main(["resume", str(run_id), "--db", db_url, *flags]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(line), (flags, err)
    assert [r.id for r in store.list_runs()] == [run_id]  # nothing recorded
