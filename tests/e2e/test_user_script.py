"""Your own training script launched and watched by ftui (``ftui run --script``, ``launch.script``),
reporting through ``runner.track`` or ``runner.track_hf.FtuiCallback``.

Some tests check the client, the recipe, the launch and the bad input in-process or with real small
subprocesses. The others train ftui's builtin tiny Llama on CPU through the real ``ftui run --script`` with
the two shipped examples, against a real SQLite store: a plain accelerate loop and a ``transformers.Trainer``
under DDP x2, and one process with evaluation (TRL's ``SFTTrainer`` when trl is installed, else the Trainer).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support import QUICKSTART, ROOT, Ftui
from tests.support.matrix import Matrix

ACC = ROOT / "examples" / "accelerate_train.py"
HF = ROOT / "examples" / "hf_trainer_train.py"
SMALL = ["--max-steps", "3", "--context-length", "32", "--batch-size", "2"]


# ---------------------------------------------------------------------- the client, in-process


@pytest.fixture
def tracked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    from runner import track

    monkeypatch.setenv("FTUI_RUN_DIR", str(tmp_path))
    monkeypatch.delenv("RANK", raising=False)
    track._reset()
    yield tmp_path
    monkeypatch.delenv("FTUI_RUN_DIR")
    track._reset()


def journal(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_track_does_nothing_outside_ftui(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from runner import track

    monkeypatch.delenv("FTUI_RUN_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    track._reset()
    track.start(total_steps=3)
    track.log({"loss": 1.0}, step=1)
    track.finish()
    assert not track.enabled()
    assert list(tmp_path.iterdir()) == []


def test_track_writes_nothing_on_other_ranks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from runner import track

    monkeypatch.setenv("FTUI_RUN_DIR", str(tmp_path))
    monkeypatch.setenv("RANK", "1")
    track._reset()
    track.log({"loss": 1.0}, step=1)
    track.finish()
    assert track.under_ftui() and not track.enabled()
    assert not (tmp_path / "events.jsonl").exists()
    track._reset()


def test_track_journals_start_steps_named_metrics_and_end_into_the_store(tracked: Path) -> None:
    from runner import track
    from store import Store

    track.start(distributed="NO", world_size=1, total_steps=3, device_type="cpu")
    for step in (1, 2, 3):
        time.sleep(0.01)
        track.log({"loss": 4.0 - step, "lr": 1e-3, "grad_norm": 0.5, "tokens": 100 * step, "reward": step / 10},
                  step=step)
    track.log_eval({"eval_loss": 1.5})
    track.finish("completed")
    events = journal(tracked)
    assert [e["type"] for e in events] == ["start", "step", "metrics", "step", "metrics", "step", "metrics",
                                           "metrics", "end"]
    assert [e["seq"] for e in events] == list(range(len(events)))
    start, end = events[0], events[-1]
    assert start["distributed_type"] == "NO" and start["total_steps"] == 3
    steps = [e for e in events if e["type"] == "step"]
    assert [s["tokens"] for s in steps] == [100, 200, 300]
    assert all(s["step_time"] > 0 and s["tokens_per_s"] > 0 for s in steps)
    assert end["status"] == "completed" and end["steps"] == 3 and end["final_loss"] == 1.0
    assert end["tokens"] == 300 and end["train_seconds"] > 0
    assert end["tokens_per_s"] == pytest.approx(300 / end["train_seconds"])

    store = Store(f"sqlite:///{tracked / 'db.sqlite'}")
    run_id = store.create_run(name="s", recipe_text="", recipe_hash="x", strategy="single", nproc=1,
                              method="script", model="script:x.py", run_dir=str(tracked))
    store.ingest(run_id, events)
    metrics = store.metrics(run_id)
    assert [(m.step, m.loss, m.tokens) for m in metrics] == [(1, 3.0, 100), (2, 2.0, 200), (3, 1.0, 300)]
    named = {(p.name, p.step): p.value for p in store.named_metrics(run_id)}
    assert named == {("reward", 1): 0.1, ("reward", 2): 0.2, ("reward", 3): 0.3, ("eval/loss", 3): 1.5}


def test_track_without_start_reports_distributed_type_as_not_known(tracked: Path) -> None:
    from runner import track

    track.log({"loss": 2.0})
    track.log({"loss": 1.0})
    track.finish("failed")
    events = journal(tracked)
    assert events[0]["type"] == "start" and events[0]["distributed_type"] is None
    assert [e["step"] for e in events if e["type"] == "step"] == [1, 2]
    assert events[-1]["status"] == "failed"


def test_track_imports_neither_torch_nor_textual() -> None:
    code = "import sys; from runner import track; print(sorted({'torch', 'textual', 'rich'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.stdout.strip() == "[]"


# ---------------------------------------------------------------------- recipe, launch, bad input


def test_script_recipe_keeps_only_what_was_written(tmp_path: Path) -> None:
    from runner.spec.recipe import RecipeError, parse_recipe
    from runner.spec.script import described, store_method, store_model

    (tmp_path / "train.py").write_text("")
    recipe = parse_recipe('[launch]\nscript = "train.py"\nscript_args = ["--lr", "1e-3"]\nstrategy = "ddp"\n'
                          "nproc = 2\n", base_dir=tmp_path)
    assert recipe.launch.script == str(tmp_path / "train.py")
    assert described(recipe) == frozenset()
    assert (store_method(recipe), store_model(recipe)) == ("script", "script:train.py")
    text = recipe.to_toml()
    assert "[model]" not in text and "[train]" not in text and 'script_args = ["--lr", "1e-3"]' in text
    again = parse_recipe(text)
    assert again.to_toml() == text and described(again) == frozenset()
    with_model = parse_recipe('[model]\nname = "builtin:tiny-llama"\n[launch]\nscript = "/x/train.py"\n')
    assert described(with_model) == {"model"} and store_model(with_model) == "builtin:tiny-llama"
    with pytest.raises(RecipeError, match=r"launch.script_args: script arguments without launch.script"):
        parse_recipe('[launch]\nscript_args = ["--x"]\n')


def test_script_launch_is_accelerate_with_the_strategy_config_and_the_script_as_argv(tmp_path: Path) -> None:
    from runner.spec.launch import build_launch
    from runner.spec.recipe import parse_recipe

    recipe = parse_recipe('[launch]\nscript = "/src/train.py"\nscript_args = ["--name", "a b; rm -rf /"]\n'
                          'strategy = "ddp"\nnproc = 2\n')
    spec = build_launch(recipe, tmp_path, port=29511, cpu_threads=1, python="py", workdir=Path("/work/here"))
    assert spec.argv == ["py", "-m", "runner.rank.loopback_launch", "--config_file", str(tmp_path / "accelerate.yaml"),
                         "--num_cpu_threads_per_process", "1", "-m", "runner.rank.script_run", "--run-dir", str(tmp_path),
                         "--cwd", "/work/here", "--", "/src/train.py", "--name", "a b; rm -rf /"]
    assert "distributed_type: MULTI_GPU" in (spec.accelerate_config_text or "")
    assert "num_processes: 2" in (spec.accelerate_config_text or "")


def test_script_run_parses_its_own_argv() -> None:
    from runner.rank.script_run import parse

    run_dir, cwd, script, args = parse(["--run-dir", "/r", "--cwd", "/c", "--", "t.py", "--", "-x"])
    assert (str(run_dir), str(cwd), script, args) == ("/r", "/c", "t.py", ["--", "-x"])


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    from tui.cli.main import main

    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_missing_script_is_one_line_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FTUI_HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    code, out, err = cli(capsys, "run", "--script", "nope.py", "--dry-run")
    assert code == 2 and out == ""
    assert err == f"ftui: launch.script: {tmp_path / 'nope.py'}: no such file\n"
    recipe = tmp_path / "r.toml"
    recipe.write_text('[launch]\nscript = "gone.py"\n')
    code, out, err = cli(capsys, "run", str(recipe), "--dry-run")
    assert code == 2 and err.count("\n") == 1 and f"launch.script: {tmp_path / 'gone.py'}: no such file" in err


def test_script_args_without_a_script_is_one_line_exit_2(capsys: pytest.CaptureFixture[str],
                                                         tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FTUI_HOME", str(tmp_path))
    code, out, err = cli(capsys, "run", str(QUICKSTART), "--dry-run", "--", "--lr", "1")
    assert code == 2 and out == ""
    assert err == ("ftui: script arguments (--lr 1) without a script: give --script FILE or launch.script "
                   "in the recipe\n")
    code, out, err = cli(capsys, "run", "--dry-run")
    assert code == 2 and err == "ftui: run: give a recipe file, or --script FILE (your own training script)\n"


def test_dry_run_of_a_script_names_the_script_and_its_args(capsys: pytest.CaptureFixture[str],
                                                            tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FTUI_HOME", str(tmp_path))
    code, out, err = cli(capsys, "run", "--script", str(ACC), "--strategy", "ddp", "--nproc", "2", "--dry-run",
                         "--format", "json", "--", "--max-steps", "7")
    assert code == 0, err
    spec = json.loads(out)
    assert spec["argv"][-4:] == ["--", str(ACC), "--max-steps", "7"]
    assert "runner.rank.script_run" in spec["argv"] and "runner.rank.loopback_launch" in spec["argv"]


# ---------------------------------------------------------------------- real script runs


def run_script(ftui: Ftui, name: str, script: Path, *flags: str, args: list[str] = SMALL) -> dict[str, Any]:
    proc = ftui.run("run", "--script", str(script), "--name", name, *flags, "--", *args, timeout=600)
    assert proc.returncode == 0, f"{name}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    run = next(r for r in ftui.runs() if r["name"] == name)
    return ftui.show(run["id"])


def has_trl() -> bool:
    try:
        import trl  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.fixture(scope="session")
def script_runs(ftui: Ftui) -> dict[str, dict[str, Any]]:
    """The two examples under DDP x2, and the Trainer example in one process with evaluation (as TRL's
    SFTTrainer when trl is installed). Made once per session, on the worker of its xdist group (a module
    fixture would be made again each time the worker came back to this module)."""
    ddp = ["--strategy", "ddp", "--nproc", "2"]
    single = [*SMALL, "--eval-steps", "3", *(["--sft"] if has_trl() else [])]
    return {
        "acc-ddp": run_script(ftui, "s-acc-ddp", ACC, *ddp),
        "hf-ddp": run_script(ftui, "s-hf-ddp", HF, *ddp),
        "hf-single": run_script(ftui, "s-hf-single", HF, args=single),
    }


@pytest.mark.parametrize("key", ["acc-ddp", "hf-ddp", "hf-single"])
def test_script_run_fills_the_store(script_runs: dict[str, dict[str, Any]], key: str) -> None:
    run = script_runs[key]
    ddp = key.endswith("ddp")
    assert run["status"] == "completed", run.get("error")
    assert run["distributed_type"] == ("MULTI_CPU" if ddp else "NO")
    assert run["summary"]["world_size"] == (2 if ddp else 1)
    assert run["method"] == "script"
    steps = [m["step"] for m in run["metrics"]]
    assert steps == [1, 2, 3]
    assert all(m["loss"] is not None and m["tokens"] for m in run["metrics"])
    assert [m["tokens"] for m in run["metrics"]] == sorted(m["tokens"] for m in run["metrics"])
    assert run["summary"]["train_seconds"] > 0 and run["summary"]["tokens_per_s"] > 0
    assert run["summary"]["final_loss"] == run["metrics"][-1]["loss"]
    assert run["summary"]["telemetry"]["devices"], "no device samples stored"
    ranks = {k for k in run["summary"]["telemetry"]["devices"] if k.startswith("rank:")}
    assert ranks == ({"rank:0", "rank:1"} if ddp else {"rank:0"})
    if key == "hf-single":
        assert [p["step"] for p in run["named_metrics"]["eval/loss"]] == [3]
        assert run["summary"]["params"] == 12_587_904  # the builtin tiny Llama


def test_script_runs_compare_beside_a_recipe_run(ftui: Ftui, matrix: Matrix,
                                                 script_runs: dict[str, dict[str, Any]]) -> None:
    ids = [str(matrix["single"].id), str(script_runs["hf-ddp"]["id"]), str(script_runs["acc-ddp"]["id"])]
    proc = ftui.call("compare", *ids, "--format", "json", check=True)
    rows = {r["run_id"]: r for r in json.loads(proc.stdout)["runs"]}
    for rid in ids:
        row = rows[int(rid)]
        assert row["status"] == "completed" and row["tokens_per_s"] and row["final_loss"] is not None
    text = ftui.call("compare", *ids, check=True).stdout
    assert "script" in text


def journal_lines(run_dir: Path) -> str:
    path = run_dir / "events.jsonl"
    return path.read_text() if path.exists() else ""


def test_stopping_a_ddp_script_run_reaps_every_rank(ftui: Ftui) -> None:
    import psutil

    from runner.watch.procs import find_processes

    proc = subprocess.Popen([sys.executable, "-m", "tui.cli", "run", "--script", str(ACC), "--strategy", "ddp",
                             "--nproc", "2", "--name", "s-stop", "--sample-interval", "0", "--grace", "60", "--",
                             "--max-steps", "100000", "--context-length", "32", "--batch-size", "2"],
                            env=ftui.env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    run_dir = None
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        folders = list((ftui.home / "runs").glob("*-s-stop"))
        if folders:
            run_dir = folders[0]
            if len(list((run_dir / "ranks").glob("*.pid"))) == 2 and '"type":"step"' in journal_lines(run_dir):
                break
        time.sleep(0.2)
    else:
        raise AssertionError("no step within 300 s")
    assert run_dir is not None
    pids = [int(p.read_text()) for p in (run_dir / "ranks").glob("*.pid")]
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 130, out[-3000:]
    shown = ftui.show(next(r["id"] for r in ftui.runs() if r["name"] == "s-stop"))
    assert shown["status"] == "stopped"
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert find_processes(run_dir) == {}
    assert "STILL ALIVE" not in shown["summary"]["stop"]


MISMATCH = """\
import time
from accelerate import Accelerator
from runner import track

