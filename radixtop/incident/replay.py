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
from dataclasses import dataclass, replace

import httpx

from radixtop.incident.cache_watch import CacheSetting, EvictionWatch, read_cache_setting
from radixtop.incident.trace import PlannedRequest

__all__ = ["Outcome", "ReplayRun", "replay_once"]

DEFAULT_CALL_DEADLINE_S = 120.0  # a whole generate call, when the client sets no read timeout


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
    sent_at: float = 0.0  # wall clock, to place the server's eviction events
    answered_at: float = 0.0


@dataclass(frozen=True)
class ReplayRun:
    outcomes: tuple[Outcome, ...]
    duration_s: float
    eviction_times: tuple[float, ...] | None = None  # the server's evictions (wall clock); None: unseen

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
    payload: dict = {"sampling_params": {"max_new_tokens": planned.max_tokens, "temperature": temperature}}
    if planned.text is not None:
        payload["text"] = planned.text
    else:
        payload["input_ids"] = planned.input_ids
    if planned.extra_key is not None:
        payload["extra_key"] = planned.extra_key
    # httpx's timeout is per read: a server sending a byte now and then would hold the call
    # forever. The same number of seconds is the whole call's deadline.
    total = client.timeout.read or DEFAULT_CALL_DEADLINE_S
    sent_at = time.time()

    def failed(why: str) -> Outcome:
        return Outcome(planned.request_id, planned.copy, None, (), None, why, lateness_ms, sent_at, time.time())

    try:
        response = await asyncio.wait_for(client.post(f"{url}/generate", json=payload), total)
    except httpx.HTTPError as exc:
        return failed(f"{type(exc).__name__}: {exc}")
    except TimeoutError:
        return failed(f"no whole answer within {total:.0f} s")
    if response.status_code != 200:
        return failed(_error_text(response))
    try:
        body = response.json()
        if isinstance(body, list):  # a batch answer; we always send one prompt
            body = body[0]
        meta = body.get("meta_info", {})
        cached = meta.get("cached_tokens")
        return Outcome(
            planned.request_id,
            planned.copy,
            str(body["text"]),
            tuple(body.get("output_ids") or ()),
            cached if isinstance(cached, int) and not isinstance(cached, bool) else None,
            None,
            lateness_ms,
            sent_at,
            time.time(),
        )
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
        return failed(f"malformed answer: {exc}")


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


# -- several runs of one workload -----------------------------------------------------------------


@dataclass(frozen=True)
class ReplayEvent:
    """Progress of a series, for a UI or a progress line: kind is "flush", "run-start",
    "run-done", "server-down" or "stopped"; run is 1-based."""

    kind: str
    run: int
    runs: int
    message: str


@dataclass(frozen=True)
class ReplaySeries:
    url: str
    runs: tuple[ReplayRun, ...]
    requested_runs: int
    flush: bool
    notes: tuple[str, ...] = ()
    stopped_early: str | None = None  # why fewer runs than requested were made
    cache: CacheSetting | None = None  # the server's page size, cache switch and instrument


FLUSH_ATTEMPTS = 5
FLUSH_RETRY_S = 0.2
FLUSH_DEADLINE_S = 10.0  # one flush call, whole
HEALTH_DEADLINE_S = 3.0


async def flush_cache(client: httpx.AsyncClient, url: str) -> str | None:
    """POST /flush_cache; None when flushed, else why not (SGLang refuses while requests run)."""
    last = ""
    for attempt in range(FLUSH_ATTEMPTS):
        try:
            response = await asyncio.wait_for(client.post(f"{url}/flush_cache"), FLUSH_DEADLINE_S)
        except httpx.HTTPError as exc:
            return f"{type(exc).__name__}: {exc}"
        except TimeoutError:
            return f"no whole answer within {FLUSH_DEADLINE_S:.0f} s"
        if response.status_code == 200:
            return None
        last = f"HTTP {response.status_code}: {response.text.strip()[:200]}"
        if attempt + 1 < FLUSH_ATTEMPTS:
            await asyncio.sleep(FLUSH_RETRY_S)
    return last


async def server_alive(client: httpx.AsyncClient, url: str) -> bool:
    try:
        return (await asyncio.wait_for(client.get(f"{url}/health", timeout=3.0), HEALTH_DEADLINE_S)).status_code == 200
    except (httpx.HTTPError, TimeoutError):
        return False


async def replay_series(
    url: str,
    planned: Sequence[PlannedRequest],
    runs: int,
    *,
    flush: bool = True,
    temperature: float = 0.0,
    client: httpx.AsyncClient | None = None,
    headers: dict[str, str] | None = None,
    on_event: Callable[[ReplayEvent], None] | None = None,
    should_stop: Callable[[], bool] = lambda: False,
    request_timeout_s: float = 120.0,
    instrument: str | None = None,
) -> ReplaySeries:
    """The same planned calls ``runs`` times, the cache flushed before each run when ``flush``.

    A run whose every call failed ends the series when the server no longer answers /health (a
    dead server is evidence, not a reason to keep hammering it). The server's cache setting is read
    first, and each run's evictions from its debug endpoint (``instrument``, else the one
    /server_info lists) when there is one.
    """
    url = url.rstrip("/")
    emit = on_event or (lambda event: None)
    owned = client is None
    if client is None:
        client = httpx.AsyncClient(
            timeout=httpx.Timeout(request_timeout_s, connect=5.0),
            # Idle connections expire well before a server's keep-alive timeout (uvicorn's 5 s), so a
            # call never goes out on a connection the server is closing at that moment.
            limits=httpx.Limits(max_connections=512, max_keepalive_connections=64, keepalive_expiry=1.0),
            headers=headers or {},
        )
    done: list[ReplayRun] = []
    notes: list[str] = []
    stopped: str | None = None
    try:
        cache = await read_cache_setting(client, url, instrument)
        watch = EvictionWatch(cache.instrument) if cache.instrument else None
        for index in range(1, runs + 1):
            if should_stop():
                stopped = "stopped on request"
                emit(ReplayEvent("stopped", index, runs, stopped))
                break
            if flush:
                why = await flush_cache(client, url)
                if why is None:
                    emit(ReplayEvent("flush", index, runs, "cache flushed"))
                else:
                    notes.append(f"run {index}: the cache could not be flushed ({why})")
                    emit(ReplayEvent("flush", index, runs, f"cache NOT flushed: {why}"))
            emit(ReplayEvent("run-start", index, runs, f"run {index}/{runs}: {len(planned)} calls"))
            watching = watch is not None and await watch.mark(client)
            run = await replay_once(client, url, planned, temperature=temperature, should_stop=should_stop)
            if watching:
                run = replace(run, eviction_times=await watch.eviction_times(client))
            done.append(run)
            emit(ReplayEvent(
                "run-done", index, runs,
                f"run {index}/{runs}: {len(run.outcomes) - run.errors} answered, {run.errors} failed, {run.duration_s:.1f} s",
            ))  # fmt: skip
            if run.outcomes and run.errors == len(run.outcomes) and not await server_alive(client, url):
                if index < runs:
                    stopped = f"the server stopped answering during run {index}"
                    emit(ReplayEvent("server-down", index, runs, stopped))
                break
    finally:
        if owned:
            await client.aclose()
    return ReplaySeries(url, tuple(done), runs, flush, tuple(notes), stopped, cache)
