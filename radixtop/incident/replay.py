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
import contextlib
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit

import httpx

from radixtop.incident.cache_watch import CacheSetting, EvictionWatch, read_cache_setting
from radixtop.incident.trace import PlannedRequest

__all__ = ["Outcome", "ReplayRun", "dispatch_plan", "generate_payload", "replay_once"]

DEFAULT_CALL_DEADLINE_S = 120.0  # a whole generate call, when the client sets no read timeout
DEFAULT_CONNECT_S = 5.0
DISPATCHER_MODULE = "radixtop.incident.dispatch"
# Headers the dispatcher writes itself, or must not send (it does not decompress answers).
_DISPATCHER_HEADERS = frozenset({"host", "content-type", "content-length", "transfer-encoding", "connection",
                                 "accept-encoding"})  # fmt: skip
STOP_POLL_S = 0.05  # how often should_stop is asked while calls are out
DISPATCHER_GRACE_S = 30.0  # past the last call's deadline, before a silent dispatcher is killed
EXIT_WAIT_S = 5.0
RESULT_LINE_LIMIT = 64 << 20  # one result line: an answer is capped at 16 MiB, JSON-escaped
READ_CHUNK = 1 << 20


@dataclass(frozen=True)
class Outcome:
    """What one generate call returned (or why it did not)."""

    request_id: str
    copy: int
    text: str | None  # None when the call failed
    output_ids: tuple[int, ...]
    cached_tokens: int | None
    error: str | None
    lateness_ms: float  # written to the socket this long after its offset (dispatch jitter)
    sent_at: float = 0.0  # wall clock, to place the server's eviction events
    answered_at: float = 0.0


@dataclass(frozen=True)
class ReplayRun:
    outcomes: tuple[Outcome, ...]
    duration_s: float
    eviction_times: tuple[float, ...] | None = None  # the server's evictions (wall clock); None: unseen
    started_at: float = 0.0  # wall clock of offset 0: a call was due at started_at + its offset

    @property
    def errors(self) -> int:
        return sum(1 for o in self.outcomes if o.error is not None)


def _error_text(status: int, body: str) -> str:
    try:
        doc = json.loads(body)
        message = doc.get("error", {}).get("message") or doc.get("message") or doc.get("detail")
    except (ValueError, AttributeError):
        message = None
    return f"HTTP {status}: {message or body[:200]}"


def generate_payload(planned: PlannedRequest, temperature: float) -> dict[str, Any]:
    payload: dict[str, Any] = {"sampling_params": {"max_new_tokens": planned.max_tokens, "temperature": temperature}}
    if planned.ignore_eos:
        payload["sampling_params"]["ignore_eos"] = True
    if planned.text is not None:
        payload["text"] = planned.text
    else:
        payload["input_ids"] = planned.input_ids
    if planned.extra_key is not None:
        payload["extra_key"] = planned.extra_key
    return payload


def _outcome(planned: PlannedRequest, result: dict[str, Any]) -> Outcome:
    """One of the dispatcher's results as an Outcome."""
    late, sent, answered = float(result["late_ms"]), float(result["sent"]), float(result["answered"])

    def failed(why: str) -> Outcome:
        return Outcome(planned.request_id, planned.copy, None, (), None, why, late, sent, answered)

    if "error" in result:
        return failed(str(result["error"]))
    body = str(result.get("body", ""))
    if result.get("status") != 200:
        return failed(_error_text(int(result.get("status") or 0), body))
    try:
        doc = json.loads(body)
        if isinstance(doc, list):  # a batch answer; we always send one prompt
            doc = doc[0]
        meta = doc.get("meta_info", {})
        cached = meta.get("cached_tokens")
        return Outcome(
            planned.request_id,
            planned.copy,
            str(doc["text"]),
            tuple(doc.get("output_ids") or ()),
            cached if isinstance(cached, int) and not isinstance(cached, bool) else None,
            None,
            late,
            sent,
            answered,
        )
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
        return failed(f"malformed answer: {exc}")


def dispatch_plan(client: httpx.AsyncClient, url: str, order: Sequence[PlannedRequest], temperature: float) -> dict[str, Any]:
    """What the dispatcher process is told: where, with which headers, and each call's body."""
    parts = urlsplit(url)
    # The client's own headers (auth above all) go with every call, less those the dispatcher
    # writes itself and Accept-Encoding (it reads answers as they come, uncompressed).
    headers = [[k, v] for k, v in client.headers.items() if k.lower() not in _DISPATCHER_HEADERS]
    return {
        "host": parts.hostname, "port": parts.port or (443 if parts.scheme == "https" else 80),
        "tls": parts.scheme == "https", "authority": parts.netloc, "path": "/generate", "headers": headers,
        # httpx's timeout is per read: a server sending a byte now and then would hold a call
        # forever. The same number of seconds is the whole call's deadline.
        "deadline_s": client.timeout.read or DEFAULT_CALL_DEADLINE_S,
        "connect_timeout_s": client.timeout.connect or DEFAULT_CONNECT_S,
        "calls": [{"offset_s": p.offset_s, "body": json.dumps(generate_payload(p, temperature))} for p in order],
    }  # fmt: skip


