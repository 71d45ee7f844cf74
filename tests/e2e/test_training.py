"""The spine end to end: quickstart under every strategy, real processes, real training, real SQLite."""

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
from tests.support import QUICKSTART, ROOT, STEPS, Ftui
from safetensors import safe_open

# fp32 on CPU, same rows per optimizer step: measured differences are ~1e-6.
LOSS_TOLERANCE = 1e-4
EXPECTED_TYPE = {"single": "NO", "mp": "NO", "ddp": "MULTI_CPU", "fsdp": "FSDP"}


@pytest.mark.parametrize("strategy", ["single", "mp", "ddp", "fsdp"])
def test_each_strategy_completes_and_stores_its_metrics(strategy_runs: dict[str, Any], strategy: str) -> None:
    run = strategy_runs[strategy]
    assert run["status"] == "completed"
    assert run["strategy"] == strategy
    assert run["distributed_type"] == EXPECTED_TYPE[strategy]
    assert run["nproc"] == (2 if strategy in ("ddp", "fsdp") else 1)
    losses = [m["loss"] for m in run["metrics"]]
    assert [m["step"] for m in run["metrics"]] == list(range(1, STEPS + 1))
    assert sum(losses[-3:]) / 3 < losses[0] - 0.05, f"loss did not go down: {losses}"
    summary = run["summary"]
    assert summary["train_seconds"] > 0 and summary["tokens_per_s"] > 0
    assert summary["final_loss"] == pytest.approx(losses[-1])
    assert len(summary["ranks"]) == run["nproc"]
    assert all(r["peak_rss_bytes"] > 0 and r["param_bytes"] > 0 for r in summary["ranks"])
    assert "summary" in run["stdout"]


@pytest.mark.parametrize("strategy", ["mp", "ddp", "fsdp"])
def test_losses_match_single_process_at_the_same_global_batch(strategy_runs: dict[str, Any], strategy: str) -> None:
    single = [m["loss"] for m in strategy_runs["single"]["metrics"]]
    other = [m["loss"] for m in strategy_runs[strategy]["metrics"]]
    assert other == pytest.approx(single, abs=LOSS_TOLERANCE)


def test_fsdp_really_shards(strategy_runs: dict[str, Any]) -> None:
    ddp, fsdp = strategy_runs["ddp"]["summary"], strategy_runs["fsdp"]["summary"]
    assert fsdp["local_param_numel"] * 2 == pytest.approx(ddp["local_param_numel"], rel=0.01)
    for ddp_rank, fsdp_rank in zip(ddp["ranks"], fsdp["ranks"], strict=True):
        assert fsdp_rank["param_bytes"] * 2 == pytest.approx(ddp_rank["param_bytes"], rel=0.01)
        assert fsdp_rank["optimizer_bytes"] * 2 == pytest.approx(ddp_rank["optimizer_bytes"], rel=0.01)


@pytest.mark.parametrize("strategy", ["single", "fsdp"])
def test_the_adapter_is_saved_and_not_empty(strategy_runs: dict[str, Any], strategy: str) -> None:
    saved = Path(strategy_runs[strategy]["summary"]["saved"])
    files = list(saved.glob("*.safetensors"))
    assert files
    with safe_open(str(files[0]), framework="pt") as fh:
        keys = list(fh.keys())
        assert any("lora_A" in k for k in keys) and any("lora_B" in k for k in keys)
        assert all(fh.get_tensor(k).numel() > 0 for k in keys)


def test_run_folder_holds_journal_logs_and_config(strategy_runs: dict[str, Any]) -> None:
    run_dir = Path(strategy_runs["ddp"]["run_dir"])
    for name in ("recipe.toml", "accelerate.yaml", "launch.json", "events.jsonl", "launcher.log",
                 "logs/rank0.log", "logs/rank1.log"):
        assert (run_dir / name).is_file(), name
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert [e["seq"] for e in events] == list(range(len(events)))
    started = [e["type"] for e in events].index("start")
    assert {e["type"] for e in events[:started]} <= {"phase"}  # before step 1: what the ranks are doing
    assert events[-1]["type"] == "end"


