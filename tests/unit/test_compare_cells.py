"""Compare's cells stay short: three runs fit ``ftui compare`` at 120 columns and two at 80, and long
provenance (the MFU peak's source, a failure's reason) goes to numbered footnotes, the peak's in one or two
lines. Comparisons built from runs made by hand (no training)."""

from __future__ import annotations

import dataclasses
import time

from rich.console import Console

from runner.analysis import cpu_peak
from runner.analysis.compare import Comparison, build_comparison
from runner.analysis.mfu import Peak
from tests.support import run_info
from tui.render.compare import rich_table
from tui.render.compare_cells import CELL_MAX, columns, footnotes

SOURCE = (f"{cpu_peak.PROBE_SOURCE}, fp32 640x640, 2 thread(s), 7 probe(s) of >= 20 ms per rank through the steady "
          "steps, time-weighted, mean over 1 rank(s) (min 40.2 GFLOP/s, max 51.0 GFLOP/s), on Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz (2 cores) "
          "[avx2 avx512f avx512bw avx512vl fma torch 2.13] [3f9a1c2b]")
"""A CPU peak's source as ``runner.analysis.cpu_peak`` writes it (the ISA flags made it 8-9 lines)."""


def comparison(n: int) -> Comparison:
    """``n`` runs: single, ddp x2, and a pipeline run that failed with a long reason."""
    peak = Peak(46.5e9, SOURCE, kind="probe", dtype="fp32", threads=2, measured_at=time.time(), fingerprint="f")
    made = [run_info(1, "single", 1, 1234.0, threads=2), run_info(2, "ddp", 2, 2345.0, threads=1),
            run_info(3, "pp", 2, None, "failed")]
    runs = [dataclasses.replace(made[2], error="refused before launch: pp on CPU needs the gloo backend and two "
                                               "processes with a layer each; give --nproc 2"), *made[:2]]
    runs = [made[0], made[1], runs[0]][:n]
    peaks = {r.id: peak for r in runs}
    dims = {r.id: {"layers": 2, "heads": 4, "head_dim": 8, "seq_len": 16, "embedding_params": 0} for r in runs}
    runs = [dataclasses.replace(r, summary=dataclasses.replace(r.summary, params=10_000)) for r in runs]
    return build_comparison(runs, {}, peaks=peaks, dims=dims)


def printed(cmp: Comparison, width: int) -> list[str]:
    console = Console(width=width, record=True, highlight=False)
    console.print(rich_table(cmp))
    return console.export_text().splitlines()


def test_every_cell_is_short_and_long_texts_are_footnotes() -> None:
    cmp = comparison(3)
    for header, cell in columns(cmp):
        for r in cmp.rows:
            assert len(cell(r)) <= CELL_MAX, (header, cell(r))
    cells = {h: [c(r) for r in cmp.rows] for h, c in columns(cmp)}
    assert cells["MFU peak/device"][:2] == ["46.5 GFLOP/s fp32 [1]"] * 2  # one footnote for the same peak
    assert cells["status"] == ["completed", "completed", "failed [2]"]
    notes = footnotes(cmp)
    assert notes[0] == f"[1] 46.5 GFLOP/s fp32, 2 threads, probed beside the run; {cpu_peak.PROBE_SOURCE}"
    assert notes[1].startswith("[2] run 3 failed: refused before launch: pp on CPU needs the gloo backend")


def test_three_runs_fit_120_columns_and_two_fit_80() -> None:
    for n, width in ((3, 120), (2, 80)):
        cmp = comparison(n)
        lines = printed(cmp, width)
        assert max(len(line) for line in lines) <= width
        end = next(i for i, line in enumerate(lines) if line.startswith("└"))  # the figures' table
        table = [line for line in lines[:end] if line.startswith(("│", "┃"))]
        # one line per figure and the header: no cell wrapped onto a second line
        assert len(table) == len(columns(cmp)), "\n".join(table)
        for _, cell in columns(cmp):
            for r in cmp.rows:
                assert any(cell(r) in line for line in table), (cell(r), width)
        # the MFU peak's provenance: one or two lines
        peak_lines = [line for line in lines if "GFLOP/s" in line or cpu_peak.PROBE_SOURCE in line]
        assert len([line for line in peak_lines if not line.startswith("│")]) <= 2, peak_lines
