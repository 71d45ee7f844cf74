"""Modal dialogs: confirm, ask for one line of text, pick a file, list the keys."""

from __future__ import annotations

import textwrap

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, OptionList
from textual.widgets.option_list import Option


class ConfirmScreen(ModalScreen[bool]):
    """Ask yes/no; dismisses with True on yes (``y``), False on no (``n``/escape)."""

    BINDINGS = [Binding("y", "answer(True)", "Yes"), Binding("n,escape", "answer(False)", "No")]

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self.question, markup=False)
            with Horizontal(classes="buttons"):
                yield Button("Yes (y)", variant="error", id="yes")
                yield Button("No (n)", id="no")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, value: bool) -> None:
        self.dismiss(value)


class PromptScreen(ModalScreen[str | None]):
    """Ask for one line of text; dismisses with the text (enter) or None (escape)."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, question: str, value: str = "") -> None:
        super().__init__()
        self.question = question
        self.value = value

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self.question, markup=False)
            yield Input(value=self.value, id="prompt")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value)

    def action_cancel(self) -> None:
        self.dismiss(None)


class PickFileScreen(ModalScreen[str | None]):
    """Pick one of ``paths`` (ctrl+o on Compose: the recipe files under ./recipes); enter or a click
    picks, escape cancels. Paths are shown as text, never markup."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, question: str, paths: list[str], empty: str) -> None:
        super().__init__()
        self.question = question
        self.paths = paths
        self.empty = empty
        """What the box says when there is no file to pick."""

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog", id="pick"):
            yield Label(self.question if self.paths else self.empty, markup=False)
            if self.paths:
                yield OptionList(*(Option(Text(path)) for path in self.paths), id="pick-list")

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(self.paths[event.option_index])

    def action_cancel(self) -> None:
        self.dismiss(None)


class KeysScreen(ModalScreen[None]):
    """``?`` or F4: the keys of the screen below, then the app's, in a box that fits 80x24 and scrolls
    (up, down, page up, page down, home, end and the mouse wheel); esc, ?, F4 or q closes it."""

    BINDINGS = [Binding("escape,question_mark,f4,q", "close", "Close")]

    def __init__(self, sections: list[tuple[str, list[tuple[str, str]]]]) -> None:
        super().__init__()
        self.sections = sections

    def body(self, width: int) -> Text:
        """The list as text ``width`` cells wide: a column of keys (as wide as the widest), then what each
        does, wrapped under itself (a hanging indent), so that it reads at 80 columns."""
        rows = [row for _, section in self.sections for row in section]
        keys = min(max((len(k) for k, _ in rows), default=4) + 2, 26)
        out = Text()
        for heading, section in self.sections:
            out.append(f"{heading}\n", style="bold")
            for key, what in section:
                out.append(f"  {key:<{keys}}", style="bold cyan")
                lines = textwrap.wrap(what, max(20, width - keys - 2)) or [""]
                out.append(("\n" + " " * (keys + 2)).join(lines) + "\n")
            out.append("\n")
        out.append("esc, ? or F4 closes; up/down, page up/down, home/end scroll", style="dim")
        return out

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog", id="keys"):  # the first heading names the screen: no title row
            with VerticalScroll(id="keys-scroll"):
                # the box: 76 columns or the terminal's width, less its border, padding and scrollbar
                yield Label(self.body(min(76, self.app.size.width) - 6), id="keys-body")

    def on_mount(self) -> None:
        self.query_one("#keys-scroll").focus()

    def action_close(self) -> None:
        self.dismiss(None)
