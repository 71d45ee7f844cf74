"""Run uids: ULIDs (48-bit millisecond time + 80 random bits, Crockford base32, 26 characters).

Globally unique without coordination (two hosts, two databases), never reused, and they sort by creation
time, so a folder of runs named by uid lists oldest first.
"""

from __future__ import annotations

import secrets
import time

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def new_uid(now: float | None = None) -> str:
    """A fresh ULID string (26 characters of ``0-9A-Z`` without I, L, O, U).

    Args:
        now: Seconds since the epoch to encode (default: the current time).
    """
    ms = int((time.time() if now is None else now) * 1000) & ((1 << 48) - 1)
    value = (ms << 80) | secrets.randbits(80)
    return "".join(_ALPHABET[(value >> shift) & 31] for shift in range(125, -1, -5))
