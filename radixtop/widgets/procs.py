"""The processes pane: the server's process tree (pid, role and rank, state, RSS, CPU, threads);
zombies, stopped processes and schedulers that vanished stand out, with the time they went.

The app hands in the latest ProcsSample; nothing here does I/O.
"""

from __future__ import annotations

import textwrap
import time
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.widgets import Static

from radixtop.widgets.fmt import age, clock, frozen_banner, size, update_text
from radixtop.widgets.rows import TextRows

HEADER = f"{'pid':>8} {'role':<18} {'state':<10} {'RSS':>10} {'CPU':>6} {'thr':>4} {'up':>6}  command"


def render_procs(sample: Any, *, now: float | None = None, last_good: Any = None, width: int = 0) -> Text:
    """`width`: the pane's, to wrap the status message to (the table itself scrolls sideways)."""
    now = time.time() if now is None else now
    out = Text()
    if sample is None:
        out.append(
            "no server process found on this node to watch (see the log pane for what discovery found)",
            style="italic",
        )
        return out
    if not sample.status.ok:
        style = "bold red" if sample.status.state in ("down", "error") else "bold yellow"
        said = f"{sample.status.state.upper()} since {clock(sample.status.since)}: {sample.status.message}"
        for line in textwrap.wrap(said, width) if width > 20 else [said]:  # whole, never cut mid-sentence
            out.append(line + "\n", style=style)
    out.append(HEADER + "\n", style="dim")
    procs = sample.procs
    if not any(p.status != "gone" for p in procs) and last_good is not None:
        out.append(frozen_banner(sample.status.state, sample.status.since, last_good.time) + "\n", style="bold red")
        procs = _frozen_rows(last_good.procs, procs)
    for p in procs:
        if p.status == "gone":
            style = "bold red" if p.role in ("scheduler", "worker", "engine-core", "server") else "red"
        elif p.status in ("zombie", "dead", "stopped"):
            style = "bold red reverse" if p.status == "zombie" else "bold red"
        elif p.role == "server":
            style = "bold"
        else:
            style = ""
        cpu = f"{p.cpu_percent:.0f}%" if p.cpu_percent is not None else "—"
        up = age(now - p.started) if p.started else "—"
        status = p.status if p.status != "gone" else f"gone {clock(p.gone_at)}"
        line = (
            f"{p.pid:>8} {p.label[:18]:<18} {status[:14]:<10} {size(p.rss):>10} {cpu:>6}"
            f" {p.threads if p.threads is not None else '—':>4} {up:>6}  {p.name}"
        )
        out.append(line + "\n", style=style or None)
    for problem in sample.problems[:4]:
        out.append(f"! {problem}\n", style="bold red")
    out.rstrip()
    return out


def _frozen_rows(last_good: tuple[Any, ...], gone: tuple[Any, ...]) -> tuple[Any, ...]:
    """The last live table with each process that went since in its gone row, once per pid
    (the last live sample already listed those gone before it)."""
    rows = {p.pid: p for p in last_good}
    rows.update((p.pid, p) for p in gone if p.status == "gone")
    return tuple(rows.values())


class ProcsPane(Vertical):
    DEFAULT_CSS = """
    ProcsPane { height: 1fr; }
    ProcsPane > #procs-title { height: 1; background: $panel; text-style: bold; padding: 0 1; }
    ProcsPane > VerticalScroll { height: 1fr; padding: 0 1; }
    ProcsPane #procs-body { width: auto; min-width: 100%; }
    """

    def compose(self) -> ComposeResult:
        yield Static("Processes", id="procs-title")
        with VerticalScroll():
            yield TextRows(id="procs-body")  # row by row: a CPU figure moving redraws its row

    def show(self, sample: Any, *, now: float | None = None, last_good: Any = None) -> None:
        title = Text("Processes", style="bold")
        if sample is not None:
            # A zombie or dead process is not running: counted apart, so a dead scheduler shows.
            stuck = sum(1 for p in sample.procs if p.status in ("zombie", "dead"))
            alive = sum(1 for p in sample.procs if p.status not in ("gone", "zombie", "dead"))
            title.append(f"  pid {sample.root_pid} · {alive} alive", style="dim")
            if stuck:
                title.append(f" · {stuck} zombie/dead", style="bold red")
            state = sample.status.state
            title.append(f"  {state}", style="green" if state == "ok" else "red")
        update_text(self.query_one("#procs-title", Static), title)
        width = max(0, (self.size.width or 0) - 2)  # the body's padding
        self.query_one("#procs-body", TextRows).update(render_procs(sample, now=now, last_good=last_good, width=width))
        self._last = (sample, now, last_good)

    _last: tuple[Any, Any, Any] | None = None

    def on_resize(self) -> None:
        if self._last is not None:  # the status message is wrapped to the pane's width
            sample, now, last_good = self._last
            self.show(sample, now=now, last_good=last_good)
