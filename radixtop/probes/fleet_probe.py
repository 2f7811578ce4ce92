"""FleetProbe: the fleet's Prometheus polled, the queries of probes/fleet.py asked at once within
one deadline, their answers folded into a FleetSample; a failure is the sample's status, one line
saying what to do, never an exception."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from radixtop.probes.fleet import (
    DEFAULT_INTERVAL_S,
    DEFAULT_TIMEOUT_S,
    LOOKBACK,
    QUERIES,
    FleetSample,
    RankFigures,
    fold,
)
from radixtop.probes.http import make_client
from radixtop.probes.prometheus import instant_query, shown_url
from radixtop.probes.status import StateClock
from radixtop.schema import STATE_METRIC_NAMES

if TYPE_CHECKING:
    import httpx

__all__ = ["FleetProbe"]


class FleetProbe:
    """Polls the fleet's Prometheus at `url`; each poll is one FleetSample, never an exception."""

    def __init__(self, url: str, *, interval_s: float = DEFAULT_INTERVAL_S, timeout_s: float = DEFAULT_TIMEOUT_S,
                 client: httpx.AsyncClient | None = None, clock: Callable[[], float] = time.time) -> None:
        self.url = url.rstrip("/")
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self._client = client
        self._own_client = client is None
        self._clock = clock
        self._state = StateClock(clock)

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = make_client(self.timeout_s)
        return self._client

    async def aclose(self) -> None:
        if self._own_client and self._client is not None:
            client, self._client = self._client, None
            await client.aclose()

    async def poll(self) -> FleetSample:
        try:
            return await self._poll()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a gap in our own handling must not take the caller down
            return self._sample("error", f"radixtop failed reading {shown_url(self.url)}: {type(exc).__name__}: {exc}")

    async def _poll(self) -> FleetSample:
        deadline = self.timeout_s
        try:
            async with asyncio.timeout(deadline):
                answers = await asyncio.gather(*(
                    instant_query(self.client, self.url, q, timeout_s=deadline) for q in QUERIES.values()
                ))
        except TimeoutError:
            return self._sample("down", f"Prometheus at {shown_url(self.url)}: no answer within {deadline:g} s; "
                                        "check the URL, or give it longer (--timeout)")
        failed = next((a for a in answers if not a.ok), None)
        if failed is not None:
            return self._sample("down", failed.error or "")
        known, up, figures = answers
        notes = tuple(f"{name}: {a.note}" for name, a in zip(QUERIES, answers, strict=True) if a.note)
        ranks = fold(known, up, figures)
        if not ranks:
            return self._sample("degraded", "Prometheus answers but scrapes no radixtop debug endpoint (no "
                                            f"{STATE_METRIC_NAMES['hooks_active']} in the last {LOOKBACK}); "
                                            "add the ranks' /metrics to its scrape config", notes=notes)
        return self._sample("ok", ranks=ranks, notes=notes)

    def _sample(self, state: str, message: str = "", *, ranks: tuple[RankFigures, ...] = (),
                notes: tuple[str, ...] = ()) -> FleetSample:
        return FleetSample(shown_url(self.url), self._state.update(state, message), self._clock(), ranks, notes)
