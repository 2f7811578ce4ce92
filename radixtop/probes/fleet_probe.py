"""FleetProbe: the fleet's Prometheus polled, the queries of probes/fleet.py asked at once within
one deadline, their answers folded into a FleetSample; a failure is the sample's status, one line
saying what to do, never an exception."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from radixtop.probes.fleet import (
    DEFAULT_INTERVAL_S,
    DEFAULT_TIMEOUT_S,
    LOOKBACK,
    QUERIES,
    FleetSample,
    fold,
)
from radixtop.probes.http import PolledProbe
from radixtop.probes.prometheus import instant_query, shown_url
from radixtop.probes.status import StateClock
from radixtop.schema import STATE_METRIC_NAMES

if TYPE_CHECKING:
    import httpx

__all__ = ["FleetProbe"]


class FleetProbe(PolledProbe):
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
    def shown_url(self) -> str:
        return shown_url(self.url)

    async def _poll(self) -> FleetSample:
        deadline = self.timeout_s
        try:
            async with asyncio.timeout(deadline):
                answers = await asyncio.gather(*(
                    instant_query(self.client, self.url, q, timeout_s=deadline) for q in QUERIES.values()
                ))
        except TimeoutError:
            return self._sample("down", f"Prometheus at {self.shown_url}: no answer within {deadline:g} s; "
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

    def _sample(self, state: str, message: str = "", **kw: Any) -> FleetSample:
        """A sample with `ranks` (tuple[RankFigures, ...]) and `notes` (tuple[str, ...]) where given."""
        return FleetSample(self.shown_url, self._state.update(state, message), self._clock(), kw.get("ranks", ()),
                           kw.get("notes", ()))
