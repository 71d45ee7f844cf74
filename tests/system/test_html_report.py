"""The HTML report (`ftui compare --format html`) says where it comes from, has round
ticks and zero-based utilisation axes, marks each run's training window on its device timelines, charts
lr and grad norm, notes identical curves, and its table fits 900 px; it renders in headless Chromium
with no console error (a page with an injected error is caught, so the check can fail)."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from runner.analysis.compare import Comparison, build_comparison
from runner.hardware import DeviceSample
from store import MetricPoint
from tests.support import Ftui, run_info
from tests.support.matrix import Matrix, Sweep
from tui.render.compare import nice_step, to_html

T0 = 1_800_000_000.0


def comparison(n_runs: int = 6) -> Comparison:
    runs, metrics, samples = [], {}, {}
    for i in range(n_runs):
        strategy, nproc = [("single", 1), ("ddp", 2), ("fsdp", 2)][i % 3]
        run = run_info(i + 1, strategy, nproc, 1000.0 + 10 * i,
                   telemetry={"window": [T0 + 5.0, T0 + 25.0]})
        runs.append(dataclasses.replace(run, recipe_text=run.recipe_text + '[data]\nsource = "builtin:pydoc-topics"\n'))
        metrics[i + 1] = [MetricPoint(s, T0 + 5 + 2 * s, 8.5 - 0.1 * s, 1e-3 * s, 0.5 + 0.01 * s, 1024 * s, 2.0, 512.0)
                          for s in range(1, 11)]
        samples[i + 1] = [DeviceSample(T0 + k, "vm", "rank", r, f"rank {r}", 91.0 + k % 7, (400 + k) * 2**20,
                                       16 * 2**30, None, None, None, "psutil", 100 + r)
                          for k in range(30) for r in range(nproc)]
    return build_comparison(runs, metrics, samples=samples)  # type: ignore[arg-type]


def test_nice_steps_are_round() -> None:
    assert [nice_step(s) for s in (0.35, 7.0, 100.0, 1234.0)] == [0.1, 2.0, 50.0, 500.0]


def test_the_page_says_where_it_comes_from_and_draws_windows_lr_and_grad_norm() -> None:
    page = to_html(comparison())
    provenance = page[page.index('<table class="provenance">'):]
    provenance = provenance[:provenance.index("</table>")]
    for expected in ("UTC on", "by ftui ", "1 q, 2 q", "builtin:tiny-llama", "builtin:pydoc-topics", "run hosts"):
        assert expected in provenance, (expected, provenance)
    # zero-based utilisation axis (the samples are 91-97%) with round ticks
    util = page[page.index("run 1 single: utilisation per device"):]
    util = util[:util.index("</svg>")]
    ticks = re.findall(r'text-anchor="end">([^<]+)</text>', util)
    assert ticks[0] == "0" and all(float(t) % 10 == 0 for t in ticks), ticks
    # the training window (5 s to 25 s after the first sample) is marked, named by its steps
    assert 'class="window"' in util and "training (steps 1-10)" in util
    assert "learning rate" in page and "gradient norm (before clipping)" in page
    assert "The curves coincide" in page
    assert page.count('<table class="runs">') == 2  # 6 runs: 5 a table, transposed


@pytest.fixture(scope="module")
def chromium() -> str:
    path = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
    if path is None:
        pytest.skip("chromium is not installed (.ci/run installs Debian's package)")
    return path


MEASURE = ('<script>document.body.dataset.widest = Math.max(...[...document.querySelectorAll("table.runs, svg")]'
           '.map(t => t.getBoundingClientRect().right));</script>')


def render(chromium: str, page: str, tmp_path: Path) -> tuple[str, list[str]]:
    """The DOM after load (with the widest table's right edge measured) and the console errors."""
    html_file = tmp_path / "page.html"
    html_file.write_text(page.replace("</body>", MEASURE + "</body>"))
    proc = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}",
         "--enable-logging=stderr", "--v=0", "--window-size=940,1200", "--dump-dom", html_file.as_uri()],
        capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0 and "</html>" in proc.stdout, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]
    return proc.stdout, errors


def test_the_page_renders_in_chromium_with_no_console_error_and_fits_900_px(chromium: str, tmp_path: Path) -> None:
    page = to_html(comparison())
    dom, errors = render(chromium, page, tmp_path)
    assert errors == []
    widest = float(re.search(r'data-widest="([\d.]+)"', dom).group(1))  # type: ignore[union-attr]
    assert 0 < widest <= 900 + 20, widest  # the body's 20 px margin
    # the check can fail: the same page with a script error is caught
    _, errors = render(chromium, page.replace("</body>", "<script>throw new Error('injected')</script></body>"),
                       tmp_path)
    assert any("injected" in e for e in errors), errors


@pytest.fixture(scope="module")
def sweep(matrix: Matrix) -> Sweep:
    return matrix.sweep()


def test_html_report_renders_in_headless_chromium(ftui: Ftui, sweep: Sweep, chromium: str,
                                                  tmp_path: Path) -> None:
    page = tmp_path / "compare.html"
    ftui.run("compare", "--sweep", sweep.id, "--format", "html", "-o", str(page), check=True)
    html = page.read_text()
    assert "<svg" in html and "training loss, all runs" in html and "utilisation per device" in html
    assert "Recipe differences" in html
    assert not re.search(r"""(src|href)=["']?https?:""", html), "the page must not load anything"
    png = tmp_path / "compare.png"
    proc = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}",
         f"--screenshot={png}", "--window-size=1400,1800", page.as_uri()],
        capture_output=True, text=True, timeout=180,
    )
    assert png.exists(), f"no screenshot: exit {proc.returncode}\n{proc.stderr[-2000:]}"
    assert png.stat().st_size > 30_000, png.stat().st_size  # a blank page is a few KB
    print(f"screenshot: {png}")  # pytest -s shows where to look
