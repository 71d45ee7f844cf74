"""A launch is data: the argv, environment and accelerate config of a run, built by pure functions.

Nothing here spawns or writes; :mod:`runner.orchestrator` does (in one place). Tests compare the
result by list equality, like accelerate's own tests of ``prepare_*_cmd_env``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runner import events as ev
from runner import strategies
from runner.recipe import Recipe


@dataclass(frozen=True)
class LaunchSpec:
    """Everything needed to start a run, and to start it again by hand."""

    argv: list[str]
    env: dict[str, str]
    """Variables to set on top of the caller's environment."""
    accelerate_config: str | None
    """Path of the accelerate config file the argv names (generated or the recipe's own)."""
    accelerate_config_text: str | None = None
    """Contents of the generated config (None when the recipe names its own file)."""
    files: dict[str, str] = field(default_factory=dict)
    """Files to write into the run folder before starting: name -> text."""

    def to_json(self) -> dict[str, Any]:
        return {"argv": self.argv, "env": self.env, "accelerate_config": self.accelerate_config}


LOOPBACK = "127.0.0.1"
"""Where a one-machine run's rendezvous and collectives listen: nothing outside the host can reach them."""


def accelerate_config(recipe: Recipe, port: int) -> dict[str, Any]:
    """The accelerate config (as a dict for YAML) for a recipe.

    Always a complete file: ``accelerate launch`` silently reads the user's default config when
    flags are missing (docs/cpu-facts.md).
    """
    launch = recipe.launch
    strategy = strategies.get(launch.strategy)
    multi = launch.nproc > 1 or strategy.accelerate_type == "FSDP"
    config: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        # A pipeline or tensor-parallel run starts its processes as DDP would; runner/pipeline.py and
        # runner/tensor_parallel.py train them without accelerate's prepare.
        "distributed_type": ("MULTI_GPU" if strategy.own_loop and launch.nproc > 1
                             else strategy.accelerate_type if multi else "NO"),
        "num_machines": 1,
        "machine_rank": 0,
        "num_processes": launch.nproc,
        "main_process_ip": LOOPBACK,  # one machine: the rendezvous needs no other interface
        "main_process_port": port,
        "mixed_precision": recipe.train.accelerate_mixed_precision,
        "gpu_ids": ",".join(map(str, launch.gpus)) if launch.gpus else "all",
        "rdzv_backend": "static",
        "same_network": True,
        "use_cpu": False,  # --cpu with several processes starts ONE process; the trainer asks for CPU
        "downcast_bf16": "no",
        "enable_cpu_affinity": False,
        "debug": False,
        "main_training_function": "main",
        "tpu_env": [],
        "tpu_use_cluster": False,
        "tpu_use_sudo": False,
    }
    if strategy.accelerate_type == "FSDP":
        fsdp: dict[str, Any] = {
            "fsdp_version": launch.fsdp_version,
            # Wraps each decoder layer; accelerate takes the class from the model's _no_split_modules.
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_state_dict_type": "FULL_STATE_DICT",
            "fsdp_offload_params": False,
            "fsdp_cpu_ram_efficient_loading": False,
            "fsdp_activation_checkpointing": False,
        }
        if launch.fsdp_version == 1:
            fsdp |= {
                "fsdp_sharding_strategy": "FULL_SHARD",
                "fsdp_backward_prefetch": "BACKWARD_PRE",
                "fsdp_use_orig_params": True,  # LoRA mixes frozen and trainable params in one unit
                "fsdp_sync_module_states": False,  # needed on CPU (docs/cpu-facts.md); ranks init alike
                "fsdp_forward_prefetch": False,
            }
        else:
            fsdp["fsdp_reshard_after_forward"] = True
        config["fsdp_config"] = fsdp
    return config


def build_launch(
    recipe: Recipe,
    run_dir: Path,
    port: int,
    cpu_threads: int | None = None,
    python: str = sys.executable,
) -> LaunchSpec:
    """Build the launch of ``recipe`` in ``run_dir`` (pure: writes nothing).

    Args:
        recipe: the validated recipe.
        run_dir: the run folder (absolute); its files are named in the argv.
        port: the rendezvous port (the caller picks a free one, so runs do not collide).
        cpu_threads: threads per rank when training on CPU (accelerate's default is 1, which
            leaves cores idle); None on GPU machines, where accelerate's default stands.
        python: the interpreter that runs ``accelerate launch`` and the ranks.
    """
    import yaml

    launch = recipe.launch
    files = {ev.RECIPE_FILE: recipe.to_toml()}
    text: str | None
    if launch.accelerate_config:
        config_path = str(Path(launch.accelerate_config).expanduser().resolve())
        text = None
    else:
        config_path = str(run_dir / ev.ACCELERATE_FILE)
        text = yaml.safe_dump(accelerate_config(recipe, port), sort_keys=False)
        files[ev.ACCELERATE_FILE] = text
    # Several processes on one machine: accelerate launch through runner/loopback_launch.py, which binds
    # torchrun's rendezvous store to the loopback address (its server would otherwise listen on every
    # interface). One process has no store: plain accelerate launch.
    launcher = "runner.loopback_launch" if launch.nproc > 1 else "accelerate.commands.launch"
    argv = [
        python,
        "-m",
        launcher,
        "--config_file",
        config_path,
        *(["--num_cpu_threads_per_process", str(cpu_threads)] if cpu_threads else []),
        "-m",
        "runner.trainer",
        "--run-dir",
        str(run_dir),
    ]
    # torchrun reads MASTER_ADDR for a one-machine rendezvous (accelerate passes main_process_ip only
    # to multi-machine launches); gloo (the CPU backend) binds its pairs to the named interface.
    env = {"PYTHONUNBUFFERED": "1", "MASTER_ADDR": LOOPBACK, "GLOO_SOCKET_IFNAME": "lo"}
    if launch.gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, launch.gpus))
    if launch.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    return LaunchSpec(argv=argv, env=env, accelerate_config=config_path, accelerate_config_text=text, files=files)
