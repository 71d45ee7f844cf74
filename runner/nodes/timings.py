"""Every timing of a multi-node run in one place: how often a node agent reports, when a silent node is
taken for dead, and how long the nodes wait for one another.

Each default is decided here only. A launch reads them from the environment (``FTUI_NODE_HEARTBEAT_S``,
``FTUI_NODE_DEAD_AFTER_S``, ``FTUI_NODE_POLL_S``, ``FTUI_NODE_JOIN_WAIT_S``, ``FTUI_NODE_REFUSE_WAIT_S``:
:meth:`NodeTimings.from_env`), so every node of a job gets the same ones from its launcher (an sbatch
script, a test); code that builds a :class:`runner.nodes.agent.NodeAgent` passes them directly.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields

ENV_PREFIX = "FTUI_NODE_"
"""``FTUI_NODE_<FIELD IN CAPITALS>`` sets a field of :class:`NodeTimings` (seconds)."""


class TimingsError(ValueError):
    """A timing from the environment is not a usable number of seconds (one line naming the variable)."""


@dataclass(frozen=True)
class NodeTimings:
    """The timings of one node agent (seconds)."""

    heartbeat_s: float = 2.0
    """How often an agent renews its heartbeat and reads the run's stop requests."""
    dead_after_s: float = 30.0
    """A node whose agent has not renewed its heartbeat for this long is taken for dead."""
    poll_s: float = 1.0
    """How often an agent waiting on the other nodes (their joining, their end) reads the store again."""
    join_wait_s: float = 600.0
    """How long a resuming node waits for the other nodes to join before it gives up."""
    refuse_wait_s: float = 10.0
    """How long a node that refuses to start waits for the other nodes' end, to settle the run itself."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise TimingsError(f"{env_name(f.name)}: {value!r}: not a number of seconds (0 or more)")
        if self.dead_after_s <= self.heartbeat_s:
            raise TimingsError(f"{env_name('dead_after_s')}: {self.dead_after_s:g} s: must exceed the heartbeat "
                               f"({env_name('heartbeat_s')}, {self.heartbeat_s:g} s), or a live node looks dead")

    @property
    def settle_wait_s(self) -> float:
        """How long a node that ended waits for the others to end or go silent, so that a node that died is
        noticed by its stale heartbeat: past :attr:`dead_after_s` by two heartbeats and a poll."""
        return self.dead_after_s + 2 * self.heartbeat_s + self.poll_s

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> NodeTimings:
        """The defaults, with each one the environment sets replaced.

        Raises:
            TimingsError: a variable that is not a number of seconds, or a death timeout not past the heartbeat.
        """
        env = os.environ if env is None else env
        values: dict[str, float] = {}
        for f in fields(cls):
            text = env.get(env_name(f.name))
            if text is None or not text.strip():
                continue
            try:
                values[f.name] = float(text)
            except ValueError:
                raise TimingsError(f"{env_name(f.name)}: {text!r}: not a number of seconds") from None
        return cls(**values)


def env_name(field_name: str) -> str:
    """The environment variable of a :class:`NodeTimings` field: ``heartbeat_s`` -> ``FTUI_NODE_HEARTBEAT_S``."""
    return ENV_PREFIX + field_name.upper()
