"""The vital-signs pane: one sparkline per series (token usage, running and queued requests, cache
hit rate, evicted tokens per second, retractions, GPU memory), the current value and where it came
from; the moment the first signature appeared is marked on every plot (a ▼ above the column, and
the column itself in reverse).

The time scale follows the history: one column per second while it fits, then as many seconds per
column as it takes (up to two minutes), so the whole incident stays on screen. Nothing here does I/O.
"""

from __future__ import annotations

import math
import time
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from radixtop.session.vitals import SPECS, SeriesSpec, Vitals
from radixtop.widgets.fmt import clock, count, percent, size, sparkline, update_text
from radixtop.widgets.rows import TextRows

LABEL_WIDTH = 15
VALUE_WIDTH = 18
MAX_STEP = 120
STALE_S = 60.0  # no value for this long: the window ends at the newest value instead of now
FILL_S = 6.0  # gaps this short between two values are drawn at the earlier value (polls are 2 s apart)
_SOURCE = {"metrics": "/metrics", "log": "log", "radix": "endpoint", "nvml": "NVML"}


def seconds_per_column(vitals: Vitals, now: float, columns: int) -> int:
    """The smallest whole number of seconds per column that shows all the history (and the first
    signature's mark), so the plots fill the pane."""
    first = min((s.points[0][0] for s in vitals.series.values() if s.points), default=now)
    mark = vitals.first_mark
    if mark is not None:
        first = min(first, mark[0])
    span = max(1.0, now - first + 1)
    return max(1, min(MAX_STEP, math.ceil(span / max(1, columns))))


def _cut(text: str, room: int) -> str:
    if len(text) <= room:
        return text
    return text[: max(0, room - 1)] + "…" if room > 0 else ""


def _value(spec: SeriesSpec, value: float | None, vitals: Vitals) -> str:
    if value is None:
        return "—"
    if spec.key == "gpu_memory" and vitals.gpu_bytes is not None:
        return f"{percent(value)} {size(vitals.gpu_bytes[0])}"
    if spec.unit == "ratio":
        return percent(value)
    if spec.unit == "rate":
        return f"{count(round(value))}/s"
    return count(round(value, 1))


def window_end(vitals: Vitals, now: float) -> float:
    """Now, while values come in; else just after the newest value (a log read after the fact, a
    server long gone), so the plots show what there is instead of an empty stretch up to now."""
    newest = max((s.points[-1][0] for s in vitals.series.values() if s.points), default=None)
    mark = vitals.first_mark
    if mark is not None and mark[0] <= now:  # a signature after the last value stays in view
        newest = mark[0] if newest is None else max(newest, mark[0])
    if newest is None or now - newest <= STALE_S:
        return now
    return newest + 1


