"""``python -m runner.rank.solo_launch ARGS``: ``accelerate launch ARGS`` for one process on one machine, run in
the launcher's own interpreter.

For one process ``accelerate launch`` parses its config, builds the rank's environment
(``prepare_simple_launcher_cmd_env``: ``ACCELERATE_*``, ``OMP_NUM_THREADS``, the visible devices) and
starts a second interpreter for the program, which imports torch and accelerate again: 1.2-1.3 s of a
run's start on the 2-core dev machine (docs/architecture.md). Here the same parser, validation and environment
builder of accelerate run, the environment is applied to this process, and the program (``-m
runner.rank.trainer ...`` or a script) runs here as ``__main__``: the rank is the launcher.

Anything but accelerate's simple launcher (DeepSpeed's launcher on a GPU, several processes or
machines, SageMaker), or an accelerate whose internals differ, goes through accelerate's own
``launch_command`` unchanged.

Importing accelerate here imports torch, and with it the OpenMP runtime, which reads its variables
(``OMP_*``, ``GOMP_*``, ``KMP_*``) once, as it loads: what this process's environment held then is what
the rank runs with. ftui's own (``OMP_WAIT_POLICY``: :mod:`runner.spec.openmp`) are in it from the spawn;
``OMP_NUM_THREADS``, which accelerate's environment adds, is applied through torch. Any other OpenMP
variable that accelerate's environment adds or changes (``KMP_BLOCKTIME`` when a user's accelerate config
says ``use_cpu``) would come too late, so such a launch goes through ``launch_command``, whose program
starts with it.
"""

from __future__ import annotations

import copy
import os
import runpy
import sys
from collections.abc import Mapping
from typing import Any

OPENMP_PREFIXES = ("OMP_", "GOMP_", "KMP_")
"""The OpenMP runtimes' variables (GNU's, Intel's), read once as the runtime loads."""
APPLIED_LATE = frozenset({"OMP_NUM_THREADS"})
"""OpenMP variables this launcher applies after the runtime loaded (``torch.set_num_threads``)."""


def _simple(args: Any, defaults: Any) -> bool:
    """Whether accelerate's ``launch_command`` would take its simple launcher for one process (its own
    order of checks)."""
    if (args.num_processes or 1) != 1 or (args.num_machines or 1) != 1 or args.no_python:
        return False
    if str(getattr(defaults, "compute_environment", "")).endswith("SAGEMAKER"):
        return False
    return bool(args.cpu) or not any((args.use_deepspeed, args.use_fsdp, args.use_megatron_lm, args.multi_gpu,
                                      args.tpu))


def late_openmp(loaded: Mapping[str, str], env: Mapping[str, str]) -> list[str]:
    """The OpenMP variables that ``env`` (the rank's) adds or changes from ``loaded`` (this process's when the
    runtime loaded) and that nothing applies afterwards: with any, the rank needs an interpreter of its own."""
    names = (set(loaded) | set(env)) - APPLIED_LATE
    return sorted(n for n in names if n.startswith(OPENMP_PREFIXES) and loaded.get(n) != env.get(n))


def main(argv: list[str] | None = None) -> None:
    loaded = dict(os.environ)  # as the OpenMP runtime will read it (torch loads with accelerate, below)
    from accelerate.commands.launch import launch_command, launch_command_parser

    args = launch_command_parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        from accelerate.commands.launch import _validate_launch_command
        from accelerate.utils.launch import prepare_simple_launcher_cmd_env

        checked, defaults, _ = _validate_launch_command(copy.deepcopy(args))
        simple = _simple(checked, defaults)
        env = prepare_simple_launcher_cmd_env(checked)[1] if simple else {}
    except (ImportError, TypeError, ValueError, AttributeError):
        simple, env = False, {}  # an accelerate of another shape (or arguments its own launch refuses)
    if not simple or late_openmp(loaded, env):
        launch_command(args)  # accelerate's own launch: a second interpreter, or torchrun's agent
        return
    os.environ.clear()
    os.environ.update(env)
    import torch

    # torch (and its OpenMP runtime) was imported before OMP_NUM_THREADS was set: apply it directly.
    torch.set_num_threads(int(env.get("OMP_NUM_THREADS", "1")))
    program = checked.training_script
    sys.argv = [program, *checked.training_script_args]
    if checked.module:
        runpy.run_module(program, run_name="__main__", alter_sys=True)
    else:
        runpy.run_path(program, run_name="__main__")


if __name__ == "__main__":
    main()
