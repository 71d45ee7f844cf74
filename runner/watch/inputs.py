"""Pre-launch checks of what a recipe points at, outside the recipe itself: the data file, and the
folders a run is written to. They run before a run is recorded, so that bad input is one line and
exit 2 with nothing stored, instead of a ``failed`` row seconds after launch.

:func:`runner.watch.orchestrator.preflight` calls :func:`check_inputs`; ``ftui sweep`` calls it once for
the sweep's recipe before the first run.
"""

from __future__ import annotations

from runner.data.check import check_data
from runner.data.rows import DataError
from runner.spec.paths import FolderError, check_runs_dir
from runner.spec.recipe import Recipe, RecipeError


class InputError(RecipeError):
    """A recipe's data or folders are unusable; one line naming the field or file."""


def check_inputs(recipe: Recipe) -> None:
    """Check the recipe's data (read and parsed: :func:`runner.data.check.check_data`) and that run
    folders can be written (:func:`runner.spec.paths.check_runs_dir`).

    Raises:
        InputError: one line naming the field, file or folder.
    """
    try:
        check_data(recipe.data)
        # Chat, completion and eval data are tokenized here, every row checked, into the cache the ranks
        # read (runner/data/prepare.py): a bad row anywhere is one line before anything is recorded.
        from runner.data.prepare import prefill

        prefill(recipe)
    except DataError as exc:
        field = str(exc).split(":", 1)[0] if str(exc).startswith("data.") else "data.source"
        raise InputError(str(exc), field=field, problem=str(exc)) from None
    try:
        check_runs_dir()
    except FolderError as exc:
        raise InputError(f"run folders: {exc}") from None


def input_warnings(recipe: Recipe) -> list[str]:
    """What the user should know before launch about the recipe's inputs (one line each)."""
    warnings = []
    if recipe.model.trust_remote_code:
        warnings.append(f"model.trust_remote_code = true: {recipe.model.name}'s own Python code from the model "
                        "folder or the hub will run in every rank")
    return warnings