def test_the_dry_run_argv_run_by_hand_trains_the_same(ftui: Ftui, strategy_runs: dict[str, Any]) -> None:
    launch = json.loads(
        ftui.run("run", str(QUICKSTART), "--set", f"train.max_steps={STEPS}", "--dry-run", "--format", "json",
                 check=True).stdout
    )
    proc = subprocess.run(launch["argv"], env={**os.environ, **launch["env"]}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    run_dir = Path(launch["accelerate_config"]).parent
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    losses = [e["loss"] for e in events if e["type"] == "step"]
    single = [m["loss"] for m in strategy_runs["single"]["metrics"]]
    assert losses == pytest.approx(single, abs=LOSS_TOLERANCE)


@pytest.mark.slow
def test_a_failing_run_is_recorded_as_failed(ftui: Ftui, tmp_path: Path) -> None:
    # The pre-flight reads the first rows (a bad first row is refused before anything is recorded, exit 2):
    # a problem further down is found by the trainer, after launch, and the run is recorded as failed.
    data = tmp_path / "rows.jsonl"
    data.write_text('{"text": "hello world"}\n' * 30 + '{"content": "hello"}\n')
    proc = ftui.run("run", str(QUICKSTART), "--set", f"data.source={json.dumps(str(data))}", "--name", "t-fails")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    run = next(r for r in ftui.runs() if r["name"] == "t-fails")
    assert run["status"] == "failed"
    assert "data.text_field" in run["error"] and "'text'" in run["error"]
    assert "Traceback" not in proc.stdout + proc.stderr


@pytest.mark.slow
def test_ctrl_c_stops_every_rank_and_records_stopped(ftui: Ftui) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tui.cli", "run", str(QUICKSTART), "--strategy", "ddp", "--nproc", "2",
         "--set", "train.max_steps=500", "--name", "t-ctrl-c"],
        env=ftui.env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    run = _wait_for(lambda: next((r for r in ftui.runs() if r["name"] == "t-ctrl-c" and (r["steps_done"] or 0) >= 2), None))
    pids = run["summary"]["pids"]
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, out + err
    run = ftui.show(run["id"])
    assert run["status"] == "stopped"
    assert 2 <= len(run["metrics"]) < 500
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()


