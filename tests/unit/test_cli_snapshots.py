"""`ftui runs`, `estimate`, `show` and `gpus` fit 80 and 120 columns, with text
snapshots (syrupy) at 80x24 and 120x40. Every input is fixed: a store filled by hand (the summary of a
real quickstart run, tests/golden/show_run.json), the fake GPUs, the host name replaced."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path

import pytest

from runner.spec.flops import run_flops_per_token
from store import Store
from tui.cli import main

ROOT = Path(__file__).resolve().parents[2]
SIZES = [(80, 24), (120, 40)]
RUN_DIR = "/home/u/.local/share/ftui/runs/01M84NS3HEWKP45XEDR4NPP4EG-quickstart"


@pytest.fixture
def store(tmp_path: Path) -> Store:
    golden = json.loads((ROOT / "tests" / "golden" / "show_run.json").read_text())
    store = Store(f"sqlite:///{tmp_path / 'ftui.db'}")
    for i, (name, strategy, nproc) in enumerate([("quickstart", "single", 1), ("ablation [v2] lr sweep", "ddp", 2),
                                                  ("tinyllama-1.1b-lora", "fsdp", 4)]):
        # The running one runs on another machine of the team's store: a read here leaves it as recorded.
        run_id = store.create_run(name=name, recipe_text=golden["recipe"], recipe_hash="", strategy=strategy,
                                  nproc=nproc, method="lora", model="builtin:tiny-llama", run_dir=RUN_DIR,
                                  host="gpu-box-2" if i == 2 else None)
        store.update_run(run_id, status=("completed", "failed", "running")[i], tokens_per_s=1234.5 * (i + 1),
                         final_loss=7.25 + i, train_seconds=61.0 * (i + 1), distributed_type="NO",
                         total_steps=30, steps_done=30, summary=golden["summary"] if i == 0 else {})
    events = [{"seq": k, "type": "step", "time": 1000.0 + k, "step": k + 1, "epoch": 0, "loss": 8.5 - 0.03 * k,
               "lr": 2e-3, "grad_norm": 0.7, "tokens": 1024 * (k + 1), "step_time": 0.4, "tokens_per_s": 2560.0}
              for k in range(30)]
    store.ingest(1, events)
    # What a run records now besides the golden summary: its device type, and the peak its ranks probed
    # beside it (the MFU's divisor) with its FLOPs per token (runner.spec.flops of the builtin tiny Llama).
    flops = run_flops_per_token("lora", PARAMS, TRAINABLE, DIMS)
    store.update_run(1, device_type="cpu", summary={"flops_per_token": flops, "mfu_peak": PEAK})
    return store


PARAMS, TRAINABLE = 12_587_904, 122_880
DIMS = {"layers": 6, "heads": 6, "head_dim": 64, "seq_len": 256, "embedding_params": 1_572_864}
PEAK = {"flops": 118.2e9, "source": "matmul probe in the ranks (CPU), fp32", "kind": "probe", "dtype": "fp32",
        "threads": 2, "measured_at": 1795447228.6, "fingerprint": "x", "machine": "test", "size": 640, "load": 0.5}


def cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, size: tuple[int, int],
        *argv: str) -> str:
    monkeypatch.setenv("COLUMNS", str(size[0]))
    monkeypatch.setenv("LINES", str(size[1]))
    assert main(list(argv)) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    too_wide = [line for line in lines if len(line) > size[0]]
    assert not too_wide, "\n".join(too_wide)
    assert "…" not in out, out  # nothing cut short
    return out.replace(socket.gethostname(), "HOST")


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_runs(store: Store, capsys, monkeypatch, snapshot, size) -> None:  # type: ignore[no-untyped-def]
    assert cli(capsys, monkeypatch, size, "runs", "--db", store.url) == snapshot


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_show(store: Store, capsys, monkeypatch, snapshot, size) -> None:  # type: ignore[no-untyped-def]
    out = cli(capsys, monkeypatch, size, "show", "1", "--db", store.url)
    # the steps left out are said, the step time has its unit, the peak is printed once; the recipe is named
    # (its file, or --recipe), not printed: some 60 lines that buried the metrics
    assert "10 steps not shown" in out and "step time (s)" in out
    assert "[launch]" not in out and out.replace("\n", "").endswith(
        f"recipe: ftui show 1 --recipe, or {RUN_DIR}/recipe.toml")
    assert len(out.splitlines()) <= 80, out
    assert "global batch" in out and "4 rows" in out and "micro-batch 4 x 1" in out
    if size[0] == 120:  # no row of a table wraps onto a second line (a blank first cell)
        assert not [line for line in out.splitlines() if re.match(r"\s*│\s+│", line)], out
    assert "rank 0 peak memory" not in out and out.count("221.5 MiB") == 4  # the peak and backward's, estimated and measured
    assert out == snapshot


def test_show_recipe_prints_the_resolved_recipe(store: Store, capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    out = cli(capsys, monkeypatch, (80, 24), "show", "1", "--recipe", "--db", store.url)
    assert "[launch]" in out and 'name = "builtin:tiny-llama"' in out and "--recipe" not in out
    assert out.index("[launch]") < out.index("metrics (measured)")


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("what", [["recipes/quickstart.toml"], ["--params", "34e9", "--method", "lora", "--gpus", "4"]],
                         ids=["quickstart", "34b"])
def test_estimate(store: Store, capsys, monkeypatch, snapshot, size, what: list[str]) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(ROOT)
    # The fixed store: its run stored no estimate key, so "error this host" is "-" (never the user's own store)
    out = cli(capsys, monkeypatch, size, "estimate", *what, "--gpu-mem", "48GiB", "--db", store.url)
    assert "total" in out and "fsdp" in out and "zero3" in out and "host error" in " ".join(out.split())
    assert out == snapshot


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_gpus(capsys, monkeypatch, snapshot, size) -> None:  # type: ignore[no-untyped-def]
    out = cli(capsys, monkeypatch, size, "--fake-gpus", "4", "gpus")
    assert out.count("H100 80GB HBM3") == 4 and "fake NVML" in out
    assert len(out.splitlines()) <= 12  # one line per GPU (it took 4 at 80 columns)
    assert out == snapshot
