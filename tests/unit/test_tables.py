"""The CLI's tables fit the terminal: at 80 and 120 columns nothing is cut short; what does not fit is
left out, most important columns first."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from store import Store
from tui.render.report import runs_table


@pytest.fixture
def store(tmp_path: Path) -> Store:
    store = Store(f"sqlite:///{tmp_path / 'ftui.db'}")
    for i, (name, strategy, nproc) in enumerate([("quickstart", "single", 1), ("ablation [v2] lr sweep", "ddp", 2),
                                                  ("tinyllama-1.1b-lora", "fsdp", 4)]):
        run_id = store.create_run(name=name, recipe_text="", recipe_hash="", strategy=strategy, nproc=nproc,
                                  method="lora", model="builtin:tiny-llama", run_dir="")
        store.update_run(run_id, status=("completed", "failed", "running")[i], tokens_per_s=1234.5 * (i + 1),
                         final_loss=7.25 + i, train_seconds=61.0 * (i + 1), distributed_type="MULTI_CPU")
    return store


def render(table: object, width: int) -> list[str]:
    out = io.StringIO()
    Console(file=out, width=width, color_system=None, highlight=False).print(table)
    return out.getvalue().splitlines()


@pytest.mark.parametrize("width", [80, 120])
def test_runs_fit_the_terminal_without_cutting_a_cell(store: Store, width: int) -> None:
    lines = render(runs_table(store.list_runs(), width=width), width)
    assert all(len(line) <= width for line in lines)
    text = "\n".join(lines)
    assert "…" not in text
    for expected in ("quickstart", "tinyllama-1.1b-lora", "ddp x2", "fsdp x4", "2,469", "8.2500", "completed"):
        assert expected in text, (expected, text)
    header = next(line for line in lines if " id " in f" {line} ")
    if width == 120:  # the wide table adds when it started and what accelerate had in effect, in words
        assert "started" in header and "in effect" in header and "DDP (CPU)" in text
    else:
        assert "in effect" not in header


def test_the_runs_command_uses_the_terminal_width(store: Store, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from tui.cli import main

    monkeypatch.setenv("COLUMNS", "80")
    assert main(["runs", "--db", store.url]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines and all(len(line) <= 80 for line in lines) and "…" not in "\n".join(lines)
