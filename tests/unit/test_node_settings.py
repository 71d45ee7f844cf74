"""The settings of one machine of a multi-node run, pure: the rendezvous flags (each bad one named), the
accelerate multi-machine configs of a static and a c10d launch, the node timings from the environment,
and which old node's checkpoint folder each rank of a c10d resume loads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runner.nodes.c10d_resume import unreadable
from runner.nodes.timings import NodeTimings, TimingsError, env_name
from runner.rank.resume_map import node_rank, recipe_for_node, write_map
from runner.spec.launch import accelerate_config, build_launch
from runner.spec.recipe import load_recipe
from runner.spec.rendezvous import NodesError, node_spec

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "recipes" / "quickstart.toml"


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


def test_node_timings_come_from_the_environment_each_named_when_wrong() -> None:
    default = NodeTimings()
    assert NodeTimings.from_env({}) == default
    assert default.settle_wait_s > default.dead_after_s > default.heartbeat_s  # a death is seen before giving up
    small = NodeTimings.from_env({"FTUI_NODE_HEARTBEAT_S": "0.5", "FTUI_NODE_DEAD_AFTER_S": "4",
                                  "FTUI_NODE_POLL_S": " ", "OTHER": "x"})
    assert (small.heartbeat_s, small.dead_after_s, small.poll_s, small.join_wait_s) == (
        0.5, 4.0, default.poll_s, default.join_wait_s)
    assert env_name("join_wait_s") == "FTUI_NODE_JOIN_WAIT_S"
    with pytest.raises(TimingsError, match=r"^FTUI_NODE_POLL_S: 'soon': not a number of seconds$"):
        NodeTimings.from_env({"FTUI_NODE_POLL_S": "soon"})
    with pytest.raises(TimingsError, match=r"^FTUI_NODE_JOIN_WAIT_S: -1\.0: not a number of seconds"):
        NodeTimings.from_env({"FTUI_NODE_JOIN_WAIT_S": "-1"})
    with pytest.raises(TimingsError, match=r"^FTUI_NODE_REFUSE_WAIT_S: nan"):
        NodeTimings.from_env({"FTUI_NODE_REFUSE_WAIT_S": "nan"})
    # A death timeout within one heartbeat would take every live node for dead.
    with pytest.raises(TimingsError, match=r"^FTUI_NODE_DEAD_AFTER_S: 2 s: must exceed the heartbeat"):
        NodeTimings.from_env({"FTUI_NODE_DEAD_AFTER_S": "2"})


def test_each_rank_takes_its_folder_from_the_node_rank_torchrun_gave_it(tmp_path: Path) -> None:
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
