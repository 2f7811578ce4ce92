"""The debug endpoint: snapshots taken on the scheduler thread, served from an HTTP thread.

Runs inside the host's scheduler process: standard library only; never raises into the host
(start() returns False and logs one line when it cannot serve, e.g. the port is taken); bounded
cost: snapshots are captured on demand (a safe point captures only when a reader asked for one
and found none younger than `min_interval_s`; one at start so health has something to show),
rate-limited (at most one per `min_interval_s`, 2/s by default) and stretched so that snapshots (detail walks within
`max_duty - census_duty`) never take more than `max_duty` (1 %) of the scheduler thread with the
census, which advances one bounded slice per step, its steps spaced to keep within `census_duty`
(ten times less while nobody reads snapshots); at most `max_connections` requests are served at once,
at most half of them for one client address, and each connection is closed once it has taken
`request_deadline_s` in all (a client that sends its request a line every few seconds, which no
per-read timeout catches, cannot keep the others out for longer), or HEAD_DEADLINE_S without its
request head. A new connection that finds no slot takes the one of the oldest connection still
without its head: radixtop's own probe shares 127.0.0.1 with every local user, whose idle
half-requests must not keep it out.

The scheduler thread only reads: it captures raw figures (snapshot.Capture: plain ints, floats and
row tuples) and swaps the capture in under a lock. The first HTTP thread that wants it builds the
checked Snapshot and its JSON from it (once per capture) on its own time; HTTP threads otherwise
read only the counters (plain ints) and the event ring (locked).

Wiring for a host (one per rank), see Instrumentation below for the three-call version:
    hooks = CacheHooks(); hooks.install(cache)          # or its class, in a one-cache process
    ep = InstrumentEndpoint(rank=r, hooks=hooks); ep.start()
    ... once per scheduler iteration: ep.safe_point(cache)
    ep.stop(); hooks.uninstall()
"""

from __future__ import annotations

import contextlib
import errno
import hmac
import ipaddress
import logging
import secrets
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qs, urlsplit

from radixtop.instrument.flight import FlightRecorder
from radixtop.instrument.holders import HolderTracker
from radixtop.instrument.hooks import CacheHooks, EventRing
from radixtop.instrument.snapshot import Capture, SnapshotConfig, TreeSnapshotter
from radixtop.schema import (
    BUDGET_PARAM,
    DEFAULT_BASE_PORT,
    DEFAULT_HOST,
    EVENTS_PATH,
    HEALTH_PATH,
    INSTRUMENT_PORT_SPAN,
    LIMIT_PARAM,
    MAX_EVENTS_PER_PAGE,
    METRIC_NAMES,
    METRICS_PATH,
    SCHEMA_VERSION,
    SINCE_PARAM,
    SNAPSHOT_PATH,
    STATE_METRIC_NAMES,
    Counters,
    EventPage,
    Health,
    Snapshot,
    encode_json,
    error_body,
)

log = logging.getLogger("radixtop.instrument")

_JSON = "application/json"
_MIN_CENSUS_GAP_S = 0.02  # census steps at most 50 a second, however cheap (a cache with no tree)
_PROM = "text/plain; version=0.0.4; charset=utf-8"

_COUNTER_HELP = {
    "lock_ops": "inc_lock_ref calls.",
    "unlock_ops": "dec_lock_ref calls.",
    "lock_failures": "inc_lock_ref calls that raised.",
    "unlock_failures": "dec_lock_ref calls that raised.",
    "negative_lock_ref": "dec_lock_ref calls that left a node on their path with lock_ref below zero.",
    "evict_calls": "evict calls.",
    "evictions": "evict calls that freed at least one token.",
    "evicted_tokens": "Tokens freed by evict.",
    "evict_short_locked": "evict calls that freed less than asked while locked (protected) tokens were held.",
    "evict_failures": "evict calls that raised.",
    "instrument_errors": "Errors inside radixtop's own instrumentation (caught).",
    "events_dropped": "Events pushed out of the bounded event ring before being read.",
}
_NOTICE_EVERY_S = 30.0  # at most one INFO line per kind of client trouble this often
RefusedFor = Literal["token", "port", "error"]  # no token off loopback, no free port, anything else
HEAD_DEADLINE_S = 2.0  # a request head (a GET's line and headers) comes at once, or not at all
HEAD_GRACE_S = 0.25  # a connection still without its head after this yields its slot to a new one


