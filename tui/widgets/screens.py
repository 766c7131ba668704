"""Modal prompts, a page of text and the request view (the help screen is in ``help.py``)."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import DataTable, Footer, Input, Label, Static

from schedtrace.tui.messages import RequestFailed, RequestLoaded
from schedtrace.tui.model.lifecycle import LifeStep


class Prompt(ModalScreen[str | None]):
    """One line of input; dismisses with the text, or None on escape."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]
    DEFAULT_CSS = """
    Prompt { align: center middle; }
    Prompt > Vertical { width: 70; height: auto; border: thick $primary; background: $surface; padding: 0 1; }
    """

    def __init__(self, question: str, placeholder: str = "", hint: str = "") -> None:
        super().__init__()
        self.question, self.placeholder, self.hint = question, placeholder, hint

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self.question)
            yield Input(placeholder=self.placeholder, id="prompt-input")
            if self.hint:
                yield Label(self.hint, classes="hint")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value)

    def action_cancel(self) -> None:
        self.dismiss(None)


class TextScreen(ModalScreen[None]):
    """A titled page of text over the browser (the gaps and losses); escape closes it."""

    BINDINGS = [Binding("escape,q,i", "close", "Close")]
    DEFAULT_CSS = """
    TextScreen { align: center middle; }
    TextScreen > Vertical { width: 90%; max-width: 140; height: 80%; border: thick $primary; background: $surface;
                            padding: 0 1; }
    TextScreen #text-title { text-style: bold; height: auto; }
    """

    def __init__(self, title: str, text: Text) -> None:
        super().__init__()
        self.title_text, self.text = title, text

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self.title_text, id="text-title")
            with VerticalScroll():
                yield Static(self.text, id="text-body")

    def action_close(self) -> None:
        self.dismiss(None)


class RequestScreen(Screen[int | None]):
    """The life of one rid; enter jumps to the highlighted step's pass."""

    BINDINGS = [
        Binding("escape,r", "close", "Back"),
        Binding("enter", "jump", "Go to pass"),
        Binding("j", "move(1)", "Down", show=False),
        Binding("k", "move(-1)", "Up", show=False),
        Binding("q", "app.quit", "Quit"),
    ]
    DEFAULT_CSS = """
    RequestScreen #request-title { height: auto; padding: 0 1; background: $primary-darken-2; }
    RequestScreen DataTable { height: 1fr; border-left: tall $accent; }
    """

    def __init__(self, rid: str) -> None:
        super().__init__()
        self.rid = rid
        self.steps: list[LifeStep] = []

    def compose(self) -> ComposeResult:
        yield Static(f"Request [b]{self.rid}[/b]: reading its passes…", id="request-title")
        yield DataTable(cursor_type="row", zebra_stripes=True, id="request-steps")
        yield Footer()

    def on_mount(self) -> None:
        self._table().focus()

    def on_screen_resume(self) -> None:
        self._table().focus()  # the steps table has the keys from the moment the view opens

    def action_move(self, delta: int) -> None:
        table = self._table()
        table.move_cursor(row=max(0, min(table.cursor_row + delta, table.row_count - 1)))

    def _table(self) -> DataTable:
        table = self.query_one(DataTable)
        if not table.columns:
            table.add_columns("passes", "state", "detail")
        return table

    def on_request_loaded(self, message: RequestLoaded) -> None:
        self.show_steps(message.steps, message.note)

    def on_request_failed(self, message: RequestFailed) -> None:
        self.show_failure(message.message)

    def show_steps(self, steps: list[LifeStep], note: str = "") -> None:
        self.steps = steps
        table = self._table()
        table.clear()
        for step in steps:
            table.add_row(step.passes_text(), step.state, step.detail)
        waited = sum(s.last - s.first + 1 for s in steps if s.state == "waiting")
        title = f"Request [b]{self.rid}[/b]: {len(steps)} steps, waited {waited} passes"
        self.query_one("#request-title", Static).update(title + (f"  [dim]{note}[/dim]" if note else ""))

    def show_failure(self, message: str) -> None:
        self.query_one("#request-title", Static).update(f"Request [b]{self.rid}[/b]: [red]{message}[/red]")

    def action_close(self) -> None:
        self.dismiss(None)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.action_jump()

    def action_jump(self) -> None:
        table = self.query_one(DataTable)
        if self.steps and 0 <= table.cursor_row < len(self.steps):
            self.dismiss(self.steps[table.cursor_row].first)
