"""The recipe fuzz: every field of the recipe, set to values of every type (path-like ones of any length),
through the real command line in process (``ftui run RECIPE --dry-run --set FIELD=VALUE``: the pre-flight
of every launch, nothing trained). A value is taken (exit 0, the launch printed) or refused before anything
is recorded: exit 2, exactly one line naming a field, no traceback, no row and no run folder. Then the
values that passed the pre-flight and failed only after the run was recorded, each refused that way."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from huggingface_hub import constants as hub_constants
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from runner.spec.recipe import Recipe
from runner.watch.host import cuda_device_count
from store import Store
from tests.support import QUICKSTART, ROOT, new_home, run_in_process


def field_paths(model: type[BaseModel] = Recipe, prefix: str = "") -> list[str]:
    """Every leaf field of the recipe, dotted (``train.resume_from``), read from the model itself."""
    paths = []
    for name, info in model.model_fields.items():
        kind = info.annotation
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            paths += field_paths(kind, f"{prefix}{name}.")
        else:
            paths.append(prefix + name)
    return paths


FIELDS = field_paths()
SECTIONS = sorted({p.rsplit(".", 1)[0] for p in FIELDS if "." in p})


def toml(value: Any) -> str:
    """``value`` as a TOML value (inline tables for dicts; TOML's nan and inf literals)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if value != value else ("inf" if value > 0 else "-inf")
    if isinstance(value, list):
        return "[" + ", ".join(toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {toml(v)}" for k, v in value.items()) + "}"
    return json.dumps(value)


names = st.text(alphabet="abx._-~ ", min_size=1, max_size=300)
path_like = st.builds(lambda lead, parts: lead + "/".join(parts), st.sampled_from(["", "/", "./", "~/", "../"]),
                      st.lists(names, min_size=1, max_size=20))
scalars = st.one_of(st.integers(min_value=-(2**63), max_value=2**63 - 1), st.floats(), st.booleans(),
                    st.text(max_size=40), st.text(max_size=6000), path_like,
                    st.sampled_from(["cuda", "cpu", "builtin:x", "org/model", "q_proj", "2GiB", "fp16", "bf16"]))
values = st.one_of(scalars, st.lists(scalars, max_size=3),
                   st.dictionaries(st.sampled_from(["a", "name", "r"]), scalars, max_size=2))


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    ftui = new_home(tmp_path)
    monkeypatch.setenv("FTUI_HOME", str(ftui.home))
    monkeypatch.setenv("FTUI_DB", ftui.db)
    monkeypatch.chdir(ROOT)
    # Offline: a random model id is looked up in the local Hugging Face cache only (no network per example).
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    return tmp_path


def recorded(home: Path) -> tuple[int, list[str]]:
    store = Store(f"sqlite:///{home / 'ftui.db'}", create=False)
    try:
        count = store.count_runs()
    finally:
        store.close()
    folders = sorted(p.name for p in (home / "runs").iterdir() if not p.name.startswith("dry-run-")) \
        if (home / "runs").is_dir() else []
    return count, folders


def dry_run(home: Path, capsys: pytest.CaptureFixture[str], *overrides: str) -> tuple[int, str, str]:
    argv = ["run", str(QUICKSTART), "--dry-run"]
    for item in overrides:
        argv += ["--set", item]
    result = run_in_process(capsys, *argv)
    assert "Traceback" not in result.stdout + result.stderr, (overrides, result.stderr[-2000:])
    assert recorded(home) == (0, []), overrides
    return result.returncode, result.stdout, result.stderr


def assert_refused(code: int, err: str, overrides: tuple[str, ...], *fields: str) -> str:
    lines = err.splitlines()
    assert code == 2, (overrides, code, err[-500:])
    assert len(lines) == 1 and lines[0].startswith("ftui: "), (overrides, err[-2000:])
    assert any(f in lines[0] for f in fields), (fields, lines[0][:500])
    return lines[0]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(FIELDS), value=values)
@example(field="launch.rdzv_endpoint", value="")  # was refused naming the flag, not the field
def test_every_field_with_any_value_is_taken_or_refused_in_one_line_before_anything_is_recorded(
        home: Path, capsys: pytest.CaptureFixture[str], field: str, value: Any) -> None:
    item = f"{field}={toml(value)}"
    code, out, err = dry_run(home, capsys, item)
    if code == 0:
        assert "argv" in out, (item, out[-500:])
    else:
        assert_refused(code, err, (item,), *FIELDS, *SECTIONS)


