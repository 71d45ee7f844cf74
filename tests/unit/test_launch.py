"""The launch is data: exact argv/env/config for each strategy (like accelerate's tests/integration/test_cli.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from runner.rank.solo_launch import late_openmp
from runner.spec.launch import build_launch
from runner.spec.openmp import wait_words
from runner.spec.recipe import parse_recipe
from runner.spec.rendezvous import node_spec

RUN = Path("/runs/00007-quickstart")


def _argv(config: str, threads: list[str] | None = None, launcher: str = "runner.rank.solo_launch") -> list[str]:
    return [sys.executable, "-m", launcher, "--config_file", config, *(threads or []),
            "-m", "runner.rank.trainer", "--run-dir", str(RUN)]


def test_single_on_cpu() -> None:
    spec = build_launch(parse_recipe(""), RUN, port=29555, cpu_threads=2)
    assert spec.argv == _argv(f"{RUN}/accelerate.yaml", ["--num_cpu_threads_per_process", "2"])
    assert spec.env == {"PYTHONUNBUFFERED": "1", "MASTER_ADDR": "127.0.0.1", "GLOO_SOCKET_IFNAME": "lo",
                        "OMP_WAIT_POLICY": "PASSIVE"}
    config = yaml.safe_load(spec.files["accelerate.yaml"])
    assert (config["distributed_type"], config["num_processes"], config["main_process_port"]) == ("NO", 1, 29555)
    assert config["use_cpu"] is False
    assert parse_recipe(spec.files["recipe.toml"]) == parse_recipe("")


def test_compiled_layers_on_cpu_compile_in_the_rank() -> None:
    compiled = parse_recipe("[train]\ncompile = true\n")
    assert build_launch(compiled, RUN, port=1, cpu_threads=2).env["TORCHINDUCTOR_COMPILE_THREADS"] == "1"
    assert "TORCHINDUCTOR_COMPILE_THREADS" not in build_launch(compiled, RUN, port=1).env  # a GPU's: inductor's own


def test_cpu_ranks_openmp_threads_yield_unless_the_user_set_how_they_wait() -> None:
    cpu, gpu = parse_recipe("[launch]\nstrategy='ddp'\nnproc=2\n"), parse_recipe("[launch]\ndevice='cuda'\n")
    assert build_launch(cpu, RUN, 1, cpu_threads=1, environ={"HOME": "/h"}).env["OMP_WAIT_POLICY"] == "PASSIVE"
    assert build_launch(parse_recipe("[launch]\ndevice='cpu'\n"), RUN, 1).env["OMP_WAIT_POLICY"] == "PASSIVE"
    assert "OMP_WAIT_POLICY" not in build_launch(gpu, RUN, 1, environ={}).env  # GPU ranks: OpenMP's default
    for mine in ({"OMP_WAIT_POLICY": "ACTIVE"}, {"GOMP_SPINCOUNT": "10000"}, {"KMP_BLOCKTIME": "0"}):
        env = build_launch(cpu, RUN, 1, cpu_threads=1, environ=mine).env
        assert not set(env) & {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME"}, mine  # the user's reaches the ranks
    # a script run's ranks and one machine's of several (SLURM's node agents build theirs here too) alike
    script = parse_recipe("[launch]\nscript='train.py'\n")
    assert build_launch(script, RUN, 1, cpu_threads=2, environ={}).env["OMP_WAIT_POLICY"] == "PASSIVE"
    node = node_spec(2, 1, "10.0.0.5", None, None, None, cpu.name)
    assert build_launch(cpu, RUN, node.main_port, cpu_threads=1, nodes=node).env["OMP_WAIT_POLICY"] == "PASSIVE"


def test_how_openmp_threads_wait_in_words() -> None:
    assert wait_words({"OMP_WAIT_POLICY": "PASSIVE"}) == "yield"
    assert wait_words({"OMP_WAIT_POLICY": "active"}) == "spin"
    assert wait_words({}) == "spin (OpenMP's default)"
    assert wait_words({"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "10000"}) == (
        "as set: OMP_WAIT_POLICY=PASSIVE, GOMP_SPINCOUNT=10000")  # a spin length bounds the spin whatever the policy
    assert wait_words({"KMP_BLOCKTIME": "0"}) == "as set: KMP_BLOCKTIME=0"


def test_the_one_process_launcher_hands_late_openmp_variables_to_an_interpreter_of_their_own() -> None:
    """The OpenMP runtime reads its variables as torch loads, before accelerate's environment is known: one that
    environment adds (KMP_BLOCKTIME under a user's ``use_cpu``) needs a second interpreter; OMP_NUM_THREADS is
    applied through torch; ftui's own are there from the spawn."""
    loaded = {"OMP_WAIT_POLICY": "PASSIVE", "PATH": "/bin"}
    assert late_openmp(loaded, {**loaded, "OMP_NUM_THREADS": "2", "ACCELERATE_USE_CPU": "False"}) == []
    assert late_openmp(loaded, {**loaded, "KMP_BLOCKTIME": "1", "KMP_AFFINITY": "compact"}) == [
        "KMP_AFFINITY", "KMP_BLOCKTIME"]
    assert late_openmp(loaded, {"PATH": "/bin"}) == ["OMP_WAIT_POLICY"]  # taken away after the load: too late too


def test_ddp_on_gpus() -> None:
    recipe = parse_recipe("[launch]\nstrategy='ddp'\nnproc=2\ngpus=[2,3]\n[train]\nprecision='bf16'\n")
    spec = build_launch(recipe, RUN, port=29600)
    # several processes on one machine: accelerate launch with the rendezvous store on the loopback
    assert spec.argv == _argv(f"{RUN}/accelerate.yaml", launcher="runner.rank.loopback_launch")
    assert spec.env == {"PYTHONUNBUFFERED": "1", "MASTER_ADDR": "127.0.0.1", "GLOO_SOCKET_IFNAME": "lo",
                        "CUDA_VISIBLE_DEVICES": "2,3"}
    config = yaml.safe_load(spec.accelerate_config_text or "")
    assert config["distributed_type"] == "MULTI_GPU"
    assert (config["num_processes"], config["gpu_ids"], config["mixed_precision"]) == (2, "2,3", "bf16")
    assert "fsdp_config" not in config


def test_fsdp2_and_fsdp1_configs() -> None:
    two = yaml.safe_load(build_launch(parse_recipe("[launch]\nstrategy='fsdp'\nnproc=2\n"), RUN, 1).files["accelerate.yaml"])
    assert two["distributed_type"] == "FSDP"
    assert two["fsdp_config"]["fsdp_version"] == 2
    assert two["fsdp_config"]["fsdp_auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP"
    assert two["fsdp_config"]["fsdp_reshard_after_forward"] is True
    one = yaml.safe_load(
        build_launch(parse_recipe("[launch]\nstrategy='fsdp'\nnproc=2\nfsdp_version=1\n"), RUN, 1).files["accelerate.yaml"]
    )
    assert one["fsdp_config"]["fsdp_version"] == 1
    assert one["fsdp_config"]["fsdp_use_orig_params"] is True
    assert one["fsdp_config"]["fsdp_sync_module_states"] is False


def test_a_recipes_own_accelerate_config_is_used_as_is(tmp_path: Path) -> None:
    own = tmp_path / "mine.yaml"
    own.write_text("distributed_type: NO\n")
    spec = build_launch(parse_recipe(f"[launch]\naccelerate_config='{own}'\n"), RUN, 1)
    assert spec.argv == _argv(str(own))
    assert spec.accelerate_config == str(own)
    assert "accelerate.yaml" not in spec.files


def test_cpu_device_hides_gpus() -> None:
    spec = build_launch(parse_recipe("[launch]\ndevice='cpu'\n"), RUN, 1, cpu_threads=1)
    assert spec.env["CUDA_VISIBLE_DEVICES"] == ""
