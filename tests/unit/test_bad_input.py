"""Bad input is found before launch: one line naming the field
or file, exit 2, never a traceback, and nothing recorded. Property-based over the recipe loader and
over every command of the CLI, in process through ``tui.cli.main`` (tests/integration/test_bad_arguments.py
runs one per command in a real process)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runner.spec.recipe import RecipeError, load_recipe, parse_recipe
from store import Store
from store.queue import entries
from tests.support import run_in_process
from tui.cli.main import main
from tui.cli.parser import COMMANDS

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "recipes" / "quickstart.toml"
FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# ---------------------------------------------------------------------- the recipe loader

SECTIONS = {
    "model": ["name", "dtype", "trust_remote_code", "revision"],
    "data": ["source", "text_field", "template", "rows", "context_length", "pack", "shuffle"],
    "method": ["type"],
    "train": ["batch_size", "grad_accum", "lr", "schedule", "warmup_steps", "max_steps", "stop_after", "epochs", "precision",
              "seed", "log_every", "save", "max_grad_norm", "weight_decay"],
    "launch": ["strategy", "nproc", "gpus", "device", "fsdp_version", "accelerate_config", "peak_tflops",
               "mem_cap", "replicate", "shard"],
}
toml_scalars = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1), st.floats(allow_nan=True), st.booleans(),
    st.text(max_size=20), st.lists(st.integers(min_value=-5, max_value=2**40), max_size=3),
)


def toml_value(value: object) -> str:
    return json.dumps(value) if not isinstance(value, float) or value == value and abs(value) != float("inf") \
        else ("nan" if value != value else ("inf" if value > 0 else "-inf"))


def check_one_line(exc: RecipeError, *names: str) -> None:
    line = str(exc)
    assert "\n" not in line and line.strip(), line
    assert any(n in line for n in names), (names, line)


@FAST
@given(st.text(max_size=200))
def test_any_text_is_a_recipe_or_one_recipe_error(text: str) -> None:
    try:
        parse_recipe(text, source="r.toml")
    except RecipeError as exc:
        check_one_line(exc, "r.toml", "--set")


@FAST
@given(st.sampled_from(sorted(SECTIONS)), st.data())
def test_wrong_types_and_ranges_name_the_field(section: str, data: st.DataObject) -> None:
    key = data.draw(st.sampled_from([*SECTIONS[section], "zz_unknown"]))
    value = data.draw(toml_scalars)
    text = f"[{section}]\n{key} = {toml_value(value)}\n"
    try:
        parse_recipe(text, source="r.toml")
    except RecipeError as exc:
        check_one_line(exc, f"{section}.{key}", "r.toml")
        assert exc.file in ("r.toml", None) and (exc.field is None or "." in exc.field or exc.field == "recipe")


@FAST
@given(st.binary(min_size=1, max_size=200))
def test_any_bytes_as_a_file_give_a_recipe_or_a_recipe_error(tmp_path_factory: pytest.TempPathFactory,
                                                              raw: bytes) -> None:
    path = tmp_path_factory.mktemp("r") / "recipe.toml"
    path.write_bytes(raw)
    try:
        load_recipe(path)
    except RecipeError as exc:
        check_one_line(exc, str(path))


@FAST
@given(st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=30), toml_scalars)
def test_any_override_is_applied_or_refused_in_one_line(key: str, value: object) -> None:
    try:
        parse_recipe("", overrides=[f"{key}={toml_value(value)}"])
    except RecipeError as exc:
        check_one_line(exc, "--set")


@pytest.mark.parametrize(("text", "override", "said"), [
    ("", "lunch.nproc=2", "--set lunch.nproc: lunch: unknown field (did you mean launch?)"),  # only the --set made it
    ("", "A.A=0", "--set A.A: A: unknown field"),  # hypothesis' falsifying example
    ("", "launch.nprocz=2", "--set launch.nprocz: unknown field (did you mean launch.nproc?)"),
    ("[lunch]\nx = 1\n", "lunch.y=2", "<t>:1: lunch: unknown field (did you mean launch?)"),  # the file's: its line
    ("[train]\nlr = 1e-4\n", "train.lr=-1", "--set train.lr: Input should be greater than 0 (got -1)"),
])
def test_an_unknown_field_names_where_it_came_from(text: str, override: str, said: str) -> None:
    with pytest.raises(RecipeError) as info:
        parse_recipe(text, source="<t>", overrides=[override])
    assert str(info.value) == said


@pytest.mark.parametrize("text", ["", "   \n\t\n", "# just a comment\n\n# another\n"])
def test_an_empty_recipe_file_is_an_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "recipe.toml"
    path.write_text(text)
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert str(info.value) == f"{path}: empty recipe (nothing to run)"
    assert parse_recipe(text).name == "run"  # the Compose form starts from nothing: text is not a file


def test_recipe_error_attributes_and_unchanged_line() -> None:
    with pytest.raises(RecipeError) as info:
        parse_recipe("[train]\nbatch_size = 'x'\n", source="<t>")
    exc = info.value
    assert str(exc) == "<t>:2: train.batch_size: Input should be a valid integer (got 'x')"
    assert (exc.field, exc.file, exc.line) == ("train.batch_size", "<t>", 2)
    assert exc.problem == "Input should be a valid integer (got 'x')"
    with pytest.raises(RecipeError) as info:
        parse_recipe("", overrides=["train.lr=-1"])
    assert (info.value.field, info.value.file, info.value.line) == ("train.lr", "--set", None)


def test_relative_paths_resolve_against_the_recipe_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "exp"
    folder.mkdir()
    (folder / "data.jsonl").write_text('{"text": "hello"}\n')
    (folder / "acc.yaml").write_text("compute_environment: LOCAL_MACHINE\n")
    (folder / "r.toml").write_text('[data]\nsource = "data.jsonl"\n[launch]\naccelerate_config = "acc.yaml"\n'
                                   '[model]\nname = "org/hub-model"\n')
    monkeypatch.chdir(tmp_path)
    recipe = load_recipe(folder / "r.toml")
    assert recipe.data.source == str(folder / "data.jsonl")
    assert recipe.launch.accelerate_config == str(folder / "acc.yaml")
    assert recipe.model.name == "org/hub-model"  # a hub id stays a hub id
    # --set values were typed in the current folder: taken from there.
    (tmp_path / "other.jsonl").write_text('{"text": "x"}\n')
    assert load_recipe(folder / "r.toml", ["data.source=other.jsonl"]).data.source == str(tmp_path / "other.jsonl")
    assert load_recipe(QUICKSTART).data.source.startswith("builtin:")


# ---------------------------------------------------------------------- the CLI, in process


@pytest.fixture
def home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("FTUI_HOME", str(home))
    monkeypatch.setenv("FTUI_DB", f"sqlite:///{home / 'ftui.db'}")
    monkeypatch.chdir(ROOT)
    store = Store(f"sqlite:///{home / 'ftui.db'}")
    from runner.spec.recipe import load_recipe as load

    recipe = load(QUICKSTART)
    store.create_run(name="kept", recipe_text=recipe.to_toml(), recipe_hash=recipe.digest(), strategy="single",
                     nproc=1, method="lora", model=recipe.model.name, run_dir="")
    files = home / "files"
    files.mkdir()
    (files / "empty.jsonl").write_text("")
    (files / "binary.txt").write_bytes(b"\x89PNG\r\n\x1a\n\0\0\0")
    (files / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    (files / "bad.jsonl").write_text('{"text": "ok"}\n{"text": \n')
    (files / "nofield.jsonl").write_text('{"body": "x"}\n')
    (files / "header.csv").write_text("text\n")
    (files / "list.json").write_text('{"a": 1}')
    (files / "model").mkdir()
    return home


def snapshot(home: Path) -> tuple[str, list[str], int]:
    store = Store(f"sqlite:///{home / 'ftui.db'}")
    rows = json.dumps([(r.id, r.name, r.status, r.tags, r.note) for r in store.list_runs()])
    queued = len(entries(store))
    store.close()
    runs = sorted(p.name for p in (home / "runs").iterdir()) \
        if (home / "runs").is_dir() else []
    return rows, runs, queued


def assert_usage_error(home: Path, argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    before = snapshot(home)
    result = run_in_process(capsys, *argv)
    code, out, err = result.returncode, result.stdout, result.stderr
    assert code == 2, (argv, code, out, err)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ftui: "), (argv, err)
    assert "Traceback" not in out + err
    assert snapshot(home) == before, argv
    return lines[0]


def bad_file(home: Path) -> st.SearchStrategy[str]:
    files = home / "files"
    return st.sampled_from([str(files / n) for n in ("empty.jsonl", "binary.txt", "latin1.txt", "bad.jsonl",
                                                     "nofield.jsonl", "header.csv", "list.json", "nope.jsonl",
                                                     "model", "x.unknown")])


not_an_id = st.one_of(st.text(min_size=1, max_size=8).filter(lambda s: not s.strip().lstrip("-+").isdigit()
                                                              and not s.startswith("-")),
                      st.integers(min_value=10**6, max_value=10**12).map(str))
bad_set = st.one_of(
    st.tuples(st.sampled_from(["train.batch_size", "train.max_steps", "data.context_length", "launch.nproc"]),
              st.integers(max_value=-1)).map(lambda kv: f"{kv[0]}={kv[1]}"),
    st.tuples(st.sampled_from(["train.lr", "train.batch_size", "train.pack"]),
              st.text(alphabet="xyz", min_size=1, max_size=5)).map(lambda kv: f"{kv[0]}=\"{kv[1]}\""),
    st.text(alphabet="abc_.", min_size=1, max_size=10).map(lambda k: f"zz_{k}=1"),
    st.text(max_size=10).filter(lambda s: "=" not in s),
)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_every_command_refuses_bad_arguments_in_one_line(home: Path, capsys: pytest.CaptureFixture[str],
                                                         data: st.DataObject) -> None:
    quick = str(QUICKSTART)
    argv = data.draw(st.one_of(
        bad_set.map(lambda s: ["run", quick, "--dry-run", "--set", s]),
        bad_file(home).map(lambda f: ["run", quick, "--dry-run", "--set", f"data.source={json.dumps(f)}"]),
        bad_file(home).map(lambda f: ["run", f, "--dry-run"]),
        bad_file(home).map(lambda f: ["run", quick, "--set", f"data.source={json.dumps(f)}"]),  # not dry: no row
        st.just(["run", quick, "--dry-run", "--set", f"model.name={json.dumps(str(home / 'files' / 'model'))}"]),
        not_an_id.map(lambda i: ["show", i]),
        not_an_id.map(lambda i: ["compare", "1", i]),
        not_an_id.map(lambda i: ["stop", i]),
        not_an_id.map(lambda i: ["resume", i]),
        st.sampled_from([["resume"], ["resume", "1"], ["resume", "999999", "--grace", "-1"]]),  # run 1 has no checkpoint
        st.sampled_from([["db"], ["db", "nope"], ["db", "upgrade", "--db", "nosuch://x"]]),
        st.sampled_from(["current", "upgrade"]).map(  # a folder under a file: not creatable, even by root
            lambda action: ["db", action, "--db", f"sqlite:///{home / 'files' / 'empty.jsonl' / 'x.db'}"]),
        st.sampled_from([["recover", "--format", "yaml"], ["recover", "extra"], ["recover", "--db", "nosuch://x"],
                         ["recover", "--db", f"sqlite:///{home / 'missing.db'}"]]),
        st.sampled_from([["stop"], ["stop", "1", "--grace", "-1"], ["stop", "1", "--grace", "nan"], ["stop", "999999", "--kil"]]),
        st.sampled_from([["slurm", quick], ["slurm", quick, "--nodes", "0"], ["slurm", quick, "--nodes", "2",
                                                                                  "--gpus-per-node", "-1"],
                         ["slurm", quick, "--nodes", "2", "--port", "70000"],
                         ["slurm", quick, "--nodes", "2", "--set", "train.lr=\"x\""],
                         ["slurm", "/nonexistent.toml", "--nodes", "2"],
                         ["run", quick, "--nnodes", "2", "--main-addr", "127.0.0.1"],
                         ["run", quick, "--nnodes", "2", "--node-rank", "5", "--main-addr", "h"],
                         ["run", quick, "--nnodes", "2", "--rdzv-endpoint", "h:x"],
                         ["run", quick, "--node-rank", "1"]]),
        st.sampled_from([["compare"], ["compare", "1", "--baseline", "7"], ["compare", "--sweep", "nope"],
                         ["runs", "--status", "done"], ["runs", "--format", "yaml"], ["gpus", "--watch", "0"],
                         ["gpus", "--watch", "nan"], ["estimate", "--params", "lots"], ["estimate", "--gpu-mem", "x"],
                         ["--bogus"], ["run"], ["show"], ["nope-command"]]),
        st.sampled_from([["--strategies", "warp,ddp"], ["--strategies", ","], ["--nproc", "0"], ["--nproc", "-3"],
                         ["--nproc", "x"], ["--grid", "train.lr"], ["--grid", "zz=1,2"], ["--set", "zz_x=1"],
                         ["--format", "pdf"], ["-o", "/nonexistent-dir/out.html"]])
        .map(lambda flags: ["sweep", quick, *flags]),  # each fails before anything trains
        bad_file(home).map(lambda f: ["sweep", quick, "--set", f"data.source={json.dumps(f)}"]),
        st.sampled_from([["--strategies", "warp,ddp"], ["--strategies", ","], ["--nproc", "0"], ["--steps", "2"],
                         ["--steps", "x"], ["--repeat", "0"], ["--budget", "-1"], ["--budget", "nan"],
                         ["--set", "zz_x=1"], ["--format", "pdf"], ["--strategies", "fsdp", "--nproc", "1"]])
        .map(lambda flags: ["plan", quick, *flags]),  # each fails before anything trains (fsdp: not on 1 CPU rank)
        bad_file(home).map(lambda f: ["plan", quick, "--set", f"data.source={json.dumps(f)}"]),
        bad_file(home).map(lambda f: ["estimate", f]),
        bad_set.map(lambda s: ["queue", "add", quick, "--set", s]),
        bad_file(home).map(lambda f: ["queue", "add", quick, "--set", f"data.source={json.dumps(f)}"]),
        not_an_id.map(lambda i: ["queue", "rm", i]),
        st.sampled_from([["queue", "--format", "yaml"], ["queue", "nope"], ["queue", "rm"], ["queue", "rm", "0"],
                         ["queue", "add"], ["queue", "add", quick, "--strategy", "ddp", "--nproc", "64"],
                         ["queue", "add", quick, "--grace", "-1"], ["queue", "add", quick, "--dry-run"],
                         ["queue", "add", quick, "--nnodes", "2"], ["queue", "add", "/nonexistent.toml"]]),
    ))
    assert_usage_error(home, argv, capsys)


def test_data_problems_name_the_file_and_row(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = home / "files"
    cases = {
        "bad.jsonl": f"{files / 'bad.jsonl'}:2: invalid JSON line",
        "empty.jsonl": "empty file",
        "binary.txt": "binary file",
        "latin1.txt": "not UTF-8 text",
        "nofield.jsonl": "data.text_field: row 1 of nofield.jsonl has no field 'text'",
        "header.csv": "no rows",
        "model": "is a folder",
        "nope.jsonl": "file not found",
    }
    for name, expected in cases.items():
        line = assert_usage_error(home, ["run", str(QUICKSTART), "--set", f"data.source={json.dumps(str(files / name))}"],
                                  capsys)
        assert expected in line, (name, line)
    line = assert_usage_error(home, ["run", str(QUICKSTART), "--set", "data.template=\"{prompt}\"", "--set",
                                     f"data.source={json.dumps(str(files / 'nofield.jsonl'))}"], capsys)
    assert "data.template: row 1 of nofield.jsonl has no field 'prompt'" in line


def test_unwritable_data_folder_is_one_line_and_records_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("FTUI_HOME", str(blocker / "home"))  # cannot be created, even as root
    monkeypatch.setenv("FTUI_DB", f"sqlite:///{tmp_path / 'ftui.db'}")
    assert main(["run", str(QUICKSTART), "--set", "train.max_steps=1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ftui: ") and err.count("\n") == 1 and "FTUI_HOME" in err and "Traceback" not in err
    assert Store(f"sqlite:///{tmp_path / 'ftui.db'}").list_runs() == []


CPU_RANKS = ["--set", "launch.device=cpu"]
"""The ranks train on the CPU whatever the host has (the refusals below are the CPU's; a GPU's: gpu-marked)."""


@pytest.mark.parametrize(("flags", "said"), [
    (["--attn", "flash_attention_2", "--set", "train.precision=bf16"],
     "model.attn_implementation: flash_attention_2 needs a CUDA GPU; this run trains on the CPU"),
    (["--attn", "flex_attention"], "model.attn_implementation: flex_attention has no backward on CPU"),
    (["--attn", "flash"], "argument --attn: invalid choice: 'flash'"),
    (["--compile", "--strategy", "zero3", "--nproc", "2"], "train.compile: not under zero3 on the deepspeed engine"),
    (["--compile", "--set", "train.gradient_checkpointing=true"], "train.compile: not with train.gradient_checkpointing"),
    (["--set", "train.compile_mode=max-autotune"], "train.compile_mode: 'max-autotune' takes effect only with"),
])
def test_a_switch_the_host_or_the_strategy_cannot_run_is_refused_before_anything_is_recorded(
        home: Path, capsys: pytest.CaptureFixture[str], flags: list[str], said: str) -> None:
    line = assert_usage_error(home, ["run", str(QUICKSTART), *CPU_RANKS, *flags], capsys)
    assert said in line, line


def test_a_sweep_over_a_value_the_host_cannot_run_is_refused_whole(home: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    line = assert_usage_error(home, ["sweep", str(QUICKSTART), "--strategies", "single", *CPU_RANKS, "--set",
                                     "train.precision=bf16", "--grid",
                                     "model.attn_implementation=sdpa,flash_attention_2"], capsys)
    assert line == "ftui: model.attn_implementation: flash_attention_2 needs a CUDA GPU; this run trains on the CPU"


def test_commands_are_all_covered() -> None:
    """A new command module must be added to the property test above."""
    assert set(COMMANDS) == {"tui.cli.run", "tui.cli.runs", "tui.cli.gpus", "tui.cli.estimate", "tui.cli.compare",
                             "tui.cli.stop", "tui.cli.db", "tui.cli.recover", "tui.cli.slurm", "tui.cli.plan",
                             "tui.cli.queue"}
