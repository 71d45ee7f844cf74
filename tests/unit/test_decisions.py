"""The memory of ``ftui plan``'s decisions (runner/service/decisions.py): a stored plan's trials, read again
from a real SQLite store, applied to a recipe of the same model shape, method, precision, context and rows
per step on this host, and shown by ``ftui estimate``."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from runner.planner.shapes import resolve_model_shape
from runner.service import decisions
from runner.spec.recipe import load_recipe
from store import Store
from tests.support import QUICKSTART, run_in_process

DIMS = {"layers": 6, "heads": 6, "head_dim": 64, "seq_len": 256, "embedding_params": 1572864}


def add_trial(store: Store, pid: str, strategy: str, nproc: int, tokens_per_s: float, *sets: str) -> int:
    """A completed trial of plan ``pid``: quickstart under ``strategy`` on ``nproc`` processes, its global
    batch kept (the micro-batch divided over data-parallel processes), written straight into the store."""
    micro = 4 // nproc if strategy in ("ddp", "fsdp", "zero1", "zero2", "zero3") else 4
    recipe = load_recipe(QUICKSTART, [f"launch.strategy={strategy}", f"launch.nproc={nproc}",
                                      f"train.batch_size={micro}", *sets])
    run_id = store.create_run(name=recipe.name, recipe_text=recipe.to_toml(), recipe_hash=recipe.digest(),
                              strategy=strategy, nproc=nproc, method="lora", model=recipe.model.name, run_dir="",
                              sweep_id=pid)
    store.ingest(run_id, [{"seq": i, "type": "step", "time": 1000.0 + i, "step": i, "loss": 5.0 - 0.1 * i,
                           "tokens_per_s": tokens_per_s, "step_time": 0.5} for i in range(1, 6)])
    store.update_run(run_id, status="completed", final_loss=4.5, tokens_per_s=tokens_per_s, train_seconds=2.5,
                     summary={"model_dims": DIMS, "params": 12587904, "trainable_params": 122880})
    return run_id


@pytest.fixture
def store(tmp_path: Path) -> Store:
    store = Store(f"sqlite:///{tmp_path / 'ftui.db'}")
    for speed in (1000.0, 1010.0):  # a plan with a clear winner: ddp x2 twice as fast, beyond both spreads
        add_trial(store, "plan-quickstart-a", "single", 1, speed)
    for speed in (2000.0, 2100.0):
        add_trial(store, "plan-quickstart-a", "ddp", 2, speed)
    add_trial(store, "plan-quickstart-b", "single", 1, 900.0, "data.context_length=64")  # another context
    add_trial(store, "plan-quickstart-b", "ddp", 2, 905.0, "data.context_length=64")  # within the spread
    add_trial(store, "sweep-20260101-000000-abcd", "single", 1, 50.0)  # a sweep, not a plan
    return store


def _key(*sets: str) -> decisions.PlanKey:
    recipe = load_recipe(QUICKSTART, list(sets))
    return decisions.this_host(recipe, resolve_model_shape(recipe.model.name).shape, on_cpu=True)


def test_a_plan_of_the_same_recipe_on_this_host_is_remembered_with_its_winner(store: Store) -> None:
    (past,) = decisions.past_decisions(store, _key())
    assert (past.plan_id, past.kind, past.leader, past.versus, past.world) == (
        "plan-quickstart-a", "use", "ddp x2", "single", 2)
    assert past.ratio == pytest.approx(2050.0 / 1005.0)
    assert past.line().startswith("measured here: ddp x2, 2.04x single (plan plan-quickstart-a, ")
    assert past.line().endswith(", 2 processes)")


def test_what_the_decision_depends_on_is_its_key(store: Store) -> None:
    (other,) = decisions.past_decisions(store, _key("data.context_length=64"))
    assert (other.plan_id, other.kind, other.ties) == ("plan-quickstart-b", "tie", ("ddp x2", "single"))
    assert other.line().startswith("measured here: ddp x2, single tie (plan plan-quickstart-b, ")
    assert decisions.past_decisions(store, _key("train.precision=bf16")) == []
    assert decisions.past_decisions(store, _key("train.grad_accum=2")) == []  # 8 rows per step, not 4
    key = _key()
    assert decisions.past_decisions(store, dataclasses.replace(key, host="elsewhere")) == []
    assert decisions.past_decisions(store, dataclasses.replace(key, device="cuda")) == []
    # The shape decides, not the name or the processes: the same recipe asked for ddp x2 finds it too.
    assert len(decisions.past_decisions(store, _key("launch.strategy=ddp", "launch.nproc=2",
                                                    "train.batch_size=2"))) == 1


def test_ftui_estimate_of_the_recipe_shows_what_was_measured_here(store: Store, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FTUI_DB", f"sqlite:///{tmp_path / 'ftui.db'}")
    shown = run_in_process(capsys, "estimate", str(QUICKSTART), "--format", "json")
    assert shown.returncode == 0, shown.stderr
    (past,) = json.loads(shown.stdout)["measured_here"]
    assert (past["plan_id"], past["leader"], past["kind"]) == ("plan-quickstart-a", "ddp x2", "use")
    text = run_in_process(capsys, "estimate", str(QUICKSTART))
    assert "measured here: ddp x2, 2.04x single (plan plan-quickstart-a" in " ".join(text.stdout.split())
    flags = run_in_process(capsys, "estimate", str(QUICKSTART), "--precision", "bf16", "--format", "json")
    assert json.loads(flags.stdout)["measured_here"] == []  # a flag changed what it trains: not this plan's


def test_composes_estimate_shows_what_was_measured_here(store: Store) -> None:
    from tui.app.screens.compose import estimate_text

    text = estimate_text(load_recipe(QUICKSTART), None, store).plain
    assert "measured here: ddp x2, 2.04x single (plan plan-quickstart-a, " in text
    assert "measured here" not in estimate_text(load_recipe(QUICKSTART), None, None).plain
