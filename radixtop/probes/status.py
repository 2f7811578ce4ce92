"""The health of one source, as every live probe reports it, and the loop that polls a probe.

A probe never raises into the app: each poll returns a sample whose `status` says how the source is
(ok, starting, degraded, down, error, unavailable) with one line saying why, and since when (wall
clock), so that a dead server can show "DOWN since 14:02:11" while its panes keep the last values.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

STATES = ("ok", "starting", "degraded", "down", "error", "unavailable")
GOOD_STATES = ("ok",)
MIN_GAP_S = 0.05  # never poll back to back, even when a poll took longer than the interval


@dataclass(frozen=True, slots=True)
class SourceState:
    state: str  # one of STATES
    message: str = ""  # one line: why (empty when ok)
    since: float = 0.0  # time.time() when the source entered this state

    @property
    def ok(self) -> bool:
        return self.state in GOOD_STATES


class StateClock:
    """Keeps `since` while the state stays the same; a new state (not a new message) restarts it."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self.current: SourceState | None = None

    def update(self, state: str, message: str = "") -> SourceState:
        cur = self.current
        if cur is not None and cur.state == state:
            since = cur.since
        else:
            since = self._clock()
        self.current = SourceState(state, one_line(message), since)
        return self.current


def one_line(text: str, limit: int = 300) -> str:
    """The first line of a message, cut to `limit` characters (messages land in one status line)."""
    text = str(text).strip()
    first = text.splitlines()[0] if text else ""
    return first if len(first) <= limit else first[: limit - 1] + "…"


class Probe(Protocol):
    interval_s: float

    async def poll(self) -> Any: ...

    async def aclose(self) -> None: ...


async def poll_forever(probe: Probe, *, interval_s: float | None = None) -> AsyncIterator[Any]:
    """One sample per interval, never two polls at once: a slow source slows only its own loop.

    The interval is measured from the start of one poll to the start of the next; a poll that takes
    longer than the interval is followed by a short gap, never by an immediate retry."""
    waker: asyncio.Event | None = getattr(probe, "waker", None)  # a probe may be asked early
    while True:
        started = time.monotonic()
        if waker is not None:
            waker.clear()
        sample = await probe.poll()
        yield sample
        every = probe.interval_s if interval_s is None else interval_s
        delay = max(MIN_GAP_S, every - (time.monotonic() - started))
        if waker is None:
            await asyncio.sleep(delay)
            continue
        await asyncio.sleep(MIN_GAP_S)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay - MIN_GAP_S):
                await waker.wait()
