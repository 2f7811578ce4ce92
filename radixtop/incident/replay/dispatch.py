"""The replay's dispatcher: a small process that writes each planned call to the server at its due
time, on a connection opened ahead of it, and reads the answers.

Why a process. In the caller's process a dispatching thread takes the GIL back after every sleep
and every write; while the caller's loop burns CPU (the TUI rendering) each take waits out the
5 ms switch interval, and at 200 calls/s such a thread fell seconds behind. Here nothing else
runs. Why one thread: a second one reading answers measured no better (a thread preempted while
it holds the GIL holds up the write that is due) and needs a lock. So one thread does it all, in
order of urgency: it sleeps to the next due time (``time.sleep``; the selector's timeout is
rounded up to whole milliseconds, so the last ``QUIET_S`` is never spent in it), writes the
call, and reads answers, opens connections and reports results only while no call is due for
``QUIET_S``. On Linux it also asks for the scheduler's shortest slice (see
:func:`ask_for_a_short_slice`).

- Lateness: a call's bytes are written with ``send`` on a non-blocking connection; the time
  after the last byte went out, minus the due time, is its lateness.
- Connections are opened ahead of the calls due soon (opening is never on a call's clock), kept
  when the server keeps them alive, and dropped when idle for ``IDLE_EXPIRY_S`` (before a
  server's keep-alive timeout) or closed by the server. A call whose pooled connection fails
  before the first byte of its answer (the server closed it as the call was written) is written
  again once, at once, on a connection opened for it; its lateness is that of the second write.
- Each call is bounded by the plan's deadline, counted from its first write.
- A client-side cap (``max_in_flight`` K): a call that comes due while K calls are in flight
  waits until one of them is answered (or fails), then goes at once, in plan order. While the
  cap holds the loop waits on the selector for answers (deadlines, commands and housekeeping go
  on as ever), never spinning. The time a call was held (``held_ms``: while it was due and the
  cap was full) is reported apart from its lateness, which counts only the rest: the
  dispatcher's own delay. Without a cap nothing changes.

Protocol. stdin: the plan as one JSON line (see :class:`Plan`), then ``stop`` (dispatch nothing
more; calls in flight are still read, each to its deadline). End of file means the caller is
gone: the process leaves at once. stdout, JSON lines: ``{"ready": wall time of offset 0}``, then
one per dispatched call, ``{"i", "late_ms", "held_ms", "sent", "answered"}`` with ``"status"``
and ``"body"`` or with ``"error"`` (``late_ms + held_ms``: written this long after its due time),
then ``{"end": calls dispatched}`` (or ``{"fatal": why}``). The plan's ``max_in_flight`` (absent,
null or 0: no cap) sets the cap.

The standard library and h11 only (through :mod:`radixtop.incident.replay.http1`): it is started for
every replay run and must start fast.
"""

from __future__ import annotations

import bisect
import collections
import errno
import json
import os
import platform
import selectors
import socket
import struct
import sys
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from radixtop.incident.replay.http1 import Answer, Call, new_connection

__all__ = ["Dispatcher", "Plan", "main"]

LEAD_S = 0.005  # from "ready" to offset 0
QUIET_S = 0.003  # no reading, connecting or reporting this close to a due time
LOOKAHEAD_S = 0.25  # connections are kept open for the calls due this soon
SPARE_CONNECTIONS = 2
MAX_AHEAD = 64  # connections opened ahead at most (answered calls give theirs back)
IDLE_EXPIRY_S = 1.0  # well before a server's keep-alive timeout (uvicorn's 5 s)
CONNECT_RETRY_S = 0.05  # after a failed connect, before the next attempt
TICK_S = 0.05  # the longest the loop sleeps without looking at deadlines and commands
MAX_DEFER_S = 0.01  # the longest answers and commands wait on calls due back to back
READ_BYTES = 65536
SLICE_NS = 100_000  # the shortest slice Linux grants
_SCHED_SETATTR = {"x86_64": 314, "aarch64": 274}  # the syscall's number


