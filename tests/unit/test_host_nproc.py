"""More processes than the host has devices for are refused before anything is recorded: one line naming
launch.nproc (--nproc) and the host's count, exit 2, for ``ftui run`` (and its dry run), ``ftui sweep`` and
``ftui resume``, unless ``--force``. Real SQLite, real run folders; nothing is started. The host is this
one (its cores from psutil), except where a GPU host is scripted at the hardware boundary (HostFacts)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from runner.data.cache import source_digest
from runner.hardware import hostfacts
from runner.service import launch
from runner.spec import checkpoint as ck
from runner.spec import events as ev
from runner.spec.layout import CPU_RANKS_PER_CORE, host_nproc_limit, host_nproc_problem
from runner.spec.recipe import load_recipe, parse_recipe
from runner.watch import host
from runner.watch.preflight import PreflightError
from store import Store
from tests.support import QUICKSTART, run_in_process

CORES = hostfacts.current().cpu_cores
OVER = CORES * CPU_RANKS_PER_CORE + 1
"""One process more than this CPU host takes."""
LINE = (f"launch.nproc (--nproc): {OVER} processes, but this host trains on CPU with {CORES} "
        f"core{'s' if CORES != 1 else ''} (at most {OVER - 1} processes: 2 per core); lower it, or pass --force "
        "to start them anyway")


def test_the_limit_is_one_process_per_gpu_and_on_cpu_two_per_core() -> None:
    assert host_nproc_limit(on_cpu=False, gpus=8, cpu_cores=64) == 8
    assert host_nproc_limit(on_cpu=True, gpus=8, cpu_cores=2) == 4
    assert host_nproc_problem(8, on_cpu=False, gpus=8, cpu_cores=2) is None
    assert host_nproc_problem(9, on_cpu=False, gpus=8, cpu_cores=2) == (
        "launch.nproc (--nproc): 9 processes, but this host has 8 GPUs (one process per GPU)")
    assert host_nproc_problem(4, on_cpu=True, gpus=0, cpu_cores=2) is None
    assert host_nproc_problem(2, on_cpu=False, gpus=0, cpu_cores=2) is None, "no GPU: launch.device's problem"
    assert host_nproc_problem(64, on_cpu=True, gpus=0, cpu_cores=2) == (
        "launch.nproc (--nproc): 64 processes, but this host trains on CPU with 2 cores (at most 4 processes: "
        "2 per core)")


def test_a_gpu_host_counts_its_visible_gpus_or_those_the_recipe_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu_host = hostfacts.HostFacts(gpu_count=4, visible_gpus=2, cpu_cores=32, hostname="h")
    monkeypatch.setattr(host, "current", lambda: gpu_host)
    three = parse_recipe('[launch]\nstrategy = "ddp"\nnproc = 3\n')
    assert host.nproc_over_host(three) == ("launch.nproc (--nproc): 3 processes, but this host has 2 GPUs "
                                           "(one process per GPU)")
    assert host.nproc_over_host(parse_recipe('[launch]\nstrategy = "ddp"\nnproc = 2\n')) is None
    listed = parse_recipe('[launch]\nstrategy = "pp"\nnproc = 2\ngpus = [1]\n')
    assert host.nproc_over_host(listed) == ("launch.nproc (--nproc): 2 processes, but launch.gpus lists 1 GPU "
                                            "(one process per GPU)")
    on_cpu = parse_recipe('[launch]\nstrategy = "ddp"\nnproc = 3\ndevice = "cpu"\n')
    assert host.nproc_over_host(on_cpu) is None, "a CPU run on a GPU host is held to the cores"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FTUI_HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    return tmp_path / "home"


def _runs(home: Path) -> list[str]:
    runs = home / "runs"
    return sorted(p.name for p in runs.iterdir()) if runs.is_dir() else []


def test_run_and_its_dry_run_refuse_too_many_processes_unless_forced(home: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    db = f"sqlite:///{home / 'ftui.db'}"
    for extra in ([], ["--dry-run"]):
        result = run_in_process(capsys, "run", str(QUICKSTART), "--strategy", "ddp", "--nproc", str(OVER), *extra,
                                "--db", db)
        assert result.returncode == 2, result.stdout + result.stderr
        assert result.stderr.strip() == f"ftui: {QUICKSTART}: {LINE}"
        assert result.stdout == "" and _runs(home) == []
    # A script run (no data to tokenize) shows --force passing the guard, and the launch it gets.
    script = home / "train.py"
    script.write_text("print('hi')\n")
    argv = ["run", "--script", str(script), "--strategy", "ddp", "--nproc", str(OVER), "--dry-run"]
    assert run_in_process(capsys, *argv).stderr.strip() == f"ftui: {LINE}"
    forced = run_in_process(capsys, *argv, "--force", "--format", "json")
    assert forced.returncode == 0, forced.stderr
    assert f"num_processes: {OVER}" in Path(json.loads(forced.stdout)["accelerate_config"]).read_text()
    assert _runs(home) == []


def test_a_sweep_refuses_too_many_processes_before_any_run_is_recorded(home: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    db = f"sqlite:///{home / 'ftui.db'}"
    result = run_in_process(capsys, "sweep", str(QUICKSTART), "--strategies", "single,ddp", "--nproc", str(OVER),
                            "--db", db)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.strip() == f"ftui: {LINE}"
    assert not (home / "ftui.db").exists() or Store(db).list_runs() == []


def _old_run(store: Store, home: Path, nproc: int) -> int:
    """A stopped ddp run over ``nproc`` processes with one sealed checkpoint (as a save writes it)."""
    data = home / "rows.jsonl"
    data.write_text("".join(json.dumps({"text": f"row {i}: the quick brown fox " * 8}) + "\n" for i in range(64)))
    run_dir = home / "runs" / "old"
    run_dir.mkdir(parents=True)
    (run_dir / ev.RECIPE_FILE).write_text(
        f'name = "old"\n[data]\nsource = "{data}"\ncontext_length = 32\n[train]\nmax_steps = 20\nbatch_size = 1\n'
        f'[launch]\nstrategy = "ddp"\nnproc = {nproc}\n')
    recipe = load_recipe(run_dir / ev.RECIPE_FILE)
    rid = store.create_run(name="old", recipe_text=recipe.to_toml(), recipe_hash=recipe.digest(), strategy="ddp",
                           nproc=nproc, method="lora", model="builtin:tiny-llama", run_dir=str(run_dir))
    store.update_run(rid, status="stopped")
    folder = ck.checkpoint_dir(run_dir, 2)
    folder.mkdir(parents=True)
    for part in ("model.safetensors", "optimizer.bin", "custom_checkpoint_0.pkl", "random_states_0.pkl"):
        (folder / part).write_bytes(os.urandom(96))
    manifest: dict[str, Any] = {"format": ck.FORMAT, "step": 2, "epoch": 0, "tokens_done": 0, "world_size": nproc,
                                "strategy": "ddp", "data": {"fingerprint": source_digest(str(data))}}
    ck.write_manifest(folder, ck.seal(folder, manifest))
    return rid


def test_a_resume_refuses_too_many_processes_unless_forced(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = Store(f"sqlite:///{home / 'ftui.db'}")
    try:
        rid = _old_run(store, home, OVER)
        result = run_in_process(capsys, "resume", str(rid), "--db", store.url)
        assert result.returncode == 2, result.stdout + result.stderr
        assert result.stderr.strip() == f"ftui: {LINE}"
        assert [r.id for r in store.list_runs()] == [rid], "nothing recorded"
        with pytest.raises(PreflightError, match=r"launch\.nproc \(--nproc\)"):
            launch.resume(store, rid)
        # Forced, the guard is passed and the next check speaks (the data, gone here: no tokenizing needed).
        (home / "rows.jsonl").unlink()
        forced = run_in_process(capsys, "resume", str(rid), "--force", "--db", store.url)
        assert forced.returncode == 2 and forced.stderr.startswith("ftui: data.source") and "nproc" not in forced.stderr
    finally:
        store.close()


def test_a_slurm_job_asking_more_ranks_than_gpus_per_node_is_refused_unless_forced(
        home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """What the job asks of SLURM is checked on the login node; the nodes' own pre-flight checks the rest
    (their devices are not this machine's), and --force is passed on to it."""
    script = home / "job.sbatch"
    argv = ["slurm", str(QUICKSTART), "--nodes", "2", "--gpus-per-node", "2", "--nproc-per-node", "4",
            "--strategy", "ddp", "-o", str(script), "--db", f"sqlite:///{home / 'ftui.db'}"]
    result = run_in_process(capsys, *argv)
    assert result.returncode == 2 and not script.exists()
    assert result.stderr.strip() == ("ftui: --nproc-per-node: 4 ranks per machine, but --gpus-per-node 2 (one "
                                     "process per GPU); lower it, or pass --force to start them anyway")
    assert run_in_process(capsys, *argv, "--force").returncode == 0
    node_command = script.read_text()
    assert '--run-key "slurm-$SLURM_JOB_ID" --force' in node_command and "--nproc 4" in node_command
