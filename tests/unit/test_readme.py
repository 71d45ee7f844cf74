"""The README is a front door that stays true: every command in it is run by a test (tests/support/readme.py
says which), CI runs its test command as written, its key table is the dashboard's real bindings, and every
link of the README and of docs/ leads to a file (and heading) that exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.support import ROOT
from tests.support.readme import CI, ELSEWHERE, README, RUN, commands

TEST_COMMAND = 'pip install torch==2.13.0 -e ".[test]" && python -m pytest'


def test_every_readme_command_is_run_by_a_test() -> None:
    found = commands()
    assert set(found) == set(RUN) | set(ELSEWHERE), "a README command without its test (tests/support/readme.py)"
    for command, where in ELSEWHERE.items():
        if where == ".ci/run":
            continue
        path, name = where.split("::")
        tree = ast.parse((ROOT / path).read_text())
        defined = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
        assert name in defined, f"{command!r} is mapped to {where}, which does not exist"


def test_the_commands_are_read_from_the_bash_blocks_only() -> None:
    text = "```bash\nftui a --x 1   # comment\nftui b \\\n  --y && pip c\n```\n```\nftui not-a-command\n```\n"
    assert commands(text) == ["ftui a --x 1", "ftui b --y", "pip c"]


def test_ci_runs_the_readme_test_command_as_written() -> None:
    assert f"```bash\n{TEST_COMMAND}\n```" in README.read_text()
    # as written, ending CI with its status when the install fails too (an && list is exempt from set -e)
    assert f"{TEST_COMMAND} || exit $?" in CI.read_text().splitlines()


def test_the_readme_is_a_front_door_with_its_picture() -> None:
    text = README.read_text()
    assert 150 <= len(text.splitlines()) <= 200
    picture = ROOT / "docs" / "dashboard.png"
    assert "](docs/dashboard.png)" in text and picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert picture.stat().st_size < 300_000
    assert "python docs/screenshot.py" in text and (ROOT / "docs" / "screenshot.py").is_file()


KEY_NAMES = {"?": "question_mark", "/": "slash", "esc": "escape"}


def _bindings(owner: type) -> set[str]:
    return {key.strip() for b in owner.BINDINGS for key in b.key.split(",")}  # type: ignore[attr-defined]


def test_the_key_table_is_the_dashboards_bindings() -> None:
    """Each key the README names is bound on the screen it names, and every key of the app and of the
    Runs, Compose, Monitor and Plan screens is in the table (the command palette is Textual's ctrl+p)."""
    from tui.app.app import FtuiApp
    from tui.app.screens.compare import CompareScreen
    from tui.app.screens.compose import ComposeScreen
    from tui.app.screens.devices import DevicesScreen
    from tui.app.screens.monitor import MonitorScreen
    from tui.app.screens.plan import PlanScreen
    from tui.app.screens.runs import RunsScreen

    owners = {"any": FtuiApp, "Runs": RunsScreen, "Compose": ComposeScreen, "Monitor": MonitorScreen,
              "Compare": CompareScreen, "Devices": DevicesScreen, "Plan": PlanScreen}
    table = re.search(r"^\| key \| screen \| what it does \|\n\|[-|]+\|\n((?:\|.*\n)+)", README.read_text(), re.M)
    assert table, "the README's key table"
    named: dict[str, set[str]] = {name: set() for name in owners}
    for row in table.group(1).splitlines():
        keys_cell, screens_cell = row.split("|")[1:3]
        keys = {KEY_NAMES.get(k, k if len(k) == 1 else k.lower()) for k in re.findall(r"`([^`]+)`", keys_cell)}
        for screen in (s.strip() for s in screens_cell.split(",")):
            named[screen] |= keys
    assert FtuiApp.COMMAND_PALETTE_BINDING == "ctrl+p"
    named["any"].discard("ctrl+p")
    for screen, owner in owners.items():
        assert named[screen] <= _bindings(owner), (screen, named[screen] - _bindings(owner))
    for screen in ("any", "Runs", "Compose", "Monitor", "Plan"):
        assert _bindings(owners[screen]) <= named[screen], (screen, _bindings(owners[screen]) - named[screen])


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def _links(page: Path) -> list[tuple[str, str]]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    return [(m.group(1), m.group(2) or "") for m in re.finditer(r"\]\(([^)#\s:]+\.(?:md|png))(?:#([^)]+))?\)", text)]


@pytest.mark.parametrize("page", [README, *sorted((ROOT / "docs").glob("*.md"))], ids=lambda p: p.name)
def test_links_lead_to_pages_and_headings_that_exist(page: Path) -> None:
    for target, anchor in _links(page):
        path = (page.parent / target).resolve()
        assert path.is_file(), f"{page.name}: link to {target}, which does not exist"
        if anchor:
            headings = re.findall(r"^#+ (.+)$", path.read_text(), re.M)
            assert anchor in {_slug(h) for h in headings}, f"{page.name}: {target}#{anchor}: no such heading"
