"""A launch is data: the argv, environment and accelerate config of a run, built by pure functions.

Nothing here spawns or writes; :mod:`runner.watch.procs` does (in one place). Tests compare the
result by list equality, like accelerate's own tests of ``prepare_*_cmd_env``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runner.spec import deepspeed_config, layout, openmp, strategies
from runner.spec import events as ev
from runner.spec.recipe import Recipe
from runner.spec.rendezvous import NodeSpec, accelerate_fields


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


def accelerate_config(recipe: Recipe, port: int, nodes: NodeSpec | None = None,
                      run_dir: Path = Path(".")) -> dict[str, Any]:
    """The accelerate config (as a dict for YAML) for a recipe.

    Always a complete file: ``accelerate launch`` silently reads the user's default config when
    flags are missing (docs/cpu-facts.md).
    """
    launch = recipe.launch
    strategy = strategies.resolve(launch.strategy, launch.engine)
    multi = launch.nproc > 1 or strategy.accelerate_type in ("FSDP", "DEEPSPEED") or nodes is not None
    config: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        # A pipeline or tensor-parallel run starts its processes as DDP would; runner/rank/pipeline.py and
        # runner/rank/tensor_parallel.py train them without accelerate's prepare.
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
    engine = strategy.engine_row()  # the ZeRO stages: which engine, which stage
    # torch's ZeRO-2/3 and hsdp are FSDP2 always
    fsdp_version = launch.fsdp_version if strategy.takes_fsdp_version else 2
    if strategy.accelerate_type == "DEEPSPEED":
        config["deepspeed_config"] = {"deepspeed_config_file": str(run_dir / deepspeed_config.DEEPSPEED_FILE),
                                      "zero3_init_flag": False}
        del config["mixed_precision"]  # the DeepSpeed file says it; accelerate refuses it said twice
    if strategy.accelerate_type == "FSDP":
        fsdp: dict[str, Any] = {
            "fsdp_version": fsdp_version,
            # Wraps each decoder layer; accelerate takes the class from the model's _no_split_modules.
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_state_dict_type": "FULL_STATE_DICT",
            "fsdp_offload_params": launch.offload == "optimizer+params",
            "fsdp_cpu_ram_efficient_loading": False,
            "fsdp_activation_checkpointing": False,
        }
        if fsdp_version == 1:
            fsdp |= {
                "fsdp_sharding_strategy": "FULL_SHARD",
                "fsdp_backward_prefetch": "BACKWARD_PRE",
                "fsdp_use_orig_params": True,  # LoRA mixes frozen and trainable params in one unit
                "fsdp_sync_module_states": False,  # needed on CPU (docs/cpu-facts.md); ranks init alike
                "fsdp_forward_prefetch": False,
            }
        else:
            # ZeRO-2 with PyTorch alone: keep the unsharded weights from forward to backward.
            fsdp["fsdp_reshard_after_forward"] = engine is None or engine.stage != 2
        config["fsdp_config"] = fsdp
    sizes = layout.mesh(recipe)
    if sizes is not None:
        # hsdp: accelerate's ParallelismConfig builds the 2-D mesh and fully_shard takes it (``accelerate launch``
        # exports it as PARALLELISM_CONFIG_*; a GPU rank's Accelerator reads it; on CPU ftui's trainer builds the
        # same config itself: runner/rank/engines/accelerate.py).
        config["parallelism_config"] = {"parallelism_config_dp_replicate_size": sizes[0],
                                        "parallelism_config_dp_shard_size": sizes[1]}
    if nodes is not None:  # several machines: the rendezvous is the main node's (runner/spec/rendezvous.py)
        config |= accelerate_fields(nodes, launch.nproc)
    return config


def build_launch(
    recipe: Recipe,
    run_dir: Path,
    port: int,
    cpu_threads: int | None = None,
    python: str = sys.executable,
    nodes: NodeSpec | None = None,
    workdir: Path | None = None,
    trainable: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> LaunchSpec:
    """Build the launch of ``recipe`` in ``run_dir`` (pure: writes nothing).

    Args:
        recipe: the validated recipe.
        run_dir: the run folder (absolute); its files are named in the argv.
        port: the rendezvous port (the caller picks a free one, so runs do not collide).
        cpu_threads: threads per rank when training on CPU (accelerate's default is 1, which
            leaves cores idle); None on GPU machines, where accelerate's default stands.
        python: the interpreter that runs ``accelerate launch`` and the ranks.
        nodes: this machine's part of a multi-node run (its rendezvous); None for one machine.
        workdir: the folder a script run (``launch.script``) runs in, so that relative paths in its
            arguments mean what they meant where ``ftui run`` was typed; default the current folder.
        trainable: the model's trainable parameter count (the planner's), which caps DeepSpeed's buckets;
            None: not known (the configured sizes).
        environ: the environment the ranks start in, before this launch's variables (the caller's: the user's
            own settings there win over ftui's defaults); None: an empty one.
    """
    import yaml

    launch = recipe.launch
    on_cpu = launch.device == "cpu" or cpu_threads is not None  # the caller's runner.watch.host.runs_on_cpu
    files = {ev.RECIPE_FILE: recipe.to_toml()}
    text: str | None
    if launch.accelerate_config:
        config_path = str(Path(launch.accelerate_config).expanduser().resolve())
        text = None
    else:
        config_path = str(run_dir / ev.ACCELERATE_FILE)
        text = yaml.safe_dump(accelerate_config(recipe, port, nodes, run_dir), sort_keys=False)
        files[ev.ACCELERATE_FILE] = text
    if strategies.resolve(launch.strategy, launch.engine).accelerate_type == "DEEPSPEED":
        # Kept in the run folder beside accelerate.yaml, which names it (also with the recipe's own config).
        ds_config = deepspeed_config.deepspeed_config(recipe, on_cpu, trainable)
        files[deepspeed_config.DEEPSPEED_FILE] = json.dumps(ds_config, indent=2) + "\n"
    # Several processes on one machine: accelerate launch through runner/rank/loopback_launch.py, which binds
    # torchrun's rendezvous store to the loopback address (its server would otherwise listen on every
    # interface). One process has no store.
    # One process: accelerate launch in the launcher's own interpreter (runner/rank/solo_launch.py), which
    # saves the rank a second interpreter start and torch import.
    launcher = "runner.rank.loopback_launch" if launch.nproc > 1 or nodes is not None else "runner.rank.solo_launch"
    argv = [
        python,
        "-m",
        launcher,
        "--config_file",
        config_path,
        *(["--num_cpu_threads_per_process", str(cpu_threads)] if cpu_threads else []),
        # accelerate reads rdzv_backend from the flag only (its default "static" hides the config's c10d)
        *(["--rdzv_backend", "c10d"] if nodes is not None and nodes.backend == "c10d" and nodes.nnodes > 1 else []),
        *_program(recipe, run_dir, workdir),
    ]
    # torchrun reads MASTER_ADDR for a one-machine rendezvous (accelerate passes main_process_ip only
    # to multi-machine launches); gloo (the CPU backend) binds its pairs to the named interface.
    env = {"PYTHONUNBUFFERED": "1", "MASTER_ADDR": LOOPBACK, "GLOO_SOCKET_IFNAME": "lo"}
    if nodes is not None:
        env["MASTER_ADDR"] = nodes.main_addr
        env["FTUI_NNODES"] = str(nodes.nnodes)  # the trainer checks each node's own checkpoint parts
        if not nodes.loopback:  # other machines: gloo picks the interface that reaches the main node
            del env["GLOO_SOCKET_IFNAME"]
    if launch.gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, launch.gpus))
    if launch.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    if recipe.train.compile and cpu_threads is not None:
        # Inductor compiles in the rank: a pool of compile workers would import torch once more each and take
        # the cores the ranks train on (a cold quickstart compile on 2 cores: 57 s of CPU against 69 s).
        env["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
    # CPU ranks' OpenMP threads yield while they wait (runner/spec/openmp.py), unless the user said otherwise.
    env |= openmp.rank_wait_env(on_cpu, environ or {})
    return LaunchSpec(argv=argv, env=env, accelerate_config=config_path, accelerate_config_text=text, files=files)


def _program(recipe: Recipe, run_dir: Path, workdir: Path | None) -> list[str]:
    """What each rank runs: ftui's trainer, or the user's script through :mod:`runner.rank.script_run`
    (which records the rank's pid and log as the trainer does, then runs the script as ``__main__``)."""
    script = recipe.launch.script
    if script is None:
        return ["-m", "runner.rank.trainer", "--run-dir", str(run_dir)]
    cwd = str(workdir if workdir is not None else Path.cwd())
    return ["-m", "runner.rank.script_run", "--run-dir", str(run_dir), "--cwd", cwd, "--", script,
            *recipe.launch.script_args]
