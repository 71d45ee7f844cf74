"""The shared matrix of real runs: quickstart trained once per test session under every strategy, in the
session's ``ftui`` home (warm caches), and read by every test that needs "a trained run of strategy X".

- The core strategies come from one ``ftui sweep`` (:data:`CORE`): the sweep that ``ftui compare`` is tested
  on, and the runs that the spine, the ZeRO, parallel, estimate and telemetry tests read.
- Every other run (:data:`EXTRAS`: ZeRO on the torch engine and with offload, GPipe, tensor parallel over
  data-parallel replicas, full fine-tuning, the checkpointed run, the chat runs with evaluation) is one
  ``ftui run``, made the first time a test asks for it: a test file run alone trains only what it reads.

Every run that is compared with another trains the same rows per optimizer step: a global batch of
:data:`GLOBAL_BATCH` as a micro-batch of 2 rows x :data:`GRAD_ACCUM` micro-steps on one process, or 1 row
x 2 micro-steps on each of 2 data-parallel processes (the sweep divides the micro-batch by the process
count; pp, mp and tp keep it: their processes share one batch). Gradient accumulation is on in every one
of them, so that the non-final micro-step's ``no_sync`` is exercised under every strategy.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support import QUICKSTART, ROOT, Ftui
from tests.support.in_process import run_ftui

STEPS = 5
"""Optimizer steps of every compared run: start-up dominates a run on CPU, a few steps show the curves agree
and the loss going down."""
GLOBAL_BATCH = 4
GRAD_ACCUM = 2
CONTEXT = 64
"""Tokens per row: a quarter of quickstart's, so a step costs a quarter (the strategies' agreement and the
memory model do not depend on the length)."""
TOKENS_PER_STEP = GLOBAL_BATCH * CONTEXT
CORE = ("single", "mp", "pp", "ddp", "fsdp", "zero1", "zero2", "zero3", "tp")
"""The sweep's strategies, in its order (zero1-3 on their default engine, DeepSpeed)."""
COMMON = [f"train.max_steps={STEPS}", f"train.batch_size={GLOBAL_BATCH // GRAD_ACCUM}",
          f"train.grad_accum={GRAD_ACCUM}", f"data.context_length={CONTEXT}", "train.lr=1e-2"]
"""The overrides of every compared run (the sweep's ``--set``). Its learning rate, 5x quickstart's, makes the
loss fall clearly within 5 short steps (the first two are warm-up)."""
DATA_PARALLEL = ["--nproc", "2", "--set", f"train.batch_size={GLOBAL_BATCH // GRAD_ACCUM // 2}"]
"""What the sweep does to a data-parallel strategy on 2 processes, for the runs made with ``ftui run``."""
CHAT = ROOT / "recipes" / "chat-lora.toml"


@dataclass(frozen=True)
class Plan:
    """One ``ftui run`` of the matrix: the recipe and the flags after it."""

    flags: tuple[str, ...]
    recipe: Path = QUICKSTART
    chat_data: bool = False
    """The recipe reads :func:`chat_rows` (written once per session) as ``data.source``."""
    compared: bool = False
    """Compared step by step with the sweep's runs: it must train their rows per step."""


def _core(*flags: str) -> Plan:
    """A run compared with the sweep's: :data:`COMMON`, then ``flags`` (the last ``--set`` of a field wins)."""
    return Plan((*[a for s in COMMON for a in ("--set", s)], *flags), compared=True)


def _chat_eval(*flags: str) -> Plan:
    """chat-lora with its held-out quarter evaluated after every step (2 steps) and at the end."""
    common = ["--set", "data.context_length=48", "--set", "data.eval_fraction=0.25", "--set", "train.max_steps=2",
              "--set", "train.eval_every=1", "--set", "eval.batch_size=2", "--set", "train.save=false"]
    return Plan((*common, *flags), recipe=CHAT, chat_data=True)


