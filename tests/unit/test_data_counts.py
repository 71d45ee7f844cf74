"""The block counts kept beside each tokenized-data cache file: what the pre-flight reads to refuse data too
short for one optimizer step without loading torch, and the rows of that step, counted in one place for
the pre-flight and the rank."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from runner.data import cache
from runner.data.blocks import Blocks
from runner.spec import layout
from runner.spec.recipe import parse_recipe


def _cached(rows: int, eval_rows: int | None) -> cache.Cached:
    def blocks(n: int) -> Blocks:
        return Blocks(torch.zeros((n, 4), dtype=torch.long), None)

    return cache.Cached(blocks(rows), None if eval_rows is None else blocks(eval_rows), "text", rows * 4)


def test_the_counts_are_written_beside_the_cache_and_read_without_it(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "data" / "k.pt"
    cache.write_cache(path, _cached(7, 2))
    assert cache.counts_path(path).read_text() == '{"train_rows": 7, "eval_rows": 2}'

    def no_torch(_: Path) -> None:
        raise AssertionError("the cache file itself was read")

    with monkeypatch.context() as patch:
        patch.setattr(cache, "read_cache", no_torch)
        assert cache.read_train_rows(path) == 7


def test_a_cache_without_counts_is_counted_once_and_a_damaged_one_is_unknown(tmp_path: Path) -> None:
    path = tmp_path / "k.pt"
    cache.write_cache(path, _cached(5, None))
    cache.counts_path(path).write_text("{not json")  # damaged counts: the file itself is read, counts rewritten
    assert cache.read_train_rows(path) == 5
    assert cache.counts_path(path).read_text() == '{"train_rows": 5, "eval_rows": 0}'
    cache.counts_path(path).unlink()
    path.write_bytes(b"damaged")
    assert cache.read_train_rows(path) is None  # the ranks rebuild it


@pytest.mark.parametrize(("launch", "replicas"), [
    ('strategy = "single"', 1),
    ('strategy = "ddp"\nnproc = 4', 4),
    ('strategy = "fsdp"\nnproc = 2\nnnodes = 3', 6),
    ('strategy = "zero2"\nnproc = 2', 2),
    ('strategy = "pp"\nnproc = 2\nmicrobatches = 2', 1),
    ('strategy = "mp"\nnproc = 3', 1),
    ('strategy = "tp"\nnproc = 4\ntp_size = 2', 2),
    ('strategy = "tp"\nnproc = 2\nnnodes = 2', 2),
])
def test_rows_per_step_counts_each_data_parallel_replica(launch: str, replicas: int) -> None:
    recipe = parse_recipe(f"[train]\nbatch_size = 2\ngrad_accum = 3\n[launch]\n{launch}\n")
    assert layout.rows_per_step(recipe) == 2 * 3 * replicas
    assert layout.batch_problem(recipe, 2 * 3 * replicas) is None
    line = layout.batch_problem(recipe, 2 * 3 * replicas - 1)
    assert line is not None and line.startswith("train.batch_size: ") and f"x {replicas} data parallel" in line
