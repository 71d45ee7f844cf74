"""Security habits: commands are argv lists, remote code is off unless asked for,
ftui's folders are private to the user."""

from __future__ import annotations

import json
import re
import stat
from pathlib import Path

import pytest

from runner.spec.paths import check_runs_dir, make_private_dir
from runner.spec.recipe import parse_recipe
from runner.watch.preflight import input_warnings
from tui.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
SHELL = re.compile(r"shell\s*=\s*True|os\.system\s*\(|os\.popen\s*\(")


def test_no_shell_strings_anywhere_in_runner_or_tui() -> None:
    sources = [p for d in ("runner", "tui", "store") for p in (ROOT / d).rglob("*.py")]
    assert len(sources) > 30
    hits = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for p in sources
            for n, line in enumerate(p.read_text().splitlines(), 1) if SHELL.search(line)]
    assert hits == []


def test_trust_remote_code_is_off_unless_the_recipe_says_so(capsys: pytest.CaptureFixture[str],
                                                            tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_recipe("").model.trust_remote_code is False
    assert input_warnings(parse_recipe("")) == []
    recipe = tmp_path / "r.toml"
    recipe.write_text("[model]\ntrust_remote_code = true\n")
    monkeypatch.setenv("FTUI_HOME", str(tmp_path / "home"))
    assert main(["run", str(recipe), "--dry-run"]) == 0
    out = capsys.readouterr().out
    warning = out.splitlines()[0]
    assert warning.startswith("warning: model.trust_remote_code = true"), out
    # The rank passes the recipe's flag to transformers, never a constant.
    trainer = (ROOT / "runner" / "rank" / "model_load.py").read_text()
    assert "trust_remote_code=True" not in trainer and "trust_remote_code=model" in trainer


def test_ftui_folders_are_created_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FTUI_HOME", str(tmp_path / "a" / "home"))
    monkeypatch.delenv("FTUI_DB", raising=False)
    root = check_runs_dir()
    for folder in (tmp_path / "a", tmp_path / "a" / "home", root):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    run_dir = make_private_dir(root / "00001-x")
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700


def test_a_dry_run_leaves_the_runs_folder_empty_and_its_own_folder_private(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("FTUI_HOME", str(tmp_path / "home"))
    assert main(["run", str(ROOT / "recipes" / "quickstart.toml"), "--dry-run", "--format", "json"]) == 0
    run_dir = Path(json.loads(capsys.readouterr().out)["accelerate_config"]).parent
    assert list((tmp_path / "home" / "runs").iterdir()) == []
    for folder in (tmp_path / "home", tmp_path / "home" / "runs", run_dir, run_dir.parent):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
