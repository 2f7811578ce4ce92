"""The help screen (`?`): keys, what the markers and the status line mean."""

from __future__ import annotations

from typing import ClassVar

from rich.style import Style
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from radixtop.themes import SEVERITY_MARKERS

KEYS: tuple[tuple[str, str], ...] = (
    ("q", "quit"),
    ("?", "this help (Esc closes)"),
    ("f", "follow the newest line on/off (scrolling up also stops following; End or G resumes)"),
    ("p", "pause the view: lines are still read, matched and buffered; the status line counts them"),
    ("/", "search (smart case: ignores case unless you type a capital); n / N next / previous"),
    ("& or \\", "filter: show only lines containing the text; Esc clears search, then filter"),
    ("e / E", "next / previous line that matched a failure signature"),
    ("Tab", "to the findings list and back; Enter jumps to a finding's first line, d shows its evidence"),
    ("t", "next theme: dark, light, high contrast"),
    ("a", ("HTTP access lines (POST /generate ... 503) shown or folded; folded by default into one counted row "
           "per second, so a crash's traceback stays on screen (a line that matched a signature is never folded)")),
    ("1 2 3 4 5", ("panes: 1 log, 2 radix, 3 GPU, 4 processes, 5 vitals; on a small screen one at a time, "
                   "on a big one (140x40 and more) all at once and the key zooms one; 0 or the key again shows all")),
    ("[ ]", "previous / next rank in the radix pane"),
    ("s", "the servers on this node (port, model, pid, uptime, log): Enter watches another one"),
    ("b", ("evidence bundle now: first occurrences with context, findings, server info, metrics, processes, "
           "stacks, GPU; written (redacted, with a SHA-256 manifest) into the current directory; the first "
           "error-or-worse signature takes one by itself")),
    ("c", ("confirmation run: evidence first, then the plan (live and control commands, workload, runs) to "
           "approve with y / Enter or refuse with n / Esc; then live progress (x cancels and stops the control, "
           "Esc hides it, c shows it again) and the verdict with the command to repeat it")),
    ("--readonly", "b, c and the automatic bundle are off: radixtop only watches"),
    ("radix tree", ("↑ ↓ move, Enter or → expands, ← collapses (or goes to the parent), x opens every path "
                    "to a locked node; 2 focuses it")),
    ("↑ ↓ PgUp PgDn Home End", "scroll (also j k Space g G); ← → scroll long lines; mouse wheel works"),
)


def help_text() -> Table:
    table = Table.grid(padding=(0, 2))
    table.add_column(style=Style(bold=True), no_wrap=True)
    table.add_column()
    for key, what in KEYS:
        table.add_row(key, what)
    table.add_row("", "")
    table.add_row(Text("Markers", style=Style(bold=True, underline=True)), "")
    table.add_row(SEVERITY_MARKERS["critical"], "critical signature (reverse video)")
    table.add_row(SEVERITY_MARKERS["error"], "error signature (bold, underlined match)")
    table.add_row(SEVERITY_MARKERS["warning"], "warning signature (underlined match)")
    table.add_row(SEVERITY_MARKERS["info"], "informational signature")
    table.add_row(SEVERITY_MARKERS["notice"], "radixtop notice: file rotated, truncated, deleted, waiting, cut, or an internal error")
    table.add_row("", "")
    table.add_row(Text("Status line", style=Style(bold=True, underline=True)), "")
    table.add_row("FOLLOW/SCROLL", "following the newest line, or scrolled back")
    table.add_row("PAUSED +N", "the view is frozen; N lines wait and appear on p")
    table.add_row("first:", "the earliest warning-or-worse signature across all files, its rank and time")
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
        Binding("escape,q,question_mark", "close", "Close"),
    ]

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(help_text(), id="help-body")

    def on_mount(self) -> None:
        scroller = self.query_one(VerticalScroll)
        scroller.border_title = "radixtop keys"
        scroller.border_subtitle = "Esc closes"
        scroller.focus()

    def action_close(self) -> None:
        self.dismiss(None)
