"""The start of a run whose data is cached: the pre-flight finds the cache from the tokenizer's files (no
torch, no transformers), the rank finds the same key, and one process runs in the launcher's interpreter
(runner/rank/solo_launch.py). Real subprocesses, real training on CPU, real SQLite."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from runner.data.cache import local_tokenizer_digest
from runner.spec.recipe import parse_recipe

ROOT = Path(__file__).resolve().parents[2]


def _recipe(tmp_path: Path) -> Path:
    rows = [{"messages": [{"role": "user", "content": f"What is {i} plus 2?"},
                          {"role": "assistant", "content": f"{i} plus 2 is {i + 2}."}]} for i in range(40)]
    source = tmp_path / "chat.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = (ROOT / "recipes" / "chat-lora.toml").read_text()
    text = text.replace('source = "data/chat.jsonl"', f"source = {json.dumps(str(source))}")
    text = text.replace("eval_fraction = 0.1", "eval_fraction = 0.0").replace("eval_every = 20", "eval_every = 0")
    text = text.replace("max_steps = 60", "max_steps = 1\nsave = false").replace("context_length = 128",
                                                                                 "context_length = 64")
    path = tmp_path / "chat.toml"
    path.write_text(text)
    return path


def _events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _newest_run(home: Path) -> Path:
    return max((home / "runs").iterdir(), key=lambda p: p.stat().st_mtime)


@pytest.mark.slow
def test_a_cached_recipe_starts_without_tokenizer_imports_and_in_one_interpreter(tmp_path: Path) -> None:
    home = tmp_path / "home"  # a fresh home: the builtin tokenizer is not trained yet
    env = {**os.environ, "FTUI_HOME": str(home), "FTUI_DB": f"sqlite:///{home / 'ftui.db'}"}
    env.pop("PYTHONPATH", None)
    recipe = _recipe(tmp_path)
    argv = [sys.executable, "-m", "tui.cli", "run", str(recipe), "--sample-interval", "0"]
    for attempt in ("cold", "cached"):
        proc = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"{attempt}: {proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        run_dir = _newest_run(home)
        start = next(e for e in _events(run_dir / "events.jsonl") if e["type"] == "start")
        # The pre-flight tokenized into the cache (training the builtin tokenizer first on the cold run);
        # the rank, keyed by the same tokenizer files, read it.
        assert start["data"]["cached"] is True, (attempt, start["data"])
        launch = next(e for e in _events(run_dir / "orchestrator.jsonl") if e["type"] == "launch")
        assert launch["argv"][1:3] == ["-m", "runner.rank.solo_launch"]
        # The rank is the launcher (the process group's leader), not a second interpreter under it,
        # and it runs with the threads accelerate launch would have given it.
        assert start["pids"] == [launch["pgid"]], (start["pids"], launch)
        threads = launch["argv"][launch["argv"].index("--num_cpu_threads_per_process") + 1]
        assert start["threads"] == int(threads)

    probe = ("import sys; from runner.spec.recipe import load_recipe; from runner.data.prepare import prefill; "
             f"found = prefill(load_recipe({str(recipe)!r})); "
             "print(found is None, 'torch' in sys.modules, 'transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    assert out == ["True", "False", "False"], out  # cached: nothing tokenized, neither library imported


def test_the_tokenizer_files_make_the_key(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "tokenizer.json").write_text('{"model": {"vocab": {"a": 0}}}')
    (folder / "config.json").write_text("{}")
    model = parse_recipe(f"[model]\nname = {json.dumps(str(folder))}\n").model
    first = local_tokenizer_digest(model)
    assert first is not None and first.startswith("files:")
    (folder / "config.json").write_text('{"hidden_size": 8}')  # not a tokenizer file
    assert local_tokenizer_digest(model) == first
    (folder / "tokenizer.json").write_text('{"model": {"vocab": {"b": 0}}}')
    assert local_tokenizer_digest(model) != first
    hub = parse_recipe('[model]\nname = "org/some-model"\n').model
    assert local_tokenizer_digest(hub) is None  # a hub tokenizer's digest needs it loaded
