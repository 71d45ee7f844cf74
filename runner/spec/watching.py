"""The defaults of how a run is watched, in one place for the watcher and the command line's flags
(which read them here without importing the watcher)."""

from __future__ import annotations

SAMPLE_INTERVAL_S = 0.5
"""Seconds between telemetry readings; 0 turns telemetry off."""

HANG_AFTER_S = 300.0
"""A hang is flagged when the run made no progress for this long (no event from the trainer, every rank
and GPU idle), and the run is stopped when it is still hung this long after the flag."""

WATCHER_CHECK_S = 5.0
"""How often an open dashboard checks that each run it shows running on this host still has a watcher
(:func:`runner.service.recover.recover_all`): a run whose watcher died shows ``running`` no longer than this."""

GRACE_S = 30.0
"""Seconds the ranks get to finish their step, save and exit before SIGKILL."""

QUEUE_POLL_S = 2.0
"""How often a host's queue runner reads the store to start the next queued run when a device frees up
(``FTUI_QUEUE_POLL_S`` sets it; the runner also wakes at once when a run it started ends): at most this
long between one queued run's end and the next one's start."""