accelerator = Accelerator()   # a plain Accelerator: on CPU it does not run FSDP, whatever the config says
track.start(accelerator)
time.sleep(120)
"""


def test_script_whose_accelerator_is_not_the_strategy_fails_with_the_reason(ftui: Ftui, tmp_path: Path) -> None:
    script = tmp_path / "plain.py"
    script.write_text(MISMATCH)
    proc = ftui.run("run", "--script", str(script), "--strategy", "fsdp", "--nproc", "2", "--name", "s-mismatch",
                    timeout=300)
    assert proc.returncode == 1, proc.stdout[-3000:]
    run = ftui.show(next(r for r in ftui.runs() if r["name"] == "s-mismatch")["id"])
    assert run["status"] == "failed"
    # Measured (accelerate 1.15, CPU): each of the two processes runs alone, distributed type NO.
    assert run["distributed_type"] == "NO"
    assert run["error"] == "launch.strategy: asked for fsdp (FSDP) but accelerate ran NO; the run was stopped"


def test_script_that_reports_nothing_still_has_status_samples_and_duration(ftui: Ftui, tmp_path: Path) -> None:
    script = tmp_path / "silent.py"
    script.write_text("import sys, time\nsum(i * i for i in range(3_000_000))\ntime.sleep(1)\n"
                      "print('args', sys.argv[1:])\n")
    proc = ftui.run("run", "--script", str(script), "--name", "s-silent", "--", "a b", "--c", timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:]
    run = ftui.show(next(r for r in ftui.runs() if r["name"] == "s-silent")["id"])
    assert run["status"] == "completed" and run["metrics"] == []
    assert run["distributed_type"] is None
    assert run["summary"]["telemetry"]["devices"]
    assert run["started_at"] and run["ended_at"]
    log = (Path(run["run_dir"]) / "logs" / "rank0.log").read_text()
    assert "args ['a b', '--c']" in log
    text = ftui.call("compare", str(run["id"]), check=True).stdout
    assert "not reported" in text
