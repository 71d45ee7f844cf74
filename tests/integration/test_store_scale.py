"""The store at scale (issue 15 item 5) and compare without model configs (issue 16 item 3).

Facts, not timings (the speeds are in bench/bench_store_scale.py and BENCHMARKS.md): the curves read for
display keep every run's first, last, lowest and highest points and delete nothing; summaries built batch
by batch equal those built in one go (and by the migration's backfill); compare and the run list read the
right values from a store with many runs; ``ftui compare`` of runs that stored their figures imports
neither torch nor transformers, and a run recorded without them still compares.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy
from hypothesis import given, settings
from hypothesis import strategies as st

from runner.spec.flops import run_flops_per_token
from store import Store, migrate
from store.rollup import BLOCK_COLUMNS, SPANS, downsample_points, rollup_named, rollup_rows
from store.store import utcnow
from tests.support import CliResult, run_in_process

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "recipes" / "quickstart.toml"
DIMS = {"layers": 6, "heads": 6, "head_dim": 64, "seq_len": 256, "embedding_params": 1572864}
PARAMS, TRAINABLE = 12587904, 122880
PEAK = {"flops": 250e9, "source": "matmul probe in the ranks (CPU), fp32", "kind": "probe", "dtype": "fp32",
        "threads": 1, "measured_at": 1795447228.6, "fingerprint": "x", "machine": "test", "size": 512, "load": 0.5}


def _loss(run: int, step: int) -> float:
    return 5.0 / (1 + step / 100) + 0.01 * ((step * 7919 + run) % 17)


def add_run(store: Store, name: str, steps: int, *, batch: int = 250, stored_figures: bool = True,
            status: str = "completed", tps: float = 700.0, losses: dict[int, float] | None = None,
            named: Callable[[int], dict[str, float]] | None = None) -> int:
    """A run written the way the orchestrator writes one: create, start summary, journal events in
    batches through ``Store.ingest``, end figures. ``stored_figures=False``: as an older ftui left it
    (no model dimensions, no FLOPs per token, no peak)."""
    recipe = QUICKSTART.read_text().replace('name = "quickstart"', f'name = "{name}"')
    run_id = store.create_run(name=name, recipe_text=recipe, recipe_hash="h", strategy="single", nproc=1,
                              method="lora", model="builtin:tiny-llama", run_dir="")
    store.update_run(run_id, status="running", started_at=utcnow(), device_type="cpu")
    start: dict[str, Any] = {"params": PARAMS, "trainable_params": TRAINABLE, "world_size": 1, "threads": 1}
    if stored_figures:
        start |= {"model_dims": DIMS, "flops_per_token": run_flops_per_token("lora", PARAMS, TRAINABLE, DIMS),
                  "estimate": {"per_device_bytes": {"total": 125820416}}}
    store.update_run(run_id, summary=start)
    events = [{"seq": s, "type": "step", "time": 1000.0 + s, "step": s, "epoch": 0,
               "loss": (losses or {}).get(s, _loss(run_id, s)), "lr": 1e-3 * (1 - s / (steps + 1)),
               "grad_norm": 1.0 + (s % 5), "tokens": 256 * s, "step_time": 0.5, "tokens_per_s": tps}
              for s in range(1, steps + 1)]
    if named is not None:  # the trainer's ``metrics`` event after a step's (named_metrics rows)
        events = [e for step in events for e in (step, {"type": "metrics", "time": step["time"], "rank": 0,
                                                         "step": step["step"], "values": named(step["step"])})]
        events = [e | {"seq": i + 1} for i, e in enumerate(events)]
    for lo in range(0, len(events), batch):
        store.ingest(run_id, events[lo:lo + batch])
    if status == "completed":
        store.update_run(run_id, status="completed", ended_at=utcnow(), tokens_per_s=tps, train_seconds=steps * 0.5,
                         final_loss=(losses or {}).get(steps, _loss(run_id, steps)) if steps else None,
                         summary={"mfu_peak": PEAK} if stored_figures else {})
    elif status != "running":
        store.update_run(run_id, status=status, ended_at=utcnow(), error="rank 0 exited with code 1")
    return run_id


# ---------------------------------------------------------------------- downsampling


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=600), st.integers(4, 120))
def test_downsampled_points_keep_first_last_min_max_and_order(values: list[float], width: int) -> None:
    points = [(i * 3, v) for i, v in enumerate(values)]
    kept = downsample_points(points, width)
    assert len(kept) <= max(width, len(points)) if len(points) <= width else len(kept) <= width
    assert kept[0] == points[0] and kept[-1] == points[-1]
    assert min(v for _, v in kept) == min(values) and max(v for _, v in kept) == max(values)
    assert [s for s, _ in kept] == sorted({s for s, _ in kept})
    assert set(kept) <= set(points)
    assert len(points) == len(values)  # the input is left as it is


def test_curves_keep_the_shape_and_never_delete_rows(db_url: str) -> None:
    store = Store(db_url)
    steps = 9000
    spikes = {4321: 50.0, 6000: -3.0}  # a divergence and an implausible dip: both must survive
    run_id = add_run(store, "long", steps, batch=997, losses={**spikes, 7000: math.nan})
    curve = store.curves([run_id], "loss", points=200)[run_id]
    assert 4 <= len(curve.points) <= 200
    assert curve.points[0] == (1, _loss(run_id, 1))
    assert curve.points[-1] == (steps, _loss(run_id, steps))
    assert (4321, 50.0) in curve.points and (6000, -3.0) in curve.points
    assert curve.best == -3.0 and curve.count == steps - 1  # the NaN step is stored but not summarised
    assert curve.last_step == steps
    # Reading thinned nothing: every row is still there, NaN included.
    rows = store.metrics(run_id)
    assert [m.step for m in rows] == list(range(1, steps + 1))
    # (SQLite stores a NaN as NULL, PostgreSQL as NaN: either way the step's row is kept.)
    assert rows[6999].step == 7000 and (rows[6999].loss is None or math.isnan(rows[6999].loss))
    assert rows[4320].loss == 50.0
    # lr, grad_norm and tokens/s are summarised too.
    lr = store.curves([run_id], "lr", points=40)[run_id]
    assert lr.points[0][0] == 1 and lr.points[-1][0] == steps and len(lr.points) <= 40


def test_summaries_built_batch_by_batch_equal_one_pass_and_the_backfill(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ftui.db'}"
    store = Store(url)
    run_id = add_run(store, "uneven", 5000, batch=37)  # batches straddle every block boundary
    engine = sqlalchemy.create_engine(url)

    def stored() -> dict[tuple[str, int, int], tuple[Any, ...]]:
        with engine.connect() as conn:
            rows = conn.execute(sqlalchemy.text(
                f"SELECT name, span, block, {', '.join(BLOCK_COLUMNS)} FROM metric_rollups WHERE run_id = :r"),
                {"r": run_id}).all()
        return {(r[0], r[1], r[2]): tuple(r[3:]) for r in rows}

    one_pass = {k: tuple(getattr(b, c) for c in BLOCK_COLUMNS)
                for k, b in rollup_rows([vars(m) for m in store.metrics(run_id)]).items()}
    assert stored() == one_pass
    assert {span for _, span, _ in one_pass} == set(SPANS)
    # A database from before the summaries (the revision before 0005): the upgrade summarises its metrics.
    store.close()
    from alembic import command

    with engine.begin() as conn:  # Alembic's own downgrade, through every revision after 0005's parent
        command.downgrade(migrate.alembic_config(conn), migrate.REVISIONS[migrate.REVISIONS.index("0005") - 1])
    assert "metric_rollups" not in sqlalchemy.inspect(engine).get_table_names()
    Store(url).close()
    assert stored() == one_pass


def _named(step: int) -> dict[str, float]:
    """``train/a`` every step, ``eval/loss`` every 5th, lowest at step 1235 (not a block's end)."""
    values = {"train/a": math.sin(step / 50)}
    if step % 5 == 0:
        values["eval/loss"] = 0.01 if step == 1235 else 3.0 + math.cos(step / 70)
    return values


def test_named_metric_summaries_built_batch_by_batch_equal_one_pass_and_the_backfill(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ftui.db'}"
    store = Store(url)
    run_id = add_run(store, "named", 5000, batch=37, named=_named)
    engine = sqlalchemy.create_engine(url)

    def stored() -> dict[tuple[str, int, int], tuple[Any, ...]]:
        with engine.connect() as conn:
            rows = conn.execute(sqlalchemy.text(
                f"SELECT name, span, block, {', '.join(BLOCK_COLUMNS)} FROM named_metric_rollups WHERE run_id = :r"),
                {"r": run_id}).all()
        return {(r[0], r[1], r[2]): tuple(r[3:]) for r in rows}

    rows = store.named_metrics(run_id)
    assert len(rows) == 5000 + 1000  # every value stored
    one_pass = {k: tuple(getattr(b, c) for c in BLOCK_COLUMNS)
                for k, b in rollup_named((p.step, p.name, p.value) for p in rows).items()}
    assert stored() == one_pass
    assert {name for name, _, _ in one_pass} == {"train/a", "eval/loss"}
    # A database from before them (0006): the upgrade to 0007 summarises the named metrics already stored.
    store.close()
    from alembic import command

    with engine.begin() as conn:  # Alembic's own downgrade of 0007
        command.downgrade(migrate.alembic_config(conn), "0006")
    assert "named_metric_rollups" not in sqlalchemy.inspect(engine).get_table_names()
    store = Store(url)
    assert stored() == one_pass
    assert store.delete_run(run_id) and stored() == {}
    store.close()


def _statements(store: Store) -> list[str]:
    """Every SQL statement the store runs from now on."""
    seen: list[str] = []
    sqlalchemy.event.listen(store.engine, "before_cursor_execute",
                            lambda _conn, _cursor, statement, *_rest: seen.append(statement))
    return seen


def test_compare_and_the_monitor_read_named_metrics_from_their_summaries(tmp_path: Path) -> None:
    from runner.analysis.compare import CURVE_POINTS, load_comparison
    from tui.app.poll import LONG_RUN_STEPS, MonitorFeed

    store = Store(f"sqlite:///{tmp_path / 'ftui.db'}")
    steps = LONG_RUN_STEPS * 3  # 1,200 evals, 6,000 train/a values: both past CURVE_POINTS
    done = add_run(store, "done", steps, batch=1000, named=_named)
    live = add_run(store, "live", steps, batch=1000, named=_named, status="running")
    evals = [(p.step, p.value) for p in store.named_metrics(done, ["eval/loss"])]
    assert len(evals) == steps // 5 > CURVE_POINTS
    seen = _statements(store)
    row = load_comparison(store, [done]).rows[0]
    assert row.best_eval_loss == 0.01 and row.final_eval_loss == evals[-1][1]
    raw_reads = [q for q in seen if re.search(r"\bnamed_metrics\b", q)]
    assert raw_reads == [] and any("named_metric_rollups" in q for q in seen)
    cmp = load_comparison(store, [done])
    assert cmp.named[done] == {"train/a": _named(steps)["train/a"], "eval/loss": evals[-1][1]}
    assert len(cmp.eval_curves[done]) <= CURVE_POINTS and (1235, 0.01) in cmp.eval_curves[done]
    # The monitor opens the running run from the summaries, then reads only named values logged after them.
    seen.clear()
    feed = MonitorFeed(store, live, plot_width=100)
    snap = feed.poll()
    assert all("step >" in q for q in seen if re.search(r"\bnamed_metrics\b", q))
    assert (1235.0, 0.01) in snap.named["eval/loss"] and len(snap.named["train/a"]) <= 8 * 100
    assert snap.named["train/a"][-1] == (float(steps), _named(steps)["train/a"])
    store.ingest(live, [{"seq": 10**6, "type": "metrics", "time": 9e9, "rank": 0, "step": steps + 1,
                         "values": {"train/a": 42.0}}])
    assert feed.poll().named["train/a"][-1] == (float(steps + 1), 42.0)
    assert len(store.named_metrics(live)) == steps + steps // 5 + 1  # nothing thinned in the store


# ---------------------------------------------------------------------- many runs

pytestmark = pytest.mark.xdist_group(name="store-scale")
"""The many-runs store (about 2 s of CPU to write) is made once: the module's tests go to one worker."""


@pytest.fixture(scope="module")
def many(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A SQLite store of 60 runs (5 of 3,000 steps), some failed, one recorded by an older ftui."""
    home = tmp_path_factory.mktemp("scale")
    url = f"sqlite:///{home / 'ftui.db'}"
    store = Store(url)
    ids = []
    rng = random.Random(0)
    for i in range(60):
        steps = 3000 if i < 5 else rng.randint(5, 60)
        ids.append(add_run(store, f"run-{i}", steps, status="failed" if i % 9 == 8 else "completed",
                           tps=500.0 + i))
    old = add_run(store, "older-ftui", 200, stored_figures=False)
    expected = {rid: min(m.loss for m in store.metrics(rid) if m.loss is not None) for rid in ids + [old]}
    store.close()
    return {"home": home, "url": url, "ids": ids, "old": old, "best": expected}


def _ftui(home: Path, *args: str, python_args: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FTUI_HOME": str(home), "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.run([sys.executable, *python_args, "-m", "tui.cli", *args], env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture
def ftui_here(many: dict[str, Any], capsys: pytest.CaptureFixture[str],
              monkeypatch: pytest.MonkeyPatch) -> Callable[..., CliResult]:
    """``ftui ARGS`` in this process on the many-runs home, 200 columns wide: for what a command reads
    and prints (the process's imports are tested apart, in a subprocess)."""
    monkeypatch.setenv("FTUI_HOME", str(many["home"]))
    monkeypatch.setenv("COLUMNS", "200")
    return lambda *args: run_in_process(capsys, *args)


def test_compare_reads_the_right_figures_from_many_runs(many: dict[str, Any]) -> None:
    from runner.analysis.compare import load_comparison

    store = Store(many["url"], create=False)
    chosen = many["ids"][:5] + many["ids"][40:45]
    cmp = load_comparison(store, chosen)
    assert [r.run_id for r in cmp.rows] == chosen
    for row in cmp.rows:
        run = store.get_run(row.run_id)
        assert run is not None
        assert row.best_loss == many["best"][row.run_id]
        assert row.tokens_per_s == run.tokens_per_s and row.final_loss == run.final_loss
        points = cmp.curves[row.run_id]
        raw = [(m.step, m.loss) for m in store.metrics(row.run_id)]
        assert points[0] == raw[0] and points[-1] == raw[-1] and len(points) <= 200
        if row.status == "completed":
            fpt = run_flops_per_token("lora", PARAMS, TRAINABLE, DIMS)
            assert fpt is not None and row.mfu == pytest.approx(fpt * (run.tokens_per_s or 0) / PEAK["flops"])


def test_runs_lists_every_run_from_the_summary_columns(many: dict[str, Any], ftui_here: Callable[..., CliResult]) -> None:
    out = ftui_here("runs", "--format", "json", "--db", many["url"])
    assert out.returncode == 0, out.stderr
    runs = {r["id"]: r for r in json.loads(out.stdout)}
    assert set(runs) == set(many["ids"]) | {many["old"]}
    long_run = runs[many["ids"][0]]
    assert long_run["steps_done"] == 3000 and long_run["status"] == "completed"


def test_the_runs_table_shows_the_newest_and_says_how_many_are_not_shown(many: dict[str, Any],
                                                                         ftui_here: Callable[..., CliResult]) -> None:
    newest = sorted(many["ids"] + [many["old"]], reverse=True)
    out = ftui_here("runs", "--limit", "10", "--db", many["url"])
    assert out.returncode == 0, out.stderr
    shown = [int(line.split()[0]) for line in out.stdout.splitlines()
             if line.split()[:1] and line.split()[0].isdigit() and "older runs" not in line]
    assert shown == newest[:10]
    assert f"{len(newest) - 10} older runs not shown: --limit N or --all" in out.stdout
    everything = ftui_here("runs", "--all", "--db", many["url"])
    assert everything.returncode == 0 and "older runs not shown" not in everything.stdout
    assert len([line for line in everything.stdout.splitlines() if line.split()[:1] and line.split()[0].isdigit()]
               ) == len(newest)
    limited = ftui_here("runs", "--format", "json", "--limit", "3", "--db", many["url"])
    assert [r["id"] for r in json.loads(limited.stdout)] == newest[:3]
    both = ftui_here("runs", "--all", "--limit", "3", "--db", many["url"])
    assert both.returncode == 2 and "not allowed with" in both.stderr


async def test_the_runs_screen_reads_the_newest_until_asked_for_all(many: dict[str, Any],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from textual.widgets import DataTable, Static

    from tests.support.dashboard import NO_WATCHER_CHECK
    from tui.app import make_app
    from tui.app.screens import runs as runs_screen

    monkeypatch.setattr(runs_screen, "RUNS_SHOWN", 20)
    total = len(many["ids"]) + 1
    app = make_app(Store(many["url"], create=False), refresh_s=0.2, watcher_check_s=NO_WATCHER_CHECK)
    async with app.run_test(size=(120, 40)) as pilot:
        for _ in range(100):
            await pilot.pause(0.05)
            if app.screen.query_one(DataTable).row_count:
                break
        assert app.screen.query_one(DataTable).row_count == 20
        status = str(app.screen.query_one("#runs-status", Static).render())
        assert f"20 of 20 runs (the newest of {total}: A reads all)" in status
        await pilot.press("A")
        for _ in range(100):
            await pilot.pause(0.05)
            if app.screen.query_one(DataTable).row_count == total:
                break
        assert app.screen.query_one(DataTable).row_count == total
        assert "A reads all" not in str(app.screen.query_one("#runs-status", Static).render())


def test_ftui_compare_imports_neither_torch_nor_transformers(many: dict[str, Any]) -> None:
    ids = [str(i) for i in many["ids"][:10]]
    out = _ftui(many["home"], "compare", *ids, "--format", "json", "--db", many["url"],
                python_args=("-X", "importtime"))
    assert out.returncode == 0, out.stderr[-2000:]
    imported = {line.split("|")[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")}
    assert "textual" not in imported and len(imported) > 50  # the trace is there
    assert not {m for m in imported if m.split(".")[0] in ("torch", "transformers")}
    rows = json.loads(out.stdout)["runs"]
    assert [r["run_id"] for r in rows] == [int(i) for i in ids]
    assert all(r["mfu"] is not None for r in rows if r["status"] == "completed")


def test_a_run_recorded_without_stored_figures_still_compares(many: dict[str, Any],
                                                             ftui_here: Callable[..., CliResult]) -> None:
    out = ftui_here("compare", str(many["ids"][5]), str(many["old"]), "--format", "json",
                "--peak-tflops", "0.25", "--db", many["url"])
    assert out.returncode == 0, out.stderr[-2000:]
    old = json.loads(out.stdout)["runs"][1]
    assert old["run_id"] == many["old"] and old["best_loss"] == many["best"][many["old"]]
    # Its dimensions come from the model's config, read lazily: the same MFU as a run that stored them.
    fpt = run_flops_per_token("lora", PARAMS, TRAINABLE, DIMS)
    assert fpt is not None and old["mfu"] == pytest.approx(fpt * 700.0 / 250e9)


def test_the_monitor_opens_a_long_run_from_the_summaries_and_follows_it(tmp_path: Path) -> None:
    from tui.app.poll import LONG_RUN_STEPS, MonitorFeed

    store = Store(f"sqlite:///{tmp_path / 'ftui.db'}")
    steps = LONG_RUN_STEPS * 3
    run_id = add_run(store, "live", steps, batch=1000, status="running", losses={1234: 0.001})
    feed = MonitorFeed(store, run_id, plot_width=100)
    snap = feed.poll()
    raw = store.metrics(run_id)
    assert snap.loss_steps == steps and snap.step == steps
    assert snap.last_loss == raw[-1].loss and min(feed.losses) == 0.001
    assert len(feed.series["loss"]) <= 8 * 100 and len(feed.metrics) >= 10
    store.ingest(run_id, [{"seq": steps + k, "type": "step", "time": 9e9, "step": steps + k, "loss": 0.5,
                           "lr": 1e-4, "grad_norm": 1.0, "tokens": 1, "step_time": 0.5, "tokens_per_s": 9.0}
                          for k in (1, 2)])
    snap = feed.poll()
    assert snap.loss_steps == steps + 2 and snap.step == steps + 2 and snap.last_loss == 0.5
    assert snap.tokens_per_s == 9.0
