"""An open dashboard and a run whose watcher died: within the check's period (``watcher_check_s``) the run
gets its true status from its folder, as ``ftui recover`` gives it, rather than showing ``running`` with a
ticking duration until someone runs ``ftui recover`` by hand."""

from __future__ import annotations

from pathlib import Path

from runner.watch import journal
from store import Store
from tests.integration.test_recover import record_orphan_run
from tests.support.dashboard import wait_for
from tui.app import make_app


async def test_the_dashboard_settles_a_run_whose_watcher_and_ranks_died(store: Store, tmp_path: Path) -> None:
    run_id, run_dir = record_orphan_run(store, tmp_path / "runs", 0, None)  # no process of it is left
    app = make_app(store, refresh_s=0.1, watcher_check_s=0.2)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: getattr(store.get_run(run_id), "status", None) != "running", timeout=60,
                       what="the dead watcher's run to leave running")
        await wait_for(pilot, lambda: any(r.id == run_id and r.status == "failed" for r in app.runs), timeout=60,
                       what="the Runs screen to show it failed")
    run = store.get_run(run_id)
    assert run is not None and run.status == "failed" and run.ended_at is not None
    assert run.error is not None and run.error.startswith("watcher and ranks gone; last step 3"), run.error
    exits = [e for e in journal.read_jsonl(run_dir / journal.ORCHESTRATOR_FILE) if e["type"] == "exit"]
    assert exits and exits[-1]["recovered"], "the end is journaled first, as recovery does"
