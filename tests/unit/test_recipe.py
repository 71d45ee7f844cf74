from __future__ import annotations

from pathlib import Path

import pytest

from runner.spec.recipe import Recipe, RecipeError, load_recipe, parse_recipe
from tests.support import QUICKSTART, CliResult, run_in_process

RECIPES = sorted((Path(__file__).resolve().parents[2] / "recipes").glob("*.toml"))


def test_defaults_round_trip_through_toml() -> None:
    recipe = parse_recipe("")
    assert parse_recipe(recipe.to_toml()) == recipe
    assert recipe.digest() == parse_recipe(recipe.to_toml()).digest()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[train]\nbatch_size = true\n", "<t>:2: train.batch_size: Input should be a valid integer"),
        ("[train]\nbatchsize = 3\n", "<t>:2: train.batchsize: unknown field (did you mean train.batch_size?)"),
        ("\n\n[launch]\nstrategy = 'ddp'\n", "launch.nproc: strategy 'ddp' needs at least 2 processes"),
        ("[method]\ntype = 'adapter'\n", "<t>:2: method.type: Input should be 'full', 'lora' or 'qlora'"),
        ("[train]\nlr = -1\n", "<t>:2: train.lr: Input should be greater than 0"),
        ("[train]\nbatch_size = '4'\n", "train.batch_size: Input should be a valid integer"),
        ("[model\nname='x'", "<t>: invalid TOML"),
        ("[method.lora]\nr = 8\ntarget = ['q_proj']\n", "<t>:3: method.lora.target: unknown field"),
        ("[train]\nstop_after = -2\n", "<t>:2: train.stop_after: Input should be greater than or equal to 0"),
        ("[train]\nmax_steps = 5\nstop_after = 6\n",
         "train.stop_after: 6 is past the schedule's end (train.max_steps = 5)"),
    ],
)
def test_bad_recipes_name_the_field_and_line(text: str, expected: str) -> None:
    with pytest.raises(RecipeError) as info:
        parse_recipe(text, source="<t>")
    message = str(info.value)
    assert expected in message
    assert "\n" not in message


def test_set_overrides_are_validated_like_the_file() -> None:
    recipe = parse_recipe("", overrides=["train.max_steps=50", "launch.strategy=fsdp", "launch.nproc=2"])
    assert (recipe.train.max_steps, recipe.launch.strategy, recipe.launch.nproc) == (50, "fsdp", 2)
    with pytest.raises(RecipeError, match="train.max_steps: Input should be a valid integer"):
        parse_recipe("", overrides=["train.max_steps=abc"])
    with pytest.raises(RecipeError, match="expected FIELD.PATH=VALUE"):
        parse_recipe("", overrides=["train.max_steps"])
    with pytest.raises(RecipeError, match="train.nope: unknown field"):
        parse_recipe("", overrides=["train.nope=1"])


def test_an_unknown_field_gets_the_closest_known_one(capsys: pytest.CaptureFixture[str]) -> None:
    """difflib's closest field of the same section, in the one line naming the field; none when nothing is
    close; the command line's override and a sweep's grid say it too, exit 2."""
    cases = {"train.batchsize=2": "--set train.batchsize: unknown field (did you mean train.batch_size?)",
             "trian.max_steps=2": "--set trian.max_steps: trian: unknown field (did you mean train?)",
             "method.lora.rr=2": "--set method.lora.rr: unknown field (did you mean method.lora.r?)",
             "train.zzzz=2": "--set train.zzzz: unknown field"}
    for override, said in cases.items():
        with pytest.raises(RecipeError) as info:
            parse_recipe("", overrides=[override])
        assert str(info.value) == said
    result = run_in_process(capsys, "run", str(QUICKSTART), "--set", "train.batchsize=2", "--dry-run")
    assert (result.returncode, result.stderr) == (2, f"ftui: {cases['train.batchsize=2']}\n")
    result = run_in_process(capsys, "sweep", str(QUICKSTART), "--grid", "train.batchsize=1,2")
    assert (result.returncode, result.stderr) == (2, f"ftui: {cases['train.batchsize=2']}\n")


def test_an_unknown_flag_gets_the_closest_flag_of_its_command(capsys: pytest.CaptureFixture[str]) -> None:
    said = {("run", "r.toml", "--nprocs", "4"): "unrecognized arguments: --nprocs 4 (did you mean --nproc?)",
            ("show", "1", "--recipes"): "unrecognized arguments: --recipes (did you mean --recipe?)",
            ("run", "r.toml", "--zzzz"): "unrecognized arguments: --zzzz"}
    for argv, line in said.items():
        assert run_in_process(capsys, *argv) == CliResult(2, "", f"ftui: {line}\n")


def test_missing_file_is_one_line() -> None:
    with pytest.raises(RecipeError, match="nope.toml: cannot read recipe"):
        load_recipe("nope.toml")


@pytest.mark.parametrize("path", RECIPES, ids=[p.name for p in RECIPES])
def test_every_shipped_recipe_loads_and_says_how_to_run_it(path: Path) -> None:
    recipe = load_recipe(path)
    assert isinstance(recipe, Recipe)
    first = path.read_text().splitlines()[0]
    assert first.startswith("#"), "a shipped recipe opens with a comment saying what it trains"
    assert "ftui run" in path.read_text(), "and the command that runs it"


def test_seed_recipes_match_the_seed_experiments() -> None:
    tiny = load_recipe(RECIPES[0].parent / "tinyllama-1.1b-lora.toml")
    assert (tiny.data.rows, tiny.data.context_length, tiny.train.batch_size, tiny.train.grad_accum) == (1024, 1024, 16, 2)
    code = load_recipe(RECIPES[0].parent / "codellama-34b-lora-fsdp.toml")
    assert (code.train.batch_size, code.train.grad_accum, code.launch.strategy) == (4, 4, "fsdp")
