"""A run's status values, a queue entry's, and the one line that says what a stopped or killed run left behind.

Every module that tests or lists a status reads it here (the store, the watcher, the command line's
choices, the dashboard), so that a status exists in one place only.

* ``stopped``: a graceful stop (``ftui stop``, Ctrl-C, SIGTERM) that the ranks finished themselves: their
  ``end`` event is journaled; :func:`ended_words` says whether a checkpoint is there to resume from.
* ``killed``: the ranks were SIGKILLed before they ended (``ftui stop --kill``, the dashboard's kill, a
  second Ctrl-C, or a grace period that ran out): whatever the last step was saving is not to be trusted.
"""

from __future__ import annotations

LIVE = ("created", "running")
"""A run being prepared or watched."""
TERMINAL = ("completed", "stopped", "killed", "failed")
"""A run that ended; its status does not change again."""
STATUSES = LIVE + TERMINAL
"""Every status a run can have, in the order a run goes through them."""
ENDED_BY_USER = ("stopped", "killed")
"""A run a stop ended (``ftui stop``, Ctrl-C, SIGTERM, the dashboard): a sweep or search ends with it."""


def ended_words(status: str, last_step: int | None, checkpoint_step: int | None, checkpoint: str | None) -> str:
    """The one line a stopped or killed run shows beside its status: the step it ended at and the newest
    complete checkpoint it can be resumed from (``checkpoint at step 40: PATH``), or ``no checkpoint``."""
    at = f"{status} at step {last_step if last_step is not None else 0}"
    if checkpoint is None:
        return f"{at}; no checkpoint"
    return f"{at}; checkpoint at step {checkpoint_step if checkpoint_step is not None else '?'}: {checkpoint}"


QUEUED = "queued"
"""A queue entry waiting for its devices (``ftui queue add``)."""
STARTED = "running"
"""A queue entry the queue runner started: its run is recorded (``run_id``), live or ended."""
DONE = "done"
"""A queue entry whose run ended (its status is the run's)."""
NOT_STARTED = "failed"
"""A queue entry the queue runner could not start (its ``error`` says why): shown as "failed to start"."""
QUEUE_STATUSES = (QUEUED, STARTED, DONE, NOT_STARTED)
"""Every status of a queue entry, in the order an entry goes through them."""
PENDING = (QUEUED, STARTED)
"""Entries the queue runner still has work with: one to start, or one whose run it waits on."""


def entry_state(status: str, run_status: str | None) -> str:
    """Where a queue entry stands: its stored ``status``, except that an entry whose run ended
    (``run_status``) is ``done`` though the queue runner has not recorded it yet (it does at its next look)."""
    if status == STARTED and run_status in TERMINAL:
        return DONE
    return status
