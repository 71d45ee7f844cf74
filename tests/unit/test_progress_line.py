"""The live line of ``ftui run`` and ``ftui sweep`` keeps the step count, loss, tokens/s and the ETA at 80
columns: the description and the bar give way first. Rendered by rich into a console of that width, with
the clock injected (the ETA is computed from the steps' times)."""

from __future__ import annotations

import io

import pytest

from tui.cli.progress import RunProgress

START = {"type": "start", "distributed_type": "MULTI_CPU", "world_size": 2, "tokens_per_step": 2048,
         "context_length": 256, "total_steps": 1000}
DESCRIPTION = "training: DDP (CPU) × 2, global batch 8"


def _line(width: int, label: str = "") -> str:
    """The progress line after 123 of 1000 steps, one step every 2 s by the injected clock."""
    now = [0.0]
    out = io.StringIO()
    from rich.console import Console

    progress = RunProgress(Console(file=out, width=width, color_system=None), label=label, clock=lambda: now[0])
    with progress:
        progress.on_event(START)
        for step in (120, 121, 122, 123):  # rich estimates the speed over the last 30 s
            now[0] = 2.0 * step
            progress.on_event({"type": "step", "step": step, "loss": 7.6912, "tokens_per_s": 1232.4})
    return out.getvalue().splitlines()[-1]


@pytest.mark.parametrize("label", ["", "run 12 ddp"])
@pytest.mark.parametrize("width", [80, 120])
def test_the_line_keeps_step_loss_speed_and_eta(width: int, label: str) -> None:
    line = _line(width, label)
    assert len(line) <= width, line
    assert line.startswith(label or "training"), line  # at least the head of the description
    # 877 steps left at 2 s each: 29 min 14 s
    for kept in ("123/1000", "loss 7.6912", "1,232 tok/s", "0:04:06", "ETA 0:29:14"):
        assert kept in line, (width, kept, line)
    if width == 120 and not label:
        assert DESCRIPTION in line, line
    if width == 80:
        assert DESCRIPTION not in line, "the description gives way first"
