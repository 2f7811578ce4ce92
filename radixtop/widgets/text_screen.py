"""A block of text in a framed, scrolling screen over the panes: a finding's evidence, a node."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static


class TextScreen(ModalScreen[None]):
    """Subclasses bind their close key to `dismiss`, name the frame (TITLE_TEXT) and the text (TEXT_ID)."""

    DEFAULT_CSS = """
    TextScreen { align: center middle; }
    TextScreen > VerticalScroll {
        width: 95%; height: 90%;
        border: round $primary; background: $surface; padding: 0 1;
    }
    """
    TITLE_TEXT: ClassVar[str] = ""
    TEXT_ID: ClassVar[str] = "screen-text"
    BINDINGS: ClassVar[list[BindingType]] = []

    def __init__(self, text: Text, title: str | None = None) -> None:
        super().__init__()
        self.text = text
        self.title_text = self.TITLE_TEXT if title is None else title  # a frame that names what it shows

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(self.text, id=self.TEXT_ID)

    def on_mount(self) -> None:
        scroller = self.query_one(VerticalScroll)
        scroller.border_title = f"{self.title_text} (Esc closes)"
        scroller.focus()

    async def action_dismiss(self, result: None = None) -> None:
        self.dismiss(result)
