"""The start of a run whose data is cached: the pre-flight finds the cache from the tokenizer's files (no
torch, no transformers), the rank finds the same key, and one process runs in the launcher's interpreter
(runner/rank/solo_launch.py). Real subprocesses, real training on CPU (three steps of a chat recipe, twice, in a
fresh home: the shared ``cold_repeat`` sweep), real SQLite."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from runner.data.cache import local_tokenizer_digest
from runner.spec.recipe import parse_recipe
from tests.support import ROOT
from tests.support.matrix import ColdRepeat


def _events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("attempt", ["cold", "cached"])
def test_a_cached_recipe_starts_in_one_interpreter_with_its_data_from_the_cache(cold_repeat: ColdRepeat,
                                                                               attempt: str) -> None:
    """The first run of a fresh home (cold) and the second (cached), from ``ftui sweep --repeat 2``."""
    run_dir = cold_repeat.run_dirs[["cold", "cached"].index(attempt)]
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


def test_a_cached_recipe_is_found_without_tokenizer_imports(cold_repeat: ColdRepeat) -> None:
    probe = ("import sys; from runner.spec.recipe import load_recipe; from runner.data.prepare import prefill; "
             f"found = prefill(load_recipe({str(cold_repeat.recipe)!r})); "
             "print(found, 'torch' in sys.modules, 'transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], env=cold_repeat.env, cwd=ROOT, capture_output=True,
                         text=True, timeout=120, check=True).stdout.split()
    # Cached: nothing tokenized, neither library imported, the blocks counted from the counts beside the cache.
    assert out[0].isdigit() and int(out[0]) > 0 and out[1:] == ["False", "False"], out


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
