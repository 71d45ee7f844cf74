"""The command line as a user meets it: fast start, one-line errors, exit codes, dry runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import QUICKSTART, ROOT, Ftui


def test_help_and_runs_do_not_import_torch_or_textual(ftui: Ftui) -> None:
    code = (
        "import sys; from tui.cli import main; rc = main(['runs', '--format', 'json']); "
        "assert rc == 0; bad = [m for m in ('torch', 'textual', 'transformers') if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=ftui.env, cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_core_never_imports_the_tui() -> None:
    code = "import sys, runner.orchestrator, runner.recipe, store; sys.exit('textual' in sys.modules or 'tui' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


def test_bad_recipe_is_one_line_and_exit_2(ftui: Ftui, tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[train]\nbatch_size = true\n")
    proc = ftui.run("run", str(bad))
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"ftui: {bad}:2: train.batch_size: Input should be a valid integer (got True)"
    proc = ftui.run("run", str(QUICKSTART), "--set", "data.source=/nope/data.jsonl")
    assert proc.returncode == 2 and "data.source: file not found: /nope/data.jsonl" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = ftui.run("run", str(tmp_path / "missing.toml"))
    assert proc.returncode == 2 and "missing.toml: cannot read recipe" in proc.stderr
    proc = ftui.run("show", "999999")
    assert proc.returncode == 2 and "run 999999: no such run" in proc.stderr


def test_dry_run_prints_the_launch_and_runs_nothing(ftui: Ftui) -> None:
    before = len(ftui.runs())
    proc = ftui.run("run", str(QUICKSTART), "--strategy", "fsdp", "--set", "train.max_steps=50", "--dry-run",
                    "--format", "json", check=True)
    launch = json.loads(proc.stdout)
    assert set(launch) == {"argv", "env", "accelerate_config"}
    assert launch["argv"][1:4] == ["-m", "accelerate.commands.launch", "--config_file"]
    config = Path(launch["accelerate_config"])
    assert config.is_file() and "distributed_type: FSDP" in config.read_text()
    recipe = (config.parent / "recipe.toml").read_text()
    assert "max_steps = 50" in recipe and 'strategy = "fsdp"' in recipe and "nproc = 2" in recipe
    assert len(ftui.runs()) == before, "a dry run records nothing"
    text = ftui.run("run", str(QUICKSTART), "--dry-run", check=True).stdout
    assert "accelerate.commands.launch" in text and "distributed_type: 'NO'" in text
