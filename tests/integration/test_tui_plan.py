"""Pilot tests of the Plan view over a store filled by hand with a plan's trials and its record (nothing is
trained: the launching path is ``ftui plan``'s own, tests/e2e/test_plan.py): the decision on top, a row per
candidate with those not raced and why, refreshed as a trial ends; the commit key on a plan without a winner
says why and starts nothing; the palette's Plans list; Compose's plan key asks before anything starts."""

from __future__ import annotations

import os
import re
from typing import Any

from textual.command import CommandList, CommandPalette
from textual.widgets import DataTable, Static

from runner.service import plan_record
from runner.service.plan_record import Process
from store import Store
from tests.support.dashboard import NO_WATCHER_CHECK, wait_for
from tests.support.plans import add_trial, fixed_setup, record
from tui.app import make_app
from tui.app.screens.modals import PromptScreen
from tui.app.screens.plan import PlanScreen, PlansScreen


def shown(screen: Any, widget: str) -> str:
    return str(screen.query_one(widget, Static).render())


def rows(screen: Any) -> dict[str, list[str]]:
    table = screen.query_one("#plan-table", DataTable)
    return {str(table.get_row_at(i)[0]): [str(c) for c in table.get_row_at(i)] for i in range(table.row_count)}


async def open_plan(app: Any, pilot: Any, pid: str) -> PlanScreen:
    app.push_screen(PlanScreen(pid))
    await wait_for(pilot, lambda: isinstance(app.screen, PlanScreen) and app.screen.view is not None,
                   what="the plan's first read")
    await pilot.pause()
    return app.screen  # type: ignore[no-any-return]


async def test_the_view_shows_the_decision_every_candidate_and_those_not_raced(store: Store) -> None:
    setup, command = fixed_setup(repeat=2)
    for n in range(2):  # ddp leads beyond the spread of the repeats: the decision names it
        add_trial(store, setup, "single", 1000.0 + 10 * n, n=n)
        add_trial(store, setup, "ddp x2", 2000.0 + 100 * n, n=n)
    add_trial(store, setup, "zero1 x2", None, status="failed")
    record(setup, command, over_budget=["zero1 x2 [launch.engine=torch]"])
    app = make_app(store, refresh_s=0.2, watcher_check_s=NO_WATCHER_CHECK)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await open_plan(app, pilot, setup.pid)
        assert shown(screen, "#plan-decision").startswith("Use ddp x2")
        assert shown(screen, "#plan-status").startswith("ended: the --budget left 1 trial(s) out")
        found = rows(screen)
        assert list(found) == ["ddp x2", "single", "zero1 x2", "zero1 x2 [launch.engine=torch]"]  # text, not markup
        assert found["ddp x2"][1:3] == ["leader", "2,050 (2,000-2,100, n=2)"]
        assert found["single"][1] == "slower" and found["zero1 x2"][1] == "failed"
        assert found["zero1 x2 [launch.engine=torch]"][1:3] == ["not raced", "-"]
        notes = shown(screen, "#plan-notes")
        assert "zero1 x2 [launch.engine=torch]: over the --budget" in notes and "zero1 x2: out of memory" in notes
        assert "continue: ftui plan recipes/quickstart.toml --set=data.context_length=64" in notes
        await pilot.press("enter")  # the leader's latest trial in the Monitor
        await wait_for(pilot, lambda: type(app.screen).__name__ == "MonitorScreen", what="the trial's Monitor")
        assert getattr(app.screen, "run_id", None) == int(found["ddp x2"][-1].split(", ")[-1])