async def replay_once(
    client: httpx.AsyncClient,
    url: str,
    planned: Sequence[PlannedRequest],
    *,
    temperature: float = 0.0,
    should_stop: Callable[[], bool] = lambda: False,
) -> ReplayRun:
    """Send every planned call at its offset; wait for all answers; return them in plan order.

    ``url`` is the server's base (``http://127.0.0.1:30000``). The calls go out from a dispatcher
    process (:mod:`radixtop.incident.dispatch`), so the caller's loop, busy or not, never delays
    them; ``client`` gives the headers and timeouts. Calls that fail become outcomes with an error,
    never exceptions, so one dead server still yields a complete, reportable run.
    """
    url = url.rstrip("/")
    began = time.monotonic()
    order = sorted(planned, key=lambda p: p.offset_s)
    if not order or should_stop():
        return ReplayRun((), time.monotonic() - began)
    plan = dispatch_plan(client, url, order, temperature)
    limit_s = order[-1].offset_s + plan["deadline_s"] + plan["connect_timeout_s"] + DISPATCHER_GRACE_S
    results, started_at, why = await _run_dispatcher(plan, should_stop, limit_s)
    if why is not None:  # the dispatcher failed: every call it did not report failed with it
        now = time.time()
        for i in range(len(order)):
            results.setdefault(i, {"late_ms": 0.0, "sent": now, "answered": now, "error": why})
    outcomes = tuple(_outcome(order[i], results[i]) for i in sorted(results))
    return ReplayRun(outcomes, time.monotonic() - began, started_at=started_at)


async def _run_dispatcher(
    plan: dict[str, Any], should_stop: Callable[[], bool], limit_s: float
) -> tuple[dict[int, dict[str, Any]], float, str | None]:
    """Run the dispatcher process on a plan: (results by call index, wall time of offset 0, why
    it failed or None). It is told to stop when ``should_stop()``, and killed when this is
    cancelled or it outlives ``limit_s``; it never outlives this call."""
    loop = asyncio.get_running_loop()
    results: dict[int, dict[str, Any]] = {}
    started_at = 0.0
    why: str | None = None
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", DISPATCHER_MODULE, stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            start_new_session=True,  # a terminal's Ctrl-C goes to the caller, which says stop
        )  # fmt: skip
    except OSError as exc:
        return results, started_at, f"the dispatcher could not start: {exc}"
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    stderr = asyncio.ensure_future(_tail(proc.stderr))
    chunk: asyncio.Future[bytes] | None = None
    pending = b""
    ended = False
    try:
        proc.stdin.write(json.dumps(plan).encode() + b"\n")
        await proc.stdin.drain()
        stop_sent = False
        give_up = loop.time() + limit_s
        while not ended and why is None:
            if not stop_sent and should_stop():
                stop_sent = True
                proc.stdin.write(b"stop\n")
            # Whole chunks, not lines: a busy loop (the TUI's) then takes a turn per chunk.
            chunk = chunk or asyncio.ensure_future(proc.stdout.read(READ_CHUNK))
            done, _ = await asyncio.wait({chunk}, timeout=STOP_POLL_S)
            if not done:
                if loop.time() > give_up:
                    why = f"the dispatcher gave no answer within {limit_s:.0f} s"
                continue
            data, chunk = chunk.result(), None
            if not data:
                break
            *lines, pending = (pending + data).split(b"\n")
            if len(pending) > RESULT_LINE_LIMIT:
                raise ValueError(f"a result line over {RESULT_LINE_LIMIT >> 20} MiB")
            for text in lines:
                doc = json.loads(text)
                if "i" in doc:
                    results[int(doc["i"])] = doc
                elif "ready" in doc:
                    started_at = float(doc["ready"])
                elif "end" in doc:
                    ended = True
                elif "fatal" in doc:
                    why = f"the dispatcher failed: {doc['fatal']}"
        if not ended and why is None:
            await asyncio.wait_for(proc.wait(), EXIT_WAIT_S)
            why = f"the dispatcher exited with code {proc.returncode}: {(await stderr).strip()[-300:] or 'no message'}"
    except (OSError, ValueError, TimeoutError) as exc:  # a broken pipe, a line that is not JSON
        why = why or f"the dispatcher failed: {type(exc).__name__}: {exc}"
    finally:
        if chunk is not None:
            chunk.cancel()
        if proc.returncode is None:
            if ended:  # it is leaving by itself
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(proc.wait(), EXIT_WAIT_S)
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        stderr.cancel()
    return results, started_at, why


async def _tail(stream: asyncio.StreamReader, keep: int = 4096) -> str:
    data = b""
    while chunk := await stream.read(4096):
        data = (data + chunk)[-keep:]
    return data.decode("utf-8", "replace")


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
            if watch is not None and watching:
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
