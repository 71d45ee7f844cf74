"""Byte sizes: parsing what users type (``48GiB``, ``80GB``). No imports from the project."""

from __future__ import annotations

import math


def parse_bytes(text: str, allow_zero: bool = False) -> int:
    """``48GiB``, ``80GB``, ``3.5GiB``, ``512MiB`` or a plain byte count.

    Raises:
        ValueError: one line, for anything else, and for sizes that are not finite or not positive (zero is
            accepted with ``allow_zero``).
    """
    units = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
             "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
    s = text.strip().lower().replace(" ", "")
    i = len(s)
    while i > 0 and not (s[i - 1].isdigit() or s[i - 1] == "."):
        i -= 1
    num, unit = s[:i], s[i:]
    expected = f"{text!r}: expected a size like 48GiB, 80GB, 512MiB or a byte count"
    if not num or unit not in units:
        raise ValueError(expected)
    try:
        value = float(num) * units[unit]
    except ValueError:
        raise ValueError(expected) from None
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{text!r}: must be a finite size {'of at least 0' if allow_zero else 'above 0'}")
    if value >= 2**63:
        raise ValueError(f"{text!r}: too large a size")
    return int(value)