EXTRAS: dict[str, Plan] = {
    # ZeRO: the stages on the torch engine, the offloads on both (the sweep has zero1-3 on DeepSpeed).
    "zero2-deepspeed-optimizer": _core("--strategy", "zero2", "--engine", "deepspeed", "--offload", "optimizer",
                                       *DATA_PARALLEL),
    "zero3-deepspeed-optimizer+params": _core("--strategy", "zero3", "--engine", "deepspeed",
                                              "--offload", "optimizer+params", *DATA_PARALLEL),
    "zero1-torch": _core("--strategy", "zero1", "--engine", "torch", *DATA_PARALLEL),
    "zero2-torch": _core("--strategy", "zero2", "--engine", "torch", *DATA_PARALLEL),
    "zero3-torch-optimizer+params": _core("--strategy", "zero3", "--engine", "torch", "--offload",
                                          "optimizer+params", *DATA_PARALLEL),
    # Pipelines and tensor parallel beyond the sweep's pp (1F1B) and tp (one group of 2).
    "pp-gpipe": _core("--strategy", "pp", "--nproc", "2", "--set", 'launch.pp_schedule="gpipe"'),
    # Two tensor-parallel groups of 2 as data-parallel replicas, 1 row x 2 micro-steps each: the global batch.
    "tp-dp": _core("--strategy", "tp", "--nproc", "4", "--force", "--set", "launch.tp_size=2",
                   "--set", f"train.batch_size={GLOBAL_BATCH // GRAD_ACCUM // 2}"),
    # The kernels against the sweep's single run (SDPA, not compiled): eager attention, compiled layers.
    "eager": _core("--strategy", "single", "--attn", "eager"),
    "compiled": _core("--strategy", "single", "--compile"),
    # The checkpointed run: every step, the newest 3 kept (the steps of its sweep twin, so the curves agree).
    "ck-fsdp": _core("--strategy", "fsdp", *DATA_PARALLEL, "--set", "train.save_every=1",
                     "--set", "train.keep_checkpoints=3"),
    # Full fine-tuning, 2 steps: what the planner's estimate is checked against.
    "full": Plan(("--strategy", "single", "--set", "method.type=full", "--set", "train.batch_size=2",
                  "--set", "train.max_steps=2", "--set", "train.save=false", "--set", f"data.context_length={CONTEXT}")),
    "full-fsdp": Plan(("--strategy", "fsdp", "--nproc", "2", "--set", "method.type=full", "--set",
                       "train.batch_size=2", "--set", "train.max_steps=2", "--set", "train.save=false",
                       "--set", f"data.context_length={CONTEXT}")),
    # Chat data with evaluation, single and FSDP at the same global batch (2 rows); samples of a prompt.
    "eval-single": _chat_eval("--set", "train.batch_size=2", "--set", 'eval.prompts=["What is 3 plus 1?"]',
                              "--set", "eval.max_new_tokens=3"),
    "eval-fsdp": _chat_eval("--strategy", "fsdp", "--nproc", "2", "--set", "train.batch_size=1"),
}


@dataclass(frozen=True)
class Run:
    """A finished run of the matrix: ``ftui show --format json`` of it, and what its command printed."""

    key: str
    shown: dict[str, Any]
    stdout: str
    """``ftui run``'s output; the sweep's for a run of the sweep."""

    @property
    def id(self) -> int:
        return int(self.shown["id"])

    @property
    def summary(self) -> dict[str, Any]:
        return dict(self.shown["summary"])

    @property
    def metrics(self) -> list[dict[str, Any]]:
        return list(self.shown["metrics"])

    @property
    def losses(self) -> list[float]:
        return [m["loss"] for m in self.shown["metrics"]]

    @property
    def run_dir(self) -> Path:
        return Path(self.shown["run_dir"])

    def __getitem__(self, name: str) -> Any:
        return self.shown[name]


@dataclass(frozen=True)
class Sweep:
    """The ``ftui sweep`` of :data:`CORE`, printed as markdown."""

    id: str
    stdout: str
    stderr: str
    run_ids: dict[str, int]
    """Strategy -> run id, in the sweep's order."""


def sweep_id(output: str) -> str:
    """The sweep id that ``ftui sweep`` prints ("reopen with: ftui compare --sweep ID")."""
    match = re.search(r"reopen with: ftui compare --sweep (\S+)", output)
    assert match, output[-3000:]
    return match.group(1)


