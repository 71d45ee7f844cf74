"""Checkpoints, resume, non-finite losses and per-rank memory events.

The checkpointed run of the shared matrix (FSDP, a checkpoint every step) and the runs here train for real
(quickstart on CPU, real subprocesses, real SQLite); the others check the journal writer and the checkpoint
folder logic on real files.
"""

from __future__ import annotations

import json
import math
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from safetensors import safe_open

from runner.spec import checkpoint as ck
from runner.spec.events import JournalWriter, finite_json
from runner.spec.recipe import RecipeError, parse_recipe
from tests.support import QUICKSTART, ROOT, Ftui
from tests.support.matrix import STEPS, TOKENS_PER_STEP, Matrix

SHORT = ["--set", "data.context_length=64"]
"""Runs that are compared with nothing: short rows, cheap steps."""


def _events(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def _losses(run: dict[str, Any]) -> dict[int, float | None]:
    return {m["step"]: m["loss"] for m in run["metrics"]}


def _run_by_name(ftui: Ftui, name: str) -> dict[str, Any]:
    run = next(r for r in ftui.runs() if r["name"] == name)
    return ftui.show(run["id"])


# ---------------------------------------------------------------------- the journal: no NaN in JSON


def test_journal_writer_turns_non_finite_floats_into_null(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    writer = JournalWriter(path)
    writer.emit("step", step=2, loss=float("nan"), lr=1e-3, grad_norm=float("inf"),
                ranks=[{"x": float("-inf"), "ok": 1.5}], pair=(float("nan"), 2))
    writer.emit("end", final_loss=3.25)
    writer.close()
    lines = path.read_text().splitlines()

    def refuse(token: str) -> None:
        raise AssertionError(f"non-JSON constant {token}")

    for line in lines:  # strict JSON: json.loads accepts NaN/Infinity unless told otherwise
        json.loads(line, parse_constant=refuse)
    step, end = (json.loads(line) for line in lines)
    assert step["loss"] is None and step["grad_norm"] is None and step["lr"] == 1e-3
    assert step["ranks"] == [{"x": None, "ok": 1.5}] and step["pair"] == [None, 2]
    assert end["final_loss"] == 3.25
    db = sqlite3.connect(":memory:")  # what broke before: SQLite's json functions refuse NaN
    assert all(db.execute("select json_valid(?)", (line,)).fetchone()[0] == 1 for line in lines)
    assert finite_json({"a": [1, float("nan")], "b": "nan"}) == {"a": [1, None], "b": "nan"}


# ---------------------------------------------------------------------- recipe fields


def test_checkpoint_and_nan_fields_are_validated() -> None:
    recipe = parse_recipe("[train]\nsave_every = 50\nkeep_checkpoints = 3\non_nan = 'skip'\nmax_skipped_steps = 4\n")
    assert (recipe.train.save_every, recipe.train.keep_checkpoints) == (50, 3)
    assert (recipe.train.on_nan, recipe.train.max_skipped_steps, recipe.train.resume_from) == ("skip", 4, None)
    for bad, field in [("save_every = -1", "train.save_every"), ("keep_checkpoints = 0", "train.keep_checkpoints"),
                       ("on_nan = 'ignore'", "train.on_nan"), ("resume_from = 3", "train.resume_from")]:
        with pytest.raises(RecipeError, match=field.replace(".", r"\.")):
            parse_recipe(f"[train]\n{bad}\n")


# ---------------------------------------------------------------------- checkpoint folders


def _fake_checkpoint(run_dir: Path, step: int, world: int = 2, complete: bool = True) -> Path:
    folder = ck.checkpoint_dir(run_dir, step)
    folder.mkdir(parents=True)
    for r in range(world):
        (folder / f"random_states_{r}.pkl").write_bytes(b"x" * (10 + r))
    (folder / "optimizer.bin").write_bytes(b"o" * 100)
    manifest = {"format": ck.FORMAT, "step": step, "world_size": world, "strategy": "ddp", "complete": complete}
    if complete:
        manifest["files"] = ck.file_sizes(folder)
    ck.write_manifest(folder, manifest)
    return folder


def test_only_complete_checkpoints_count(tmp_path: Path) -> None:
    good = _fake_checkpoint(tmp_path, 4)
    _fake_checkpoint(tmp_path, 8, complete=False)  # a save cut short: manifest says so
    assert ck.latest_complete(tmp_path) == good
    truncated = _fake_checkpoint(tmp_path, 12)
    (truncated / "optimizer.bin").write_bytes(b"o" * 7)  # a file shorter than written
    missing = _fake_checkpoint(tmp_path, 16)
    (missing / "random_states_1.pkl").unlink()
    assert ck.complete_checkpoints(tmp_path) == [good]
    with pytest.raises(ck.CheckpointError, match="damaged checkpoint.*optimizer.bin"):
        ck.check_complete(truncated)
    with pytest.raises(ck.CheckpointError, match="random_states_1.pkl is missing"):
        ck.check_complete(missing)
    with pytest.raises(ck.CheckpointError, match="incomplete checkpoint"):
        ck.check_complete(ck.checkpoint_dir(tmp_path, 8))
    assert ck.missing_rank_parts(missing, 2) == ["random_states_1.pkl"]


def test_prune_keeps_the_newest_complete_ones(tmp_path: Path) -> None:
    for step in (2, 4, 6):
        _fake_checkpoint(tmp_path, step)
    _fake_checkpoint(tmp_path, 5, complete=False)  # left over by a crash: older than the newest, removed
    newest = _fake_checkpoint(tmp_path, 8)
    removed = ck.prune(tmp_path, keep=2, current=newest)
    assert sorted(removed) == ["step-00000002", "step-00000004", "step-00000005"]
    assert [p.name for p in ck.complete_checkpoints(tmp_path)] == ["step-00000006", "step-00000008"]


def test_check_resume_refuses_another_shape_in_one_line(tmp_path: Path) -> None:
    folder = _fake_checkpoint(tmp_path, 4, world=2)
    assert ck.check_resume(str(folder), 2, "ddp")["step"] == 4
    with pytest.raises(ck.CheckpointError) as err:
        ck.check_resume(str(folder), 2, "fsdp")
    assert str(err.value).startswith("train.resume_from: ") and "\n" not in str(err.value)
    assert "strategy ddp on 2" in str(err.value)
    with pytest.raises(ck.CheckpointError, match="strategy ddp on 2 process.*single on 1"):
        ck.check_resume(str(folder), 1, "single")
    with pytest.raises(ck.CheckpointError, match="no such checkpoint folder"):
        ck.check_resume(str(tmp_path / "nope"), 2, "ddp")


# ---------------------------------------------------------------------- resume: the loss curve goes on


def test_a_resumed_run_continues_the_loss_curve_exactly(ftui: Ftui, matrix: Matrix) -> None:
    """FSDP (sharded checkpoints), a checkpoint every step, the newest 3 kept, against the same run
    uninterrupted; then a new run resumed from the step-3 checkpoint: every loss equal (to 1e-6), tokens
    counted on from the checkpoint, global step numbers."""
    uninterrupted = _losses(matrix["fsdp"].shown)
    saving = matrix["ck-fsdp"].shown
    assert _losses(saving) == pytest.approx(uninterrupted, abs=1e-6)  # saving does not disturb training
    run_dir = Path(saving["run_dir"])
    assert [ck.step_of(p) for p in ck.complete_checkpoints(run_dir)] == [3, 4, 5]
    events = _events(run_dir)
    saves = [e for e in events if e["type"] == "checkpoint"]
    assert [e["step"] for e in saves] == list(range(1, STEPS + 1))
    # each save is announced as it begins (a phase: a sign of progress for the hang rule, words for a person)
    announced = [e for e in events if e["type"] == "phase" and e["phase"] == "saving"]
    assert [e["detail"] for e in announced] == [f"the checkpoint of step {n}" for n in range(1, STEPS + 1)] + [
        "the trained model"]
    announced = announced[:-1]
    assert all(a["seq"] < s["seq"] for a, s in zip(announced, saves, strict=True))
    assert all(e["seconds"] > 0 and e["bytes"] > 0 and e["reason"] == "every" for e in saves)
    assert [e["removed"] for e in saves] == [[], [], [], ["step-00000001"], ["step-00000002"]]  # pruned
    step3 = ck.checkpoint_dir(run_dir, 3)
    manifest = ck.check_resume(str(step3), 2, "fsdp")
    assert (manifest["step"], manifest["epoch"], manifest["tokens_done"]) == (3, 0, 3 * TOKENS_PER_STEP)
    assert ck.missing_rank_parts(step3, 2) == []
    # Sharded: one torch distributed checkpoint file per rank.
    assert {f for f in manifest["files"] if f.endswith(".distcp")} >= {
        "pytorch_model_fsdp_0/__0_0.distcp", "pytorch_model_fsdp_0/__1_0.distcp"}
    memory = [e for e in events if e["type"] == "memory"]
    assert memory[0]["step"] == 1 and memory[-1]["step"] == STEPS
    for e in memory:
        assert [r["rank"] for r in e["ranks"]] == [0, 1]
        assert all(r["source"] == "rss" and r["rss_bytes"] > 100e6 and r["peak_rss_bytes"] >= r["rss_bytes"]
                   for r in e["ranks"])

    ftui.run("run", str(run_dir / "recipe.toml"), "--set", f"train.resume_from={json.dumps(str(step3))}",
             "--set", "train.save_every=0", "--name", "ck-fsdp-resumed", check=True, timeout=900)
    resumed = _run_by_name(ftui, "ck-fsdp-resumed")
    assert resumed["status"] == "completed"
    assert [m["step"] for m in resumed["metrics"]] == list(range(4, STEPS + 1))
    tail = {s: loss for s, loss in uninterrupted.items() if s > 3}
    assert _losses(resumed) == pytest.approx(tail, abs=1e-6)
    assert [m["tokens"] for m in resumed["metrics"]] == [s * TOKENS_PER_STEP for s in range(4, STEPS + 1)]
    start = next(e for e in _events(Path(resumed["run_dir"])) if e["type"] == "start")  # phase events come first
    assert (start["start_step"], start["resumed_from"]) == (3, str(step3))
    assert resumed["summary"]["tokens"] == STEPS * TOKENS_PER_STEP


def test_resume_from_a_bad_checkpoint_is_one_line_and_exit_2(ftui: Ftui, matrix: Matrix, tmp_path: Path) -> None:
    run_dir = matrix["ck-fsdp"].run_dir
    good = ck.checkpoint_dir(run_dir, 3)
    cut = tmp_path / "step-00000003"
    shutil.copytree(good, cut)
    (cut / "random_states_1.pkl").unlink()
    zeroed = tmp_path / "zeroed" / "step-00000003"  # a real save's shard zeroed at its size: only its hash tells
    shutil.copytree(good, zeroed)
    shard = zeroed / "pytorch_model_fsdp_0" / "__0_0.distcp"
    shard.write_bytes(bytes(shard.stat().st_size))
    cases = [
        (["--set", f"train.resume_from={json.dumps(str(zeroed))}"],
         "damaged checkpoint (pytorch_model_fsdp_0/__0_0.distcp's content is not what was written"),
        (["--set", f"train.resume_from={json.dumps(str(tmp_path / 'none'))}"], "no such checkpoint folder"),
        (["--set", f"train.resume_from={json.dumps(str(cut))}"], "random_states_1.pkl is missing"),
        (["--strategy", "single", "--nproc", "1", "--set", f"train.resume_from={json.dumps(str(good))}"],
         "taken with strategy fsdp on 2 process"),
    ]
    before = len(ftui.runs())
    for flags, needle in cases:
        proc = ftui.run("run", str(run_dir / "recipe.toml"), *flags)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "train.resume_from" in lines[0] and needle in lines[0], proc.stderr
        assert "Traceback" not in proc.stdout + proc.stderr
    assert len(ftui.runs()) == before  # nothing recorded for a refused resume


# ---------------------------------------------------------------------- non-finite losses


def test_a_nan_loss_stops_the_run_failed_without_saving_nan_weights(ftui: Ftui) -> None:
    name = "nan-stop"
    proc = ftui.run("run", str(QUICKSTART), *SHORT, "--set", "train.lr=1e30", "--set", "train.max_grad_norm=0",
                    "--set", "train.max_steps=8", "--set", "train.save_every=1", "--name", name)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    run = _run_by_name(ftui, name)
    assert run["status"] == "failed" and "non-finite loss" in run["error"] and "train.on_nan" in run["error"]
    run_dir = Path(run["run_dir"])
    events = _events(run_dir)
    error = next(e for e in events if e["type"] == "error")
    assert error["reason"] == "nan_loss" and error["value"] in ("nan", "inf", "-inf")
    bad_step = error["step"]
    assert events[-1]["type"] == "end" and events[-1]["status"] == "failed" and events[-1]["saved"] is None
    losses = _losses(run)
    assert losses[bad_step] is None and all(math.isfinite(losses[s]) for s in range(1, bad_step))  # type: ignore[arg-type]
    assert max(losses) == bad_step  # nothing trained after it
    assert not (run_dir / "output").exists()  # no model saved
    saved_steps = [ck.step_of(p) for p in ck.complete_checkpoints(run_dir)]
    assert saved_steps and max(saved_steps) == bad_step - 1  # checkpoints of finite weights only
    for p in ck.complete_checkpoints(run_dir):
        with safe_open(str(p / "model.safetensors"), framework="pt") as fh:
            assert all(fh.get_tensor(k).isfinite().all() for k in fh.keys())
    # Every stored payload is valid JSON to SQLite (a NaN in it broke json_extract and friends).
    db = sqlite3.connect(ftui.db.removeprefix("sqlite:///"))
    invalid = db.execute("select count(*) from events where run_id = ? and json_valid(payload) = 0",
                         (run["id"],)).fetchone()[0]
    assert invalid == 0
    assert db.execute("select json_valid(summary) from runs where id = ?", (run["id"],)).fetchone()[0] == 1


def test_skip_drops_non_finite_steps_and_fails_past_the_bound(ftui: Ftui) -> None:
    nan = [*SHORT, "--set", "train.lr=1e30", "--set", "train.max_grad_norm=0", "--set", "train.on_nan=skip",
           "--set", "train.max_steps=6"]
    ftui.run("run", str(QUICKSTART), *nan, "--set", "train.max_skipped_steps=10", "--name", "nan-skip", check=True)
    run = _run_by_name(ftui, "nan-skip")
    losses = _losses(run)
    skipped = [s for s, loss in losses.items() if loss is None]
    assert run["status"] == "completed" and skipped and run["summary"]["skipped"] == len(skipped)
    assert list(losses) == list(range(1, 7))  # it went on after skipping
    steps = {e["step"]: e for e in _events(Path(run["run_dir"])) if e["type"] == "step"}
    assert all(steps[s].get("skipped") is True for s in skipped)
    with safe_open(str(next(Path(run["summary"]["saved"]).glob("*.safetensors"))), framework="pt") as fh:
        assert all(fh.get_tensor(k).isfinite().all() for k in fh.keys())  # no NaN reached the weights

    proc = ftui.run("run", str(QUICKSTART), *nan, "--set", "train.max_skipped_steps=1", "--name", "nan-skip-bound")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    bound = _run_by_name(ftui, "nan-skip-bound")
    assert bound["status"] == "failed" and "train.max_skipped_steps = 1" in bound["error"]
    error = next(e for e in _events(Path(bound["run_dir"])) if e["type"] == "error")
    assert error["reason"] == "too_many_skipped" and error["step"] == skipped[0] + 1


# ---------------------------------------------------------------------- a graceful stop, then ftui resume


def _wait_for_step(run_folder: str, home: Path, proc: subprocess.Popen[str], timeout: float = 300) -> Path:
    """The run's folder once its journal holds a step (read from the file: no command per poll)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        for journal in (home / "runs").glob(f"*-{run_folder}/events.jsonl"):
            if '"type":"step"' in journal.read_text():
                return journal.parent
        time.sleep(0.2)
    raise AssertionError(f"{run_folder}: no step within {timeout} s")


def test_ctrl_c_stops_every_rank_checkpoints_and_ftui_resume_finishes_the_run(ftui: Ftui) -> None:
    """Ctrl-C during a DDP run: every rank finishes its step, the stop's checkpoint is written, no process
    of the run is left, the run is recorded stopped; ``ftui resume`` finishes it from that checkpoint."""
    total, rows = 30, 4 * 64
    proc = subprocess.Popen(
        [sys.executable, "-m", "tui.cli", "run", str(QUICKSTART), "--strategy", "ddp", "--nproc", "2",
         "--set", "train.batch_size=2", *SHORT, "--set", f"train.max_steps={total}", "--sample-interval", "0",
         "--name", "ck-stop"],
        env=ftui.env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        run_dir = _wait_for_step("ck-stop", ftui.home, proc)
        pids = next(e for e in _events(run_dir) if e["type"] == "start")["pids"]
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out + err
    run = _run_by_name(ftui, "ck-stop")
    stopped = ftui.show(run["id"])
    assert stopped["status"] == "stopped"
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()
    last = max(m["step"] for m in stopped["metrics"])
    assert 1 <= last < total
    saves = [e for e in _events(Path(stopped["run_dir"])) if e["type"] == "checkpoint"]
    assert [(e["step"], e["reason"]) for e in saves] == [(last, "stop")]  # save_every = 0: only the stop's
    assert stopped["summary"]["checkpoint"] == saves[0]["path"]
    assert ck.check_resume(saves[0]["path"], 2, "ddp")["step"] == last

    resumed_proc = ftui.run("resume", str(run["id"]), "--sample-interval", "0", timeout=600)
    assert resumed_proc.returncode == 0, resumed_proc.stdout + resumed_proc.stderr
    resumed = ftui.show(max(r["id"] for r in ftui.runs()))
    assert resumed["status"] == "completed" and resumed["strategy"] == "ddp" and resumed["nproc"] == 2
    assert [m["step"] for m in resumed["metrics"]] == list(range(last + 1, total + 1))
    assert resumed["metrics"][-1]["tokens"] == total * rows
    assert resumed["resumed_from"] == resumed["summary"]["resumed_from"]["run_id"] == run["id"]
    assert resumed["summary"]["resumed_from"]["step"] == last

    # No checkpoint, no such run: one line, exit 2.
    for run_id, needle in [(resumed["id"], "no complete checkpoint"), (10_000, "no such run")]:
        bad = ftui.run("resume", str(run_id))
        assert bad.returncode == 2 and needle in bad.stderr and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