def _wait_for(probe: Any, timeout: float = 180.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError("timed out")


def test_fsdp1_trains_and_saves_a_loadable_adapter(ftui: Ftui, strategy_runs: dict[str, Any]) -> None:
    proc = ftui.run("run", str(QUICKSTART), "--strategy", "fsdp", "--nproc", "2", "--set", "launch.fsdp_version=1",
                    "--set", "train.batch_size=2", "--set", "train.max_steps=3", "--name", "t-fsdp1")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = ftui.show(next(r["id"] for r in ftui.runs() if r["name"] == "t-fsdp1"))
    assert run["distributed_type"] == "FSDP"
    single = [m["loss"] for m in strategy_runs["single"]["metrics"]][:3]
    assert [m["loss"] for m in run["metrics"]] == pytest.approx(single, abs=LOSS_TOLERANCE)
    from peft import PeftModel
    from transformers import LlamaForCausalLM

    from runner.spec import builtin

    model = PeftModel.from_pretrained(LlamaForCausalLM(builtin.tiny_llama_config()), run["summary"]["saved"])
    lora_b = [p for n, p in model.named_parameters() if "lora_B" in n]
    assert len(lora_b) == 24 and all(float(p.abs().sum()) > 0 for p in lora_b), "trained, non-empty adapter"


@pytest.mark.slow
def test_sigterm_to_the_run_group_is_recorded_as_stopped(ftui: Ftui) -> None:
    """Stopping a run from outside (another terminal, the TUI): the ranks finish their step, journal
    'stopped', and the orchestrator records it so."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tui.cli", "run", str(QUICKSTART), "--strategy", "ddp", "--nproc", "2",
         "--set", "train.max_steps=500", "--set", "train.batch_size=2", "--name", "t-sigterm"],
        env=ftui.env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    run = _wait_for(lambda: next((r for r in ftui.runs() if r["name"] == "t-sigterm" and (r["steps_done"] or 0) >= 2), None))
    from store import Store

    pgid = Store(ftui.db).get_run(run["id"]).pgid  # type: ignore[union-attr]
    os.killpg(pgid, signal.SIGTERM)
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 130, out + err
    assert ftui.show(run["id"])["status"] == "stopped"


@pytest.mark.slow
def test_a_local_model_folder_and_a_local_jsonl_train(ftui: Ftui, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a user with their own model and data does: a folder saved by transformers, a .jsonl file
    with a prompt/response template, full fine-tuning."""
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    from runner.spec import builtin
    from runner.spec.paths import cache_dir

    monkeypatch.setenv("FTUI_HOME", str(ftui.home))
    tokenizer = AutoTokenizer.from_pretrained(str(builtin.ensure_tokenizer(cache_dir())))
    torch.manual_seed(0)
    folder = tmp_path / "my-model"
    LlamaForCausalLM(builtin.tiny_llama_config(len(tokenizer))).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"What is {i} + {i}?", "response": str(2 * i)}) + "\n"
                            for i in range(64)))
    proc = ftui.run("run", str(QUICKSTART), "--name", "t-local",
                    "--set", f"model.name={json.dumps(str(folder))}",
                    "--set", f"data.source={json.dumps(str(data))}",
                    "--set", 'data.template="Q: {prompt}\\nA: {response}"', "--set", "data.context_length=32",
                    "--set", "data.pack=false", "--set", "method.type=full", "--set", "train.max_steps=3")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = ftui.show(next(r["id"] for r in ftui.runs() if r["name"] == "t-local"))
    assert run["status"] == "completed" and run["method"] == "full" and len(run["metrics"]) == 3
    # One padded row per example (pack = false): tokens and tokens/s count real tokens, not padding.
    summary, capacity = run["summary"], 3 * 4 * 32
    assert 0 < summary["tokens"] < capacity / 2, summary["tokens"]
    assert summary["tokens_per_s"] == pytest.approx(summary["tokens"] / summary["train_seconds"])
    assert run["summary"]["trainable_params"] == run["summary"]["params"]
    assert (Path(run["summary"]["saved"]) / "model.safetensors").is_file()


@pytest.mark.slow
def test_gradient_accumulation_matches_single_process_under_ddp_and_fsdp(ftui: Ftui) -> None:
    """grad_accum=2: the non-final micro-step runs forward AND backward under no_sync (FSDP reads the
    flag in backward), and every strategy still sees the same 8 rows per optimizer step."""
    plans = {
        "single": ["--strategy", "single", "--set", "train.batch_size=4"],
        "ddp": ["--strategy", "ddp", "--nproc", "2", "--set", "train.batch_size=2"],
        "fsdp": ["--strategy", "fsdp", "--nproc", "2", "--set", "train.batch_size=2"],
    }
    losses: dict[str, list[float]] = {}
    for name, flags in plans.items():
        proc = ftui.run("run", str(QUICKSTART), *flags, "--set", "train.grad_accum=2", "--set", "train.max_steps=3",
                        "--set", "train.save=false", "--name", f"t-ga2-{name}")
        assert proc.returncode == 0, f"{name}: {proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        run = ftui.show(next(r["id"] for r in ftui.runs() if r["name"] == f"t-ga2-{name}"))
        assert run["summary"]["tokens_per_step"] == 8 * 256
        losses[name] = [m["loss"] for m in run["metrics"]]
    assert len(losses["single"]) == 3 and losses["single"][-1] < losses["single"][0]
    assert losses["ddp"] == pytest.approx(losses["single"], abs=LOSS_TOLERANCE)
    assert losses["fsdp"] == pytest.approx(losses["single"], abs=LOSS_TOLERANCE)