def one_line(exc: BaseException) -> str:
    """'Type: first line of the message', at most 300 characters (health's last_error)."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"[:300] if text else type(exc).__name__


class _Notice:
    """A count of one kind of client trouble, and an INFO line about it at most once per
    `every_s`: what happened in between is counted and the next line says how much."""

    def __init__(self, what: str, every_s: float) -> None:
        self.what = what
        self.every_s = every_s
        self.count = 0
        self._suppressed = 0
        self._last_line = -float("inf")
        self._lock = threading.Lock()

    def note(self, rank: int, detail: str = "") -> None:
        with self._lock:
            self.count += 1
            now = time.monotonic()
            if now - self._last_line < self.every_s:
                self._suppressed += 1
                return
            suppressed, self._suppressed, self._last_line = self._suppressed, 0, now
        more = f" ({suppressed} more since the last such line)" if suppressed else ""
        log.info("radixtop endpoint for rank %d: %s%s%s", rank, self.what, detail, more)


_LOCK_BUCKETS = (
    ("<0", -(2**63), -1), ("0", 0, 0), ("1", 1, 1), ("2-3", 2, 3), ("4-7", 4, 7), ("8-15", 8, 15), ("16+", 16, 2**63)
)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name we will not resolve: treat as reachable from outside


class _Conn:
    """A connection being served: its client address, when it was accepted, whether its request
    head has been read."""

    __slots__ = ("head_read", "host", "started")

    def __init__(self, host: str, started: float) -> None:
        self.host = host
        self.started = started
        self.head_read = False


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self, addr: tuple[str, int], endpoint: InstrumentEndpoint, max_connections: int, deadline_s: float
    ) -> None:
        self.endpoint = endpoint
        self._slots = threading.BoundedSemaphore(max_connections)
        self._per_client = max(1, (max_connections + 1) // 2)
        self._deadline_s = deadline_s
        self._head_deadline_s = min(deadline_s, HEAD_DEADLINE_S)
        self._lock = threading.Lock()
        self._active: dict[Any, _Conn] = {}
        family = socket.AF_INET6 if ":" in addr[0] else socket.AF_INET
        self.address_family = family
        super().__init__(addr, _Handler)

    def _admit(self, request: Any, host: str) -> tuple[bool, Any]:
        """(admitted, the connection it displaced or None). Every local user shares 127.0.0.1 with
        radixtop's own probe: a connection still without its request head after HEAD_GRACE_S
        yields its slot to a new one, so idle half-requests cannot keep the owner out."""
        now = time.monotonic()
        with self._lock:
            own = [c for c in self._active.items() if c[1].host == host]
            if len(own) < self._per_client and self._slots.acquire(blocking=False):  # bounded threads
                self._active[request] = _Conn(host, now)
                return True, None
            idle = [c for c in (own if len(own) >= self._per_client else self._active.items())
                    if not c[1].head_read and now - c[1].started >= HEAD_GRACE_S]
            if not idle:
                return False, None
            victim = min(idle, key=lambda c: c[1].started)[0]
            del self._active[victim]  # its slot passes to the new connection
            self._active[request] = _Conn(host, now)
            return True, victim

    def head_read(self, request: Any) -> None:
        with self._lock:
            conn = self._active.get(request)
            if conn is not None:
                conn.head_read = True

    def _release(self, request: Any) -> None:
        with self._lock:
            if self._active.pop(request, None) is not None:
                self._slots.release()

    def _turn_away(self, request: Any, *, close: bool) -> None:
        self.endpoint._refusals.note(self.endpoint.rank)
        try:
            request.sendall(b"HTTP/1.0 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n")
        except OSError:
            pass
        if close:
            self.shutdown_request(request)
        else:  # its own thread, blocked reading it, wakes, ends and closes it
            with contextlib.suppress(OSError):
                request.shutdown(socket.SHUT_RDWR)

    def process_request(self, request: Any, client_address: Any) -> None:
        host = client_address[0] if isinstance(client_address, tuple) and client_address else ""
        admitted, displaced = self._admit(request, host)
        if displaced is not None:
            self._turn_away(displaced, close=False)
        if not admitted:
            self._turn_away(request, close=True)
            return
        try:
            super().process_request(request, client_address)
        except Exception:
            self._release(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release(request)

    def service_actions(self) -> None:
        """Between polls of the serving loop: end connections past their deadline, HEAD_DEADLINE_S
        for the request head, the request deadline in all (shutting the socket down wakes the
        thread blocked reading it, which then ends and frees its slot)."""
        now = time.monotonic()
        with self._lock:
            late = [request for request, c in self._active.items()
                    if now - c.started >= (self._deadline_s if c.head_read else self._head_deadline_s)]
        for request in late:
            try:
                request.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def handle_error(self, request: Any, client_address: Any) -> None:
        # The default prints a traceback to the host's stderr. A client that vanished while its
        # request was read (the handler catches the ones that vanish while it answers) is counted.
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError):
            self.endpoint._client_gone(exc)
        log.debug("radixtop endpoint: error serving %s", client_address, exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = f"radixtop-instrument/{SCHEMA_VERSION}"
    protocol_version = "HTTP/1.0"
    timeout = 10  # a stalled client cannot hold a thread forever

    def parse_request(self) -> bool:
        parsed = super().parse_request()
        self.server.head_read(self.request)
        return parsed

    def do_GET(self) -> None:
        try:
            self.server.endpoint._serve(self)
        except OSError as exc:  # the client went away mid-response (reset, broken pipe, stalled)
            self.server.endpoint._client_gone(exc)

    def _not_allowed(self) -> None:
        try:
            self.server.endpoint._reply(self, 405, error_body("only GET is served here"), _JSON, {"Allow": "GET"})
        except OSError as exc:
            self.server.endpoint._client_gone(exc)

    do_POST = do_PUT = do_DELETE = do_PATCH = _not_allowed

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("radixtop endpoint: " + format, *args)


class InstrumentEndpoint:
    """One rank's debug endpoint. Construct, start(), call safe_point(cache) every scheduler
    iteration, stop() at shutdown. The constructor validates its options (ValueError, for the
    integrator); start, safe_point, stop and the HTTP side never raise into the host."""

    def __init__(
        self,
        *,
        rank: int = 0,
        host: str = DEFAULT_HOST,
        port: int | None = None,
        base_port: int = DEFAULT_BASE_PORT,
        token: str | None = None,
        hooks: CacheHooks | None = None,
        config: SnapshotConfig | None = None,
        min_interval_s: float = 0.5,
        watch_window_s: float = 30.0,
        max_duty: float = 0.01,
        max_connections: int = 16,
        request_deadline_s: float = 10.0,
        fresh_wait_s: float = 1.0,
        notice_every_s: float = _NOTICE_EVERY_S,
    ) -> None:
        self.rank = int(rank)
        self.host = host
        self.requested_port = base_port + self.rank if port is None else int(port)
        # base + rank is taken when another server on the node has its instrument there: the next
        # free port in the window discovery searches (its health names the rank). An exact port
        # (or 0, any free port) is that port only.
        self._ports = (range(self.requested_port, base_port + INSTRUMENT_PORT_SPAN)
                       if port is None and base_port > 0 else range(self.requested_port, self.requested_port + 1))
        self.token = token or None
        self.hooks = hooks
        self.events = hooks.events if hooks is not None else EventRing()
        self.config = config or SnapshotConfig()
        self.min_interval_s = max(0.0, min_interval_s)
        self.watch_window_s = watch_window_s
        self.max_duty = max_duty if max_duty > 0 else 1.0
        spare = self.max_duty - self.config.census_duty
        self._detail_duty = spare if spare > 0 else self.max_duty
        self.max_connections = max(1, max_connections)
        self.request_deadline_s = max(0.1, request_deadline_s)  # a whole request, read and answered
        # A reader whose snapshot would be older than min_interval_s asks the scheduler for one and
        # waits for its next safe point, at most this long (a busy or hung scheduler: the old one).
        self.fresh_wait_s = max(0.0, fresh_wait_s)
        self.instance = secrets.token_hex(8)
        self.flight_dir = ""  # set by Instrumentation: where its flight recorder writes
        self.disabled_reason = "not started"
        self.refused_for: RefusedFor | None = None  # why start() refused, for the host's advice
        self.snapshot_errors = 0
        self.safe_point_errors = 0  # reported by the host's glue (sglang.SafePoints), shown in health
        self.last_error = ""  # the latest safe point or snapshot error, one line
        self._disconnects = _Notice("a client disconnected before its response was complete", notice_every_s)
        self._refusals = _Notice(
            f"all {max(1, max_connections)} connection slots busy; a client was answered 503", notice_every_s
        )
        self._snapshotter = TreeSnapshotter(self.config, activity=self._hook_activity if hooks is not None else None)
        self.holders = HolderTracker()  # the scheduler's lock holders, observed at every safe point
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._running = False
        self._lock = threading.Lock()
        # (capture, its Snapshot, its JSON): the scheduler swaps in (capture, None, None); the first
        # reader builds the rest under _build_lock, so concurrent clients build it once.
        self._published: tuple[Capture | None, Snapshot | None, bytes | None] = (None, None, None)
        self._build_lock = threading.Lock()
        self._captured = threading.Condition(self._lock)  # notified when a capture is published
        self._wanted = False  # a reader asked for a capture newer than the published one
        self._census_next_at = 0.0
        self._census_steps = 0
        self._census_cost = 0.0  # scheduler seconds spent in census steps, all told
        self._published_at = 0.0
        self._last_cost: float | None = None
        self._seq = 0
        self._safe_points = 0
        self._next_at = 0.0
        self._interval = self.min_interval_s
        self._last_watch = -float("inf")

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def enabled(self) -> bool:
        return self._running

    @property
    def port(self) -> int | None:
        return self._server.server_address[1] if self._server is not None else None

    @property
    def url(self) -> str | None:
        if self.port is None:
            return None
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> bool:
        """Bind and serve in a daemon thread. False (and one log line) when it cannot."""
        if self._running:
            return True
        if not is_loopback(self.host) and not self.token:
            return self._refuse(
                "token",
                f"refusing to serve on non-loopback address {self.host} without a bearer token; "
                "set a token or bind 127.0.0.1",
            )
        try:
            self._server = self._bind()
        except OSError as exc:
            why = "is in use" if exc.errno == errno.EADDRINUSE else f"cannot be bound ({exc.strerror or exc})"
            where = f"{self.host}:{self._ports[0]}" + (f"..{self._ports[-1]}" if len(self._ports) > 1 else "")
            return self._refuse("port", f"{where} {why}; choose another base port (the server keeps running)")
        except Exception as exc:
            return self._refuse("error", f"could not start ({type(exc).__name__}: {exc})")
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.25},  # how soon stop() is noticed
            name=f"radixtop-endpoint-{self.rank}",
            daemon=True,
        )
        self._running = True
        self.disabled_reason = ""
        self._thread.start()
        log.info("radixtop debug endpoint for rank %d serving on %s", self.rank, self.url)
        return True

    def _bind(self) -> _Server:
        """The server on the first free port of the window (OSError of the last when none is)."""
        for port in self._ports:
            try:
                return _Server((self.host, port), self, self.max_connections, self.request_deadline_s)
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE or port == self._ports[-1]:
                    raise
        raise OSError(errno.EADDRINUSE, "no port in the window")  # an empty window

    def _refuse(self, cause: RefusedFor, why: str) -> bool:
        self.refused_for = cause
        self.disabled_reason = why
        self._server = None
        log.error("radixtop debug endpoint for rank %d disabled: %s", self.rank, why)
        return False

    def stop(self) -> None:
        """Stop serving. Idempotent; never raises."""
        server, self._server = self._server, None
        self._running = False
        self.disabled_reason = "stopped"
        if server is None:
            return
        try:
            server.shutdown()
            server.server_close()
        except Exception as exc:
            log.debug("radixtop endpoint: stop: %s", exc)
        if self._thread is not None:
            self._thread.join(timeout=5)

    # -- the scheduler side --------------------------------------------------------------------

    def _hook_activity(self) -> tuple[int, int, int]:
        hooks = self.hooks
        assert hooks is not None
        return hooks.lock_ops, hooks.unlock_ops, hooks.evict_calls

    def safe_point(self, cache: Any, scheduler: Any = None) -> bool:
        """Call once per scheduler iteration, on the scheduler thread, where the tree is consistent.
        `scheduler`: the host's scheduler, whose requests' locks are read every time (holders.py);
        without it a snapshot's holders are unknown. Takes a snapshot when the rate limit allows;
        True when it did. Never raises."""
        try:
            self._safe_points += 1
            now = time.monotonic()
            if not self._running:
                return False
            self.holders.observe(scheduler, now)
            if now < self._next_at and now < self._census_next_at:
                return False
            fresh = False
            if now >= self._census_next_at:
                fresh = self._census_step(cache, now)
            if now < self._next_at or (not self._wanted and self._published[0] is not None):
                return False  # not due, or nobody asked for a newer one: capturing is on demand
            return self._take(cache, now, fresh)
        except Exception as exc:  # e.g. a failure while building the payload
            self._snapshot_failed(exc)
            return False

    def _census_step(self, cache: Any, now: float) -> bool:
        """One census slice; the next waits so that steps take at most census_duty of the
        scheduler (ten times less while nobody reads). True when a census began and ended here."""
        cost = self._snapshotter.census_step(cache)
        self._census_steps += 1
        self._census_cost += cost
        duty = self.config.census_duty
        watching = now - self._last_watch < self.watch_window_s
        gap = cost / duty if duty > 0 else float("inf")
        self._census_next_at = now + max(_MIN_CENSUS_GAP_S, gap if watching else 10 * gap)
        return self._snapshotter.fresh

    def _take(self, cache: Any, now: float, census_fresh: bool = False) -> bool:
        started = time.thread_time()
        hooks = self.hooks
        try:
            capture = self._snapshotter.capture(
                cache,
                rank=self.rank,
                instance=self.instance,
                seq=self._seq + 1,
                counters=hooks.counters() if hooks is not None else Counters(events_dropped=self.events.dropped_total),
                hooks_state=hooks.state if hooks is not None else "off",
                events_seq=self.events.latest_seq,
                census_fresh=census_fresh,
                holders=self.holders.latest,
                released=self.holders.released,
            )
        finally:
            # Whatever happened, the next try waits: a broken cache must not cost every iteration.
            # The census keeps to its own duty (SnapshotConfig.census_duty); the rest of max_duty
            # goes to the detail snapshots, so both together stay within max_duty. Costs are this
            # thread's CPU time: what we take from the scheduler, not the time other processes
            # took from it meanwhile (on a shared host, wall time made the cap throttle on noise).
            cost = time.thread_time() - started
            self._next_at = now + max(self._interval, cost / self._detail_duty)
            self._last_cost = cost
        with self._lock:
            self._seq = capture.seq
            self._published = (capture, None, None)
            self._published_at = time.monotonic()
            self._wanted = False
            self._captured.notify_all()
        return True

    def note_safe_point_error(self, count: int, exc: BaseException) -> None:
        """The host's safe point failed (count: how many times so far): shown in health and
        /metrics, so that the endpoint says so before repeated failures switch it off."""
        self.safe_point_errors = count
        self.last_error = f"safe point: {one_line(exc)}"

    def _client_gone(self, exc: BaseException) -> None:
        self._disconnects.note(self.rank, f" ({one_line(exc)})")  # on an HTTP thread, never the scheduler's

    @property
    def client_disconnects(self) -> int:
        return self._disconnects.count

    @property
    def clients_refused(self) -> int:
        return self._refusals.count

    def _snapshot_failed(self, exc: BaseException) -> None:
        try:
            self.snapshot_errors += 1
            self.last_error = f"snapshot: {one_line(exc)}"
            if self.snapshot_errors <= 3 or self.snapshot_errors % 100 == 0:
                log.warning("radixtop snapshot error #%d: %s: %s", self.snapshot_errors, type(exc).__name__, exc)
            self.events.push("instrument_error", message=f"snapshot: {type(exc).__name__}: {exc}")
        except Exception:
            pass

    # -- the HTTP side (any of the server's threads) -------------------------------------------

    def want_capture(self) -> None:
        """Ask the scheduler's next due safe point for a capture (what a reader's request does)."""
        self._wanted = True

    def fresh(self) -> tuple[Snapshot | None, bytes]:
        """latest(), after asking for a newer capture when the published one is older than
        min_interval_s: the scheduler's next safe point takes it (when the duty cap allows one
        now, this thread waits for it, at most fresh_wait_s; otherwise it gets the older one)."""
        now = time.monotonic()
        with self._lock:
            capture = self._published[0]
            if self._running and (capture is None or now - self._published_at > self.min_interval_s):
                self._wanted = True
                if now >= self._next_at:
                    deadline = now + self.fresh_wait_s
                    while self._published[0] is capture:
                        left = deadline - time.monotonic()
                        if left <= 0 or not self._running:
                            break
                        self._captured.wait(left)
        return self.latest()

    def latest(self) -> tuple[Snapshot | None, bytes]:
        """The latest snapshot and its JSON, built from the scheduler's capture on the calling
        thread (an HTTP thread; never the scheduler's) the first time it is asked for."""
        with self._lock:
            capture, snap, payload = self._published
        if capture is None:
            return None, b""
        if snap is not None and payload is not None:
            return snap, payload
        with self._build_lock:
            with self._lock:
                published = self._published
            if published[0] is capture and published[1] is not None and published[2] is not None:
                return published[1], published[2]  # another reader built it meanwhile
            snap = capture.build()
            payload = encode_snapshot(snap)
            with self._lock:
                if self._published[0] is capture:
                    self._published = (capture, snap, payload)
            return snap, payload

    def _serve(self, req: _Handler) -> None:
        if self.token is not None and not self._authorized(req):
            self._reply(req, 401, error_body("missing or wrong bearer token"), _JSON, {"WWW-Authenticate": "Bearer"})
            return
        parts = urlsplit(req.path)
        query = parse_qs(parts.query, keep_blank_values=True)
        path = parts.path
        if path == SNAPSHOT_PATH:
            self._serve_snapshot(req, query)
        elif path == EVENTS_PATH:
            self._serve_events(req, query)
        elif path == HEALTH_PATH:
            self._reply(req, 200, encode_json(self.health().to_dict()), _JSON)
        elif path == METRICS_PATH:
            # A scrape is a reader like any other: its gauges come from a capture taken for it
            # (waiting at most fresh_wait_s for the scheduler), so they are true when scraped.
            self._last_watch = time.monotonic()
            self._reply(req, 200, self.metrics_text().encode(), _PROM)
        else:
            self._reply(req, 404, error_body(f"no route {path[:100]!r}; try {SNAPSHOT_PATH}"), _JSON)

    def _authorized(self, req: _Handler) -> bool:
        got = req.headers.get("Authorization", "")
        return hmac.compare_digest(got.encode("utf-8", "replace"), f"Bearer {self.token}".encode())

    def _serve_snapshot(self, req: _Handler, query: dict[str, list[str]]) -> None:
        self._last_watch = time.monotonic()
        budget = _int_param(query, BUDGET_PARAM)
        if isinstance(budget, str):
            self._reply(req, 400, error_body(budget), _JSON)
            return
        snap, payload = self.fresh()
        if snap is None:
            self._reply(
                req,
                503,
                error_body("no snapshot yet: the scheduler has not reached a safe point; retry shortly"),
                _JSON,
                {"Retry-After": "1"},
            )
            return
        if budget is not None and snap.tree is not None and budget < snap.tree.walked_nodes:
            payload = encode_snapshot(snap.with_budget(budget))  # a prefix of an immutable snapshot
        self._reply(req, 200, payload, _JSON)

    def _serve_events(self, req: _Handler, query: dict[str, list[str]]) -> None:
        given_since = _int_param(query, SINCE_PARAM)
        if isinstance(given_since, str):
            self._reply(req, 400, error_body(given_since), _JSON)
            return
        limit = _int_param(query, LIMIT_PARAM)
        if isinstance(limit, str):
            self._reply(req, 400, error_body(limit), _JSON)
            return
        since = given_since or 0
        events, latest, dropped, more = self.events.read(since, min(limit or 1000, MAX_EVENTS_PER_PAGE))
        page = EventPage(
            schema_version=SCHEMA_VERSION,
            rank=self.rank,
            instance=self.instance,
            since=since,
            # A since beyond our latest means the client read another instance: start it over.
            next_since=events[-1].seq if events else (latest if since > latest else since),
            latest_seq=latest,
            dropped=dropped,
            more=more,
            events=events,
        )
        self._reply(req, 200, encode_json(page.to_dict()), _JSON)

    def _reply(
        self, req: BaseHTTPRequestHandler, status: int, body: bytes, ctype: str, extra: dict[str, str] | None = None
    ) -> None:
        req.send_response(status)
        req.send_header("Content-Type", ctype)
        req.send_header("Content-Length", str(len(body)))
        req.send_header("Cache-Control", "no-store")
        for k, v in (extra or {}).items():
            req.send_header(k, v)
        req.end_headers()
        req.wfile.write(body)

    def health(self) -> Health:
        snap = self._published[0]  # the capture is enough here: nothing to build
        hooks_state = self.hooks.state if self.hooks is not None else "off"
        if snap is None:
            status, message = "starting", "no snapshot yet: waiting for the scheduler's first safe point"
        elif hooks_state == "disabled":
            status, message = "degraded", f"hooks disabled: {self.hooks.disabled_reason if self.hooks else ''}"
        elif self.safe_point_errors:
            status, message = "degraded", f"{self.safe_point_errors} safe point error(s), the last: {self.last_error}"
        elif self.snapshot_errors:
            status, message = "degraded", f"{self.snapshot_errors} snapshot error(s); see the event feed"
        else:
            status, message = "ok", ""
        return Health(
            schema_version=SCHEMA_VERSION,
            rank=self.rank,
            instance=self.instance,
            status=status,
            hooks_state=hooks_state,
            snapshots=self._seq,
            safe_points=self._safe_points,
            last_snapshot_age_s=None if snap is None else max(0.0, time.monotonic() - self._published_at),
            last_snapshot_seconds=None if snap is None else self._last_cost,
            snapshot_interval_s=self._interval,
            max_budget=self.config.max_nodes,
            message=message,
            safe_point_errors=self.safe_point_errors,
            last_error=self.last_error,
            client_disconnects=self.client_disconnects,
            clients_refused=self.clients_refused,
            flight_dir=self.flight_dir,
        )

    def metrics_text(self) -> str:
        """Prometheus text exposition (0.0.4) of the counters and a fresh snapshot's gauges (fresh())."""
        rank = f'rank="{self.rank}"'
        counters = (
            self.hooks.counters() if self.hooks is not None else Counters(events_dropped=self.events.dropped_total)
        )
        out: list[str] = []

        def family(name: str, kind: str, help_text: str, samples: list[tuple[str, Any]]) -> None:
            out.append(f"# HELP {name} {help_text}")
            out.append(f"# TYPE {name} {kind}")
            for labels, value in samples:
                out.append(f"{name}{{{labels}}} {_number(value)}")

        for key, name in METRIC_NAMES.items():
            family(name, "counter", _COUNTER_HELP[key], [(rank, getattr(counters, key))])
        snap, _ = self.fresh()
        hooks_active = 1 if self.hooks is not None and self.hooks.state == "active" else 0
        family(
            STATE_METRIC_NAMES["hooks_active"], "gauge",
            "1 while radixtop's cache hooks are installed and counting.", [(rank, hooks_active)],
        )
        family(
            STATE_METRIC_NAMES["snapshots"], "counter", "Snapshots taken at scheduler safe points.", [(rank, self._seq)]
        )
        for key, help_text in (
            (
                "safe_point_errors",
                "Errors caught at the scheduler's safe point (repeated ones switch the instrumentation off).",
            ),
            ("client_disconnects", "Clients that went away before their response was complete."),
            ("clients_refused", "Connections answered 503 because every connection slot was busy, or cut "
             "without their request head to free one."),
        ):
            family(STATE_METRIC_NAMES[key], "counter", help_text, [(rank, getattr(self, key))])
        if snap is not None:
            family(
                STATE_METRIC_NAMES["snapshot_seconds"], "gauge",
                "Scheduler-thread seconds the latest snapshot took.", [(rank, snap.seconds)],
            )
            for key, help_text in (
                ("capacity_tokens", "Token slots in the KV pool (allocator size)."),
                ("available_tokens", "Free token slots in the KV pool."),
                ("evictable_tokens", "Cached tokens that could be evicted (unlocked)."),
                ("protected_tokens", "Cached tokens locked by running requests."),
            ):
                value = getattr(snap, key)
                if value is not None:
                    family(STATE_METRIC_NAMES[key], "gauge", help_text, [(rank, value)])
            census = snap.census
            if census is not None and census.complete:
                family(
                    STATE_METRIC_NAMES["tree_nodes"], "gauge",
                    "Nodes in the radix tree (root excluded), at the last census.", [(rank, census.node_count)],
                )
                family(
                    STATE_METRIC_NAMES["census_age_seconds"], "gauge",
                    "Age of that census (it is taken in slices, within a duty cap).", [(rank, census.age_s)],
                )
                buckets = []
                for label, lo, hi in _LOCK_BUCKETS:
                    count = sum(v for k, v in census.lock_ref_histogram.items() if lo <= k <= hi)
                    buckets.append((f'{rank},lock_ref="{label}"', count))
                family(
                    STATE_METRIC_NAMES["lock_ref_nodes"], "gauge",
                    "Tree nodes by lock_ref, at the last census.", buckets,
                )
        return "\n".join(out) + "\n"


_ROWS_PER_PIECE = 64
_TAIL = b'"nodes":[]}}'  # Snapshot.to_dict() ends with the tree, whose last key is its rows


def encode_snapshot(snap: Snapshot) -> bytes:
    """snap.to_json(), byte for byte, in pieces: json's C encoder holds the GIL for a whole call,
    so a scheduler thread wanting the GIL back would wait out a whole payload (a millisecond or
    two at 256 rows); rows are encoded 64 at a time instead, the GIL handed back in between."""
    d = snap.to_dict()
    tree = d.get("tree")
    if tree is None or len(tree["nodes"]) <= _ROWS_PER_PIECE:
        return encode_json(d)
    rows = tree["nodes"]
    tree["nodes"] = []
    head = encode_json(d)
    if not head.endswith(_TAIL):  # a field order we do not expect: all in one go
        tree["nodes"] = rows
        return encode_json(d)
    pieces = [head[: -len(b"]}}")]]
    for i in range(0, len(rows), _ROWS_PER_PIECE):
        time.sleep(0)  # let a waiting scheduler thread run
        piece = encode_json(rows[i : i + _ROWS_PER_PIECE])
        pieces.append(piece[1:-1] if i == 0 else b"," + piece[1:-1])
    pieces.append(b"]}}")
    return b"".join(pieces)


def _number(value: Any) -> str:
    if isinstance(value, float):
        return repr(value)
    return str(int(value))


def _int_param(query: dict[str, list[str]], name: str) -> int | None | str:
    """The parameter as an int >= 0, None when absent, or a one-line error message."""
    values = query.get(name)
    if not values:
        return None
    raw = values[-1]
    if not raw.isdigit() or len(raw) > 12:
        return f"{name} must be a whole number >= 0, got {raw[:40]!r}"
    return int(raw)


class Instrumentation:
    """Hooks + endpoint for one cache (one rank): the whole wiring in three calls.

        inst = Instrumentation(cache, rank=r, port=p)   # installs hooks on this cache instance
        inst.start()                                     # False if it cannot serve (logged)
        inst.safe_point()                                # once per scheduler iteration
        inst.close()                                     # stop serving, restore the methods

    A flight recorder (flight.py) writes the rank's state to disk when the cache raises, or when
    the host's exception handler calls flight_record().

    Hooks are installed for this cache instance (see hooks.py: a dispatching wrapper on its
    class finds each instance's hooks), so several simulated ranks in one process each count only
    their own cache. Construction validates options (ValueError); start, safe_point and close
    never raise.
    """

    def __init__(
        self, cache: Any, *, rank: int = 0, max_errors: int = 20, event_capacity: int = 4096,
        flight_dir: str | Path | None = None, **endpoint_options: Any,
    ) -> None:
        self.cache = cache
        self.hooks = CacheHooks(max_errors=max_errors, event_capacity=event_capacity)
        self.hooks.install(cache)
        self.endpoint = InstrumentEndpoint(rank=rank, hooks=self.hooks, **endpoint_options)
        self.recorder = FlightRecorder(
            cache, rank=rank, hooks=self.hooks, instance=self.endpoint.instance, directory=flight_dir,
            before=lambda: self.endpoint.latest()[0],
        )
        self.hooks.on_host_failure = self.recorder.record
        self.endpoint.flight_dir = str(self.recorder.directory)

    def start(self) -> bool:
        return self.endpoint.start()

    def safe_point(self, scheduler: Any = None) -> bool:
        """`scheduler`: where the requests holding locks are read (see InstrumentEndpoint.safe_point)."""
        return self.endpoint.safe_point(self.cache, scheduler)

    def follow(self, cache: Any) -> None:
        """The host replaced its cache: count, snapshot and record the new one."""
        self.hooks.install(cache)
        self.cache = self.recorder.cache = cache

    def flight_record(self, kind: str, message: str, node: int | None = None) -> bool:
        """The host's exception handler ran (kind "scheduler_exception"): record this rank now.
        `node`: the node the failure concerns, as the cache's API names it, where the host knows it."""
        return self.recorder.record(kind, message, node)

    def close(self) -> None:
        self.endpoint.stop()
        self.hooks.uninstall()
