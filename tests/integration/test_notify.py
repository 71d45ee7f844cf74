"""`ftui run --notify` and the dashboard's setting ring the bell and send a desktop notification when a
run ends. The boundary is `notify-send`: a fake script on PATH records its argv."""

from __future__ import annotations

import io
import json
import os
import time
from pathlib import Path

import pytest

from store import Store
from tui import notify

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def fake_notify_send(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A ``notify-send`` on PATH that appends its argv (JSON, one call a line) to a file."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "notify-send.calls"
    script = bin_dir / "notify-send"
    script.write_text("#!/usr/bin/env python3\nimport json, sys\n"
                      f"open({str(record)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return record


def calls(record: Path) -> list[list[str]]:
    return [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []


def test_a_failed_run_rings_and_notifies_with_its_name_as_text(fake_notify_send: Path, tmp_path: Path) -> None:
    bell = io.StringIO()
    name = "x; touch $HOME/pwned `id` $(id)"  # an argv element, never a shell word
    argv = notify.run_ended(7, name, "failed", "rank 1 (pid 12) was killed by SIGKILL", stream=bell)
    assert bell.getvalue() == "\a"
    assert argv is not None and calls(fake_notify_send) == [argv[1:]]
    assert calls(fake_notify_send)[0] == ["--app-name=ftui", "--urgency=critical", "--", "ftui: run 7 failed",
                                          f"{name}: rank 1 (pid 12) was killed by SIGKILL"]


def test_without_notify_send_the_bell_still_rings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on it
    bell = io.StringIO()
    assert notify.run_ended(1, "q", "completed", stream=bell) is None
    assert bell.getvalue() == "\a"


async def test_the_dashboard_setting_notifies_when_a_run_it_saw_running_ends(
        fake_notify_send: Path, tmp_path: Path) -> None:
    from tests.support.dashboard import NO_WATCHER_CHECK
    from tui.app import make_app

    store = Store(f"sqlite:///{tmp_path / 'ftui.db'}")
    run_id = store.create_run(name="quickstart", recipe_text="", recipe_hash="", strategy="single", nproc=1,
                              method="lora", model="builtin:tiny-llama", run_dir="")
    store.update_run(run_id, status="running")
    app = make_app(store, refresh_s=0.2, notify_on_end=False, watcher_check_s=NO_WATCHER_CHECK)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.5)
        await pilot.press("b")  # the setting: on
        assert app.notify_on_end
        store.update_run(run_id, status="failed", error="hang: no step for 300 s")
        deadline = time.monotonic() + 30
        while not calls(fake_notify_send) and time.monotonic() < deadline:
            await pilot.pause(0.1)
    assert calls(fake_notify_send) == [["--app-name=ftui", "--urgency=critical", "--", f"ftui: run {run_id} failed",
                                        "quickstart: hang: no step for 300 s"]]


def test_ftui_run_notify_rings_and_notifies_when_the_run_ends(fake_notify_send: Path, tmp_path: Path) -> None:
    """A run of one step of a scripted rank (``ftui run --script``: the watcher's end, no model trained)."""
    import subprocess
    import sys

    from tests.support.scripted_rank import SCRIPT

    env = {**os.environ, "FTUI_HOME": str(tmp_path / "home"), "PYTHONUNBUFFERED": "1"}
    env.pop("FTUI_DB", None)
    proc = subprocess.run([sys.executable, "-m", "tui.cli", "run", "--script", str(SCRIPT), "--notify",
                           "--name", "notified", "--sample-interval", "0", "--", "--steps", "1", "--step-s", "0"],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "\a" in proc.stderr
    assert calls(fake_notify_send) == [["--app-name=ftui", "--urgency=normal", "--", "ftui: run 1 completed",
                                        "notified"]]


def test_a_hang_rings_and_notifies_where_each_rank_is(fake_notify_send: Path, tmp_path: Path) -> None:
    """``ftui run --notify``: the stacks of a hang notify at once, before the run is stopped."""
    from tui.cli.run import notify_hang

    store = Store(f"sqlite:///{tmp_path / 'ftui.db'}")
    run_id = store.create_run(name="ddp [x]", recipe_text="", recipe_hash="", strategy="ddp", nproc=2,
                              method="lora", model="m", run_dir=str(tmp_path / "run"))
    seen: list[dict] = []
    on_event = notify_hang(seen.append, store, run_id)
    on_event({"type": "step", "step": 1})
    assert calls(fake_notify_send) == [], "only the stacks of a hang notify"
    where = "rank 0 in tokenize (runner/data/blocks.py:80); rank 1 in all_reduce (runner/rank/loop.py:412)"
    on_event({"type": "stacks", "summary": where})
    assert [e["type"] for e in seen] == ["step", "stacks"]
    assert calls(fake_notify_send) == [["--app-name=ftui", "--urgency=normal", "--", f"ftui: run {run_id} hung",
                                        f"ddp [x]: {where}"]]