def chat_rows(path: Path) -> Path:
    """24 one-turn conversations ("What is i plus 1?"): a small chat file with a held-out quarter."""
    rows = [{"messages": [{"role": "user", "content": f"What is {i} plus 1?"},
                          {"role": "assistant", "content": f"{i} plus 1 is {i + 1}."}]} for i in range(24)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@dataclass
class Matrix:
    """The runs, made on first use and kept for the session."""

    ftui: Ftui
    scratch: Path
    _sweep: Sweep | None = None
    _runs: dict[str, Run] = field(default_factory=dict)

    def sweep(self) -> Sweep:
        if self._sweep is None:
            proc = self.ftui.run("sweep", str(QUICKSTART), "--strategies", ",".join(CORE), "--nproc", "2",
                                 *[a for s in COMMON for a in ("--set", s)], "--format", "md", timeout=1800)
            assert proc.returncode == 0, f"sweep: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
            sid = sweep_id(proc.stdout + proc.stderr)
            rows = json.loads(self.ftui.call("compare", "--sweep", sid, "--format", "json", check=True).stdout)["runs"]
            self._sweep = Sweep(sid, proc.stdout, proc.stderr, {r["strategy"]: r["run_id"] for r in rows})
            for strategy, run_id in self._sweep.run_ids.items():
                self._runs[strategy] = Run(strategy, self.ftui.show(run_id), proc.stdout)
        return self._sweep

    def __getitem__(self, key: str) -> Run:
        if key in CORE:
            self.sweep()
        if key not in self._runs:
            self._runs[key] = self._launch(key, EXTRAS[key])
        return self._runs[key]

    def _launch(self, key: str, plan: Plan) -> Run:
        flags = list(plan.flags)
        if plan.chat_data:
            source = self.scratch / "chat.jsonl"
            if not source.exists():
                chat_rows(source)
            flags += ["--set", f"data.source={json.dumps(str(source))}"]
        name = f"m-{key}"
        proc = self.ftui.run("run", str(plan.recipe), *flags, "--name", name, timeout=900)
        assert proc.returncode == 0, f"{key}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        run = next(r for r in self.ftui.runs() if r["name"] == name)
        made = Run(key, self.ftui.show(run["id"]), proc.stdout)
        if plan.compared:
            assert made.summary["tokens_per_step"] == TOKENS_PER_STEP, (key, made.summary["tokens_per_step"])
        return made

    def show_text(self, run: Run) -> str:
        """``ftui show`` of a run as a wide terminal prints it (at 80 columns its cells wrap)."""
        code, out, err = run_ftui(["show", str(run.id)], {**self.ftui.env, "COLUMNS": "400"}, ROOT)
        assert code == 0, err
        return out


@pytest.fixture(scope="session")
def matrix(ftui: Ftui, tmp_path_factory: pytest.TempPathFactory) -> Matrix:
    return Matrix(ftui, tmp_path_factory.mktemp("matrix"))


@dataclass(frozen=True)
class ColdRepeat:
    """``ftui sweep --repeat 2`` of a three-step chat recipe in a fresh home (the third step is the one after
    the memory-metered two: a steady-state tokens/s to compare): the first run starts cold (the builtin
    tokenizer is trained and the data tokenized by the pre-flight), the second finds the cache."""

    home: Path
    recipe: Path
    env: dict[str, str]
    proc: subprocess.CompletedProcess[str]
    run_dirs: list[Path]
    """The two runs' folders, in the order they ran."""


@pytest.fixture(scope="session")
def cold_repeat(tmp_path_factory: pytest.TempPathFactory) -> ColdRepeat:
    scratch = tmp_path_factory.mktemp("cold-repeat")
    home = scratch / "home"
    env = {**os.environ, "FTUI_HOME": str(home), "PYTHONUNBUFFERED": "1", "COLUMNS": "120"}
    env.pop("FTUI_DB", None)
    env.pop("FTUI_CACHE", None)  # the home's own cache, empty: the session's warm one would make it warm
    source = chat_rows(scratch / "chat.jsonl")
    text = CHAT.read_text().replace('source = "data/chat.jsonl"', f"source = {json.dumps(str(source))}")
    text = text.replace("eval_fraction = 0.1", "eval_fraction = 0.0").replace("eval_every = 20", "eval_every = 0")
    text = text.replace("\nprompts = [", "\n# prompts = [")  # no eval set: no evaluation to sample them at
    text = text.replace("max_steps = 60", "max_steps = 3\nsave = false").replace("context_length = 128",
                                                                                 "context_length = 64")
    recipe = scratch / "chat.toml"
    recipe.write_text(text)
    proc = subprocess.run([sys.executable, "-m", "tui.cli", "sweep", str(recipe), "--strategies", "single",
                           "--repeat", "2"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:] + proc.stdout[-2000:]
    code, listed, err = run_ftui(["runs", "--format", "json"], env, ROOT)
    assert code == 0, err
    run_dirs = [Path(r["run_dir"]) for r in sorted(json.loads(listed), key=lambda r: r["id"])]
    return ColdRepeat(home, recipe, env, proc, run_dirs)
