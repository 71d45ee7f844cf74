"""The command line as a user meets it: fast start, one-line errors, exit codes, dry runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import QUICKSTART, ROOT, CliResult, Ftui, run_in_process


@pytest.fixture
def in_process(ftui: Ftui, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """``ftui ARGS`` on the session's home through ``main`` in this process: for what a command prints
    and its exit code (the bad recipe and the start-up's imports are checked in real processes)."""
    monkeypatch.setenv("FTUI_HOME", str(ftui.home))
    monkeypatch.setenv("FTUI_DB", ftui.db)

    def run(*args: str) -> CliResult:
        return run_in_process(capsys, *args)
    return run


def test_help_and_runs_do_not_import_torch_or_textual(ftui: Ftui) -> None:
    code = (
        "import sys; from tui.cli import main; rc = main(['runs', '--format', 'json']); "
        "assert rc == 0; bad = [m for m in ('torch', 'textual', 'transformers') if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=ftui.env, cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_handler_the_parser_names_exists() -> None:
    """A command names its handler as "module:function" (tui/cli/parser.py); a typo there would show
    only when the command runs, so each one is resolved here, and its module is one of COMMANDS."""
    import argparse

    from tui.cli.main import handler
    from tui.cli.parser import COMMANDS, DASHBOARD, build_parser

    def commands(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
        found = []
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for command in action.choices.values():
                    found += [command, *commands(command)]
        return found

    references = {command.get_default("handler") for command in commands(build_parser())}
    assert None not in references
    assert {reference.partition(":")[0] for reference in references} == set(COMMANDS)
    for reference in references | {DASHBOARD}:
        assert callable(handler(reference)), reference


def test_core_never_imports_the_tui() -> None:
    code = "import sys, runner.watch.follow, runner.service.launch, runner.spec.recipe, store; sys.exit('textual' in sys.modules or 'tui' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


def test_bad_recipe_is_one_line_and_exit_2(ftui: Ftui, in_process, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The first in a real process (what its stderr holds, nothing more); the rest through ``main``."""
    bad = tmp_path / "bad.toml"
    bad.write_text("[train]\nbatch_size = true\n")
    proc = ftui.run("run", str(bad))
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"ftui: {bad}:2: train.batch_size: Input should be a valid integer (got True)"
    proc = in_process("run", str(QUICKSTART), "--set", "data.source=/nope/data.jsonl")
    assert proc.returncode == 2 and "data.source: file not found: /nope/data.jsonl" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = in_process("run", str(tmp_path / "missing.toml"))
    assert proc.returncode == 2 and "missing.toml: cannot read recipe" in proc.stderr
    proc = in_process("show", "999999")
    assert proc.returncode == 2 and "run 999999: no such run" in proc.stderr


def test_dry_run_prints_the_launch_and_runs_nothing(ftui: Ftui, in_process) -> None:  # type: ignore[no-untyped-def]
    before = len(ftui.runs())
    proc = in_process("run", str(QUICKSTART), "--strategy", "fsdp", "--set", "train.max_steps=50", "--dry-run",
                      "--format", "json")
    assert proc.returncode == 0, proc.stderr
    launch = json.loads(proc.stdout)
    assert set(launch) == {"argv", "env", "accelerate_config"}
    assert launch["argv"][1:4] == ["-m", "runner.rank.loopback_launch", "--config_file"]  # accelerate launch, loopback store
    config = Path(launch["accelerate_config"])
    assert config.is_file() and "distributed_type: FSDP" in config.read_text()
    recipe = (config.parent / "recipe.toml").read_text()
    assert "max_steps = 50" in recipe and 'strategy = "fsdp"' in recipe and "nproc = 2" in recipe
    assert (ftui.home / "runs").resolve() not in config.parents, "the launch's files are written outside the runs folder"
    assert len(ftui.runs()) == before, "a dry run records nothing"
    text = in_process("run", str(QUICKSTART), "--dry-run").stdout
    assert "runner.rank.solo_launch" in text and "distributed_type: 'NO'" in text
    assert not list((ftui.home / "runs").glob("dry-run-*")), "nothing is left in the runs folder"


def test_dry_run_shows_the_cpu_ranks_openmp_default_and_passes_a_users_own(  # type: ignore[no-untyped-def]
        in_process, monkeypatch: pytest.MonkeyPatch) -> None:
    """The launch env of a CPU run, through the command's real path (the session's own setting removed for it:
    it would be a user's to ftui)."""
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    proc = in_process("run", str(QUICKSTART), "--set", "launch.device=cpu", "--dry-run", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["env"]["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("GOMP_SPINCOUNT", "300000")  # the user's: it reaches the ranks as it is, nothing added
    proc = in_process("run", str(QUICKSTART), "--set", "launch.device=cpu", "--dry-run", "--format", "json")
    assert "OMP_WAIT_POLICY" not in json.loads(proc.stdout)["env"]


def test_sweep_dry_run_prints_its_runs_and_runs_nothing(ftui: Ftui, in_process) -> None:  # type: ignore[no-untyped-def]
    runs = ftui.home / "runs"
    before, folders = len(ftui.runs()), sorted(runs.iterdir()) if runs.is_dir() else []
    proc = in_process("sweep", str(QUICKSTART), "--strategies", "single,ddp", "--grid", "train.lr=1e-3,2e-3",
                      "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "1. single x 1 [train.lr=1e-3] · micro-batch 4 x 1 process",
        "2. ddp x 2 [train.lr=1e-3] · micro-batch 4/2 = 2 x 2 processes (global batch 4 kept)",
        "3. single x 1 [train.lr=2e-3] · micro-batch 4 x 1 process",
        "4. ddp x 2 [train.lr=2e-3] · micro-batch 4/2 = 2 x 2 processes (global batch 4 kept)"]
    assert len(ftui.runs()) == before and (sorted(runs.iterdir()) if runs.is_dir() else []) == folders


BAD_INPUTS = [
    (["run", "QUICKSTART", "--set", "train.seed=-1"], "ftui: --set train.seed: Input should be greater than or equal to 0"),
    (["run", "QUICKSTART", "--set", "train.epochs=inf"], "ftui: --set train.epochs: Input should be a finite number"),
    (["run", "QUICKSTART", "--set", "train.lr=-1"], "ftui: --set train.lr: Input should be greater than 0"),
    (["run", "QUICKSTART", "--set", "model.name=builtin:bogus"], "ftui: --set model.name: unknown builtin model"),
    (["run", "QUICKSTART", "--set", "method.type=qlora"], "method.type: qlora needs a CUDA GPU"),
    (["run", "QUICKSTART", "--set", "model.name=builtin:tiny-mixtral", "--set", "launch.ep_size=2"],
     "launch.ep_size: 2: expert parallelism is not available"),
    (["run", "QUICKSTART", "--set", "model.name=builtin:tiny-mixtral", "--set", 'method.lora.target_modules=["gate_proj"]'],
     "method.lora.target_modules: builtin:tiny-mixtral has no module 'gate_proj' (its linear layers: q_proj,"),
    (["run", "QUICKSTART", "--set", "train.precision=fp16"], "train.precision: fp16 needs a GPU"),
    (["run", "QUICKSTART", "--set", 'launch.accelerate_config="/nope/acc.yaml"'],
     "launch.accelerate_config: /nope/acc.yaml: no such file"),
    (["run", "QUICKSTART", "--hang-after", "0"], "argument --hang-after: expected seconds between 1 and 86400"),
    (["run", "QUICKSTART", "--set", "launch.mem_cap=lots"], "ftui: --set launch.mem_cap: 'lots': expected a size"),
    (["run", "QUICKSTART", "--set", "launch.peak_tflops=-2"], "ftui: --set launch.peak_tflops: Input should be greater"),
    (["gpus", "--watch", "-1"], "argument --watch: expected seconds between 0.05 and 3600"),
    (["runs", "--db", "sqlite:///NOTADB"], "junk.db is not an SQLite database"),
]


def test_more_bad_input_is_one_line_naming_the_field_and_exit_2(in_process, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    not_a_db = tmp_path / "junk.db"
    not_a_db.write_text("this is no sqlite file, just text long enough to have a header\n" * 4)
    for argv, expected in BAD_INPUTS:
        argv = [str(QUICKSTART) if a == "QUICKSTART" else a.replace("NOTADB", str(not_a_db)) for a in argv]
        proc = in_process(*argv, "--dry-run") if argv[0] == "run" else in_process(*argv)
        assert proc.returncode == 2, (argv, proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr, argv
        last = proc.stderr.strip().splitlines()[-1]
        assert expected in last, (argv, proc.stderr)
    latin1 = tmp_path / "latin1.toml"
    latin1.write_bytes('name = "caf\xe9"\n'.encode("latin-1"))
    proc = in_process("run", str(latin1))
    assert proc.returncode == 2 and proc.stderr.strip() == f"ftui: {latin1}: not a TOML recipe (TOML is UTF-8 text)"


def test_preflight_maps_cuda_indices_and_checks_free_memory_on_scripted_gpus(ftui: Ftui) -> None:
    """--fake-gpus 8: the demo GPUs (~62 GiB used of 80 once loaded; the probe starts them at tick 0
    with 0.5 GiB used). The seed's CodeLlama 34B recipe as a FULL fine-tune over 2 GPUs needs far more
    than one GPU holds, so pre-flight warns for each requested GPU, named by its physical index."""
    proc = ftui.call("--fake-gpus", "8", "run", str(ROOT / "recipes" / "codellama-34b-lora-fsdp.toml"),
                    "--set", "method.type=full", "--nproc", "2", "--set", "launch.gpus=[5,2]", "--dry-run",
                    check=True)
    out = " ".join(proc.stdout.split())
    assert "GPUs (CUDA index -> physical): cuda:0 -> GPU 5, cuda:1 -> GPU 2" in out
    assert "GPU 5 has" in out and "GPU 2 has" in out and "the plan needs" in out
    assert "GPU 0 " not in out, "only the requested GPUs are checked"
    lora = ftui.call("--fake-gpus", "8", "run", str(QUICKSTART), "--strategy", "ddp", "--nproc", "2",
                    "--set", "launch.gpus=[1,3]", "--dry-run", check=True)
    assert "the plan needs" not in lora.stdout, "the tiny model fits"
