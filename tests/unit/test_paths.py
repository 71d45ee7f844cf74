"""Where ftui keeps things: the data folder and the caches, as the environment names them."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.spec import paths


def test_the_cache_follows_ftui_cache_then_the_data_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FTUI_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("FTUI_CACHE", str(tmp_path / "local-cache"))
    assert paths.cache_dir() == tmp_path / "local-cache"
    assert paths.home() == tmp_path / "home" and paths.runs_dir() == tmp_path / "home" / "runs"
    monkeypatch.delenv("FTUI_CACHE")
    assert paths.cache_dir() == tmp_path / "home" / "cache"
