"""The GPU checks of a lent GPU session (bench/gpu_session.sh run): each one a real ftui command on the GPU,
its figures written to one JSON file for BENCHMARKS.md. Nothing is downloaded: the models are the builtin tiny
Llama and a TinyLlama-1.1B-shaped model with random weights built from its config on the machine.

Checks:
  quickstart   `ftui run recipes/quickstart.toml` on cuda, bf16: tokens/s, the run's measured peak (CUDA
               allocator) against its stored estimate.
  tinyllama    the seed's TinyLlama-1.1B LoRA recipe on one GPU (random weights, 10 steps): estimated peak vs
               torch.cuda.max_memory_allocated per rank (issue 17: the goal is within 10%).
  stop         start a run, `ftui stop` it, then ask NVML whether any process of the run still holds GPU
               memory (issue 10: nothing may be left).
  switches     the efficiency switches on quickstart (bf16 baseline, fp8, activation offload; with 2 GPUs
               context parallel and NVMe offload): status, what was live (the precision event's switches),
               tokens/s, measured peak against the estimate; a switch the host cannot run records the
               pre-flight's one-line refusal (that line is the check's result: e.g. torchao missing).
  perfmodel    `ftui plan` of the seed's TinyLlama-1.1B LoRA shape on one GPU (random weights; single, mp, fsdp;
               5 steps each): the performance model's predicted (held out) vs measured tokens/s per candidate and
               its predictions of what the plan did not race (bench/bench_perf_model.py).
  library      the maths library's line on the GPU: `ftui estimate recipes/quickstart.toml --library` on cuda, bf16
               (the probe: CUDA context and libraries outside the allocator, plus the allocator's reserve) against
               the same figure the run's rank records over its measured steps (`gpu_library`), and the difference.
  kernels      two sweeps of quickstart on cuda, bf16: model.attn_implementation over eager, sdpa,
               flex_attention (and flash_attention_2 where flash_attn is installed), and train.compile off/on:
               each run's kernels in effect, tokens/s, measured peak against its estimate, final loss.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FTUI = [sys.executable, "-m", "tui.cli"]


def ftui(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*FTUI, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def show(run_id: int) -> dict[str, Any]:
    return json.loads(ftui("show", str(run_id), "--format", "json").stdout)


def last_run_id() -> int:
    runs = json.loads(ftui("runs", "--format", "json").stdout)
    return max(r["id"] for r in runs)


def run_figures(run: dict[str, Any]) -> dict[str, Any]:
    summary = run.get("summary") or {}
    estimate = (summary.get("estimate") or {}).get("per_device_bytes") or {}
    ranks = summary.get("ranks") or []
    return {
        "status": run.get("status"),
        "error": run.get("error"),
        "tokens_per_s": summary.get("tokens_per_s"),
        "train_seconds": summary.get("train_seconds"),
        "estimated_total_bytes": estimate.get("total"),
        "ranks": [{k: r.get(k) for k in ("rank", "peak_allocated_bytes", "peak_reserved_bytes", "param_bytes",
                                         "grad_bytes", "optimizer_bytes", "activation_bytes")} for r in ranks],
    }


def check_quickstart() -> dict[str, Any]:
    t0 = time.time()
    proc = ftui("run", "recipes/quickstart.toml", "--set", "launch.device=cuda", "--set", "train.precision=bf16",
                "--set", "train.max_steps=60", "--name", "gpu-quickstart")
    out = run_figures(show(last_run_id()))
    out.update(exit_code=proc.returncode, wall_s=round(time.time() - t0, 1), stderr_tail=proc.stderr[-800:])
    return out


def build_tinyllama(folder: Path) -> None:
    """TinyLlama-1.1B's config with random bf16 weights, and the builtin tokenizer saved beside it."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from runner.spec import builtin
    from runner.spec.paths import cache_dir

    config = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                         num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048,
                         rms_norm_eps=1e-5, tie_word_embeddings=False)
    model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.bfloat16)
    model.save_pretrained(folder)
    tok_dir = builtin.ensure_tokenizer(cache_dir())
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(str(tok_dir)).save_pretrained(folder)


