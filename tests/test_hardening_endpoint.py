"""The debug endpoint inside the server, against clients that send their request a header line
every 3 s (no per-read timeout fires): they are cut at the request deadline, and clients from
another address are served meanwhile. Real sockets on loopback (127.0.0.2 is loopback too)."""

from __future__ import annotations

import socket
import threading
import time

import httpx

from radixtop import schema
from radixtop.instrument.endpoint import InstrumentEndpoint


class _Mini:
    """The least a cache needs for a safe point (as tests/test_instrument.py's MiniCache)."""

    page_size = 1
    root_node = None

    def evictable_size(self) -> int:
        return 0

    def protected_size(self) -> int:
        return 0


def _slow_client(port: int, stop: threading.Event, sockets: list) -> None:
    conn = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=("127.0.0.2", 0))
    sockets.append(conn)
    try:
        conn.sendall(f"GET {schema.HEALTH_PATH} HTTP/1.0\r\n".encode())
        for i in range(20):  # at most 60 s
            if stop.wait(3.0):
                return
            conn.sendall(f"X-Slow-{i}: 1\r\n".encode())
    except OSError:
        return  # cut by the server


def _closed_by_server(conn: socket.socket) -> bool:
    """The server ended the connection: end of stream after whatever it said (a 503), or a reset."""
    conn.settimeout(0.05)
    try:
        for _ in range(100):
            if conn.recv(65536) == b"":
                return True
    except TimeoutError:
        return False
    except OSError:
        return True
    return False


def test_slow_clients_cannot_shut_everyone_out(tmp_path) -> None:
    ep = InstrumentEndpoint(port=0, min_interval_s=0.0, max_connections=16, request_deadline_s=2.0)
    assert ep.start()
    stop = threading.Event()
    sockets: list[socket.socket] = []
    threads = [threading.Thread(target=_slow_client, args=(ep.port, stop, sockets), daemon=True) for _ in range(20)]
    try:
        ep.safe_point(_Mini())
        for t in threads:
            t.start()
        deadline = time.monotonic() + 5
        while len(sockets) < 20 and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.3)  # all of them connected and waiting
        began = time.monotonic()
        answer = httpx.get(f"http://127.0.0.1:{ep.port}{schema.HEALTH_PATH}", timeout=5)
        assert answer.status_code == 200, "a client from another address was shut out"
        assert time.monotonic() - began < 1.0
        # Half the slots for one address: the rest of the 20 refused (or, connecting late, cutting
        # an older idle one), once the server has taken them all from its backlog.
        deadline = time.monotonic() + 10
        while ep.clients_refused < 12 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ep.clients_refused >= 12
        time.sleep(2.6)  # past the deadline
        assert all(_closed_by_server(s) for s in sockets), "a slow client still holds its connection"
        with httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2"), timeout=5) as client:
            same = client.get(f"http://127.0.0.1:{ep.port}{schema.HEALTH_PATH}")
        assert same.status_code == 200  # the slow clients' address is served again: its slots are free
    finally:
        stop.set()
        for s in sockets:
            s.close()
        ep.stop()


def _half_requests(port: int, count: int, source: str) -> list[socket.socket]:
    """`count` connections that send part of a request head and then nothing."""
    out = []
    for _ in range(count):
        conn = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))
        conn.sendall(f"GET {schema.HEALTH_PATH} HTTP/1.0\r\nHost: x\r\n".encode())
        out.append(conn)
    return out


def test_idle_half_requests_from_loopback_do_not_lock_the_owner_out() -> None:
    # Any local user connects from 127.0.0.1, as radixtop's own probe does: eight idle
    # half-requests took every slot of that address and the probe got 503 for the whole deadline.
    ep = InstrumentEndpoint(port=0, min_interval_s=0.0, max_connections=16, request_deadline_s=10.0)
    assert ep.start()
    held: list[socket.socket] = []
    try:
        ep.safe_point(_Mini())
        for _ in range(3):  # opened again and again, as a client keeping the slots would
            held += _half_requests(ep.port, 8, "127.0.0.1")
            time.sleep(0.4)
            answer = httpx.get(f"http://127.0.0.1:{ep.port}{schema.HEALTH_PATH}", timeout=5)
            assert answer.status_code == 200, "the owner's probe was shut out by idle half-requests"
        # Every slot of every address held the same way: still served.
        held += _half_requests(ep.port, 8, "127.0.0.2") + _half_requests(ep.port, 8, "127.0.0.3")
        time.sleep(0.4)
        assert httpx.get(f"http://127.0.0.1:{ep.port}{schema.HEALTH_PATH}", timeout=5).status_code == 200
        time.sleep(2.6)  # past the request head's deadline: every half-request is cut
        assert all(_closed_by_server(s) for s in held), "an idle half-request still holds its connection"
    finally:
        for s in held:
            s.close()
        ep.stop()
