"""``ftui estimate`` of a hub model with no network: one request, no retries, and one line saying how to give
the config instead (a local folder with config.json, a recipe naming one, or the sizes). The network is made
unreachable for real: the hub's address is a closed port on the loopback (HF_ENDPOINT), the Hugging Face
cache an empty folder; the command's own subprocess, so that the hub client reads that environment."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support import ROOT

HOW = ("give its config another way: a local folder holding its config.json (--model PATH, or a recipe whose "
       "model.name is that folder), or its sizes (--params N --layers L --hidden H)")


def _estimate(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    hub = {"HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "0", **env}
    return subprocess.run([sys.executable, "-m", "tui.cli", "estimate", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "FTUI_HOME": str(tmp_path / "home"), **hub})


def test_a_hub_model_with_the_hub_unreachable_fails_at_once_saying_how_to_give_a_config(tmp_path: Path) -> None:
    proc = _estimate(tmp_path, "--model", "someorg/some-model")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.splitlines() == [  # no "Retrying in 8s [Retry 1/5]" lines before it
        "ftui: --model: model.name: someorg/some-model: not in the Hugging Face cache and the hub cannot be "
        f"reached (ConnectError); {HOW}"]


def test_a_recipe_naming_a_hub_model_offline_says_so_in_one_line(tmp_path: Path) -> None:
    recipe = tmp_path / "r.toml"
    recipe.write_text('[model]\nname = "someorg/some-model"\n')
    proc = _estimate(tmp_path, str(recipe), HF_HUB_OFFLINE="1")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == [
        f"ftui: {recipe}: model.name: someorg/some-model: not in the Hugging Face cache and HF_HUB_OFFLINE is set "
        f"(download it first: hf download NAME); {HOW}"]
