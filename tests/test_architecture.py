"""The boundaries a reader relies on: the headless core never imports the TUI, only
runner/hardware.py reaches NVML."""

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
    proc = subprocess.run([sys.executable, "-m", "mypy", "runner", "store"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_the_tui_reads_the_store_through_its_api_only() -> None:
    """Views get frozen dataclasses from store.Store, never ORM rows or SQL (STYLE.md)."""
    offenders = [
        str(path.relative_to(ROOT))
        for path in (ROOT / "tui").rglob("*.py")
        if "sqlalchemy" in path.read_text() or "store.models" in path.read_text()
    ]
    assert offenders == []
