"""Hybrid sharding (``hsdp``) without training: the mesh a recipe asks for and its refusals, the launch's
accelerate config, the planner's per-device terms (sharded over the shard group only), the sweep's and the
plan's candidates, the strategy column of a comparison, and the check of the mesh a rank found in effect.
Real training over gloo: tests/e2e/test_parallel.py."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from runner.analysis.compare import build_comparison
from runner.analysis.verdict import label
from runner.planner import estimate, inputs_from_recipe, resolve_model_shape
from runner.service.sweep import plan
from runner.spec import layout, strategies
from runner.spec.launch import build_launch
from runner.spec.recipe import RecipeError, load_recipe
from runner.watch.preflight import PreflightError, preflight
from tests.support import QUICKSTART, run_in_process, run_info
from tui.render.compare_cells import COLUMNS


def _recipe(*sets: str) -> Any:
    return load_recipe(QUICKSTART, ["launch.strategy=hsdp", *sets])


@pytest.mark.parametrize(("sets", "expected"), [
    (["launch.nproc=2"], "launch.nproc: strategy 'hsdp' needs at least 4 processes"),
    (["launch.nproc=5"], "launch.replicate: replicate 2 x shard 2 = 4 is not every process (nproc = 5) (the "
                         "default; set launch.replicate or launch.shard)"),
    (["launch.nproc=8", "launch.shard=3"], "launch.shard: replicate 2 x shard 3 = 6 is not every process (nproc = 8)"),
    (["launch.nproc=8", "launch.replicate=2", "launch.shard=2"],
     "launch.replicate: replicate 2 x shard 2 = 4 is not every process (nproc = 8)"),
    (["launch.nproc=4", "launch.replicate=4"],
     "launch.replicate: hsdp needs at least 2 replicas of at least 2 shards (got replicate 4 x shard 1; that is ddp)"),
    (["launch.nproc=4", "launch.shard=4"],
     "launch.shard: hsdp needs at least 2 replicas of at least 2 shards (got replicate 1 x shard 4; that is fsdp)"),
    (["launch.nproc=4", "launch.replicate=0"], "launch.replicate: Input should be greater than 0"),
    (["launch.nproc=4", "launch.shard=true"], "launch.shard: Input should be a valid integer"),
    (["launch.nproc=4", "launch.fsdp_version=1"], "launch.fsdp_version: hsdp is FSDP2 on a 2-D mesh (got 1); set 2"),
    (["launch.nproc=4", "launch.nnodes=3", "launch.shard=6"],
     "launch.shard: a shard group of 6 processes would straddle machines of 4; use a divisor or a multiple of nproc"),
])
def test_a_mesh_that_cannot_be_built_is_one_line_naming_the_field(sets: list[str], expected: str) -> None:
    with pytest.raises(RecipeError) as info:
        _recipe(*sets)
    assert expected in str(info.value) and "\n" not in str(info.value)


def test_the_mesh_replicates_across_machines_and_shards_within_one() -> None:
    assert layout.mesh(_recipe("launch.nproc=4")) == (2, 2)  # one machine: two groups, the smallest hybrid
    assert layout.mesh(_recipe("launch.nproc=6")) == (2, 3)
    assert layout.mesh(_recipe("launch.nproc=8", "launch.shard=4")) == (2, 4)
    assert layout.mesh(_recipe("launch.nproc=8", "launch.replicate=4")) == (4, 2)
    # Several machines: a group per machine by default; a shard group within a machine, or whole machines.
    assert layout.mesh(_recipe("launch.nproc=4", "launch.nnodes=2")) == (2, 4)
    assert layout.mesh(_recipe("launch.nproc=4", "launch.nnodes=2", "launch.shard=2")) == (4, 2)
    assert layout.mesh(_recipe("launch.nproc=2", "launch.nnodes=4", "launch.shard=4")) == (2, 4)
    assert layout.mesh(load_recipe(QUICKSTART, ["launch.strategy=fsdp", "launch.nproc=4"])) is None
    # Other strategies ignore the fields.
    assert load_recipe(QUICKSTART, ["launch.strategy=ddp", "launch.nproc=2", "launch.replicate=3"]).launch.replicate == 3


def test_the_accelerate_config_is_fsdp2_with_accelerates_parallelism_config() -> None:
    run = Path("/runs/00001-quickstart")
    config = yaml.safe_load(build_launch(_recipe("launch.nproc=4"), run, 1).files["accelerate.yaml"])
    assert (config["distributed_type"], config["num_processes"]) == ("FSDP", 4)
    assert config["fsdp_config"]["fsdp_version"] == 2 and config["fsdp_config"]["fsdp_reshard_after_forward"] is True
    assert config["parallelism_config"] == {"parallelism_config_dp_replicate_size": 2,
                                            "parallelism_config_dp_shard_size": 2}
    fsdp = yaml.safe_load(build_launch(load_recipe(QUICKSTART, ["launch.strategy=fsdp", "launch.nproc=4"]), run,
                                       1).files["accelerate.yaml"])
    assert "parallelism_config" not in fsdp


@pytest.mark.parametrize("method", ["lora", "full"])
def test_the_estimate_of_hsdp_2x2_is_fsdp_x2s(method: str) -> None:
    """Each device of hsdp 2x2 holds what a device of fsdp x2 holds: the shard group's half of the weights,
    gradients and optimizer state (the other group holds the same halves); not fsdp x4's quarter."""
    shape = resolve_model_shape("builtin:tiny-llama", allow_network=False).shape

    def est(strategy: str, nproc: int, *sets: str) -> Any:
        recipe = load_recipe(QUICKSTART, [f"launch.strategy={strategy}", f"launch.nproc={nproc}",
                                          f'method.type="{method}"', *sets])
        return estimate(inputs_from_recipe(recipe, shape=shape))

    hsdp, fsdp2, fsdp4 = est("hsdp", 4), est("fsdp", 2), est("fsdp", 4)
    for part in ("params", "grads", "grads_total", "optimizer", "master", "buffers", "total"):
        assert getattr(hsdp, part) == getattr(fsdp2, part), part
    assert hsdp.params > fsdp4.params and hsdp.optimizer > fsdp4.optimizer
    # Four groups of two shard as two groups of two do; two groups of four as fsdp x4.
    assert est("hsdp", 8, "launch.replicate=4").params == fsdp2.params
    assert est("hsdp", 8).params == fsdp4.params


