"""The price of one device-hour, from the user's environment (``FTUI_PRICE_PER_DEVICE_HOUR="2.50 USD"``).

Unset: no cost is shown (the ledger says why). Set: an amount and a currency code, e.g. ``2.50 USD`` or
``0.9 EUR``; anything else is refused in one line naming the variable (:class:`PriceError`).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

PRICE_ENV = "FTUI_PRICE_PER_DEVICE_HOUR"
_FORM = re.compile(r"\s*(\d+(?:\.\d+)?)\s+([A-Za-z]{3})\s*")


class PriceError(ValueError):
    """The price variable holds something that is not ``<amount> <currency>``."""


@dataclass(frozen=True)
class Price:
    """What one device (a GPU, or a rank on CPU) costs per hour of a run's wall time."""

    amount: float
    currency: str

    def label(self) -> str:
        """``2.50 USD per device-hour (FTUI_PRICE_PER_DEVICE_HOUR)``."""
        return f"{self.amount:g} {self.currency} per device-hour ({PRICE_ENV})"


def parse_price(text: str) -> Price:
    """``"2.50 USD"`` to a :class:`Price`; raises :class:`PriceError` naming the variable otherwise."""
    match = _FORM.fullmatch(text)
    amount = float(match.group(1)) if match else math.nan
    if match is None or not math.isfinite(amount):
        raise PriceError(f"{PRICE_ENV}={text!r}: expected an amount and a currency code, e.g. \"2.50 USD\"")
    return Price(amount, match.group(2).upper())


def configured_price(environ: Mapping[str, str] | None = None) -> Price | None:
    """The price the environment sets (read at each call), None when unset or empty."""
    text = (os.environ if environ is None else environ).get(PRICE_ENV, "").strip()
    return parse_price(text) if text else None
