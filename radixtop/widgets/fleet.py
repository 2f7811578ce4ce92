"""The fleet view: every rank the fleet's Prometheus scrapes, one row each, and the ranks that stand
out with why and the command that opens one (session/fleet.py decides which). It renders a
FleetView handed to it; nothing here does I/O.
"""

from __future__ import annotations

import time
from typing import ClassVar

from rich.text import Text
from textual.binding import BindingType
from textual.widgets import Static

from radixtop.session.fleet import HEADER, FleetView, rank_row
from radixtop.textsafe import printable
from radixtop.widgets.fmt import clock, frozen_banner
from radixtop.widgets.keys import FLEET_CLOSE, binding
from radixtop.widgets.text_screen import TextScreen

__all__ = ["FleetScreen", "render_fleet"]


def render_fleet(view: FleetView | None, *, now: float | None = None) -> Text:
    out = Text()
    if view is None or view.sample is None:
        out.append("asking Prometheus for the fleet's ranks…", style="italic")
        return out
    now = time.time() if now is None else now
    sample = view.sample
    status = sample.status
    if not status.ok:
        style = "bold red" if status.state in ("down", "error") else "bold yellow"
        if view.ranks_time is not None and status.state in ("down", "error"):
            out.append(frozen_banner(status.state, status.since, view.ranks_time) + "\n", style=style)
        out.append(printable(status.message) + "\n", style=style)
    for note in sample.notes:
        out.append(f"note: {printable(note)}\n", style="dim")
    flagged = {(s.rank.job, s.rank.instance, s.rank.rank) for s in view.standouts}
    out.append(f"{len(view.ranks)} ranks on {view.nodes} nodes · {len(view.standouts)} standing out · "
               f"read {clock(view.ranks_time)}\n", style="dim")
    if view.ranks:
        out.append(HEADER + "\n", style="bold")
        for r in view.ranks:
            out.append(rank_row(r) + "\n", style="bold red" if (r.job, r.instance, r.rank) in flagged else None)
    if view.standouts:
        out.append("\nStanding out\n", style="bold")
        for s in view.standouts:
            out.append(f"{printable(s.rank.node)} rank {printable(s.rank.rank)}", style="bold red")
            out.append(f"  ({printable(s.rank.instance)})\n", style="dim")
            for reason in s.reasons:
                out.append(f"  - {reason}\n")
            out.append("  open it: ", style="dim")
            out.append(s.command + "\n", style="bold")
    out.rstrip()
    return out


class FleetScreen(TextScreen):
    """Over the panes; `show` redraws it with the latest view."""

    TEXT_ID = "fleet-body"
    TITLE_TEXT = "Fleet"
    BINDINGS: ClassVar[list[BindingType]] = [binding(FLEET_CLOSE)]

    def __init__(self, view: FleetView | None) -> None:
        super().__init__(render_fleet(view), title=f"Fleet: {printable(view.url)}" if view is not None else None)

    def show(self, view: FleetView, *, now: float | None = None) -> None:
        self.query_one(f"#{self.TEXT_ID}", Static).update(render_fleet(view, now=now))
