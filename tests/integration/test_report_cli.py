"""``ftui compare`` and ``ftui report`` on runs written into a real SQLite store: a ``--repeat`` sweep whose
ranges overlap is a tie in every format (never "Use"), ``compare --sweep`` prints the repeats it was drawn
from, one run each is compared against the spread of repeats stored on the host, and bad input is one
line and exit 2. Through ``main`` in this process (no training)."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.analysis.compare import load_comparison
from store import Store
from tests.support import CliResult, run_in_process

MODEL_DIMS = {"layers": 2, "heads": 4, "head_dim": 8, "seq_len": 16}


def add(store: Store, strategy: str, nproc: int, tps: float, sweep: str | None = None, recipe_hash: str = "r") -> int:
    """A completed run recorded through the store API: a quickstart-shaped recipe at one global batch."""
    batch = 2 // nproc
    text = f'[launch]\nstrategy = "{strategy}"\nnproc = {nproc}\n[train]\nbatch_size = {batch}\ngrad_accum = 1\n'
    rid = store.create_run(name=strategy, recipe_text=text, recipe_hash=recipe_hash, strategy=strategy, nproc=nproc,
                           method="lora", model="builtin:tiny-llama", run_dir="", sweep_id=sweep)
    store.ingest(rid, [{"seq": s, "type": "step", "time": 1000.0 + s, "step": s, "loss": 5.0 - 0.1 * s, "lr": 1e-3,
                        "grad_norm": 0.5, "tokens_per_s": tps} for s in range(1, 4)])
    store.update_run(rid, status="completed", tokens_per_s=tps, train_seconds=3.0, final_loss=4.7, host="vm",
                     summary={"model_dims": MODEL_DIMS, "world_size": nproc})
    return rid


@pytest.fixture
def cli(store: Store, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> object:
    monkeypatch.setenv("FTUI_DB", store.url)
    monkeypatch.setenv("COLUMNS", "160")

    def run(*args: str) -> CliResult:
        return run_in_process(capsys, *args)

    return run


def test_a_repeat_sweep_within_its_spread_is_a_tie_everywhere(store: Store, cli: object, tmp_path: Path) -> None:
    for strategy, nproc, tps in [("single", 1, 1000.0), ("single", 1, 1200.0), ("single", 1, 900.0),
                                 ("ddp", 2, 1010.0), ("ddp", 2, 880.0), ("ddp", 2, 1330.0)]:
        add(store, strategy, nproc, tps, sweep="sweep-x")
    text = cli("compare", "--sweep", "sweep-x")  # type: ignore[operator]
    assert text.returncode == 0, text.stderr
    verdict = "ddp x2 and single tie: 1.01x in tokens/s, ranges 880-1,330 and 900-1,200 tokens/s over 3 and 3 runs overlap."
    assert verdict in text.stdout and "Use " not in text.stdout and "fastest" not in text.stdout
    assert "over the repeats: median (min-max)" in text.stdout  # the spread the verdict was drawn from
    md = cli("compare", "--sweep", "sweep-x", "--format", "md")  # type: ignore[operator]
    page = tmp_path / "r.html"
    report = cli("report", "--sweep", "sweep-x", "-o", str(page))  # type: ignore[operator]
    assert report.returncode == 0 and f"wrote {page}" in report.stdout
    assert verdict in md.stdout and verdict in page.read_text()


def test_one_run_each_is_judged_against_the_repeats_stored_on_the_host(store: Store, cli: object) -> None:
    add(store, "single", 1, 1000.0, recipe_hash="old")
    add(store, "single", 1, 1100.0, recipe_hash="old")  # an earlier pair of repeats: a 10% spread on vm
    a, b = add(store, "single", 1, 1000.0), add(store, "ddp", 2, 1500.0)
    cmp = load_comparison(store, [a, b])
    # the curves the report draws, read from the store's summaries (lr and grad norm were read as empty)
    for curves in (cmp.lr_curves, cmp.grad_curves, cmp.tokens_curves):
        assert [step for step, _ in curves[a]] == [1, 2, 3], curves
    assert cmp.floor is not None and cmp.floor.source == "repeats of single (runs 1, 2) on vm"
    assert cmp.recommendation().startswith("Use ddp x2 (run 4): the fastest that completed")
    close = add(store, "ddp", 2, 1050.0)
    assert load_comparison(store, [a, close]).decision().kind == "tie"
    out = cli("compare", str(a), str(b))  # type: ignore[operator]
    assert "Use ddp x2 (run 4)" in out.stdout and "beyond the run-to-run spread of 10%" in out.stdout


@pytest.mark.parametrize(("args", "named"), [
    (["report"], "report: give RUN_IDs or --sweep"),
    (["report", "99"], "run 99"),
    (["report", "--sweep", "nope"], "--sweep nope"),
    (["report", "1", "-o", "/missing/dir/r.html"], "-o/--output"),
])
def test_report_refuses_bad_input_in_one_line(store: Store, cli: object, args: list[str], named: str) -> None:
    add(store, "single", 1, 1000.0)
    result = cli(*args)  # type: ignore[operator]
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and named in lines[0], result.stderr
    assert "Traceback" not in result.stderr