def check_tinyllama(tmp: Path) -> dict[str, Any]:
    folder = tmp / "tinyllama-random"
    if not (folder / "config.json").exists():
        build_tinyllama(folder)
    t0 = time.time()
    proc = ftui("run", "recipes/tinyllama-1.1b-lora.toml", "--strategy", "single", "--set", f"model.name={json.dumps(str(folder))}",
                "--set", "train.max_steps=10", "--set", "train.save=false", "--name", "gpu-tinyllama")
    out = run_figures(show(last_run_id()))
    out.update(exit_code=proc.returncode, wall_s=round(time.time() - t0, 1), stderr_tail=proc.stderr[-800:])
    est, ranks = out.get("estimated_total_bytes"), out.get("ranks") or []
    if est and ranks and ranks[0].get("peak_allocated_bytes"):
        out["estimate_error_pct"] = round(100 * (est - ranks[0]["peak_allocated_bytes"]) / ranks[0]["peak_allocated_bytes"], 1)
    return out


def check_stop() -> dict[str, Any]:
    env = {**os.environ}
    proc = subprocess.Popen([*FTUI, "run", "recipes/quickstart.toml", "--set", "launch.device=cuda",
                             "--set", "train.max_steps=100000", "--name", "gpu-stop"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    run_id = None
    deadline = time.time() + 180
    while time.time() < deadline:
        time.sleep(2)
        try:
            run_id = last_run_id()
            if (show(run_id).get("summary") or {}).get("pids"):
                break
        except Exception:  # noqa: BLE001 (the store may not exist yet)
            continue
    if run_id is None:
        proc.kill()
        return {"error": "the run never started"}
    pids = (show(run_id).get("summary") or {}).get("pids") or []
    time.sleep(5)
    stop = ftui("stop", str(run_id))
    proc.wait(timeout=120)
    time.sleep(2)
    from runner.hardware import NvmlBackend

    # Every compute process NVML lists, and whether it is one of the run's ranks (pid match: a container
    # may list host pids, so a mismatch there is reported, not hidden).
    listed = NvmlBackend().process_memory({i: pid for i, pid in enumerate(pids)}, owners={})
    held = [{"gpu": p.gpu_index, "pid": p.pid, "used_bytes": p.used_bytes} for p in listed if p.pid in pids]
    others = [{"gpu": p.gpu_index, "pid": p.pid, "used_bytes": p.used_bytes} for p in listed if p.pid not in pids]
    return {"run_id": run_id, "status": show(run_id).get("status"), "stop_exit": stop.returncode,
            "stop_output": (stop.stdout + stop.stderr)[-500:], "rank_pids": pids, "gpu_memory_still_held": held, "other_gpu_processes": others}


SWITCH_RUNS: dict[str, tuple[int, list[str]]] = {
    "bf16": (1, []),
    "fp8": (1, ["--set", "train.precision=fp8"]),
    "activation_offload": (1, ["--set", "train.activation_offload=true"]),
    "cp_size_2": (2, ["--strategy", "fsdp", "--nproc", "2", "--cp-size", "2"]),
    "nvme": (2, ["--strategy", "zero3", "--nproc", "2", "--offload", "nvme", "--nvme-path", "/tmp/ftui-nvme"]),
}
"""Each switch's run: GPUs it needs, and its flags over quickstart on cuda in bf16."""


def check_switches() -> dict[str, Any]:
    from runner.hardware import NvmlBackend

    gpus = NvmlBackend().device_count()
    Path("/tmp/ftui-nvme").mkdir(exist_ok=True)
    out: dict[str, Any] = {"gpus": gpus}
    for name, (need, flags) in SWITCH_RUNS.items():
        if gpus < need:
            out[name] = {"skipped": f"needs {need} GPUs, NVML sees {gpus}"}
            continue
        proc = ftui("run", "recipes/quickstart.toml", "--set", "launch.device=cuda", "--set", "train.precision=bf16",
                    "--set", "train.max_steps=30", *flags, "--name", f"gpu-switch-{name}")
        if proc.returncode != 0:
            out[name] = {"exit": proc.returncode, "refused": proc.stderr.strip()[-400:]}
            continue
        run = show(last_run_id())
        out[name] = {**run_figures(run), "switches": ((run.get("summary") or {}).get("precision") or {}).get("switches"),
                     "sharding": (run.get("summary") or {}).get("sharding")}
    return out
def sweep_rows(*grid: str) -> dict[str, Any]:
    """One ``ftui sweep`` of quickstart on cuda in bf16 over ``grid`` (``FIELD=V1,V2``): its compare rows."""
    flags = ["--set", "launch.device=cuda", "--set", "train.precision=bf16", "--set", "train.max_steps=30"]
    proc = ftui("sweep", "recipes/quickstart.toml", "--strategies", "single", *flags, *[a for g in grid for a in ("--grid", g)],
                "--format", "json")
    if proc.returncode != 0:
        return {"exit_code": proc.returncode, "stderr_tail": proc.stderr[-800:]}
    runs = json.loads(proc.stdout)["runs"]
    keep = ("run_id", "grid", "status", "reason", "tokens_per_s", "mem_measured", "mem_estimated", "final_loss", "kernels")
    return {"runs": [{k: r.get(k) for k in keep} for r in runs]}


def check_kernels() -> dict[str, Any]:
    import importlib.util

    attention = ["eager", "sdpa", "flex_attention"] + (["flash_attention_2"] if importlib.util.find_spec("flash_attn")
                                                        else [])
    return {"attention": sweep_rows(f"model.attn_implementation={','.join(attention)}"),
            "compile": sweep_rows("train.compile=false,true")}


def check_library() -> dict[str, Any]:
    sets = ["--set", 'launch.device="cuda"', "--set", 'train.precision="bf16"', "--set", "data.context_length=64"]
    est = ftui("estimate", "recipes/quickstart.toml", *sets, "--library", "--strategy", "single", "--format", "json")
    term = json.loads(est.stdout).get("library") if est.returncode == 0 else {"error": est.stderr[-800:]}
    proc = ftui("run", "recipes/quickstart.toml", *sets, "--set", "train.max_steps=3", "--name", "gpu-library")
    ranks = (show(last_run_id()).get("summary") or {}).get("ranks") or []
    measured = [r.get("gpu_library") for r in ranks]
    out: dict[str, Any] = {"estimate": term, "ranks": measured, "exit_code": proc.returncode,
                           "stderr_tail": proc.stderr[-800:]}
    line = (term or {}).get("bytes")
    if line is not None and measured and measured[0]:
        out["difference_mib"] = round((line - measured[0]["beyond_tensors_bytes"]) / 2**20, 2)
    return out


def check_perfmodel(tmp: Path) -> dict[str, Any]:
    from bench_perf_model import markdown, rows, run_plan  # bench/ is this script's folder

    folder = tmp / "tinyllama-random"
    if not (folder / "config.json").exists():
        build_tinyllama(folder)
    home = Path(os.environ.get("FTUI_HOME", str(tmp / "ftui-home")))
    found = rows(run_plan(home, "recipes/tinyllama-1.1b-lora.toml", 1, [f"model.name={json.dumps(str(folder))}"],
                          strategies="single,mp,fsdp", steps=5))
    print(markdown(found), flush=True)
    return found


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("gpu-results.json"))
    parser.add_argument("--only", action="append", choices=["quickstart", "tinyllama", "stop", "switches", "kernels",
                                                             "perfmodel", "library"])
    args = parser.parse_args()
    tmp = Path(os.environ.get("TMPDIR", "/tmp"))
    results: dict[str, Any] = {"started": time.strftime("%Y-%m-%d %H:%M:%S")}
    checks = {"quickstart": check_quickstart, "stop": check_stop, "tinyllama": lambda: check_tinyllama(tmp),
              "switches": check_switches, "kernels": check_kernels, "perfmodel": lambda: check_perfmodel(tmp), "library": check_library}
    for name, check in checks.items():
        if args.only and name not in args.only:
            continue
        t0 = time.time()
        try:
            results[name] = check()
        except Exception as exc:  # noqa: BLE001 (one failed check must not lose the others' figures)
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
        results[name]["check_s"] = round(time.time() - t0, 1)
        args.out.write_text(json.dumps(results, indent=2))
        print(name, json.dumps(results[name])[:600], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
