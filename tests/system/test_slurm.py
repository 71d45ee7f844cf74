"""SLURM: the sbatch script ``ftui slurm`` writes (golden files), and a real one-node SLURM cluster on this
machine (tests/support/slurm_cluster.py) running a job to its end with its run in the store, then a resume
job continuing it with its losses."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runner.nodes.slurm import SlurmJob, sbatch_script
from store import Store

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden"
QUICKSTART = ROOT / "recipes" / "quickstart.toml"


def _job(**kwargs: object) -> SlurmJob:
    base: dict[str, object] = {"recipe": Path("/shared/recipes/quickstart.toml"), "nodes": 4, "gpus_per_node": 8,
                               "db_url": "postgresql+psycopg://ftui@db.internal/ftui", "python": "/opt/venv/bin/python",
                               "name": "ftui-quickstart"}
    return SlurmJob(**(base | kwargs))  # type: ignore[arg-type]


@pytest.mark.parametrize(("name", "kwargs"), [
    ("slurm_4x8_gpu.sbatch", {"partition": "gpu", "time": "04:00:00", "account": "ml-team",
                              "overrides": ("train.max_steps=1000",)}),
    ("slurm_2x_cpu.sbatch", {"nodes": 2, "gpus_per_node": 0, "nproc_per_node": 2, "workdir": Path("/shared/work"),
                             "ftui_home": "/shared/ftui"}),
    ("slurm_resume_2x.sbatch", {"nodes": 2, "gpus_per_node": 0, "resume": 7}),
])
def test_the_sbatch_script_is_the_golden_one(name: str, kwargs: dict[str, object]) -> None:
    text = sbatch_script(_job(**kwargs))
    golden = GOLDEN / name
    if os.environ.get("FTUI_REGEN_GOLDEN"):
        golden.write_text(text)
    assert text == golden.read_text()


def test_ftui_slurm_writes_the_script_and_checks_the_recipe_first(tmp_path: Path) -> None:
    env = {**os.environ, "FTUI_HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}
    out = tmp_path / "job.sbatch"
    proc = subprocess.run([sys.executable, "-m", "tui.cli", "slurm", str(QUICKSTART), "--nodes", "2", "--strategy",
                           "ddp", "--partition", "cpu", "-o", str(out), "--db", f"sqlite:///{tmp_path}/x.db"],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert "#SBATCH --nodes=2" in text and "#SBATCH --partition=cpu" in text
    assert "--rdzv-endpoint \"$head_node:29500\" --run-key \"slurm-$SLURM_JOB_ID\"" in text
    bad = subprocess.run([sys.executable, "-m", "tui.cli", "slurm", str(QUICKSTART), "--nodes", "2", "--set",
                          "train.batch_size=true", "-o", str(tmp_path / "bad.sbatch")],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "train.batch_size" in bad.stderr
    assert not (tmp_path / "bad.sbatch").exists()


def test_ftui_slurm_resume_takes_the_runs_own_recipe_from_the_store(tmp_path: Path) -> None:
    from runner.spec.recipe import load_recipe

    db = f"sqlite:///{tmp_path}/ftui.db"
    env = {**os.environ, "FTUI_HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}
    store = Store(db)
    recipe = load_recipe(QUICKSTART, ["name=\"long-one\"", "launch.strategy=\"ddp\"", "launch.nproc=2"])
    run_id = store.create_run(name=recipe.name, recipe_text=recipe.to_toml(), recipe_hash=recipe.digest(),
                              strategy="ddp", nproc=2, method="lora", model=recipe.model.name, run_dir="")
    store.close()

    def line(*args: str) -> str:
        proc = _slurm(env, tmp_path, *args, "--db", db)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stdout + proc.stderr
        return proc.stderr.strip()

    assert line("--nodes", "1") == "ftui: RECIPE: required (or --resume ID: a run to resume with its own recipe)"
    assert line(str(QUICKSTART), "--resume", str(run_id), "--nodes", "1") == (
        f"ftui: RECIPE: not with --resume (run {run_id} is resumed with its own recipe)")
    assert line("--resume", str(run_id), "--nodes", "1", "--set", "train.lr=1") == (
        f"ftui: --set/--strategy: not with --resume (run {run_id} is resumed with its own recipe)")
    assert line("--resume", "99", "--nodes", "1") == f"ftui: --resume 99: no such run in {db}"
    assert line("--resume", str(run_id), "--nodes", "1") == (
        f"ftui: --nproc-per-node/--gpus-per-node: run {run_id} ran 2 rank(s) per machine; its resume needs as "
        "many, got 1")
    proc = _slurm(env, tmp_path, "--resume", str(run_id), "--nodes", "1", "--nproc-per-node", "2", "--db", db)
    assert proc.returncode == 0, proc.stderr
    script = (tmp_path / "ftui-long-one.sbatch").read_text()
    assert "#SBATCH --job-name=ftui-long-one" in script and f"-m tui.cli resume {run_id} --nnodes" in script


def _slurm(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tui.cli", "slurm", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=120)


def _slurm_state(db: str, run_id: int, env: dict[str, str]) -> str | None:
    """The job's state as ``ftui runs`` shows it (from squeue, then sacct)."""
    import json

    listed = subprocess.run([sys.executable, "-m", "tui.cli", "runs", "--db", db, "--format", "json"],
                            capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert listed.returncode == 0, listed.stderr
    row = next(r for r in json.loads(listed.stdout) if r["id"] == run_id)
    state: str | None = row.get("slurm", {}).get("state")
    return state


def _follow_job(store: Store, run_id: int, tmp_path: Path) -> None:
    """Read the store until the job's run ends."""
    deadline = time.monotonic() + 400
    while time.monotonic() < deadline:
        now = store.get_run(run_id)
        assert now is not None
        if now.status not in ("created", "running"):
            return
        time.sleep(0.2)
    output = "".join(p.read_text()[-3000:] for p in tmp_path.glob("ftui-*.out"))
    raise AssertionError(f"run {run_id} did not end within 400 s\n{output}")


def test_a_submitted_job_runs_to_its_end_and_its_run_completes_then_a_resume_job_continues_it(
        slurm_cluster: dict[str, str], tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/ftui.db"
    env = {**os.environ, **slurm_cluster, "FTUI_HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT)}
    proc = _slurm(env, tmp_path, str(QUICKSTART), "--nodes", "1", "--strategy", "single", "--set", "train.max_steps=4",
                  "--set", "train.save_every=2", "--port", "29731", "--db", db, "-o", str(tmp_path / "job.sbatch"),
                  "--submit")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    store = Store(db)
    (run,) = store.list_runs()
    assert run.slurm_job_id is not None and run.status in ("created", "running")
    seen = {_slurm_state(db, run.id, env)}  # while the job is queued or runs
    _follow_job(store, run.id, tmp_path)
    seen.add(_slurm_state(db, run.id, env))  # once it ended
    now = store.get_run(run.id)
    assert now is not None
    output = "".join(p.read_text()[-3000:] for p in tmp_path.glob("ftui-*.out"))
    assert now.status == "completed", f"{now.status} {now.error}\n{output}"
    assert seen & {"pending", "running", "configuring", "completing", "completed"}, seen
    uninterrupted = {m.step: m.loss for m in store.metrics(run.id)}
    assert list(uninterrupted) == [1, 2, 3, 4]
    from runner.spec import checkpoint as ck
    from store.nodes import nodes

    (node,) = nodes(store, run.id)
    assert (node.status, node.node_rank, node.ranks) == ("completed", 0, [0])

    # The newest checkpoint is damaged: the resume job, with no RECIPE (the run's own, from the store),
    # continues from step 2 and logs the losses the run logged.
    (ck.checkpoint_dir(Path(node.run_dir), 4) / "random_states_0.pkl").unlink()
    refused = _slurm(env, tmp_path, "--resume", str(run.id), "--nodes", "2", "--db", db, "-o", str(tmp_path / "x.sbatch"))
    assert refused.returncode == 2 and refused.stderr.strip() == (
        f"ftui: --nodes: run {run.id} ran on 1 machine(s); its resume needs as many (each holds its part of the "
        "checkpoints), got 2"), refused.stderr
    proc = _slurm(env, tmp_path, "--resume", str(run.id), "--nodes", "1", "--port", "29732", "--db", db,
                  "-o", str(tmp_path / "resume.sbatch"), "--submit")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"tui.cli resume {run.id} --nnodes" in (tmp_path / "resume.sbatch").read_text()
    new = next(r for r in store.list_runs() if r.id != run.id)
    assert (new.slurm_job_id, new.resumed_from, new.name) == (proc.stdout.split("submitted job ")[1].split(":")[0],
                                                              run.id, run.name)
    _follow_job(store, new.id, tmp_path)
    done = store.get_run(new.id)
    assert done is not None
    output = "".join(p.read_text()[-3000:] for p in tmp_path.glob("ftui-*.out"))
    assert (done.status, done.resumed_from) == ("completed", run.id), f"{done.status} {done.error}\n{output}"
    assert done.summary.resumed_from["step"] == 2, done.summary
    resumed = {m.step: m.loss for m in store.metrics(new.id)}
    assert list(resumed) == [3, 4]
    assert resumed == pytest.approx({s: uninterrupted[s] for s in (3, 4)}, abs=1e-6)
