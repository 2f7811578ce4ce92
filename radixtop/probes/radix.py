"""Client of radixtop's debug endpoint (radixtop/schema.py): one rank's snapshot, events and health.

`RadixProbe.poll()` fetches the snapshot (and the events since the last poll, and now and then the
health) and returns a `RadixSample`; it never raises: garbage, a wrong schema version, a timeout, an
answer too large or a server that went away are each a `status` with one line saying what to do.
Parsing and indexing the tree run in a thread (a 100,000-node snapshot takes a while), and an answer
byte-identical to the previous one is not parsed again.

The snapshot's parsing and indexing live in probes/radix_tree.py; the board that folds every
rank's samples into what the radix pane shows, in session/radix_board.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from radixtop.probes.http import Fetched, PolledProbe, fetch, is_loopback_url
from radixtop.probes.radix_tree import TreeIndex, discard, parse_and_index
from radixtop.probes.status import SourceState, StateClock, one_line
from radixtop.schema import (
    BUDGET_PARAM,
    EVENTS_PATH,
    HEALTH_PATH,
    LIMIT_PARAM,
    SINCE_PARAM,
    SNAPSHOT_PATH,
    Event,
    Health,
    Snapshot,
    parse_error,
    parse_events,
    parse_health,
)

if TYPE_CHECKING:  # imported when first used: httpx costs ~70 ms of start-up
    import httpx

DEFAULT_INTERVAL_S = 2.0
DEFAULT_BUDGET = 5_000  # nodes asked for; the server caps it at its own max_budget
MAX_SNAPSHOT_BYTES = 32 * 1024 * 1024  # 200,000 nodes are ~16 MiB; more than twice that is not a snapshot
MAX_EVENTS_BYTES = 8 * 1024 * 1024
EVENT_PAGE = 1_000
EVENT_PAGES_PER_POLL = 5
HEALTH_EVERY_S = 30.0  # the snapshot carries hooks_state; health adds only the endpoint's own view
INLINE_PARSE_BYTES = 64 * 1024  # smaller answers are parsed on the loop (a thread hop costs more)


# ----------------------------------------------------------------------------------------------
# One rank's probe


@dataclass(frozen=True, slots=True)
class RadixSample:
    url: str
    status: SourceState
    time: float  # time.time() of this poll
    rank: int | None = None
    snapshot: Snapshot | None = None  # None when this poll got none (the board keeps the last)
    index: TreeIndex | None = None
    health: Health | None = None
    events: tuple[Event, ...] = ()  # new since the previous sample
    events_dropped: int = 0  # events that left the server's ring before we read them
    restarted: bool = False  # the endpoint's instance changed: the server restarted
    unchanged: bool = False  # the snapshot answer was byte-identical to the previous one
    seconds: float = 0.0  # fetch + parse
    size: int = 0  # bytes of the snapshot answer
    source: str = ""  # what the tree comes from when not the debug endpoint (kv-events), named in the pane
    source_note: str = ""  # that source's one line of what it holds and missed
    locks_known: bool = True  # False: lock counts are unknown (shown as such, never as zero)
    label: str = ""  # the view's name in the pane's title, when not its rank's
    before: Snapshot | None = None  # a flight record's last safe point before the failure
    failed_node: int | None = None  # the node the failing lock or unlock was on (a flight record's trigger)
    failed_op: str = ""  # that trigger's kind
    node: str = ""  # the node the endpoint is on, when not this one (reached through an ssh forward)


class RadixProbe(PolledProbe):
    """Polls one rank's debug endpoint at `base_url` (e.g. http://127.0.0.1:39100)."""

    def __init__(
        self,
        base_url: str,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        budget: int = DEFAULT_BUDGET,
        timeout_s: float = 3.0,
        max_bytes: int = MAX_SNAPSHOT_BYTES,
        client: httpx.AsyncClient | None = None,
        clock: Callable[[], float] = time.time,
        node: str = "",
    ) -> None:
        self.url = base_url.rstrip("/")
        self.node = node
        self.interval_s = interval_s
        self.budget = budget
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self._client = client
        self._own_client = client is None
        self._clock = clock
        self._state = StateClock(clock)
        self._instance: str | None = None
        self._since = 0
        self._last_body = b""
        self._last: tuple[Snapshot, TreeIndex | None] | None = None
        self._health: Health | None = None
        self._health_at = -float("inf")

    def _sample(self, state: str, message: str = "", **kw) -> RadixSample:
        return RadixSample(self.url, self._state.update(state, message), self._clock(), node=self.node, **kw)

    async def _poll(self) -> RadixSample:
        started = time.monotonic()
        got = await fetch(
            self.client, self.url + SNAPSHOT_PATH, max_bytes=self.max_bytes, params={BUDGET_PARAM: self.budget}
        )
        if got.error is not None:
            if got.refused:
                return self._sample("down", f"{self.url}: {got.error}")
            return self._sample("error", f"{self.url}: snapshot: {got.error}")
        if got.status != 200:
            return await self._not_ok(got)
        last = self._last if got.body == self._last_body else None
        unchanged = last is not None
        if last is not None:
            snapshot, index = last
        else:
            try:
                if len(got.body) <= INLINE_PARSE_BYTES:
                    snapshot, index = parse_and_index(got.body)
                else:
                    snapshot, index = await asyncio.to_thread(parse_and_index, got.body)
            except ValueError as exc:
                return self._sample("error", f"{self.url}: {one_line(str(exc))}")
            if self._last is not None:
                discard(self._last[0])
                discard(self._last[1])
            self._last_body, self._last = got.body, (snapshot, index)
        restarted = self._instance is not None and snapshot.instance != self._instance
        if snapshot.instance != self._instance:
            self._instance, self._since = snapshot.instance, 0
            self._health_at = -float("inf")
        events: tuple[Event, ...] = ()
        dropped, problem = 0, ""
        if snapshot.events_seq != self._since:  # the snapshot names the newest event: skip a no-op request
            events, dropped, problem = await self._events()
        now = time.monotonic()
        if now - self._health_at >= HEALTH_EVERY_S:
            self._health_at = now
            health, _ = await self._fetch_health()
            if health is not None:
                self._health = health
        state, message = "ok", ""
        if snapshot.hooks_state == "disabled" or (self._health is not None and self._health.status == "degraded"):
            state = "degraded"
            message = (self._health.message if self._health is not None else "") or "hooks disabled"
        elif not snapshot.walkable:
            state, message = "degraded", f"tree not walkable: {snapshot.reason}"
        elif problem:
            state, message = "degraded", problem
        return self._sample(
            state,
            message,
            rank=snapshot.rank,
            snapshot=snapshot,
            index=index,
            health=self._health,
            events=events,
            events_dropped=dropped,
            restarted=restarted,
            unchanged=unchanged,
            seconds=time.monotonic() - started,
            size=len(got.body),
        )

    async def _not_ok(self, got: Fetched) -> RadixSample:
        message = parse_error(got.body)
        if got.status == 404:
            return self._sample(
                "error",
                f"{self.url} has no radixtop debug endpoint (HTTP 404: {message}); "
                "check the URL (see /server_info radixtop_instrument)",
            )
        if got.status == 503:
            health, _ = await self._fetch_health()
            return self._sample("starting", f"{self.url}: {message}", health=health)
        return self._sample("error", f"{self.url}: HTTP {got.status}: {message}")

    async def _fetch_health(self) -> tuple[Health | None, str]:
        got = await fetch(self.client, self.url + HEALTH_PATH, max_bytes=256 * 1024)
        if not got.ok:
            return None, got.error or f"HTTP {got.status}"
        try:
            return parse_health(got.body), ""
        except ValueError as exc:
            return None, one_line(str(exc))

    async def _events(self) -> tuple[tuple[Event, ...], int, str]:
        """New events since the last poll (a few pages at most); a failure is a line, not a stop."""
        out: list[Event] = []
        dropped = 0
        for _ in range(EVENT_PAGES_PER_POLL):
            got = await fetch(
                self.client,
                self.url + EVENTS_PATH,
                max_bytes=MAX_EVENTS_BYTES,
                params={SINCE_PARAM: self._since, LIMIT_PARAM: EVENT_PAGE},
            )
            if not got.ok:
                why = got.error or f"HTTP {got.status}: {parse_error(got.body)}"
                return tuple(out), dropped, f"events: {why}"
            try:
                if len(got.body) <= INLINE_PARSE_BYTES:
                    page = parse_events(got.body)
                else:
                    page = await asyncio.to_thread(parse_events, got.body)
            except ValueError as exc:
                return tuple(out), dropped, one_line(str(exc))
            if page.instance != self._instance:  # the server restarted between the two requests
                self._instance, self._since = page.instance, 0
                continue
            out.extend(page.events)
            dropped += page.dropped
            self._since = page.next_since
            if not page.more:
                break
        return tuple(out), dropped, ""


def instrument_urls(values: Iterable[object], dropped: list[str] | None = None) -> list[str]:
    """The debug-endpoint URLs in /server_info's radixtop_instrument list that radixtop may contact.

    The list is network content, so the one rule for addresses radixtop did not get from its
    user applies (the UI, discovery and the bundle all read the list here): only loopback URLs
    are kept; an address off this machine is contacted only when the user types it
    (--instrument). Anything else (not http(s), too long, off loopback) goes to ``dropped``.
    """
    out = []
    for v in values:
        if isinstance(v, str) and v.startswith(("http://", "https://")) and len(v) < 300 and is_loopback_url(v):
            out.append(v.rstrip("/"))
        elif dropped is not None:
            dropped.append(str(v)[:300])
    return out
