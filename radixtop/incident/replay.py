"""Send a workload trace to a server at the trace's offsets and collect what came back.

One replay is the planned generate calls of a trace (``trace.plan_requests``), each sent to
``/generate`` as ``input_ids`` at temperature 0, at its offset from the replay's start. The
difference between when a call was due and when it was actually sent is recorded, so a report can
say how faithfully the timing was reproduced (the seed's divergence depends on arrival bursts).

This module is the shared core: ``radixtop demo`` loops it to drive the simulator, and the replay
and confirmation commands run it N times and compare outputs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import httpx

from radixtop.incident.trace import PlannedRequest

__all__ = ["Outcome", "ReplayRun", "replay_once"]


@dataclass(frozen=True)
class Outcome:
    """What one generate call returned (or why it did not)."""

    request_id: str
    copy: int
    text: str | None  # None when the call failed
    output_ids: tuple[int, ...]
    cached_tokens: int | None
    error: str | None
    lateness_ms: float  # sent this long after its offset (dispatch jitter)


@dataclass(frozen=True)
class ReplayRun:
    outcomes: tuple[Outcome, ...]
    duration_s: float

    @property
    def errors(self) -> int:
        return sum(1 for o in self.outcomes if o.error is not None)


def _error_text(response: httpx.Response) -> str:
    try:
        body = response.json()
        message = body.get("error", {}).get("message") or body.get("message") or body.get("detail")
    except (ValueError, AttributeError):
        message = None
    return f"HTTP {response.status_code}: {message or response.text[:200]}"


async def _send(
    client: httpx.AsyncClient, url: str, planned: PlannedRequest, temperature: float, lateness_ms: float
) -> Outcome:
    payload = {
        "input_ids": planned.input_ids,
        "sampling_params": {"max_new_tokens": planned.max_tokens, "temperature": temperature},
    }
    try:
        response = await client.post(f"{url}/generate", json=payload)
    except httpx.HTTPError as exc:
        return Outcome(planned.request_id, planned.copy, None, (), None, f"{type(exc).__name__}: {exc}", lateness_ms)
    if response.status_code != 200:
        return Outcome(planned.request_id, planned.copy, None, (), None, _error_text(response), lateness_ms)
    try:
        body = response.json()
        if isinstance(body, list):  # a batch answer; we always send one prompt
            body = body[0]
        meta = body.get("meta_info", {})
        return Outcome(
            planned.request_id,
            planned.copy,
            str(body["text"]),
            tuple(body.get("output_ids") or ()),
            meta.get("cached_tokens"),
            None,
            lateness_ms,
        )
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        return Outcome(planned.request_id, planned.copy, None, (), None, f"malformed answer: {exc}", lateness_ms)


async def replay_once(
    client: httpx.AsyncClient,
    url: str,
    planned: Sequence[PlannedRequest],
    *,
    temperature: float = 0.0,
    should_stop: Callable[[], bool] = lambda: False,
) -> ReplayRun:
    """Send every planned call at its offset; wait for all answers; return them in plan order.

    ``url`` is the server's base (``http://127.0.0.1:30000``). Calls that fail become outcomes with
    an error, never exceptions, so one dead server still yields a complete, reportable run.
    """
    url = url.rstrip("/")
    loop = asyncio.get_running_loop()
    start = loop.time()
    began = time.monotonic()
    tasks: list[asyncio.Task[Outcome]] = []
    for item in sorted(planned, key=lambda p: p.offset_s):
        if should_stop():
            break
        delay = start + item.offset_s - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        lateness_ms = max(0.0, (loop.time() - start - item.offset_s) * 1000.0)
        tasks.append(asyncio.create_task(_send(client, url, item, temperature, lateness_ms)))
    outcomes = await asyncio.gather(*tasks)
    return ReplayRun(tuple(outcomes), time.monotonic() - began)
