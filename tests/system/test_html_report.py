"""The HTML report (`ftui report`, `ftui compare --format html`): the verdict first, the table of short
cells with its footnotes, the runs overlaid on shared axes (loss, lr, grad norm, tokens/s, utilisation
bounded by 100%, the measured memory with its source), bars per run, the provenance in one <details>
block. Rendered in headless Chromium, which fails on an empty chart for data the runs have and on a
console error (pages with an injected error and an emptied chart are caught, so the checks can fail)."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from runner.analysis.compare import Comparison, build_comparison
from runner.analysis.mfu import Peak
from runner.analysis.report_data import memory_curve
from runner.hardware import DeviceSample
from store import EventInfo, MetricPoint, Store
from tests.support import Ftui, new_home, run_info
from tests.support.matrix import Matrix, Sweep
from tui.render.compare import nice_step, to_html
from tui.render.compare_html import util_series

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
    cmp = build_comparison(runs, metrics, samples=samples)  # type: ignore[arg-type]
    rows = [dataclasses.replace(r, mem_measured=(160 + i) * 2**20, mem_estimated=170 * 2**20, mfu=0.2 + 0.01 * i)
            for i, r in enumerate(cmp.rows)]
    return dataclasses.replace(cmp, rows=rows, memory_curves={r.id: [(s, (150 + s) * 2**20) for s in (1, 5, 10)] for r in runs},
                               memory_source="measured: live-tensor peak")


def test_nice_steps_are_round() -> None:
    assert [nice_step(s) for s in (0.35, 7.0, 100.0, 1234.0)] == [0.1, 2.0, 50.0, 500.0]


def chart(page: str, title: str) -> str:
    svg = page[:page.index(f'aria-label="{title}"')]
    svg = page[svg.rindex("<svg"):]
    return svg[:svg.index("</svg>")]


def test_the_page_leads_with_the_verdict_and_overlays_the_runs() -> None:
    cmp = comparison()
    page = to_html(cmp)
    assert page.index('class="verdict"') < page.index('<table class="runs">') < page.index("Runs overlaid")
    assert "No recommendation" not in page and "The runs tie" in page or "tie" in page.split("</div>")[0]
    # One collapsible provenance block, the MFU formula and the report's origin in it.
    assert page.count("<details") == 1
    details = page[page.index("<details"):page.index("</details>")]
    for expected in ("UTC on", "by ftui ", "1 q, 2 q", "builtin:tiny-llama", "builtin:pydoc-topics", "run hosts",
                     "6N_trainable"):
        assert expected in details, expected
    # lr, grad norm and tokens/s: one line per run on one shared axis, never "no data".
    for title in ("training loss", "learning rate", "gradient norm (before clipping)", "tokens/s per step (all devices)",
                  "utilisation, mean over devices", "peak memory per device, busiest rank"):
        svg = chart(page, title)
        assert "no data" not in svg and svg.count("<polyline") == 6, title
    memory = chart(page, "peak memory per device, busiest rank")
    assert "MiB (measured: live-tensor peak)" in memory
    util = chart(page, "utilisation, mean over devices")
    ticks = re.findall(r'text-anchor="end">([^<]+)</text>', util)
    assert ticks[0] == "0" and ticks[-1] == "100", ticks
    for title in ("tokens/s per run (all devices)", "peak memory per device: estimated vs measured", "MFU per run"):
        assert f'aria-label="{title}"' in page
    assert chart(page, "tokens/s per run (all devices)").count('class="bar"') == 6
    assert "The loss curves coincide" in page
    assert page.count('<table class="runs">') == 2  # 6 runs: 5 a table, transposed


def test_memory_events_give_the_measured_peak_or_else_the_rss_apart() -> None:
    def event(step: int, ranks: list[dict[str, object]]) -> EventInfo:
        return EventInfo(source="trainer", seq=step, type="memory", time=T0 + step, payload={"step": step, "ranks": ranks})

    gpu = [event(s, [{"rank": r, "peak_allocated_bytes": 100 * s + r} for r in (0, 1)]) for s in (1, 2)]
    assert memory_curve(gpu) == ([(1, 101), (2, 201)], "measured: CUDA allocator peak", [])
    cpu = [event(s, [{"rank": 0, "source": "rss", "rss_bytes": 900 + s, "peak_rss_bytes": 999}]) for s in (1, 2)]
    assert memory_curve(cpu) == ([], "", [(1, 901), (2, 902)])


def test_utilisation_is_the_tables_percent_of_the_threads_and_never_above_100() -> None:
    """psutil's % of one core over the rank's threads: 190% of one core with 2 threads is 95%."""
    cmp = comparison(1)
    row = dataclasses.replace(cmp.rows[0], cpu_threads=2)
    timeline = {"rank:0": [(float(t), 190.0, None) for t in range(5, 26)]}
    series, unit = util_series(dataclasses.replace(cmp, rows=[row], timelines={row.run_id: timeline}))
    assert unit == "CPU % of its threads (psutil)"
    assert {y for _, _, points in series for _, y in points} == {95.0}


@pytest.fixture(scope="module")
def chromium() -> str:
    path = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
    if path is None:
        pytest.skip("chromium is not installed (.ci/run installs Debian's package)")
    return path


CHECK = ('<script>const svgs = [...document.querySelectorAll("svg.chart")];'
         'document.body.dataset.widest = Math.max(...[...document.querySelectorAll("table.runs, svg")]'
         '.map(t => t.getBoundingClientRect().right));'
         'document.body.dataset.charts = svgs.length;'
         'document.body.dataset.empty = svgs.filter(s => !s.querySelector("polyline, circle, rect.bar"))'
         '.map(s => s.getAttribute("aria-label")).join("|");</script>')


def render(chromium: str, page: str, tmp_path: Path) -> tuple[dict[str, str], list[str]]:
    """What the page measured of itself after load (widest element, charts, empty charts) and the console
    errors."""
    html_file = tmp_path / "page.html"
    html_file.write_text(page.replace("</body>", CHECK + "</body>"))
    proc = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}",
         "--enable-logging=stderr", "--v=0", "--window-size=940,1200", "--dump-dom", html_file.as_uri()],
        capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0 and "</html>" in proc.stdout, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]
    body = re.search(r"<body([^>]*)>", proc.stdout)
    assert body is not None, proc.stdout[:2000]
    return dict(re.findall(r'data-(\w+)="([^"]*)"', body.group(1))), errors


def assert_renders(chromium: str, page: str, tmp_path: Path) -> None:
    """No console error, every chart drawn, nothing wider than 900 px."""
    measured, errors = render(chromium, page, tmp_path)
    assert errors == []
    assert int(measured["charts"]) >= 9 and measured["empty"] == "", measured
    assert 0 < float(measured["widest"]) <= 900 + 20, measured  # the body's 20 px margin


def test_a_hand_built_page_renders_in_chromium(chromium: str, tmp_path: Path) -> None:
    assert_renders(chromium, to_html(comparison()), tmp_path)


def test_the_checks_can_fail(chromium: str, tmp_path: Path) -> None:
    """The same page with a script error and the learning-rate chart emptied: both are caught."""
    page = to_html(comparison()).replace("</body>", "<script>throw new Error('injected')</script></body>")
    page = re.sub(r'(aria-label="learning rate")(.*?)</svg>',
                  lambda m: m.group(1) + re.sub(r"<polyline[^>]*/>", "", m.group(2)) + "</svg>", page, flags=re.S)
    measured, errors = render(chromium, page, tmp_path)
    assert any("injected" in e for e in errors), errors
    assert measured["empty"] == "learning rate", measured


def stored_runs(home: Ftui) -> list[int]:
    """Two runs written through the real store API as the watcher writes them: steps with loss, lr, grad
    norm and tokens/s, memory events of the live-tensor peak, telemetry samples."""
    store = Store(home.db)
    ids = []
    for strategy, nproc, tps in (("single", 1, 1000.0), ("ddp", 2, 1800.0)):
        rid = store.create_run(name=strategy, recipe_text=f'[launch]\nstrategy = "{strategy}"\n', recipe_hash="h",
                               strategy=strategy, nproc=nproc, method="lora", model="builtin:tiny-llama", run_dir="")
        steps = [{"seq": s, "type": "step", "time": T0 + s, "step": s, "loss": 5.0 - 0.1 * s, "lr": 1e-3 * s,
                  "grad_norm": 0.5 + 0.01 * s, "tokens_per_s": tps + s, "step_time": 0.5} for s in range(1, 9)]
        memory = [{"seq": 100 + s, "type": "memory", "time": T0 + s, "step": s,  # a CPU rank's: its RSS only
                   "ranks": [{"rank": r, "source": "rss", "rss_bytes": (650 + s + r) * 2**20,
                              "peak_rss_bytes": (660 + s) * 2**20} for r in range(nproc)]}
                  for s in (1, 4, 8)]
        store.ingest(rid, steps + memory)
        store.add_samples(rid, [DeviceSample(T0 + k, "vm", "rank", r, f"rank {r}", 60.0 + k, 900 * 2**20, 16 * 2**30,
                                             None, None, None, "psutil", 100 + r) for k in range(10) for r in range(nproc)])
        peak = Peak(1e10, "given for the test", kind="given")
        store.update_run(rid, status="completed", tokens_per_s=tps, train_seconds=8.0, final_loss=4.2, host="vm",
                         summary={"model_dims": {"layers": 2, "heads": 4, "head_dim": 8, "seq_len": 16},
                                  "flops_per_token": 1e6, "mfu_peak": peak.to_json(), "world_size": nproc,
                                  "ranks": [{"rank": r, "peak_tensor_bytes": (160 + r) * 2**20} for r in range(nproc)],
                                  "estimate": {"per_device_bytes": {"total": 170 * 2**20}}})
        ids.append(rid)
    store.close()
    return ids


def test_ftui_report_of_stored_runs_renders_every_chart(chromium: str, tmp_path: Path) -> None:
    home = new_home(tmp_path)
    ids = stored_runs(home)
    page = tmp_path / "out" / "report.html"
    page.parent.mkdir()
    home.call("report", *map(str, ids), "-o", str(page), check=True)
    html = page.read_text()
    assert "Cannot tell" in html  # one run each, no spread measured: no "Use"
    # the RSS of the memory events on a chart of its own, named so; the measured peak is in the bars
    assert "peak memory per device, busiest rank" not in html
    assert "MiB (process RSS, /proc)" in chart(html, "process RSS, largest rank (not training memory)")
    assert not re.search(r"""(src|href)=["']?https?:""", html), "the page must not load anything"
    assert_renders(chromium, html, tmp_path)
    same = tmp_path / "out" / "compare.html"
    home.call("compare", *map(str, ids), "--format", "html", "-o", str(same), check=True)
    made = r"<th>made</th><td>[^<]*</td>"  # when it was made
    assert re.sub(made, "", same.read_text()) == re.sub(made, "", html)


@pytest.fixture(scope="module")
def sweep(matrix: Matrix) -> Sweep:
    return matrix.sweep()


def test_the_report_of_a_real_sweep_renders_every_chart(ftui: Ftui, sweep: Sweep, chromium: str,
                                                        tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    ftui.call("report", "--sweep", sweep.id, "-o", str(page), check=True)
    html = page.read_text()
    assert "Recipe differences" in html and "eval loss" not in html  # no run of the sweep evaluates
    assert_renders(chromium, html, tmp_path)