LONG = "x" * 5000
BAD = [
    # (override, the field the one line must name)
    ('launch.device="cuda"', "launch.device"),  # no CUDA here: it trained on the CPU, exit 0, no warning
    (f'train.resume_from="{LONG}"', "train.resume_from"),  # these six were tracebacks (file name too long)
    (f'data.source="/{LONG}"', "data.source"),
    (f'data.eval_source="{LONG}"', "data.eval_source"),
    (f'model.name="/{LONG}"', "model.name"),
    (f'launch.accelerate_config="{LONG}"', "launch.accelerate_config"),
    (f'launch.script="{LONG}"', "launch.script"),
    ('data.eval_source="/nonexistent/eval.jsonl"', "data.eval_source"),  # was reported as data.source
    (f'name="{"n" * 10_000}"', "name"),  # was stored whole
    ('method.lora.target_modules=["nope"]', "method.lora.target_modules"),
    ("method.lora.target_modules=[]", "method.lora.target_modules"),
    # Data too short for one optimizer step: the rank failed it (batch_size x replicas x grad_accum rows).
    ("data.context_length=100000", "train.batch_size"),
    ("train.batch_size=100000", "train.batch_size"),
    ("data.rows=1", "train.batch_size"),
    ("data.eval_fraction=0.99", "train.batch_size"),
    ('data.template="{nope}"', "data.template"),  # the builtin corpus' rows have no such field: failed in the rank
    ('data.template="{"', "data.template"),
    ('data.text_field="nope"', "data.text_field"),
    ("train.lr=1e300", "train.lr"),  # RuntimeError in AdamW's step: the step overflowed a float32 weight
    ("train.lr=1e38", "train.lr"),
    # Taken and ignored: exit 0, the run trained without what the value asked for.
    ("train.eval_every=1", "train.eval_every"),  # no eval set: never evaluated
    ('eval.prompts=["Hello"]', "eval.prompts"),  # no eval set: never sampled
    ('model.revision="main"', "model.revision"),  # the builtin model has no revisions
    ('data.split="test"', "data.split"),  # the builtin corpus has no splits
    ('data.subset="nope"', "data.subset"),
    ('data.eval_split="nope"', "data.eval_split"),  # it evaluated on the training corpus
    pytest.param("launch.gpus=[0]", "launch.gpus", marks=pytest.mark.skipif(
        cuda_device_count() > 0, reason="a GPU is visible: the value is usable here")),  # trained on the CPU
]


@pytest.mark.parametrize(("item", "field"), BAD, ids=[str(getattr(b, "values", b)[0])[:40] for b in BAD])
def test_values_that_failed_after_the_run_was_recorded_are_refused_before(
        home: Path, capsys: pytest.CaptureFixture[str], item: str, field: str) -> None:
    code, _, err = dry_run(home, capsys, item)
    line = assert_refused(code, err, (item,), field)
    assert len(line) < 400, line  # the value is shown cut, not whole


NOT_HERE = ['model.name="org/no-such-model"', f'model.name="{LONG[:100]}"']
"""Hub models in no cache and on no reachable hub: they failed in the rank, after the run was recorded."""


@pytest.mark.parametrize("item", NOT_HERE, ids=[n[:40] for n in NOT_HERE])
def test_a_hub_model_that_is_not_here_is_refused_by_a_run_and_a_warning_of_a_dry_run(
        home: Path, capsys: pytest.CaptureFixture[str], item: str) -> None:
    result = run_in_process(capsys, "run", str(QUICKSTART), "--set", item)
    assert_refused(result.returncode, result.stderr, (item,), "model.name")
    assert recorded(home) == (0, [])
    code, out, err = dry_run(home, capsys, item)  # loads nothing: says it, and shows the launch
    assert code == 0, err
    assert "warning: model.name: " in " ".join(out.split()) and "a real run is refused until it is" in out, out


def test_the_recorded_run_path_refuses_them_too_and_records_nothing(
        home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = run_in_process(capsys, "run", str(QUICKSTART), "--set", 'launch.device="cuda"')  # not a dry run
    assert_refused(result.returncode, result.stderr, ("launch.device",), "launch.device")
    assert recorded(home) == (0, [])


def test_the_rows_of_every_data_parallel_replica_are_counted(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """438 blocks of the builtin corpus fill a step of 300 rows on one process, not on two DDP replicas."""
    assert dry_run(home, capsys, "train.batch_size=300")[0] == 0
    item = ("train.batch_size=300", "launch.strategy=\"ddp\"", "launch.nproc=2")
    code, _, err = dry_run(home, capsys, *item)
    line = assert_refused(code, err, item, "train.batch_size")
    assert "one optimizer step of 600 rows" in line, line
