"""Make docs/dashboard.png, the README's picture of the dashboard, with the project's own tooling.

    python docs/screenshot.py                      # trains three short runs in a scratch home, then shoots
    python docs/screenshot.py --home DIR           # reuses DIR's runs when it has some (trains them if not)

1. Three quickstart runs (single, DDP x 2, FSDP x 2; 20 steps each) are trained for real with
   ``ftui --fake-gpus 4 run``: their telemetry samples the four scripted GPUs of runner/hardware/fake.py
   (the project's demo GPUs) beside each rank's process.
2. The dashboard, built as ``ftui --fake-gpus 4`` builds it (``tui.app.app.dashboard``), runs headless under
   Textual's pilot; it opens the DDP run's Monitor and saves the screen as SVG (``App.save_screenshot``).
3. Headless Chromium (what .ci/run installs for the system tests) renders the SVG to PNG.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "quickstart.toml"
FAKE_GPUS = 4
SIZE = (132, 36)
"""The terminal the dashboard is drawn in (columns, rows)."""
RUNS = {
    "quickstart-single": [],
    "quickstart-ddp": ["--strategy", "ddp", "--nproc", "2"],
    "quickstart-fsdp": ["--strategy", "fsdp", "--nproc", "2"],
}
SHOWN = "quickstart-ddp"
"""The run whose Monitor is the picture."""
STEPS = 20


def ftui(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FTUI_HOME": str(home), "PYTHONPATH": str(ROOT)}
    env.pop("FTUI_DB", None)
    return subprocess.run([sys.executable, "-m", "tui.cli", "--fake-gpus", str(FAKE_GPUS), *args], cwd=ROOT,
                          env=env, text=True, capture_output=True, check=True)


def runs(home: Path) -> list[dict[str, object]]:
    if not (home / "ftui.db").exists():
        return []
    return list(json.loads(ftui(home, "runs", "--format", "json").stdout))


def train(home: Path) -> None:
    """The runs of :data:`RUNS` that ``home`` lacks, trained for real."""
    have = {r["name"] for r in runs(home)}
    for name, flags in RUNS.items():
        if name not in have:
            print(f"training {name} ...", flush=True)
            ftui(home, "run", str(RECIPE), *flags, "--name", name, "--set", f"train.max_steps={STEPS}")


async def shoot(home: Path, svg: Path) -> None:
    """Open :data:`SHOWN`'s Monitor under the pilot and save the screen as SVG."""
    os.environ["FTUI_HOME"] = str(home)
    os.environ.pop("FTUI_DB", None)
    from textual.widgets import DataTable

    from tui.app.app import dashboard

    shown = next(int(str(r["id"])) for r in runs(home) if r["name"] == SHOWN)
    app = dashboard(f"sqlite:///{home}/ftui.db", fake_gpus=FAKE_GPUS)
    async with app.run_test(size=SIZE) as pilot:
        await _until(pilot, lambda: getattr(app.screen, "loaded", False), "the Runs screen")
        table = app.screen.query_one(DataTable)
        table.move_cursor(row=table.get_row_index(str(shown)))
        await pilot.press("enter")
        await _until(pilot, lambda: type(app.screen).__name__ == "MonitorScreen", "the Monitor")
        await pilot.pause(3.0)  # the Monitor's first reads of the store (metrics, samples) and a repaint
        await pilot.press("l")  # the rank logs' tail off: the picture is the figures
        await pilot.pause(1.0)
        app.save_screenshot(filename=svg.name, path=str(svg.parent))


async def _until(pilot: object, predicate: object, what: str) -> None:
    for _ in range(600):
        if predicate():  # type: ignore[operator]
            return
        await pilot.pause(0.1)  # type: ignore[attr-defined]
    raise SystemExit(f"screenshot: timed out waiting for {what}")


def render(svg: Path, png: Path) -> None:
    """The SVG as PNG, at the SVG's own size, by headless Chromium."""
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    match = re.search(r'viewBox="0 0 ([\d.]+) ([\d.]+)"', svg.read_text())
    if match is None:
        raise SystemExit(f"screenshot: {svg}: no viewBox")
    width, height = (round(float(v)) for v in match.groups())
    html = svg.with_suffix(".html")
    html.write_text(f'<html><body style="margin:0;background:#0c0c0c">{svg.read_text()}</body></html>')
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--screenshot={png}", f"--window-size={width},{height}", html.as_uri()],
                   check=True, capture_output=True, timeout=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", type=Path, help="an ftui home to reuse (default: a scratch one)")
    parser.add_argument("-o", "--out", type=Path, default=ROOT / "docs" / "dashboard.png")
    args = parser.parse_args()
    home = args.home or Path(tempfile.mkdtemp(prefix="ftui-shot-"))
    home.mkdir(parents=True, exist_ok=True)
    train(home)
    with tempfile.TemporaryDirectory() as tmp:
        svg = Path(tmp) / "dashboard.svg"
        asyncio.run(shoot(home, svg))
        render(svg, args.out)
    print(f"{args.out} ({args.out.stat().st_size // 1024} KiB), from the runs in {home}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
