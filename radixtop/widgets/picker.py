"""Two small dialogs about the server being watched: the server picker (several servers on the node:
port, kind, model, pid, uptime, where its log is) and a yes/no question (following a tmux pane through
`tmux pipe-pane`). They show what they are given and hand back the answer; the app does the work.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from radixtop.widgets.keys import PICKER_CANCEL, QUESTION_NO, QUESTION_YES, binding


@dataclass(frozen=True)
class ServerRow:
    port: str  # "30000", or "—" when no port answers
    kind: str  # "SGLang", "vLLM", "radixtop sim"
    model: str
    pid: int
    uptime: str  # "3h12m"
    log: str  # "/var/log/sglang.log", "tmux pane %3 (work:1.0)", "no log found"
    current: bool = False


def uptime_text(seconds: float) -> str:
    seconds = max(0, int(seconds))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _cut_left(text: str, width: int) -> str:
    """A path keeps its end (the file's name)."""
    return text if len(text) <= width else "…" + text[len(text) - width + 1 :]


def row_text(row: ServerRow) -> Text:
    mark = "▶" if row.current else " "
    line = (
        f"{mark} {row.port:>6}  {_cut(row.kind, 12):<12}  {_cut(row.model or '—', 36):<36}  "
        f"pid {row.pid:<8}  up {row.uptime:>7}  {_cut_left(row.log, 48)}"
    )
    return Text(line, style="bold" if row.current else "")


class ServerPicker(ModalScreen[int | None]):
    """The servers on this node; dismissed with the index chosen, or None (Esc)."""

    DEFAULT_CSS = """
    ServerPicker { align: center middle; }
    ServerPicker > Vertical {
        width: 96%; max-width: 150; height: auto; max-height: 80%;
        border: thick $accent; background: $surface; padding: 0 1;
    }
    ServerPicker #picker-title { text-style: bold; padding: 0 0 1 0; }
    ServerPicker OptionList { height: auto; max-height: 20; }
    ServerPicker #picker-help { color: $text-muted; padding: 1 0 0 0; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [binding(PICKER_CANCEL)]

    def __init__(self, rows: Sequence[ServerRow], title: str = "Servers on this node: which one to watch?") -> None:
        super().__init__()
        self.rows = list(rows)
        self.title_text = title

    def compose(self) -> ComposeResult:
        with Vertical(id="picker-box"):
            yield Static(self.title_text, id="picker-title")
            yield OptionList(*(Option(row_text(r), id=str(i)) for i, r in enumerate(self.rows)), id="picker-list")
            yield Static("↑/↓ choose · Enter watch · Esc keep the current one · s (later) opens this again",
                         id="picker-help")

    def on_mount(self) -> None:
        options = self.query_one(OptionList)
        current = next((i for i, r in enumerate(self.rows) if r.current), 0)
        options.highlighted = current
        options.focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.dismiss(int(event.option.id or 0))

    def action_cancel(self) -> None:
        self.dismiss(None)


class Question(ModalScreen[bool]):
    """A yes/no question with the lines explaining it; dismissed with True for yes."""

    DEFAULT_CSS = """
    Question { align: center middle; }
    Question > Vertical {
        width: 90%; max-width: 110; height: auto;
        border: thick $warning; background: $surface; padding: 0 1;
    }
    Question #question-text { text-style: bold; padding: 1 0 0 0; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        binding(QUESTION_YES),
        binding(QUESTION_NO),
    ]

    def __init__(self, lines: Sequence[str], question: str) -> None:
        super().__init__()
        self.lines = list(lines)
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(id="question-box"):
            yield Static(Text("\n".join(self.lines)), id="question-body")
            yield Static(f"{self.question}  y yes · n / Esc no", id="question-text")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
