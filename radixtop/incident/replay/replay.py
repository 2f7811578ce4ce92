"""Send a workload trace to a server at the trace's offsets and collect what came back.

One replay is the planned generate calls of a trace (``trace.plan_requests``), each sent to
``/generate`` as ``input_ids`` at temperature 0, at its offset from the replay's start. The
difference between when a call was due and when it was actually sent is recorded, so a report can
say how faithfully the timing was reproduced (the seed's divergence depends on arrival bursts).

This module is the shared core: ``radixtop demo`` loops it to drive the simulator, and the replay
and confirmation commands run it N times and compare outputs.

Two settings change the pressure a replay puts on a server that is already up, without touching
its flags: ``max_in_flight`` (at most K calls written and not yet answered: a call that comes due
while K are out waits for an answer, so the server runs fewer requests and holds fewer KV tokens;
the time it waited is ``held_ms``, apart from its dispatch lateness) and a cache namespace per
call (``namespace_per_request``: every call carries its own SGLang ``extra_key``, so none can
reuse another's cached pages: the same pressure without prefix reuse). A series can also take
each run's peak token usage (``peak_token_usage``): from the server's ``sglang:token_usage`` on
/metrics, read while the run goes, and from the batch lines its logs gained meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import secrets
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit

import httpx

from radixtop.incident.common.appended import AppendedLines, BatchTally
from radixtop.incident.replay.cache_watch import CacheSetting, EvictionWatch, read_cache_setting
from radixtop.incident.replay.trace import PlannedRequest
from radixtop.textsafe import printable_line

__all__ = [
    "Outcome",
    "ReplayRun",
    "UsageSampler",
    "call_namespace",
    "dispatch_plan",
    "format_pressure",
    "generate_payload",
    "pressure_json",
    "replay_once",
]

DEFAULT_CALL_DEADLINE_S = 120.0  # a whole generate call, when the client sets no read timeout
DEFAULT_CONNECT_S = 5.0
DISPATCHER_MODULE = "radixtop.incident.replay.dispatch"
# Headers the dispatcher writes itself, or must not send (it does not decompress answers).
_DISPATCHER_HEADERS = frozenset({"host", "content-type", "content-length", "transfer-encoding", "connection",
                                 "accept-encoding"})
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
    held_ms: float = 0.0  # due, but held back this long by the client-side cap (max_in_flight)


@dataclass(frozen=True)
class ReplayRun:
    outcomes: tuple[Outcome, ...]
    duration_s: float
    eviction_times: tuple[float, ...] | None = None  # the server's evictions (wall clock); None: unseen
    started_at: float = 0.0  # wall clock of offset 0: a call was due at started_at + its offset
    # The highest token usage the run's own batches set (None: not sampled, or none seen): from
    # sglang:token_usage on /metrics (usage_samples reads) and the logs' batch lines (usage_lines).
    peak_token_usage: float | None = None
    usage_samples: int = 0
    usage_lines: int = 0

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


def call_namespace(planned: PlannedRequest, namespace: str) -> str:
    """The ``extra_key`` of one call (one copy of a request) in a run tagged ``namespace``: its own,
    shared with no other call; the request's own ``extra_key`` stays in front."""
    key = f"radixtop-{namespace}-{planned.request_id}-{planned.copy}"
    return key if planned.extra_key is None else f"{planned.extra_key}-{key}"


def generate_payload(planned: PlannedRequest, temperature: float, namespace: str | None = None) -> dict[str, Any]:
    """The /generate body of a call; with ``namespace`` (a run's tag), in a cache namespace of its own."""
    payload: dict[str, Any] = {"sampling_params": {"max_new_tokens": planned.max_tokens, "temperature": temperature}}
    if planned.ignore_eos:
        payload["sampling_params"]["ignore_eos"] = True
    if planned.stop:
        payload["sampling_params"]["stop"] = list(planned.stop)
    if planned.text is not None:
        payload["text"] = planned.text
    else:
        payload["input_ids"] = planned.input_ids
    extra_key = planned.extra_key if namespace is None else call_namespace(planned, namespace)
    if extra_key is not None:
        payload["extra_key"] = extra_key
    return payload


def _outcome(planned: PlannedRequest, result: dict[str, Any]) -> Outcome:
    """One of the dispatcher's results as an Outcome."""
    late, sent, answered = float(result["late_ms"]), float(result["sent"]), float(result["answered"])
    held = float(result.get("held_ms") or 0.0)

    def failed(why: str) -> Outcome:
        return Outcome(planned.request_id, planned.copy, None, (), None, why, late, sent, answered, held)

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
            held,
        )
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
        return failed(f"malformed answer: {exc}")


