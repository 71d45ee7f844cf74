"""Before step 1 the trainer journals what it is doing: tokenizing, loading the model, preparing the
strategy (phase events), under every strategy (the shared matrix's sweep of quickstart); the watcher
stores the time to first step split at those moments (runner.spec.first_step)."""

from __future__ import annotations

import json

import pytest

from runner.spec import events as ev
from runner.spec.first_step import STAGES
from tests.support.matrix import CORE, Matrix


def test_every_run_journals_its_phases_before_the_start_event(matrix: Matrix) -> None:
    for name in CORE:
        lines = (matrix[name].run_dir / ev.EVENTS_FILE).read_text().splitlines()
        kinds = [(e["type"], e.get("phase")) for e in map(json.loads, lines)]
        start = kinds.index(("start", None))
        assert kinds[:start] == [("phase", "tokenizing"), ("phase", "loading_model"), ("phase", "preparing")], name
        assert json.loads(lines[1])["detail"] == "builtin:tiny-llama, lora", lines[1]  # words, not a repr
        assert ev.typed(json.loads(lines[0])) is not None  # a typed trainer event, stored like the rest
        ttfs = matrix[name].summary["time_to_first_step"]
        seconds = ttfs["seconds"]
        assert list(seconds) == list(STAGES), (name, ttfs)  # no resume, no compile: neither was journaled
        assert all(v is not None and v >= 0 for v in seconds.values()), (name, ttfs)
        assert ttfs["total"] == pytest.approx(sum(seconds.values()), abs=0.05), (name, ttfs)  # they tile it (10 ms tick)
        # One process runs in the launcher's own interpreter: its start is the launcher's (to the tick).
        assert (seconds["spawn"] < 0.05) == (name == "single"), (name, ttfs)