def render_vitals(vitals: Vitals, *, width: int = 100, now: float | None = None, cursor: float | None = None) -> Text:
    """`cursor`: the moment the radix pane shows (an earlier snapshot, a flight record): its column
    is marked on every plot and the values (◆) are the ones at that moment."""
    now = time.time() if now is None else now
    columns = max(8, width - LABEL_WIDTH - VALUE_WIDTH - 2)
    end = window_end(vitals, now)
    step = seconds_per_column(vitals, end, columns)
    start = int(end) - (int(end) % step) - (columns - 1) * step
    mark = vitals.first_mark
    mark_col = None
    if mark is not None:
        col = (int(mark[0]) - start) // step
        if 0 <= col < columns:
            mark_col = col
    cursor_col = None
    if cursor is not None and 0 <= (int(cursor) - start) // step < columns:
        cursor_col = (int(cursor) - start) // step
    out = Text()
    if mark is not None and mark_col is not None:
        label = f"first signature {clock(mark[0])}: {mark[1]}"
        arrow_at = LABEL_WIDTH + 1 + mark_col
        room_right, room_left = width - arrow_at - 2, arrow_at - 1
        right = len(label) <= room_right or (len(label) > room_left and room_right >= room_left)
        if right:
            out.append(" " * arrow_at + "▼", style="bold red")
            out.append(" " + _cut(label, room_right) + "\n", style="red")
        else:  # to its left, so that more of it is read
            label = _cut(label, room_left)
            out.append(" " * (arrow_at - len(label) - 1) + label + " ", style="red")
            out.append("▼\n", style="bold red")
    elif mark is not None:
        where = "before" if mark[0] < start else "after"
        out.append(f"first signature {clock(mark[0])}: {mark[1]} ({where} this window)\n", style="red")
    else:
        out.append(f"{'':<{LABEL_WIDTH}} no signature yet; ▼ will mark the first\n", style="dim")
    for spec in SPECS:
        series = vitals.series[spec.key]
        values = series.window(end, columns, step, fill_s=FILL_S)
        lo, hi = (0.0, 1.0) if spec.unit == "ratio" else (0.0, None)
        if hi is None:
            present = [v for v in values if v is not None]
            hi = max(present) if present and max(present) > 0 else 1.0
        line = sparkline(values, lo, hi)
        out.append(f"{spec.title:<{LABEL_WIDTH}} ", style="bold")
        shown = ((mark_col, "bold red reverse"), (cursor_col, "bold yellow reverse"))
        marks = {c: s for c, s in shown if c is not None}
        at = 0
        for col in sorted(marks):
            out.append(line[at:col], style="cyan")
            out.append(line[col] if line[col] != " " else "│", style=marks[col])
            at = col + 1
        out.append(line[at:], style="cyan")
        if cursor_col is not None:  # the value beside the tree shown (the last one at or before it)
            back = [values[c] for c in range(cursor_col, max(-1, cursor_col - 1 - int(FILL_S // step)), -1)]
            then = next((v for v in back if v is not None), None)
            value = "◆ " + (_value(spec, then, vitals) if then is not None else "—")
        else:
            value = _value(spec, series.last, vitals)
        stale = series.updated < end - max(10.0, 5 * step)
        src = _SOURCE.get(series.source, "")
        tail = f" {value}" + (f" {src}" if src else "")
        out.append(
            f"{tail[:VALUE_WIDTH]:<{VALUE_WIDTH}}", style="dim" if stale or math.isinf(series.updated) else "bold"
        )
        out.append("\n")
    span = columns * step
    ends = f"now {clock(now)}" if end == now else f"ends at the last value, {clock(end)}"
    if cursor is not None:
        ends += f" · ◆ {clock(cursor)}" + ("" if cursor_col is not None else " (off the plot)")
    out.append(f"{'':<{LABEL_WIDTH}} ← {span // 60} min {span % 60} s · {step} s per column · {ends}", style="dim")
    return out


class VitalsPane(Vertical):
    DEFAULT_CSS = """
    VitalsPane { height: 1fr; }
    VitalsPane > #vitals-title { height: 1; background: $panel; text-style: bold; padding: 0 1; }
    VitalsPane > #vitals-body { height: 1fr; padding: 0 1; }
    """

    def compose(self) -> ComposeResult:
        yield Static("Vital signs", id="vitals-title")
        yield TextRows(id="vitals-body")  # row by row: on an idle server only the clock row moves

    _last: tuple[Any, ...] | None = None

    def on_resize(self) -> None:
        if self._last is not None:  # the plots' width is the pane's
            self.show(*self._last[:1], **self._last[1])

    def show(self, vitals: Vitals, *, status: Any = None, note: str = "", now: float | None = None,
             cursor: float | None = None) -> None:
        self._last = (vitals, {"status": status, "note": note, "now": now, "cursor": cursor})
        title = Text("Vital signs", style="bold")
        sources = sorted({_SOURCE.get(s.source, s.source) for s in vitals.series.values() if s.source})
        if sources:
            title.append(f"  from {', '.join(sources)}", style="dim")
        if status is not None and not status.ok:
            title.append(f"  {status.state.upper()} since {clock(status.since)} · last values kept", style="bold red")
        if note:
            title.append(f"  {note}", style="yellow")
        update_text(self.query_one("#vitals-title", Static), title)
        width = max(40, (self.size.width or 100) - 2)
        self.query_one("#vitals-body", TextRows).update(render_vitals(vitals, width=width, now=now, cursor=cursor))