class Plan(NamedTuple):
    host: str  # to connect to
    port: int
    tls: bool
    authority: str  # the Host header
    path: str
    headers: tuple[tuple[str, str], ...]
    deadline_s: float  # a whole call, from its first write to its answer's last byte
    connect_timeout_s: float
    offsets: tuple[float, ...]  # seconds from the run's start, non-decreasing
    bodies: tuple[bytes, ...]
    max_in_flight: int | None = None  # at most this many calls written and not yet answered; None: no cap

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Plan:
        calls = doc["calls"]
        offsets = tuple(float(c["offset_s"]) for c in calls)
        if list(offsets) != sorted(offsets):
            raise ValueError("the calls are not in order of their offsets")
        cap = doc.get("max_in_flight") or None  # 0 and null: no cap
        if cap is not None and (type(cap) is not int or cap < 1):
            raise ValueError(f"max_in_flight must be a whole number of calls, got {cap!r}")
        return cls(
            doc["host"], int(doc["port"]), bool(doc["tls"]), doc["authority"], doc["path"],
            tuple((str(n), str(v)) for n, v in doc["headers"]), float(doc["deadline_s"]),
            float(doc["connect_timeout_s"]), offsets, tuple(c["body"].encode() for c in calls), cap,
        )


class _Conn:
    __slots__ = ("sock", "http", "state", "since", "pooled", "flight")

    def __init__(self, sock: socket.socket, state: str) -> None:
        self.sock = sock
        self.http = new_connection()  # the protocol's state on this socket
        self.state = state  # "connecting", "handshake", "idle" or "busy"
        self.since = time.monotonic()  # when it began connecting, or became idle
        self.pooled = False  # taken from the pool: the server may have closed it meanwhile
        self.flight: _Flight | None = None


class _Flight:
    __slots__ = ("index", "due", "held", "conn", "out", "started", "retried", "answer", "written")

    def __init__(self, index: int, due: float, held: float, conn: _Conn, out: memoryview, retried: bool) -> None:
        self.index = index
        self.due = due
        self.held = held  # seconds the cap held it after its due time
        self.conn = conn
        self.out = out  # bytes still to write
        self.started = time.monotonic()  # the first write: the deadline counts from here
        self.retried = retried
        self.answer = Answer(conn.http)
        self.written = 0.0  # after the last byte