def test_the_sweep_and_the_plan_take_hsdp_with_its_mesh() -> None:
    items = {i.strategy: i for i in plan(QUICKSTART, ["ddp", "hsdp"], 2, [], [])}
    hsdp = items["hsdp"]
    assert (hsdp.nproc, hsdp.label) == (4, "hsdp 2x2") and items["ddp"].label == "ddp x 2"
    assert "train.batch_size=1" in hsdp.overrides and "global batch 4 kept" in hsdp.note
    assert strategies.global_batch("hsdp", 1, 2, 4) == 8  # every process trains its own rows
    assert plan(QUICKSTART, ["hsdp"], 8, ["launch.shard=4"], [])[0].label == "hsdp 2x4"


def test_compare_reads_the_mesh_in_effect_else_the_recipes() -> None:
    seen = {"how": "FSDP2 fully_shard on a 2-D mesh: replicate 2 x shard 2", "mesh": {"replicate": 2, "shard": 2}}
    in_effect = run_info(1, "hsdp", 4, 100.0, sharding=seen)
    asked = dataclasses.replace(run_info(2, "hsdp", 8, 90.0), recipe_text='[launch]\nstrategy = "hsdp"\nshard = 4\n')
    ddp = run_info(3, "ddp", 4, 80.0)
    cmp = build_comparison([in_effect, asked, ddp], {})
    cell = dict(COLUMNS)["strategy"]
    assert [cell(r) for r in cmp.rows] == ["hsdp 2x2", "hsdp 2x4", "ddp"]
    assert [label(r) for r in cmp.rows] == ["hsdp 2x2", "hsdp 2x4", "ddp x4"]


def test_a_rank_whose_mesh_is_not_the_recipes_stops_the_run() -> None:
    recipe = _recipe("launch.nproc=4")
    right = {"how": "FSDP2 fully_shard on a 2-D mesh: replicate 2 x shard 2", "mesh": {"replicate": 2, "shard": 2}}
    assert layout.mesh_mismatch(recipe, right) is None
    flat = {"how": "FSDP2 fully_shard", "mesh": {"replicate": 1, "shard": 4}}
    assert layout.mesh_mismatch(recipe, flat) == ("launch.strategy: asked for hsdp replicate 2 x shard 2 but the "
                                                  "rank runs FSDP2 fully_shard; the run was stopped")
    assert layout.mesh_mismatch(load_recipe(QUICKSTART, ["launch.strategy=fsdp", "launch.nproc=4"]), flat) is None


def test_the_cli_flags_override_the_recipe_and_bad_ones_are_one_line(capsys: Any, monkeypatch: Any,
                                                                    tmp_path: Path) -> None:
    monkeypatch.setenv("FTUI_HOME", str(tmp_path))
    monkeypatch.setenv("FTUI_DB", f"sqlite:///{tmp_path / 'ftui.db'}")
    bad = run_in_process(capsys, "run", str(QUICKSTART), "--strategy", "hsdp", "--nproc", "8", "--replicate", "3",
                         "--force", "--dry-run")
    assert bad.returncode == 2 and len(bad.stderr.splitlines()) == 1 and "Traceback" not in bad.stderr
    assert "launch.replicate: replicate 3 x shard 2 = 6 is not every process (nproc = 8)" in bad.stderr
    zero = run_in_process(capsys, "run", str(QUICKSTART), "--strategy", "hsdp", "--shard", "0", "--dry-run")
    assert zero.returncode == 2 and "launch.shard: Input should be greater than 0" in zero.stderr
    # --strategy hsdp alone takes the 4 processes it needs; --shard picks the groups.
    ok = run_in_process(capsys, "run", str(QUICKSTART), "--strategy", "hsdp", "--nproc", "8", "--shard", "4",
                        "--force", "--dry-run", "--format", "json")
    assert ok.returncode == 0, ok.stderr
    default = run_in_process(capsys, "run", str(QUICKSTART), "--strategy", "hsdp", "--dry-run", "--format", "json")
    assert default.returncode == 0, default.stderr
    configs = [Path(json.loads(r.stdout)["accelerate_config"]) for r in (ok, default)]
    meshes = [yaml.safe_load(c.read_text())["parallelism_config"] for c in configs]
    assert [(m["parallelism_config_dp_replicate_size"], m["parallelism_config_dp_shard_size"]) for m in meshes] == \
        [(2, 4), (2, 2)]


def test_your_own_script_under_hsdp_on_cpu_is_refused_before_launch(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    recipe = load_recipe(QUICKSTART, ["launch.strategy=hsdp", "launch.nproc=4", 'launch.device="cpu"',
                                      f'launch.script="{script}"'])
    with pytest.raises(PreflightError, match="launch.strategy: hsdp in your own script needs GPUs"):
        preflight(recipe, force=True)
