"""What a replay learns about the server's prefix cache: its page size, whether it is on, and when it
evicted (from radixtop's instrument, when the server has one).

``/server_info`` gives ``page_size`` and ``disable_radix_cache`` (SGLang's server args; the simulator
says the same) and, on the simulator, the debug endpoints (``radixtop_instrument``; only loopback
ones are used, the rule for addresses read from the network); a real SGLang lists none, so on this
machine they are found among the listening ports of the server's processes, as discovery finds
them. The endpoint's event feed names
every evict call with its wall-clock time, so a call that got fewer cached tokens than expected can
be told "evicted before reuse" from "not cached yet". Every read here fails soft: unknown is None.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from radixtop.probes.http import Fetched, fetch
from radixtop.probes.radix import instrument_urls
from radixtop.schema import EVENTS_PATH, HEALTH_PATH, LIMIT_PARAM, SINCE_PARAM, parse_events

if TYPE_CHECKING:
    import httpx

    from radixtop.schema import EventPage

__all__ = ["CacheSetting", "EvictionWatch", "read_cache_setting"]

READ_DEADLINE_S = 2.0  # one whole read; a replay waits for it before its first run
EVENT_PAGE = 1_000
MAX_BYTES = 8 << 20  # /server_info, or one page of 1,000 events
MAX_EVENT_PAGES = 50  # 50,000 events after one run; more were dropped by the server's ring anyway


async def _fetch(client: httpx.AsyncClient, url: str, params: dict[str, str | int] | None = None) -> Fetched:
    """GET, the whole answer within READ_DEADLINE_S (probes/http.py fetch)."""
    return await fetch(client, url, timeout_s=READ_DEADLINE_S, params=params, max_bytes=MAX_BYTES)


@dataclass(frozen=True)
class CacheSetting:
    page_size: int | None  # None: the server did not say
    disabled: bool
    instrument: str | None  # rank 0's debug endpoint


async def read_cache_setting(client: httpx.AsyncClient, url: str, instrument: str | None = None) -> CacheSetting:
    """The server's cache setting from /server_info; ``instrument`` (the user's) wins over its list."""
    from radixtop.probes.server_info import LimitError, ServerLimits, decode_server_info

    got = await _fetch(client, f"{url}/server_info")
    info: dict[str, Any] = {}
    if got.ok:
        try:
            info = decode_server_info(got.body, url)
        except ValueError:
            info = {}
    try:
        page_size = ServerLimits.read(info).page_size
    except LimitError:
        page_size = None  # unknown, as when the server does not say
    if instrument is None:
        listed = info.get("radixtop_instrument")
        urls = instrument_urls(listed if isinstance(listed, list) else [])
        instrument = urls[0] if urls else await _rank0_among_ports(client, url)
    return CacheSetting(page_size, info.get("disable_radix_cache") is True, instrument)


async def _rank0_among_ports(client: httpx.AsyncClient, url: str) -> str | None:
    """Rank 0's debug endpoint among the listening ports of the server on `url` (loopback only)."""
    from radixtop.incident.common.server import listening_pid, url_port
    from radixtop.probes.discovery import instrument_candidates, rank_of_health
    from radixtop.probes.http import is_loopback_url

    if not is_loopback_url(url):
        return None
    pid = await asyncio.to_thread(listening_pid, url_port(url))
    if pid is None:
        return None
    for candidate in await asyncio.to_thread(instrument_candidates, pid):
        got = await _fetch(client, candidate + HEALTH_PATH)
        if rank_of_health(got.status, got.body) == 0:
            return candidate
    return None


class EvictionWatch:
    """The evict events of one debug endpoint after a starting point (``mark``)."""

    def __init__(self, instrument: str) -> None:
        self.url = instrument.rstrip("/") + EVENTS_PATH
        self._since: int | None = None
        self._instance: str | None = None

    async def _page(self, client: httpx.AsyncClient, since: int, limit: int) -> EventPage | None:
        got = await _fetch(client, self.url, {SINCE_PARAM: since, LIMIT_PARAM: limit})
        if not got.ok:
            return None
        try:
            return parse_events(got.body)
        except ValueError:
            return None

    async def mark(self, client: httpx.AsyncClient) -> bool:
        """Start from the newest event now; False when the endpoint does not answer."""
        page = await self._page(client, 0, 1)
        if page is None:
            self._since = None
            return False
        self._since, self._instance = page.latest_seq, page.instance
        return True

    async def eviction_times(self, client: httpx.AsyncClient) -> tuple[float, ...] | None:
        """Wall-clock times of the evictions since ``mark``, sorted; None when they cannot be known
        (no answer, the server restarted, or its ring dropped some)."""
        if self._since is None:
            return None
        times: list[float] = []
        since = self._since
        for _ in range(MAX_EVENT_PAGES):
            page = await self._page(client, since, EVENT_PAGE)
            if page is None or page.instance != self._instance or page.dropped:
                return None
            times.extend(e.time for e in page.events if e.kind == "evict")
            since = page.next_since
            if not page.more:
                return tuple(sorted(times))
        return None
