"""The help screen (`?`): keys, what the markers and the status line mean."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from rich.style import Style
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from radixtop.themes import SEVERITY_MARKERS
from radixtop.tui.keys import help_rows
from radixtop.widgets.keys import HELP_CLOSE, binding


def help_text(keymap: Mapping[str, str] | None = None) -> Table:
    """The keys (from radixtop.tui.keys, with the user's keymap applied), markers, status line, panes."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style=Style(bold=True), no_wrap=True)
    table.add_column()
    table.add_column(style=Style(dim=True), no_wrap=True)  # the id a keymap file moves it by
    for key, what, key_id in help_rows(keymap):
        table.add_row(key, what, key_id)
    table.add_row("", "")
    table.add_row(Text("Markers", style=Style(bold=True, underline=True)), "")
    table.add_row(SEVERITY_MARKERS["critical"], "critical signature (reverse video)")
    table.add_row(SEVERITY_MARKERS["error"], "error signature (bold, underlined match)")
    table.add_row(SEVERITY_MARKERS["warning"], "warning signature (underlined match)")
    table.add_row(SEVERITY_MARKERS["info"], "informational signature")
    table.add_row(
        SEVERITY_MARKERS["notice"],
        "radixtop notice: file rotated, truncated, deleted, waiting, cut, or an internal error",
    )
    table.add_row("", "")
    table.add_row(Text("Status line", style=Style(bold=True, underline=True)), "")
    table.add_row("FOLLOW/SCROLL", "following the newest line, or scrolled back")
    table.add_row("PAUSED +N", "the view is frozen; N lines wait and appear on p")
    table.add_row("first:", "the earliest cause across all files (not a notice or a consequence), its rank and time")
    table.add_row("sources", "each followed file: ok, waiting, rotated, truncated, deleted or error, with why")
    table.add_row("lines /s", "lines read in total and per second; then the matching engine in use")
    table.add_row("server r0 procs gpu", "the live sources: ok, DOWN since the time it went, starting, "
                  "degraded or error with why; gpu n/a without an NVIDIA driver")
    table.add_row("", "")
    table.add_row(Text("Panes", style=Style(bold=True, underline=True)), "")
    table.add_row("radix", "one rank's prefix tree from radixtop's debug endpoint: the pool (locked, running, "
                  "evictable, free tokens), evictions/s, lock anomalies with their times, the lock_ref "
                  "histogram (page-lock occupancy), 'ranks disagree' when tree digests differ, and "
                  "the radix-cache signatures the log reported (log HH:MM:SS rank …); in the tree "
                  "* locked, + path to a lock, ! negative lock_ref")
    table.add_row("vitals", "token usage, running and queued requests, cache hit rate, evicted tokens/s, "
                  "retractions, GPU memory over time (from /metrics, else the log); ▼ marks the first signature")
    table.add_row("GPU", "per GPU memory, utilisation, temperature, power; processes holding GPU memory, "
                  "named when they are the server's; Xid errors")
    table.add_row("processes", "the server's process tree: role and rank, state, RSS, CPU; zombies and "
                  "vanished schedulers stand out")
    table.add_row("DOWN", "a source that stopped answering: its pane keeps the last values and says since when")
    return table


class HelpScreen(ModalScreen[None]):
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll {
        width: 90%; max-width: 110; height: auto; max-height: 90%;
        border: round $primary; background: $surface; padding: 0 1;
    }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        binding(HELP_CLOSE),
    ]

    def __init__(self, keymap: Mapping[str, str] | None = None) -> None:
        super().__init__()
        self.keymap = keymap

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(help_text(self.keymap), id="help-body")

    def on_mount(self) -> None:
        scroller = self.query_one(VerticalScroll)
        scroller.border_title = "radixtop keys"
        scroller.border_subtitle = "Esc closes"
        scroller.focus()

    def action_close(self) -> None:
        self.dismiss(None)
