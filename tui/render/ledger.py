"""The ledger's lines (``ftui show``, the end of ``ftui run``) and cells (``ftui compare``, the report):
device-hours, energy, cost, tokens per joule and per unit of cost, each with its source
(:mod:`runner.analysis.ledger`)."""

from __future__ import annotations

from runner.analysis.ledger import Figures


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def energy_text(joules: float | None) -> str:
    """``1.23 kJ`` / ``456 J`` / ``-``."""
    if joules is None:
        return "-"
    return f"{joules / 1000:.2f} kJ" if joules >= 1000 else f"{joules:.0f} J"


def cost_text(figures: Figures) -> str:
    """``0.0042 USD`` / ``-``."""
    return "-" if figures.cost is None else f"{figures.cost:.4g} {figures.currency}"


def per_cost_text(figures: Figures) -> str:
    """``1.2e+06 tokens/USD`` / ``-``."""
    return "-" if figures.tokens_per_cost is None else f"{figures.tokens_per_cost:.3g}/{figures.currency}"


def ledger_rows(figures: Figures) -> list[tuple[str, str, str]]:
    """(figure, value, source) for the run's table."""
    return [
        ("device-hours", _num(figures.device_hours, ".4g"), figures.device_hours_source),
        ("energy", energy_text(figures.energy_j), figures.energy_source),
        ("tokens per joule", _num(figures.tokens_per_joule, ".3g"), figures.tokens_per_joule_source),
        ("cost", cost_text(figures), figures.cost_source),
        ("tokens per unit of cost", per_cost_text(figures), figures.tokens_per_cost_source),
    ]
