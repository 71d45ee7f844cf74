"""SLURM (issue 15 item 2): the sbatch script ``ftui slurm`` writes (golden files), and a real one-node
SLURM cluster on this machine (tests/slurm_cluster.py) running a job to its end with its run in the store."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runner.slurm import SlurmJob, sbatch_script
from store import Store

ROOT = Path(__file__).resolve().parents[1]
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


@pytest.mark.slow
def test_a_submitted_job_runs_to_its_end_and_its_run_completes(slurm_cluster: dict[str, str], tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/ftui.db"
    env = {**os.environ, **slurm_cluster, "FTUI_HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "tui.cli", "slurm", str(QUICKSTART), "--nodes", "1", "--strategy",
                           "single", "--set", "train.max_steps=2", "--port", "29731", "--db", db,
                           "-o", str(tmp_path / "job.sbatch"), "--submit"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    store = Store(db)
    (run,) = store.list_runs()
    assert run.slurm_job_id is not None and run.status in ("created", "running")
    seen = set()
    deadline = time.monotonic() + 400
    while time.monotonic() < deadline:
        listed = subprocess.run([sys.executable, "-m", "tui.cli", "runs", "--db", db, "--format", "json"],
                                capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
        import json

        (row,) = json.loads(listed.stdout)
        seen.add(row.get("slurm", {}).get("state"))
        now = store.get_run(run.id)
        assert now is not None
        if now.status not in ("created", "running"):
            break
        time.sleep(2)
    output = "".join(p.read_text()[-3000:] for p in tmp_path.glob("ftui-*.out"))
    assert now.status == "completed", f"{now.status} {now.error}\n{output}"
    assert seen & {"pending", "running", "configuring", "completing", "completed"}, seen
    assert [m.step for m in store.metrics(run.id)] == [1, 2]
    from store.nodes import nodes

    (node,) = nodes(store, run.id)
    assert (node.status, node.node_rank, node.ranks) == ("completed", 0, [0])
