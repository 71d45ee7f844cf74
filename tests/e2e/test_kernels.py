"""The attention implementation and torch.compile, trained for real on this CPU: the sweep's single run (SDPA,
nothing compiled) against the same recipe with eager attention and with compiled decoder layers (the shared
matrix's extras): the same losses, the kernels in effect, and the memory and tokens/s differences in
``ftui compare``. On a GPU, flash_attention_2, flex_attention and compile (gpu-marked)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from runner.spec import events as ev
from tests.support import Ftui, new_home
from tests.support.matrix import STEPS, Matrix

LOSS_TOLERANCE = 1e-3
"""The task's bound; fp32 on CPU measured ~1e-6 between the kernels."""


def _compare(ftui: Ftui, *run_ids: int) -> tuple[dict[int, dict[str, Any]], str]:
    """``ftui compare`` of the runs: its rows by run id (JSON), and its table (text)."""
    ids = [str(i) for i in run_ids]
    rows = json.loads(ftui.call("compare", *ids, "--format", "json", check=True).stdout)["runs"]
    text = ftui.call("compare", *ids, check=True).stdout
    return {r["run_id"]: r for r in rows}, text


def _saved(run: Any) -> tuple[int, int]:
    """(measured, estimated) bytes one forward saves for backward: the trainer's saved-tensor hooks, the planner's."""
    rank = run.summary["ranks"][0]
    return rank["activation_bytes"], run.summary["estimate"]["per_device_bytes"]["activations_stored"]


def test_eager_attention_trains_like_sdpa_and_keeps_the_probabilities(matrix: Matrix, ftui: Ftui) -> None:
    sdpa, eager = matrix["single"], matrix["eager"]
    assert eager["status"] == "completed" and len(eager.losses) == STEPS
    assert eager.losses == pytest.approx(sdpa.losses, abs=LOSS_TOLERANCE)
    rows, text = _compare(ftui, sdpa.id, eager.id)
    assert (rows[sdpa.id]["kernels"]["attention"], rows[eager.id]["kernels"]["attention"]) == ("sdpa", "eager")
    # Eager keeps each layer's B x H x S x S fp32 probabilities: more memory, measured and estimated alike.
    (m_sdpa, e_sdpa), (m_eager, e_eager) = _saved(sdpa), _saved(eager)
    probabilities = 4 * 2 * 6 * 64 * 64 * 6  # micro-batch 2, 6 heads, 64 tokens, 6 layers
    assert m_eager - m_sdpa > probabilities
    assert e_eager - e_sdpa == pytest.approx(m_eager - m_sdpa, rel=0.01)
    assert rows[eager.id]["mem_measured"] > rows[sdpa.id]["mem_measured"]
    assert rows[eager.id]["tokens_per_s"] and rows[sdpa.id]["tokens_per_s"]
    lines = text.splitlines()
    assert any(line.split()[:3] == ["│", "attention", "│"] and "eager" in line for line in lines), text
    assert "single (eager)" in text  # the verdict names the configurations apart


def test_compiled_layers_train_like_eager_ones_with_compile_its_own_phase(matrix: Matrix, ftui: Ftui) -> None:
    plain, compiled = matrix["single"], matrix["compiled"]
    assert compiled["status"] == "completed"
    assert compiled.losses == pytest.approx(plain.losses, abs=LOSS_TOLERANCE)
    kernels = compiled.summary["kernels"]["compile"]
    assert (kernels["mode"], kernels["layers"], kernels["graph_breaks"]) == ("default", 6, 0)
    assert kernels["graphs"] >= 6 and kernels["seconds"] == pytest.approx(compiled.metrics[0]["step_time"])
    # The compile is the first step, after the start event; the steady state leaves it out.
    journal = [json.loads(line) for line in (compiled.run_dir / ev.EVENTS_FILE).read_text().splitlines()]
    kinds = [(e["type"], e.get("phase") or e.get("step")) for e in journal]
    at = kinds.index(("phase", "compiling"))
    assert kinds[at - 1] == ("start", None)
    assert next(k for k in kinds[at + 1:] if k[0] in ("step", "phase")) == ("step", 1)  # step 1 ends it
    assert compiled.summary["steady_steps"] == STEPS - 3  # not the metered two, nor the profiled last
    stages = compiled.summary["time_to_first_step"]["seconds"]  # step 1, compiling, is a stage of its own
    assert stages["compile"] == pytest.approx(kernels["seconds"], abs=1.0) and stages["first_step"] < 1.0
    # What the compiled layers save is the partitioner's (fewer: recomputed in backward), as estimated.
    (m_plain, e_plain), (m_compiled, e_compiled) = _saved(plain), _saved(compiled)
    assert m_compiled < m_plain and e_compiled - e_plain == pytest.approx(m_compiled - m_plain, rel=0.01)
    rows, text = _compare(ftui, plain.id, compiled.id)
    assert rows[compiled.id]["kernels"]["compile_mode"] == "default" and rows[plain.id]["kernels"]["compile_mode"] is None
    assert rows[compiled.id]["tokens_per_s"] and rows[compiled.id]["mem_measured"]
    assert "single (compiled)" in text and "mem measured of compiled CPU runs" in " ".join(text.split())


@pytest.mark.gpu
@pytest.mark.parametrize("flags", [["--attn", "flash_attention_2"], ["--attn", "flex_attention"], ["--compile"],
                                   ["--compile", "max-autotune", "--attn", "eager"]])
def test_gpu_kernels(tmp_path: Path, flags: list[str]) -> None:
    """On a CUDA GPU: each kernel trains the quickstart in bf16 (3 steps) and is what the run says was in
    effect; flash_attention_2 without the flash_attn package is refused before anything is recorded."""
    from runner.hardware.hostfacts import current

    if current().visible_gpus == 0:
        pytest.skip("no CUDA GPU visible (NVML)")
    import importlib.util

    ftui = new_home(tmp_path)
    argv = ["run", "recipes/quickstart.toml", *flags, "--set", "train.precision=bf16", "--set", "train.max_steps=3",
            "--set", "data.context_length=64", "--set", "launch.device=cuda"]
    if "flash_attention_2" in flags and importlib.util.find_spec("flash_attn") is None:
        proc = ftui.run(*argv)
        assert proc.returncode == 2 and "needs the flash_attn package" in proc.stderr
        assert ftui.runs() == []
        return
    proc = ftui.run(*argv, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    shown = ftui.show(max(r["id"] for r in ftui.runs()))
    kernels = shown["summary"]["kernels"]
    attention = flags[flags.index("--attn") + 1] if "--attn" in flags else "sdpa"
    assert kernels["attention"] == attention
    assert (kernels["compile"] is not None) == ("--compile" in flags)