class Dispatcher:
    """One run of a plan, on the calling thread. Results go to ``emit`` (dicts, as in the
    module's protocol), and ``flush`` is called when the loop has time; ``send`` is the one place
    a call's bytes go out (a seam for tests); ``control`` is a file descriptor of ``stop`` lines
    (end of file: abandon the run)."""

    def __init__(self, plan: Plan, emit: Callable[[dict[str, Any]], None], *,
                 send: Callable[[socket.socket, memoryview], int] | None = None,
                 control: int | None = None, flush: Callable[[], None] | None = None) -> None:
        self.plan = plan
        self._emit = emit
        self._flush = flush or (lambda: None)
        self._send_bytes = send or (lambda sock, data: sock.send(data))
        self._calls = [Call(plan.authority, plan.path, plan.headers, b) for b in plan.bodies]
        self._ssl = None
        self._would_block: tuple[type[BaseException], ...] = (BlockingIOError, InterruptedError)
        if plan.tls:
            import ssl

            self._ssl = ssl.create_default_context()
            self._would_block += (ssl.SSLWantReadError, ssl.SSLWantWriteError)
        self._addr: tuple[str, int] | tuple[str, int, int, int] | tuple[int, bytes] | None = None  # run() resolves it
        self._family = socket.AF_INET
        self._sel = selectors.DefaultSelector()
        self._control = control
        self._conns: set[_Conn] = set()  # every open connection
        self._idle: list[_Conn] = []  # the pool, most recently idle last
        self._connecting = 0
        self._retries: list[_Flight] = []
        self._flights: set[_Flight] = set()
        self._refused: str | None = None  # the last connect failed, and none succeeded since
        self._refused_at = 0.0
        self.dispatched = 0
        self.stopping = False
        self.abandoned = False
        self._serviced = 0.0  # when the loop last looked at its connections and commands
        self._housekept = 0.0  # ... and last kept house
        self._cap = plan.max_in_flight or None
        # The cap's holds: spans during which the next call was due and the cap was full (closed
        # ones, oldest first, those that ended before the next call's due time dropped), and the
        # start of the open one. A call's held time is its overlap with them after its due time.
        self._holds: collections.deque[tuple[float, float]] = collections.deque()
        self._holding: float | None = None
        self.mono0 = 0.0
        self.wall0 = 0.0

    def stop(self) -> None:
        """Dispatch nothing more; calls in flight are still read to their deadlines."""
        self.stopping = True

    # -- the loop ---------------------------------------------------------------------------

    def run(self) -> None:
        """Open the first connections, then dispatch every call and read every answer."""
        if self._control is not None:
            os.set_blocking(self._control, False)
            self._sel.register(self._control, selectors.EVENT_READ, "control")
        try:
            self._resolve()
            self._fill_first()
            now_mono, now_wall = time.monotonic(), time.time()
            self.mono0, self.wall0 = now_mono + LEAD_S, now_wall + LEAD_S
            self._serviced = now_mono
            self._emit({"ready": self.wall0})
            self._loop()
        finally:
            for conn in list(self._conns):
                self._close(conn)
            self._sel.close()

    def _loop(self) -> None:
        offsets = self.plan.offsets
        while not self.abandoned:
            now = time.monotonic()
            self._resend()
            while self.dispatched < len(offsets) and not self.stopping and self.mono0 + offsets[self.dispatched] <= now:
                if self._capped(now):
                    break
                index = self.dispatched
                self.dispatched += 1
                at = self.mono0 + offsets[index]
                self._start(index, at, self._held(at, now), self._take(), retried=False)
                now = time.monotonic()
            if (self.stopping or self.dispatched == len(offsets)) and not self._flights and not self._retries:
                return
            # Held by the cap, nothing can go before an answer: the loop waits on the selector.
            waiting = self.dispatched < len(offsets) and not self.stopping and self._holding is None
            due = self.mono0 + offsets[self.dispatched] if waiting else None
            near = due is not None and due - now <= QUIET_S
            if due is not None and near and now - self._serviced < MAX_DEFER_S:
                time.sleep(max(0.0, due - now))  # the last stretch: nothing but the write after it
                continue
            # Calls spaced closer than QUIET_S for long would starve the answers and the caller's
            # stop: after MAX_DEFER_S one look is taken anyway, without waiting.
            timeout = 0.0 if near else TICK_S if due is None else min(TICK_S, due - now - QUIET_S)
            if self._flights:
                timeout = min(timeout, max(0.0, min(f.started for f in self._flights) + self.plan.deadline_s - now))
            holding = self._holding is not None
            for key, mask in self._sel.select(timeout):
                if not near and due is not None and due - time.monotonic() <= QUIET_S:
                    break  # the rest stays ready for the next turn
                self._ready(key, mask)
                if holding and self._holding is None:
                    break  # an answer freed a place: the held call goes first, the rest stays ready
            now = self._serviced = time.monotonic()
            if holding and self._holding is None and now - self._housekept < MAX_DEFER_S:
                continue  # housekeeping after the held call (but not put off for longer)
            if near or due is None or due - now > QUIET_S:
                self._housekept = now
                self._housekeep(now, due)

    def _ready(self, key: selectors.SelectorKey, mask: int) -> None:
        if key.data == "control":
            self._command()
            return
        conn: _Conn = key.data
        if conn not in self._conns:
            return  # closed earlier in this turn
        if conn.state in ("connecting", "handshake"):
            self._connect_step(conn)
        elif conn.state == "busy" and conn.flight is not None:
            flight = conn.flight
            if mask & selectors.EVENT_WRITE and flight.out:
                self._push(flight)
            if mask & selectors.EVENT_READ and conn.flight is flight:
                self._read(flight)
        else:  # idle, and readable: the server closed it (or sent what no request asked for)
            self._drop(conn)

    def _command(self) -> None:
        assert self._control is not None
        try:
            data = os.read(self._control, 4096)
        except BlockingIOError:
            return
        if not data:
            self.abandoned = True  # the caller is gone: nobody will read the results
        elif b"stop" in data:
            self.stop()

    def _housekeep(self, now: float, due: float | None) -> None:
        """Results out, deadlines, idle connections dropped and new ones opened, until ``due`` nears."""
        self._flush()
        for flight in [f for f in self._flights if now - f.started >= self.plan.deadline_s]:
            self._finish(flight, error=f"no whole answer within {self.plan.deadline_s:.0f} s")
        for conn in [c for c in self._conns if c.state in ("connecting", "handshake")]:
            if now - conn.since >= self.plan.connect_timeout_s:
                self._connect_failed(conn, "TimeoutError: timed out")
        for conn in [c for c in self._idle if now - c.since >= IDLE_EXPIRY_S]:
            self._drop(conn)
        if self.stopping:
            for conn in list(self._idle):
                self._drop(conn)
            return
        if self._refused is not None and now - self._refused_at < CONNECT_RETRY_S:
            return
        for _ in range(self._need(now - self.mono0) - len(self._idle) - self._connecting):
            if due is not None and due - time.monotonic() <= QUIET_S:
                return
            self._begin_connect()

    def _need(self, at: float) -> int:
        """Connections to hold for the calls due from ``at`` (seconds from offset 0) to LOOKAHEAD_S
        later; under a cap, for as many of them as it lets go."""
        start = self.dispatched
        due = bisect.bisect_right(self.plan.offsets, at + LOOKAHEAD_S, lo=start) - start
        if due and self._cap is not None:
            return min(MAX_AHEAD, max(0, min(due, self._cap - self._in_flight())) + SPARE_CONNECTIONS)
        return min(MAX_AHEAD, due + SPARE_CONNECTIONS) if due else 0

    # -- the cap ----------------------------------------------------------------------------

    def _in_flight(self) -> int:
        """Calls written and not yet answered, those waiting to be written again included."""
        return len(self._flights) + len(self._retries)

    def _capped(self, now: float) -> bool:
        """Whether the next call, due now, must wait for an answer; a hold starts here."""
        if self._cap is None or self._in_flight() < self._cap:
            self._unhold(now)
            return False
        if self._holding is None:
            self._holding = now
        return True

    def _unhold(self, now: float) -> None:
        """A place is free: the open hold, if any, ends now."""
        if self._holding is not None and self._cap is not None and self._in_flight() < self._cap:
            self._holds.append((self._holding, now))
            self._holding = None

    def _held(self, due: float, now: float) -> float:
        """Seconds the cap held a call due at ``due`` and going now (no hold is open)."""
        holds = self._holds
        while holds and holds[0][1] <= due:  # ended before this call (and every later one) was due
            holds.popleft()
        return sum(max(0.0, min(end, now) - max(start, due)) for start, end in holds)

    # -- calls ------------------------------------------------------------------------------

    def _start(self, index: int, due: float, held: float, conn: _Conn | None, *, retried: bool) -> None:
        """Write a call now, on ``conn`` or, without one, on a connection opened for it."""
        if conn is None:
            conn = self._open_now(index, due, held)
            if conn is None:
                return
        conn.state = "busy"
        flight = _Flight(index, due, held, conn, memoryview(self._calls[index].bytes_on(conn.http)), retried)
        conn.flight = flight
        self._flights.add(flight)
        self._push(flight)

    def _push(self, flight: _Flight) -> None:
        sock = flight.conn.sock
        try:
            while flight.out:
                flight.out = flight.out[self._send_bytes(sock, flight.out) :]
        except self._would_block:
            pass
        except OSError as exc:
            self._failed(flight, f"{type(exc).__name__}: {exc}")
            return
        if flight.out:  # the rest when the socket drains
            self._sel.modify(sock, selectors.EVENT_READ | selectors.EVENT_WRITE, flight.conn)
            return
        flight.written = time.monotonic()
        self._sel.modify(sock, selectors.EVENT_READ, flight.conn)

    def _read(self, flight: _Flight) -> None:
        sock, answer = flight.conn.sock, flight.answer
        try:
            while not answer.done:
                try:
                    data = sock.recv(READ_BYTES)
                except self._would_block:
                    return
                answer.feed(data)
                if not data:
                    break
        except OSError as exc:
            self._failed(flight, f"{type(exc).__name__}: {exc}")
            return
        except ValueError as exc:
            self._failed(flight, f"malformed answer: {exc}")
            return
        if answer.done:
            self._finish(flight)

    def _failed(self, flight: _Flight, why: str) -> None:
        """The connection broke. Before any byte of the answer, on a pooled connection, the call
        is written again once; otherwise it failed."""
        if flight.conn.pooled and not flight.retried and not flight.answer.started:
            self._flights.discard(flight)
            self._close(flight.conn)
            self._retries.append(flight)
            return
        self._finish(flight, error=why)

    def _resend(self) -> None:
        retries, self._retries = self._retries, []
        for flight in retries:
            if self.stopping:
                self._report(
                    flight, time.monotonic(), "the connection closed before an answer; not sent again: stopped"
                )
            else:
                self._start(flight.index, flight.due, flight.held, None, retried=True)

    def _finish(self, flight: _Flight, *, error: str | None = None) -> None:
        self._flights.discard(flight)
        self._unhold(time.monotonic())  # the held call's wait ends with this answer
        conn = flight.conn
        conn.flight = None
        if error is None and flight.answer.keep_alive and not self.stopping:
            conn.http.start_next_cycle()
            conn.state, conn.since = "idle", time.monotonic()
            self._idle.append(conn)
        else:
            self._close(conn)
        if not flight.written:
            flight.written = time.monotonic()  # it failed while being written
        self._report(flight, flight.written, error)

    def _report(self, flight: _Flight, written: float, error: str | None) -> None:
        doc: dict[str, Any] = {"i": flight.index, "late_ms": _late_ms(written, flight.due, flight.held),
               "held_ms": flight.held * 1000.0, "sent": self._wall(written), "answered": self._wall(time.monotonic())}
        if error is None:
            doc["status"] = flight.answer.status
            doc["body"] = flight.answer.body.decode("utf-8", "replace")
        else:
            doc["error"] = error
        self._emit(doc)

    def _report_unsent(self, index: int, due: float, held: float, error: str) -> None:
        now = time.monotonic()
        self._emit({"i": index, "late_ms": _late_ms(now, due, held), "held_ms": held * 1000.0, "sent": self._wall(now),
                    "answered": self._wall(now), "error": error})

    def _wall(self, mono: float) -> float:
        return mono - self.mono0 + self.wall0

    # -- connections ------------------------------------------------------------------------

    def _resolve(self) -> None:
        family, _, _, _, addr = socket.getaddrinfo(self.plan.host, self.plan.port, type=socket.SOCK_STREAM)[0]
        self._family, self._addr = family, addr

    def _take(self) -> _Conn | None:
        """The most recently idle connection that has not expired; None when there is none."""
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if now - conn.since < IDLE_EXPIRY_S:
                conn.pooled = True
                return conn
            self._close(conn)
        return None

    def _fill_first(self) -> None:
        """Before the run's clock starts: the connections for its first calls, opened in turn."""
        for _ in range(self._need(0.0)):
            conn = None if self.stopping else self._open_blocking()
            if conn is None:
                return
            self._idle.append(conn)

    def _open_blocking(self) -> _Conn | None:
        try:
            sock = socket.create_connection((self.plan.host, self.plan.port), timeout=self.plan.connect_timeout_s)
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if self._ssl is not None:
                    sock = self._ssl.wrap_socket(sock, server_hostname=self.plan.host)
                sock.setblocking(False)
            except OSError:
                sock.close()
                raise
        except OSError as exc:
            self._refused, self._refused_at = f"{type(exc).__name__}: {exc}", time.monotonic()
            return None
        self._refused = None
        conn = _Conn(sock, "idle")
        self._conns.add(conn)
        self._sel.register(sock, selectors.EVENT_READ, conn)
        return conn

    def _open_now(self, index: int, due: float, held: float) -> _Conn | None:
        """A connection for a call that found the pool empty (its lateness shows the wait). While
        the server refuses, the call fails at once: a server that is gone must not hold the run."""
        conn = self._open_blocking() if self._refused is None else None
        if conn is not None:
            return conn
        self._report_unsent(index, due, held, self._refused or "no connection")
        return None

    def _begin_connect(self) -> None:
        addr = self._addr
        assert addr is not None, "run() resolves the address before any connection"
        sock = socket.socket(self._family, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            code = sock.connect_ex(addr)
        except OSError as exc:
            sock.close()
            self._refused, self._refused_at = f"{type(exc).__name__}: {exc}", time.monotonic()
            return
        conn = _Conn(sock, "connecting")
        self._conns.add(conn)
        self._connecting += 1
        self._sel.register(sock, selectors.EVENT_WRITE, conn)
        if code not in (0, errno.EINPROGRESS):
            self._connect_failed(conn, _why(code))

    def _connect_step(self, conn: _Conn) -> None:
        if conn.state == "connecting":
            code = conn.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if code:
                self._connect_failed(conn, _why(code))
                return
            if self._ssl is not None:
                self._sel.unregister(conn.sock)
                conn.sock = self._ssl.wrap_socket(
                    conn.sock, server_hostname=self.plan.host, do_handshake_on_connect=False
                )
                self._sel.register(conn.sock, selectors.EVENT_WRITE, conn)
                conn.state = "handshake"
        if conn.state == "handshake":
            import ssl

            try:
                conn.sock.do_handshake()  # type: ignore[attr-defined]
            except ssl.SSLWantReadError:
                self._sel.modify(conn.sock, selectors.EVENT_READ, conn)
                return
            except ssl.SSLWantWriteError:
                self._sel.modify(conn.sock, selectors.EVENT_WRITE, conn)
                return
            except OSError as exc:
                self._connect_failed(conn, f"{type(exc).__name__}: {exc}")
                return
        self._connecting -= 1
        self._refused = None
        conn.state, conn.since = "idle", time.monotonic()
        self._sel.modify(conn.sock, selectors.EVENT_READ, conn)
        self._idle.append(conn)

    def _connect_failed(self, conn: _Conn, why: str) -> None:
        self._connecting -= 1
        self._refused, self._refused_at = why, time.monotonic()
        self._close(conn)

    def _drop(self, conn: _Conn) -> None:
        if conn in self._idle:
            self._idle.remove(conn)
        self._close(conn)

    def _close(self, conn: _Conn) -> None:
        if conn not in self._conns:
            return
        self._conns.discard(conn)
        try:
            self._sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        try:
            conn.sock.close()
        except OSError:
            pass


def _late_ms(written: float, due: float, held: float) -> float:
    """A call's lateness: from its due time to its last byte out, less the time the cap held it."""
    return max(0.0, (written - due - held) * 1000.0)


def _why(code: int) -> str:
    """An errno as the error a blocking call would have raised (ConnectionRefusedError: ...)."""
    exc = OSError(code, os.strerror(code))
    return f"{type(exc).__name__}: {exc}"


# -- the process ------------------------------------------------------------------------------


class _Output:
    """JSON lines to stdout, never blocking the loop: what the pipe does not take waits here."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buf = bytearray()
        os.set_blocking(fd, False)

    def put(self, doc: dict[str, Any]) -> None:
        self.buf += json.dumps(doc).encode() + b"\n"
        self.flush()

    def flush(self) -> None:
        try:
            while self.buf:
                del self.buf[: os.write(self.fd, self.buf)]
        except BlockingIOError:
            pass  # the caller is busy; the rest goes with the next result, or at the end

    def drain(self) -> None:
        os.set_blocking(self.fd, True)
        self.flush()


def ask_for_a_short_slice() -> bool:
    """Ask Linux's scheduler (EEVDF, 6.12 and later) for its shortest slice, 0.1 ms, as a latency
    hint: a process that wakes for microseconds per call then runs before a CPU-bound neighbour
    has used up its longer slice. Unprivileged, for this process only; the nice value and policy
    stay. False where the kernel or machine does not take it (an older kernel ignores it)."""
    nr = _SCHED_SETATTR.get(platform.machine())
    if not sys.platform.startswith("linux") or nr is None or os.sched_getscheduler(0) != os.SCHED_OTHER:
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        # struct sched_attr (56 bytes): size, policy, flags, nice, priority, runtime (the slice), ...
        attr = struct.pack("IIQiIQQQII", 56, os.SCHED_OTHER, 0, os.getpriority(os.PRIO_PROCESS, 0), 0,
                           SLICE_NS, 0, 0, 0, 0)
        result: int = libc.syscall(nr, 0, ctypes.c_char_p(attr), 0)  # ctypes' calls are untyped
        return result == 0
    except (OSError, AttributeError):
        return False


def main() -> int:
    ask_for_a_short_slice()
    line = b""
    while b"\n" not in line:  # unbuffered: the control lines that follow stay in the pipe
        chunk = os.read(0, 1 << 20)
        if not chunk:
            return 0
        line += chunk
    line, _, early = line.partition(b"\n")
    out = _Output(sys.stdout.fileno())
    try:
        try:
            dispatcher = Dispatcher(Plan.from_json(json.loads(line)), out.put, control=0, flush=out.flush)
        except (ValueError, KeyError, TypeError) as exc:
            out.put({"fatal": f"bad plan: {exc}"})
            return 2
        if b"stop" in early:
            dispatcher.stop()
        try:
            dispatcher.run()
        except Exception as exc:  # noqa: BLE001 - the caller fails the calls it has no result for
            out.put({"fatal": f"{type(exc).__name__}: {exc}"})
            return 1
        if dispatcher.abandoned:
            return 0
        out.put({"end": dispatcher.dispatched})
    except BrokenPipeError:
        return 0  # the caller is gone
    finally:
        try:
            out.drain()
        except OSError:
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
