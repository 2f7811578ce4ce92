"""Small text formatters shared by the live panes (numbers, sizes, ages, bars, sparklines)."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

SPARK = "▁▂▃▄▅▆▇█"


def clock(t: float | None) -> str:
    """HH:MM:SS (local) of an epoch time."""
    if t is None or not math.isfinite(t):
        return "--:--:--"
    return time.strftime("%H:%M:%S", time.localtime(t))


def age(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "—"
    seconds = max(0.0, seconds)
    if seconds < 10:
        return f"{seconds:.1f}s"
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.0f}h"


def count(n: float | None) -> str:
    if n is None:
        return "—"
    if isinstance(n, float) and not n.is_integer():
        return f"{n:,.1f}"
    return f"{int(n):,}"


def size(n: int | None) -> str:
    """Bytes in binary units, 3 significant-ish digits."""
    if n is None:
        return "—"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" or value >= 100 else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def percent(x: float | None) -> str:
    return "—" if x is None else f"{x * 100:.0f}%"


def rate(x: float | None) -> str:
    if x is None:
        return "—"
    return f"{x:,.0f}/s" if x >= 10 else f"{x:.1f}/s"


def bar(fractions: Sequence[float], width: int, chars: Sequence[str] = ("█", "▓", "▒", "░")) -> list[tuple[str, int]]:
    """Split `width` cells among the fractions (each 0..1, summing to <= 1); the rest is the last
    char. Returns (char, cells) runs, so callers can style each run."""
    width = max(0, width)
    runs: list[tuple[str, int]] = []
    used = 0
    acc = 0.0
    for i, f in enumerate(fractions):
        acc += max(0.0, f)
        cells = min(width, round(acc * width)) - used
        if cells > 0:
            runs.append((chars[min(i, len(chars) - 2)], cells))
            used += cells
    if width - used > 0:
        runs.append((chars[-1], width - used))
    return runs


def sparkline(values: Sequence[float | None], lo: float | None = None, hi: float | None = None) -> str:
    """One block character per value, scaled between lo and hi (the data's range by default);
    a space where there is no value."""
    present = [v for v in values if v is not None]
    if not present:
        return " " * len(values)
    low = min(present) if lo is None else lo
    high = max(present) if hi is None else hi
    span = high - low
    out = []
    for v in values:
        if v is None:
            out.append(" ")
        elif span <= 0:
            out.append(SPARK[0] if v <= low else SPARK[-1])
        else:
            level = int((min(max(v, low), high) - low) / span * (len(SPARK) - 1) + 0.5)
            out.append(SPARK[level])
    return "".join(out)


def frozen_banner(state: str, since: float | None, last_good: float | None) -> str:
    """ "DOWN since 14:02:11 · last values from 14:02:09" for a source that is not ok."""
    text = f"{state.upper()} since {clock(since)}"
    if last_good is not None:
        text += f" · last values from {clock(last_good)}"
    return text


def update_text(static: Any, text: Any) -> None:
    """Static.update, but only when the text or its styles changed, and without a layout pass
    when its size did not change (a layout pass re-measures the whole screen)."""
    plain = text.plain
    spans = list(text.spans)
    last = getattr(static, "_radixtop_shown", None)
    if last is not None and last[0] == plain and last[1] == spans:
        return
    lines = plain.split("\n")
    size = (len(lines), max(map(len, lines)))
    static.update(text, layout=last is None or last[2] != size)
    static._radixtop_shown = (plain, spans, size)