async def test_a_plan_in_progress_refreshes_as_its_trial_ends(store: Store) -> None:
    """Raced by a live process (this test's): the running trial, the candidates waiting their turn; the
    commit key waits for the race; the trial's end shows without a key."""
    setup, command = fixed_setup()
    add_trial(store, setup, "single", 1000.0)
    running = add_trial(store, setup, "ddp x2", None, status="running")
    record(setup, command, ended=False, process=Process.of(os.getpid()))
    app = make_app(store, refresh_s=0.2, watcher_check_s=NO_WATCHER_CHECK)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await open_plan(app, pilot, setup.pid)
        assert f"run {running} (ddp x 2) running" in shown(screen, "#plan-status")
        found = rows(screen)
        assert found["ddp x2"][1] == "running" and found["zero1 x2"][1] == "waiting"
        assert "zero1 x2: not raced yet: the plan is racing" in shown(screen, "#plan-notes")
        await pilot.press("c")
        await wait_for(pilot, lambda: "is still racing: commit when its process ends" in shown(screen, "#plan-status"),
                       what="the commit key's refusal")
        store.update_run(running, status="completed", tokens_per_s=1500.0)
        await wait_for(pilot, lambda: rows(screen)["ddp x2"][2] == "1,500", what="the ended trial's figures")
        assert shown(screen, "#plan-decision").startswith("Cannot tell")


async def test_commit_without_a_winner_says_why_and_starts_nothing(store: Store) -> None:
    setup, command = fixed_setup(strategies=("single", "ddp"))
    add_trial(store, setup, "single", 1000.0)
    add_trial(store, setup, "ddp x2", 1500.0)
    record(setup, command)
    app = make_app(store, refresh_s=0.2, watcher_check_s=NO_WATCHER_CHECK)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await open_plan(app, pilot, setup.pid)
        assert shown(screen, "#plan-status").startswith("ended: every candidate raced")
        await pilot.press("c")
        await wait_for(pilot, lambda: "--commit: the plan names no winner" in shown(screen, "#plan-status"),
                       what="why nothing is committed")
        status = shown(screen, "#plan-status")
        assert "so nothing is launched (Cannot tell: ddp x2 had 1.50x the tokens/s of single" in status
        assert "Traceback" not in status and not plan_record.log_path(setup.pid).exists()
        assert len(store.list_runs()) == 2  # no run started


async def test_the_palette_lists_the_plans_and_opens_one(store: Store) -> None:
    setup, command = fixed_setup(strategies=("single", "ddp"))
    add_trial(store, setup, "single", 1000.0)
    fresh, fresh_command = fixed_setup(strategies=("single",), pid="plan-quickstart-fresh0000000")
    record(fresh, fresh_command, ended=False)  # recorded, no trial yet: its process is gone
    app = make_app(store, refresh_s=0.2, watcher_check_s=NO_WATCHER_CHECK)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("ctrl+p")
        await wait_for(pilot, lambda: isinstance(app.screen, CommandPalette), what="the palette")
        await pilot.press(*"plans")
        await wait_for(pilot, lambda: str(app.screen.query_one(CommandList).get_option_at_index(0).prompt)
                       .startswith("Plans"), what="the palette's Plans")
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, PlansScreen) and app.screen.plans is not None,
                       what="the plans")
        table = app.screen.query_one(DataTable)
        listed = [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]
        assert listed == [[fresh.pid, "quickstart", "0", "not finished"], [setup.pid, "", "1", "no record here"]]
        await pilot.press("down", "enter")
        await wait_for(pilot, lambda: isinstance(app.screen, PlanScreen) and app.screen.view is not None,
                       what="the plan's view")
        assert list(rows(app.screen)) == ["single"]  # from its stored trial alone
        assert shown(app.screen, "#plan-status").startswith("no record of this plan on this host")


async def test_compose_plan_key_asks_before_racing(store: Store) -> None:
    """ctrl+r checks the form's plan as ``ftui plan`` does and asks how many trials per candidate; escape
    starts nothing."""
    app = make_app(store, refresh_s=0.2, watcher_check_s=NO_WATCHER_CHECK)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("2")
        await wait_for(pilot, lambda: getattr(app.screen, "recipe", None) is not None, what="the Compose form")
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: isinstance(app.screen, PromptScreen), what="the plan's question")
        question = str(app.screen.query_one("Label").render())
        assert re.match(r"Race \d+ of \d+ candidates of this recipe on this host, 8 steps each", question), question
        await pilot.press("escape")
        await pilot.pause()
        assert not list(plan_record.path("x").parent.glob("*")) and store.list_runs() == []
