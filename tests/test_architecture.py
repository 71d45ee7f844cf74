"""The boundaries a reader relies on: the headless core never imports a front end, the CLI never imports
Textual, only runner/hardware/nvml.py (and its scripted twin) reaches NVML, mypy strict holds everywhere."""

from __future__ import annotations

import shutil
import subprocess
import sys

from conftest import ROOT


def test_import_linter_contracts_hold() -> None:
    exe = shutil.which("lint-imports")
    assert exe, "import-linter is a test dependency"
    proc = subprocess.run([exe], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_only_the_hardware_module_imports_pynvml() -> None:
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--select", "TID251", "runner", "store", "tui"],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_core_is_mypy_strict_clean() -> None:
    proc = subprocess.run([sys.executable, "-m", "mypy", "runner", "store", "tui"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_the_tui_reads_the_store_through_its_api_only() -> None:
    """Views get frozen dataclasses from store.Store, never ORM rows or SQL (the house style: harlequin, MLflow)."""
    offenders = [
        str(path.relative_to(ROOT))
        for path in (ROOT / "tui").rglob("*.py")
        if "sqlalchemy" in path.read_text() or "store.models" in path.read_text()
    ]
    assert offenders == []


def _modules_after(code: str) -> set[str]:
    proc = subprocess.run([sys.executable, "-c", code + "\nimport sys, json; print(json.dumps(sorted(sys.modules)))"],
                          cwd=ROOT, capture_output=True, text=True, check=True)
    import json

    return set(json.loads(proc.stdout.splitlines()[-1]))


def test_the_cli_imports_neither_textual_nor_torch() -> None:
    """Building the whole parser (what `ftui --help` does) loads no Textual and no torch (harlequin's
    import-hygiene test, as a subprocess so nothing this test process imported counts)."""
    loaded = _modules_after("from tui.cli import build_parser; build_parser()")
    assert not {m for m in loaded if m.split(".")[0] in ("textual", "torch", "transformers")}


def test_the_core_imports_no_front_end() -> None:
    loaded = _modules_after("import runner.watch.follow, runner.service.launch, runner.analysis.compare, runner.service.sweep, runner.hardware, store")
    assert not {m for m in loaded if m.split(".")[0] in ("textual", "rich", "tui")}


def test_comments_cite_only_documents_in_the_project() -> None:
    """What the code relies on is written in the project (docs/), so every .md a comment names exists here."""
    import re

    missing = []
    for path in [*(ROOT / "runner").rglob("*.py"), *(ROOT / "store").rglob("*.py"), *(ROOT / "tui").rglob("*.py")]:
        for name in re.findall(r"([\w./-]+\.md)\b", path.read_text()):
            candidates = [ROOT / name, ROOT / "docs" / name, ROOT / "docs" / name.removeprefix("docs/")]
            if not any(c.is_file() for c in candidates):
                missing.append(f"{path.relative_to(ROOT)}: {name}")
    assert missing == []
