"""Modal dialogs: confirm, and ask for one line of text."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label


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


class KeysScreen(ModalScreen[None]):
    """``?``: every key of the screen below and of the app, with what it does (any key closes)."""

    BINDINGS = [Binding("escape,question_mark,q", "close", "Close")]

    def __init__(self, title: str, keys: list[tuple[str, str]]) -> None:
        super().__init__()
        self.title_text = title
        self.keys = keys

    def compose(self) -> ComposeResult:
        from rich.text import Text

        body = Text()
        body.append(f"{self.title_text}\n\n", style="bold")
        width = max((len(k) for k, _ in self.keys), default=4) + 2
        for key, what in self.keys:
            body.append(f"{key:<{width}}", style="bold cyan")
            body.append(f"{what}\n")
        body.append("\nescape or ? closes; ctrl+p opens the command palette", style="dim")
        with Vertical(classes="dialog", id="keys"):
            yield Label(body)

    def action_close(self) -> None:
        self.dismiss(None)
