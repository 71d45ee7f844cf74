"""Every efficiency switch of a recipe (runner/service/switch_report.py): each turned to its other states with
what that does to the planner's estimate, whether this host can run it (the pre-flight's and the recipe's own
refusal texts), and the switch the recommendation proposes: an estimated memory cut beyond the estimate's
error band, and a tokens/s difference stored runs on this host measured beyond their spread (a real SQLite
store); shown by ``ftui estimate`` (text and JSON) and Compose."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from runner.planner import estimate, inputs_from_recipe
from runner.planner.switch_effects import switch_effects
from runner.service import switch_report
from runner.spec import kernels
from runner.spec.layout import EXPERT_PARALLEL_MISSING
from runner.spec.recipe import Recipe, load_recipe
from store import Store
from tests.support import QUICKSTART, run_in_process
from tests.unit.test_decisions import DIMS

ON_CPU = ["launch.device=cpu"]


def _recipe(*sets: str) -> Recipe:
    return load_recipe(QUICKSTART, [*ON_CPU, *sets])


def _rows(recipe: Recipe) -> dict[tuple[str, str], switch_report.SwitchRow]:
    return {(r.effect.field, r.effect.to): r for r in switch_report.switch_rows(recipe, inputs_from_recipe(recipe))}


def test_every_switch_is_turned_and_estimated() -> None:
    inp = inputs_from_recipe(_recipe())
    effects = {(e.field, e.to): e for e in switch_effects(inp)}
    assert set(effects) == {("model.attn_implementation", a) for a in ("eager", "flex_attention", "flash_attention_2")} | {
        ("train.compile", "true"), ("launch.strategy", "hsdp"), ("launch.cp_size", "2"), ("train.precision", "fp8"),
        ("train.activation_offload", "true"), ("launch.offload", "nvme"), ("launch.ep_size", "2")}
    now = estimate(inp)
    eager = effects[("model.attn_implementation", "eager")]
    assert (eager.state, eager.before) == ("sdpa", now.activations_stored)
    assert eager.after == estimate(replace(inp, attention="eager")).activations_stored > eager.before
    assert effects[("train.compile", "true")].after < now.activations_stored  # the partitioner recomputes
    cp = effects[("launch.cp_size", "2")]  # half the tokens of each sequence per process
    assert cp.after < 0.6 * cp.before
    assert effects[("train.activation_offload", "true")].after == 0 < now.activations
    assert effects[("launch.ep_size", "2")].change is None
    # A switch that is on is turned off; hsdp against sharding over every process.
    on = replace(inp, strategy="hsdp", n_devices=4, cp_size=2, nvme_offload=True, offload_optimizer=True,
                 offload_params=True, compiled=True)
    turned = {e.field: (e.state, e.to) for e in switch_effects(on)}
    assert (turned["launch.strategy"], turned["launch.cp_size"], turned["launch.offload"], turned["train.compile"]) == (
        ("hsdp", "fsdp"), ("2", "1"), ("nvme", "none"), ("true", "false"))


def test_whether_each_runs_here_is_the_pre_flights_and_the_recipes_own_line() -> None:
    recipe = _recipe()
    rows = _rows(recipe)
    flash = switch_report.variant(recipe, "model.attn_implementation", "flash_attention_2")  # fp32: not validated
    assert rows[("model.attn_implementation", "flash_attention_2")].problem == kernels.host_problem(flash, True)
    assert rows[("model.attn_implementation", "eager")].problem is None
    assert rows[("launch.ep_size", "2")].problem == f"launch.ep_size: 2: {EXPERT_PARALLEL_MISSING}"
    assert (rows[("launch.cp_size", "2")].problem or "").startswith("launch.cp_size: context parallelism needs CUDA")
    assert (rows[("train.activation_offload", "true")].problem or "").startswith("train.activation_offload:")
    assert (rows[("launch.strategy", "hsdp")].problem or "").startswith("launch.nproc: ")  # one process
    compile_here = rows[("train.compile", "true")].problem
    assert compile_here is None if shutil.which(kernels.CPU_COMPILER) else compile_here is not None
    # Under gradient checkpointing compile is the recipe's refusal, in its own words.
    assert "train.compile: not with train.gradient_checkpointing" in (
        _rows(_recipe("train.gradient_checkpointing=true"))[("train.compile", "true")].problem or "")


def test_the_memory_proposal_is_the_largest_cut_that_runs_here() -> None:
    recipe = _recipe("model.attn_implementation=\"eager\"")
    inp = inputs_from_recipe(recipe)
    rows = switch_report.switch_rows(recipe, inp)
    runnable = [r for r in rows if r.problem is None and (r.effect.change or 0) < 0]
    best = min(runnable, key=lambda r: r.effect.change or 0.0).effect
    line = switch_report.memory_proposal(rows, inp)
    assert line is not None and line.startswith(f"{best.field} = {best.to} (instead of {best.state}) cuts ")
    assert f"by {-(best.change or 0) * 100:.0f}% here (estimate;" in line
    # Nothing runnable cuts anything: nothing is proposed.
    assert switch_report.memory_proposal([replace(r, problem="x") for r in rows], inp) is None


def _add_run(store: Store, tokens_per_s: float, attention: str, compiled: bool, *sets: str) -> int:
    recipe = _recipe(f"model.attn_implementation=\"{attention}\"", f"train.compile={str(compiled).lower()}", *sets)
    run_id = store.create_run(name=recipe.name, recipe_text=recipe.to_toml(), recipe_hash=recipe.digest(),
                              strategy="single", nproc=1, method="lora", model=recipe.model.name, run_dir="")
    store.ingest(run_id, [{"seq": i, "type": "step", "time": 1000.0 + i, "step": i, "loss": 5.0 - 0.1 * i,
                           "tokens_per_s": tokens_per_s, "step_time": 0.5} for i in range(1, 6)])
    kernels_record: dict[str, Any] = {"attention": attention,
                                      "compile": {"mode": "default", "layers": 6} if compiled else None}
    store.update_run(run_id, status="completed", final_loss=4.5, tokens_per_s=tokens_per_s, train_seconds=2.5,
                     summary={"model_dims": DIMS, "params": 12587904, "trainable_params": 122880,
                              "kernels": kernels_record})
    return run_id


@pytest.fixture
def store(tmp_path: Path) -> Store:
    store = Store(f"sqlite:///{tmp_path / 'ftui.db'}")
    for speed in (1000.0, 1020.0):  # the recipe as written (sdpa), twice: its spread is 2%
        _add_run(store, speed, "sdpa", False)
    for speed in (1300.0, 1310.0):  # eager, beyond both ranges
        _add_run(store, speed, "eager", False)
    _add_run(store, 1010.0, "sdpa", True)  # compiled, within the measured spread
    _add_run(store, 5000.0, "sdpa", True, "data.context_length=64")  # another training: never compared
    return store


def test_a_speed_measured_here_beyond_the_spread_is_proposed(store: Store) -> None:
    recipe = _recipe()
    rows = switch_report.switch_rows(recipe, inputs_from_recipe(recipe))
    (line,) = switch_report.speed_proposals(store, recipe, inputs_from_recipe(recipe).shape, rows)
    assert line.startswith("model.attn_implementation = eager: +29% tokens/s measured on this host (single (eager) "
                           "runs 3, 4 against single runs 1, 2; ranges")  # 1305 / 1010
    # What cannot run here is never proposed, however fast it measured.
    refused = [replace(r, problem="x") if r.effect.to == "eager" else r for r in rows]
    assert switch_report.speed_proposals(store, recipe, inputs_from_recipe(recipe).shape, refused) == []


def test_ftui_estimate_and_compose_list_every_switch_and_the_proposals(store: Store, tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str],
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FTUI_DB", f"sqlite:///{tmp_path / 'ftui.db'}")
    recipe_file = tmp_path / "cpu.toml"
    recipe_file.write_text(QUICKSTART.read_text().replace("[launch]\n", "[launch]\ndevice = \"cpu\"\n"))
    shown = run_in_process(capsys, "estimate", str(recipe_file), "--format", "json")
    assert shown.returncode == 0, shown.stderr
    report = json.loads(shown.stdout)
    fields = {(row["field"], row["to"]): row for row in report["every_switch"]}
    assert len(fields) == 10 and fields[("launch.ep_size", "2")]["runs_here"] is False
    assert any(p.startswith("model.attn_implementation = eager: +29% tokens/s measured") for p in report["proposals"])
    text = " ".join(run_in_process(capsys, "estimate", str(recipe_file)).stdout.split())
    assert "every switch of the recipe (single, 1 process), turned" in text and "model.attn_implementation sdpa -> flash_attention_2" in text
    assert "proposed: model.attn_implementation = eager: +29% tokens/s measured on this host" in text
    from tui.app.screens.compose import estimate_text

    plain = estimate_text(load_recipe(recipe_file), None, store).plain
    assert "launch.cp_size 1 -> 2" in plain and "proposed: model.attn_implementation = eager: +29%" in plain