def dispatch_plan(client: httpx.AsyncClient, url: str, order: Sequence[PlannedRequest], temperature: float, *,
                  max_in_flight: int | None = None, namespace: str | None = None) -> dict[str, Any]:
    """What the dispatcher process is told: where, with which headers, each call's body (each in a
    cache namespace of its own under ``namespace``), and at most how many calls in flight."""
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
        "calls": [
            {"offset_s": p.offset_s, "body": json.dumps(generate_payload(p, temperature, namespace))} for p in order
        ],
        "max_in_flight": max_in_flight or None,
    }


async def replay_once(
    client: httpx.AsyncClient,
    url: str,
    planned: Sequence[PlannedRequest],
    *,
    temperature: float = 0.0,
    should_stop: Callable[[], bool] = lambda: False,
    max_in_flight: int | None = None,
    namespace: str | None = None,
) -> ReplayRun:
    """Send every planned call at its offset; wait for all answers; return them in plan order.

    ``url`` is the server's base (``http://127.0.0.1:30000``). The calls go out from a dispatcher
    process (:mod:`radixtop.incident.replay.dispatch`), so the caller's loop, busy or not, never delays
    them; ``client`` gives the headers and timeouts. Calls that fail become outcomes with an error,
    never exceptions, so one dead server still yields a complete, reportable run. With
    ``max_in_flight`` at most that many calls are out at once (a due call waits for an answer);
    with ``namespace`` (a tag unique to the run) every call has a cache namespace of its own.
    """
    url = url.rstrip("/")
    began = time.monotonic()
    order = sorted(planned, key=lambda p: p.offset_s)
    if not order or should_stop():
        return ReplayRun((), time.monotonic() - began)
    plan = dispatch_plan(client, url, order, temperature, max_in_flight=max_in_flight, namespace=namespace)
    # Under a cap the calls go in waves of K, each within a call's connect timeout and deadline.
    waves = math.ceil(len(order) / max_in_flight) if max_in_flight else 1
    limit_s = order[-1].offset_s + waves * (plan["deadline_s"] + plan["connect_timeout_s"]) + DISPATCHER_GRACE_S
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
        )
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
            async with asyncio.timeout(EXIT_WAIT_S):
                await proc.wait()
            why = f"the dispatcher exited with code {proc.returncode}: {(await stderr).strip()[-300:] or 'no message'}"
    except (OSError, ValueError, TimeoutError) as exc:  # a broken pipe, a line that is not JSON
        why = why or f"the dispatcher failed: {type(exc).__name__}: {exc}"
    finally:
        if chunk is not None:
            chunk.cancel()
        if proc.returncode is None:
            if ended:  # it is leaving by itself
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(EXIT_WAIT_S):
                        await proc.wait()
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
    max_in_flight: int | None = None  # the client-side cap the runs were sent under; None: none
    namespace_per_request: bool = False  # every call in a cache namespace of its own


USAGE_EVERY_S = 0.5  # /metrics is read at most this often while a run goes
USAGE_DEADLINE_S = 2.0  # one read of /metrics, whole
FLUSH_ATTEMPTS = 5
FLUSH_RETRY_S = 0.2
FLUSH_DEADLINE_S = 10.0  # one flush call, whole
HEALTH_DEADLINE_S = 3.0


async def flush_cache(client: httpx.AsyncClient, url: str) -> str | None:
    """POST /flush_cache; None when flushed, else why not (SGLang refuses while requests run).
    The answer is read within the cap every answer has (probes/http.py fetch)."""
    from radixtop.probes.http import SHORT_ANSWER_BYTES, fetch

    last = ""
    for attempt in range(FLUSH_ATTEMPTS):
        got = await fetch(client, f"{url}/flush_cache", method="POST", max_bytes=SHORT_ANSWER_BYTES,
                          timeout_s=FLUSH_DEADLINE_S)
        if got.error is not None:
            return got.error
        if got.status == 200:
            return None
        last = f"HTTP {got.status}: {got.body.decode('utf-8', 'replace').strip()[:200]}"
        if attempt + 1 < FLUSH_ATTEMPTS:
            await asyncio.sleep(FLUSH_RETRY_S)
    return last


