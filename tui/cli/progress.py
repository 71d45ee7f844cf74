"""The live progress line of headless ``ftui run``: step/total, loss, tokens/s, ETA (rich).

On a narrow terminal the line stays one line: the description and the bar shrink (the description cut
with an ellipsis), never the step count, loss, tokens/s or the ETA. Rich's table shrinks only the
columns that may wrap, so those two may and every other one may not.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Column
from rich.text import Text

from runner.spec.events import phase_words
from tui.render.words import distributed_words

BAR_WIDTH = 18
"""The bar's width where there is room: at 120 columns it leaves the whole training description."""


MORE_THAN_THE_HEAD = 12
"""Columns past a description's head below which its cut parenthesis says too little to show."""


class Fitted:
    """A description on one line in whatever width it is given: whole where it fits; cut with an ellipsis
    where that still says something of its parenthesis; else its head (``training``), cut if need be.
    Plain text, never markup."""

    def __init__(self, text: str, style: str) -> None:
        self.text = text
        self.style = style

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        text, width = self.text, options.max_width
        head = text.split(" (", 1)[0]
        if cell_len(text) > width and width < cell_len(head) + MORE_THAN_THE_HEAD:
            text = head
        yield Text(text, style=self.style, no_wrap=True, overflow="ellipsis")

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement(1, cell_len(self.text))


class Description(ProgressColumn):
    """The task's description (:class:`Fitted`: a phase names the user's paths) in a column that gives
    way first on a narrow terminal."""

    def __init__(self, text: str = "", style: str = "bold", table_column: Column | None = None) -> None:
        # wrappable by default: rich shrinks it first (its text never wraps: cut with an ellipsis)
        super().__init__(table_column=table_column or Column(no_wrap=False, min_width=1))
        self.text = text
        self.style = style

    def render(self, task: Task) -> Fitted:
        return Fitted(self.text or task.description, self.style)


def _kept() -> Column:
    """The table column of a part never shrunk nor wrapped on a narrow terminal (step count, loss, speed, ETA)."""
    return Column(no_wrap=True)


class RunProgress:
    """Feeds trainer events into a rich progress bar; use as a context manager."""

    def __init__(self, console: Console, label: str = "", clock: Callable[[], float] | None = None) -> None:
        """``label``: what a sweep's line starts with (its run); ``clock``: seconds for the elapsed time and
        the ETA (default: rich's monotonic clock)."""
        self.progress = Progress(
            *([Description(label, style="", table_column=_kept())] if label else []),
            Description(),
            BarColumn(bar_width=BAR_WIDTH, table_column=Column(no_wrap=False, min_width=1)),
            MofNCompleteColumn(table_column=_kept()),
            TextColumn("loss {task.fields[loss]}", markup=False, table_column=_kept()),
            TextColumn("{task.fields[tps]} tok/s", markup=False, table_column=_kept()),
            TimeElapsedColumn(table_column=_kept()),
            TextColumn("ETA", markup=False, table_column=_kept()),
            TimeRemainingColumn(table_column=_kept()),
            console=console,
            transient=False,
            refresh_per_second=2,
            get_time=clock,
        )
        self.task = self.progress.add_task("starting", total=None, loss="-", tps="-")
        self.training: str | None = None
        """The description while steps come (a phase between steps shows instead until the next step)."""

    def __enter__(self) -> RunProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def on_event(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        if kind == "phase":  # say what the minutes of loading, evaluating or saving are spent on
            self.progress.update(self.task, description=phase_words(event))  # plain text: a data path is the user's
        elif kind == "start":
            # a script may not say (runner.track)
            dist = distributed_words(event.get("distributed_type")) if event.get("distributed_type") else "not reported"
            world = event.get("world_size")
            who = dist if world == 1 and dist == "one process" else f"{dist} × {world}"
            # the global batch is what a speed means: a --nproc 2 DDP run trains twice the rows per step
            rows = (event.get("tokens_per_step") or 0) // max(1, event.get("context_length") or 1) or None
            batch = f", global batch {rows}" if rows else ""
            self.training = f"training: {who}{batch}"
            self.progress.update(self.task, description=self.training, total=event.get("total_steps"))
            self.progress.console.print(Text(
                f"start: {who} on {event.get('device_type') or 'not reported'}, "
                f"{(event.get('params') or 0) / 1e6:.1f}M params, {(event.get('trainable_params') or 0) / 1e6:.2f}M trainable"
                + (f", global batch {rows} rows x {event.get('context_length')} tokens per step" if rows else "")
            ))
        elif kind == "step":
            if self.training:  # a phase between steps (a save, an evaluation) is over
                self.progress.update(self.task, description=self.training)
            self.progress.update(
                self.task,
                completed=event["step"],
                # A non-finite loss arrives as null (JSON has no NaN).
                loss="skipped" if event.get("skipped") else "-" if event.get("loss") is None else f"{event['loss']:.4f}",
                tps="-" if event.get("tokens_per_s") is None else f"{event['tokens_per_s']:,.0f}",
            )
        elif kind == "end":
            self.progress.update(self.task, description=f"{event.get('status')}")
        elif kind == "error":
            # Run text is printed as text: a gloo message holds "[/path/pair.cc:553]", which rich
            # would read as a closing markup tag (MarkupError, and ftui run died with its run).
            self.progress.console.print(Text.assemble(("error:", "red"), f" {event.get('message')}"))
        elif kind == "hang":
            self.progress.console.print(Text.assemble(
                ("warning:", "yellow"),
                f" hang suspected: no progress for {event.get('since_progress_s', 0):.0f} s (no event from the "
                f"trainer, {', '.join(event.get('idle') or []) or 'devices'} idle); the run is stopped if it "
                f"lasts as long again (--hang-after)"))
        elif kind == "stacks":
            self.progress.console.print(Text.assemble(
                ("stacks:", "yellow"), f" {event.get('summary')} (full dumps: {event.get('folder')})"))
        elif kind == "rank_exit":
            self.progress.console.print(Text.assemble(
                ("warning:", "yellow"), f" rank {event.get('rank')} (pid {event.get('pid')}) ended before the run did"))


class SweepProgress:
    """The live line of the run a sweep is on: one :class:`RunProgress` per run, begun when the run
    starts and ended (its last state printed) when it is done."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.current: RunProgress | None = None

    def begin(self, label: str) -> None:
        self.end()
        self.current = RunProgress(self.console, label=label).__enter__()

    def on_event(self, event: dict[str, Any]) -> None:
        if self.current is not None:
            self.current.on_event(event)

    def end(self) -> None:
        if self.current is not None:
            self.current.__exit__(None, None, None)
            self.current = None
