"""Bad arguments in a real ``ftui`` process, one case per command: exit 2 and one line on stderr naming what
is wrong, never a traceback, and nothing recorded. These are the CLI's real-process refusals; every other
CLI test reads what a command prints through ``main`` in the test's process (``Ftui.call``,
``run_in_process``: docs/testing.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from runner.watch.host import cuda_device_count
from store import Store
from store.queue import entries
from tests.support import ROOT
from tests.support.in_process import command_names

QUICK = "recipes/quickstart.toml"
CASES = [
    ["--bogus"],  # the dashboard's flags
    ["run", QUICK, "--set", "data.source=\"nope.jsonl\""],
    ["resume", "abc"],
    ["stop", "abc"],
    ["runs", "--status", "x"],
    ["show", "abc"],
    ["gpus", "--watch", "0"],
    ["estimate", "--params", "lots"],
    ["compare", "1", "x"],
    ["report"],
    ["sweep", QUICK, "--nproc", "0"],
    ["recover", "--format", "yaml"],
    ["plan", QUICK, "--steps", "1"],
    ["db", "nope"],
    ["slurm", QUICK, "--nodes", "0"],
    ["queue", "add", QUICK, "--set", "data.source=\"nope.jsonl\""],
]
# The GPU-only switches on a host without CUDA: the pre-flight's line names the field and what is missing.
SWITCHES = [
    (["--strategy", "fsdp", "--nproc", "2", "--cp-size", "2"], "launch.cp_size: context parallelism needs CUDA GPUs"),
    (["--set", "train.precision=fp8"], "train.precision: fp8 needs a CUDA GPU of compute capability 8.9"),
    (["--set", "train.activation_offload=true"], "train.activation_offload: this run trains on the CPU"),
    (["--strategy", "zero3", "--nproc", "2", "--offload", "nvme", "--nvme-path", "/tmp"],
     "launch.offload: 'nvme' needs DeepSpeed's async_io op"),
]


@pytest.mark.parametrize("argv", CASES, ids=[" ".join(c[:1]) for c in CASES])
def test_bad_arguments_in_a_real_process(tmp_path: Path, argv: list[str]) -> None:
    env = {**os.environ, "FTUI_HOME": str(tmp_path), "FTUI_DB": f"sqlite:///{tmp_path / 'ftui.db'}"}
    proc = subprocess.run([sys.executable, "-m", "tui.cli", *argv], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2, proc
    assert len(proc.stderr.splitlines()) == 1 and proc.stderr.startswith("ftui: "), proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "ftui.db").exists() or Store(env["FTUI_DB"]).list_runs() == []
    assert not (tmp_path / "ftui.db").exists() or entries(Store(env["FTUI_DB"])) == [], "nothing queued"


@pytest.mark.skipif(cuda_device_count() > 0, reason="the switches' refusals are of a host without CUDA")
@pytest.mark.parametrize(("argv", "line"), SWITCHES, ids=["cp_size", "fp8", "activation_offload", "nvme"])
def test_a_gpu_only_switch_on_a_cpu_host_is_refused_before_anything_is_recorded(
        tmp_path: Path, argv: list[str], line: str) -> None:
    env = {**os.environ, "FTUI_HOME": str(tmp_path), "FTUI_DB": f"sqlite:///{tmp_path / 'ftui.db'}"}
    proc = subprocess.run([sys.executable, "-m", "tui.cli", "run", QUICK, *argv], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc
    assert proc.stderr.splitlines() == [proc.stderr.strip()] and line in proc.stderr, proc.stderr
    assert not (tmp_path / "ftui.db").exists() and not (tmp_path / "runs").exists()


def test_every_command_has_a_real_process_case() -> None:
    assert {argv[0] for argv in CASES[1:]} == command_names()
