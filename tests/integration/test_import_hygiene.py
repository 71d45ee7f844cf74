"""What a fresh interpreter loads: building the CLI's parser (what `ftui --help` does) loads no Textual
and no torch, and the headless core loads no front end. Each check runs in a subprocess, so nothing this
test process imported counts (harlequin's import-hygiene test)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support import ROOT


def _modules_after(code: str) -> set[str]:
    proc = subprocess.run([sys.executable, "-c", code + "\nimport sys, json; print(json.dumps(sorted(sys.modules)))"],
                          cwd=ROOT, capture_output=True, text=True, check=True)
    return set(json.loads(proc.stdout.splitlines()[-1]))


def test_the_cli_imports_neither_textual_nor_torch() -> None:
    """Building the whole parser (what `ftui --help` does) loads no Textual and no torch (harlequin's
    import-hygiene test, as a subprocess so nothing this test process imported counts)."""
    loaded = _modules_after("from tui.cli import build_parser; build_parser()")
    assert not {m for m in loaded if m.split(".")[0] in ("textual", "torch", "transformers")}


def test_the_core_imports_no_front_end() -> None:
    loaded = _modules_after("import runner.watch.follow, runner.service.launch, runner.analysis.compare, runner.service.sweep, runner.hardware, store")
    assert not {m for m in loaded if m.split(".")[0] in ("textual", "rich", "tui")}
