"""Resume from the app: `R` on the Runs screen goes through `ftui resume`'s path, and the
Monitor shows a resumed run's loss curve joined to its parent's."""

from __future__ import annotations

from pathlib import Path

from textual.message import Message

from store import Store
from tests.support.dashboard import wait_for
from tui.app import make_app
from tui.app.messages import LaunchFailed
from tui.app.poll import MonitorFeed
from tui.app.screens.runs import RunsScreen


def _run(store: Store, name: str, steps: range, parent: int | None = None, at: int | None = None,
         run_dir: str = "") -> int:
    rid = store.create_run(name=name, recipe_text="", recipe_hash="", strategy="single", nproc=1, method="lora",
                           model="builtin:tiny-llama", run_dir=run_dir, resumed_from=parent)
    store.ingest(rid, [{"seq": i, "type": "step", "time": 1000.0 + s, "step": s, "loss": 9.0 - 0.1 * s}
                       for i, s in enumerate(steps)])
    store.update_run(rid, status="stopped" if parent is None else "completed")
    if parent is not None:
        store.update_run(rid, summary={"resumed_from": {"run_id": parent, "checkpoint": "x", "step": at}})
    return rid


def test_the_monitor_joins_a_resumed_runs_curve_to_its_parents(store: Store) -> None:
    parent = _run(store, "parent", range(1, 9))
    child = _run(store, "child", range(5, 11), parent, 4)
    snapshot = MonitorFeed(store, child).poll()
    assert snapshot is not None
    feed = MonitorFeed(store, child)
    feed.poll()
    assert [m[0] for m in feed.metrics] == list(range(1, 11))
    assert feed.losses[:4] == [9.0 - 0.1 * s for s in range(1, 5)]


async def test_resume_key_without_a_checkpoint_says_why(store: Store, tmp_path: Path) -> None:
    folder = tmp_path / "runs" / "old"
    folder.mkdir(parents=True)
    _run(store, "no-checkpoint", range(1, 4), run_dir=str(folder))
    seen: list[Message] = []
    app = make_app(store)
    async with app.run_test(size=(120, 40), message_hook=seen.append) as pilot:
        await pilot.pause()
        assert isinstance(app.screen, RunsScreen)
        await wait_for(pilot, lambda: app.screen.query_one("DataTable").row_count == 1, what="the run listed")
        await pilot.press("R")
        await wait_for(pilot, lambda: any(isinstance(m, LaunchFailed) for m in seen), what="the refusal")
    failed = [m for m in seen if isinstance(m, LaunchFailed)]
    assert failed and "no complete checkpoint" in failed[0].error
    assert len(store.list_runs()) == 1  # nothing recorded
