"""The run queue as people and scripts read it (``ftui queue``, the Runs screen's queue section): each entry's
place in line and where it stands, in the words of docs/running.md ("Queue"). Text from a recipe or a run
(names, paths, reasons) is always text, never markup."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich import box
from rich.table import Table
from rich.text import Text

from runner.spec.status import DONE, NOT_STARTED, QUEUED, STARTED, entry_state
from store.queue import QueueEntryInfo

STATE_STYLE = {QUEUED: "cyan", STARTED: "yellow", DONE: "green", NOT_STARTED: "red"}


def positions(entries: Sequence[QueueEntryInfo]) -> dict[int, int]:
    """Each waiting entry's place in its host's line (1: it starts next), by entry id; ``entries`` in line
    order (as :func:`store.queue.entries` gives them)."""
    seen: dict[str, int] = {}
    out = {}
    for entry in entries:
        if entry.status == QUEUED:
            seen[entry.host] = seen.get(entry.host, 0) + 1
            out[entry.id] = seen[entry.host]
    return out


def state_words(entry: QueueEntryInfo) -> str:
    """``queued``, ``running (run 14)``, ``done (run 14, completed)`` or ``failed to start (REASON)``."""
    state = entry_state(entry.status, entry.run_status)
    if state == QUEUED:
        return "queued"
    if state == STARTED:
        return f"running (run {entry.run_id})" if entry.run_id is not None else "starting"
    if state == DONE:
        return f"done (run {entry.run_id}, {entry.run_status})" if entry.run_id is not None else "done (its run was deleted)"
    return f"failed to start ({entry.error or 'no reason recorded'})"


def queue_table(entries: Sequence[QueueEntryInfo]) -> Table:
    """Every entry, in line order: position (waiting ones), id, name, recipe, state."""
    places = positions(entries)
    table = Table(title="queue", box=box.SIMPLE_HEAD, title_justify="left")
    for header in ("pos", "id", "name", "recipe", "state"):
        table.add_column(header, overflow="fold", justify="right" if header in ("pos", "id") else "left")
    for entry in entries:
        state = entry_state(entry.status, entry.run_status)
        table.add_row(str(places[entry.id]) if entry.id in places else "-", str(entry.id), Text(entry.name),
                      Text(entry.recipe_source or "-"), Text(state_words(entry), style=STATE_STYLE.get(state, "")))
    return table


def queue_json(entries: Sequence[QueueEntryInfo]) -> list[dict[str, Any]]:
    """The entries for scripts (``ftui queue --format json``): what the table shows, and the devices, host,
    times and reason."""
    places = positions(entries)
    return [{"id": e.id, "position": places.get(e.id), "name": e.name, "recipe": e.recipe_source,
             "state": entry_state(e.status, e.run_status), "run_id": e.run_id, "run_status": e.run_status,
             "error": e.error, "host": e.host, "devices": e.devices,
             "created_at": e.created_at.isoformat(), "started_at": e.started_at.isoformat() if e.started_at else None,
             "ended_at": e.ended_at.isoformat() if e.ended_at else None} for e in entries]


def queue_lines(entries: Sequence[QueueEntryInfo], most: int) -> list[Text]:
    """The Runs screen's queue section: one line per entry still to see to (running, waiting, not started),
    at most ``most`` of them, then how many more ``ftui queue`` lists."""
    places = positions(entries)
    shown = [e for e in entries if entry_state(e.status, e.run_status) != DONE]
    lines = []
    for entry in shown[:most]:
        state = entry_state(entry.status, entry.run_status)
        place = f"{places[entry.id]}." if entry.id in places else "·"
        lines.append(Text.assemble(f"{place:>3} #{entry.id} ", (entry.name, "bold"), f"  {entry.recipe_source or '-'}  ",
                                   (state_words(entry), STATE_STYLE.get(state, ""))))
    if len(shown) > most:
        lines.append(Text(f"    and {len(shown) - most} more: ftui queue lists them"))
    return lines