async def server_alive(client: httpx.AsyncClient, url: str) -> bool:
    from radixtop.probes.http import SHORT_ANSWER_BYTES, fetch

    got = await fetch(client, f"{url}/health", max_bytes=SHORT_ANSWER_BYTES, timeout_s=HEALTH_DEADLINE_S)
    return got.ok


class UsageSampler:
    """The server's ``sglang:token_usage`` (``radixtop.probes.sglang.parse_metrics``) read from
    /metrics while one run goes, at most every USAGE_EVERY_S; nothing else is asked (never /health,
    nothing that generates). ``await run()`` in a task, then ``await finish(run)``: one last read
    at the next tick, and the run's peak.

    SGLang's scheduler sets the gauge where it logs a batch (a prefill, every 40th decode step) and
    /metrics gives the value set last (none before its first batch; 0 once idle), so a read before
    the run's first answer may hold the previous run's value: only the reads sent after that answer
    count. Only an answer other than 200 (no ``--enable-metrics``: 404) stops the reads.

    Reads miss whatever the gauge held between them; the batch lines do not. With the server's
    ``logs``, the lines they gain from the sampler's creation on count too (``BatchTally``).
    """

    def __init__(self, client: httpx.AsyncClient, url: str, logs: Sequence[str] = (), *, metrics: bool = True) -> None:
        self._client = client
        self._url = url
        self._stop = asyncio.Event()
        self._metrics = metrics
        self.samples: list[tuple[float, float]] = []  # (wall time the read was sent, token usage)
        self.missing: str | None = None  # why the server gives no token usage (no /metrics)
        self._lines = AppendedLines(logs) if logs else None
        self.tally = BatchTally()
        if self._lines is not None:
            self._lines.start()

    def _read_logs(self) -> None:
        if self._lines is not None:
            for _path, _lineno, text in self._lines.read():
                self.tally.add(text)

    async def run(self) -> None:
        while True:
            last = self._stop.is_set()
            began = time.monotonic()
            await asyncio.to_thread(self._read_logs)
            if self._metrics and self.missing is None:
                await self._read_metrics()
            elif self._lines is None:
                return  # nothing left to read
            if last:
                return
            await asyncio.sleep(max(0.0, USAGE_EVERY_S - (time.monotonic() - began)))

    async def _read_metrics(self) -> None:
        from radixtop.probes.http import fetch
        from radixtop.probes.sglang import MAX_METRICS_BYTES, parse_metrics

        sent = time.time()
        got = await fetch(self._client, f"{self._url}/metrics", max_bytes=MAX_METRICS_BYTES, timeout_s=USAGE_DEADLINE_S)
        if got.ok:
            try:
                usage = parse_metrics(got.body.decode("utf-8", "replace")).get("token_usage")
            except ValueError:
                usage = None
            if usage is not None:  # SGLang has no sample of the gauge before its first batch
                self.samples.append((sent, usage))
        elif got.status is not None:  # answered, but not with metrics
            self.missing = f"{self._url}/metrics answered HTTP {got.status} (start it with --enable-metrics)"

    async def finish(self, task: asyncio.Task[None], run: ReplayRun) -> ReplayRun:
        """One last read (the run's final batches), then ``run`` with its peak token usage."""
        self._stop.set()
        try:
            async with asyncio.timeout(USAGE_EVERY_S + USAGE_DEADLINE_S + 1.0):
                await asyncio.shield(task)
        except TimeoutError:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        answered = [o.answered_at for o in run.outcomes if o.error is None]
        if not answered:
            return run
        first = min(answered)
        reads = [u for sent, u in self.samples if sent >= first]
        lines = [self.tally.peak_token_usage] if self.tally.peak_token_usage is not None else []
        return replace(run, peak_token_usage=max(reads + lines, default=None), usage_samples=len(reads),
                       usage_lines=self.tally.usage_lines)


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
    max_in_flight: int | None = None,
    namespace_per_request: bool = False,
    sample_token_usage: bool = False,
    logs: Sequence[str] = (),
) -> ReplaySeries:
    """The same planned calls ``runs`` times, the cache flushed before each run when ``flush``.

    A run whose every call failed ends the series when the server no longer answers /health (a
    dead server is evidence, not a reason to keep hammering it). The server's cache setting is read
    first, and each run's evictions from its debug endpoint (``instrument``, else the one
    /server_info lists) when there is one. ``max_in_flight``: at most that many calls out at once;
    ``namespace_per_request``: every call of every run in a cache namespace of its own (tagged
    with this series and run, so neither another run nor another replay can share its pages);
    ``sample_token_usage``: each run's peak token usage (:class:`UsageSampler`; ``logs``: the
    server's logs, whose batch lines miss no value).
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
    series_tag = secrets.token_hex(4)  # the cache namespaces of this series' calls
    metrics = sample_token_usage  # until /metrics says it has none
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
                    why = printable_line(why)  # an error page is many lines of HTML: one line, as text
                    notes.append(f"run {index}: the cache could not be flushed ({why})")
                    emit(ReplayEvent("flush", index, runs, f"cache NOT flushed: {why}"))
            emit(ReplayEvent("run-start", index, runs, f"run {index}/{runs}: {len(planned)} calls"))
            watching = watch is not None and await watch.mark(client)
            sampled = sample_token_usage and (metrics or bool(logs))
            sampler = UsageSampler(client, url, logs, metrics=metrics) if sampled else None
            sampling = asyncio.create_task(sampler.run()) if sampler is not None else None
            try:
                run = await replay_once(client, url, planned, temperature=temperature, should_stop=should_stop,
                                        max_in_flight=max_in_flight,
                                        namespace=f"{series_tag}-{index}" if namespace_per_request else None)
            except BaseException:
                if sampling is not None:
                    sampling.cancel()  # cancelled: no run to report
                raise
            if sampler is not None and sampling is not None:
                run = await sampler.finish(sampling, run)
                if sampler.missing is not None:
                    metrics = False  # asked no more: the next run would not have it either
                    notes.append(f"no token usage sampled from /metrics: {sampler.missing}")
            if watch is not None and watching:
                run = replace(run, eviction_times=await watch.eviction_times(client))
            done.append(run)
            emit(ReplayEvent(
                "run-done", index, runs,
                f"run {index}/{runs}: {len(run.outcomes) - run.errors} answered, {run.errors} failed, "
                f"{run.duration_s:.1f} s",
            ))
            if run.outcomes and run.errors == len(run.outcomes) and not await server_alive(client, url):
                if index < runs:
                    stopped = f"the server stopped answering during run {index}"
                    emit(ReplayEvent("server-down", index, runs, stopped))
                break
    finally:
        if owned:
            await client.aclose()
    return ReplaySeries(url, tuple(done), runs, flush, tuple(notes), stopped, cache, max_in_flight or None,
                        namespace_per_request)


# -- what the series' pressure settings did -------------------------------------------------------


def _held(run: ReplayRun) -> dict[str, Any]:
    held = sorted(o.held_ms for o in run.outcomes if o.held_ms > 0)
    return {"calls": len(held), "median": round(held[len(held) // 2], 3) if held else 0.0,
            "max": round(held[-1], 3) if held else 0.0}


def pressure_json(series: ReplaySeries) -> dict[str, Any]:
    """The series' client-side settings, and per run the server's peak token usage and the calls
    the cap held back (how many, the median and longest hold in ms)."""
    return {
        "max_in_flight": series.max_in_flight,
        "namespace_per_request": series.namespace_per_request,
        "per_run": [
            {"run": i, "peak_token_usage": run.peak_token_usage, "token_usage_samples": run.usage_samples,
             "token_usage_lines": run.usage_lines, "held_by_cap_ms": _held(run)}
            for i, run in enumerate(series.runs, 1)
        ],
    }


def format_pressure(series: ReplaySeries) -> list[str]:
    """The same as report lines."""
    out = []
    if series.max_in_flight:
        out.append(f"  Max in flight: {series.max_in_flight} calls (client-side: a call due while they are out "
                   "waits for an answer; the jitter above leaves that wait out)")
        for i, run in enumerate(series.runs, 1):
            held = _held(run)
            out.append(f"    run {i}: {held['calls']} of {len(run.outcomes)} calls held, "
                       f"median {held['median']:.1f} ms, longest {held['max']:.1f} ms")
    if series.namespace_per_request:
        out.append("  Cache namespace: one per call (extra_key): no call can reuse another's cached pages")
    if any(run.usage_samples or run.usage_lines for run in series.runs):
        peaks = [f"run {i} {'-' if r.peak_token_usage is None else f'{r.peak_token_usage:.2f}'}"
                 for i, r in enumerate(series.runs, 1)]
        sources = ([f"sglang:token_usage, read every {USAGE_EVERY_S:g} s"] if any(r.usage_samples for r in series.runs)
                   else []) + (["the logs' batch lines"] if any(r.usage_lines for r in series.runs) else [])
        out.append(f"  Peak token usage ({' and '.join(sources)}): {', '.join(peaks)}")
    return out
