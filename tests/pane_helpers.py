"""Shared by the live-pane tests: snapshots built from the schema, a real loopback HTTP server whose
answers a test sets route by route, and a simulator process."""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from radixtop.schema import (
    SCHEMA_VERSION,
    Census,
    Counters,
    Event,
    EventPage,
    Health,
    NodeRow,
    Snapshot,
    TreeView,
    encode_json,
)


def node(parent: int, tokens: int, lock_ref: int = 0, nid: int | None = None, *, last_access: float = 100.0,
         hits: int = 1, children: int = 0, subtree: int | None = None, evicted: bool = False) -> NodeRow:
    return NodeRow(
        id=nid, parent=parent, tokens=tokens, lock_ref=lock_ref, evicted=evicted, hit_count=hits,
        last_access=last_access, children=children, subtree_tokens=subtree if subtree is not None else tokens,
        head=tuple(range(1, min(tokens, 4) + 1)),
    )


def small_tree() -> tuple[NodeRow, ...]:
    """root -> 1 (locked) -> 2 (locked); root -> 3 -> 4 (lock_ref -1); root -> 5 (evicted)."""
    return (
        node(-1, 0, 1, 0, children=3, subtree=60),
        node(0, 16, 1, 1, children=1, subtree=32, hits=7),
        node(1, 16, 1, 2, last_access=90.0, hits=3),
        node(0, 8, 0, 3, children=1, subtree=12),
        node(3, 4, -1, 4),
        node(0, 16, 0, 5, evicted=True),
    )


def make_snapshot(*, rank: int = 0, instance: str = "aa11", seq: int = 1, nodes: tuple[NodeRow, ...] | None = None,
                  digest: str = "0123456789abcdef", counters: Counters | None = None, when: float = 1_700_000_000.0,
                  events_seq: int = 0, hist: dict[int, int] | None = None, **changes) -> Snapshot:
    nodes = small_tree() if nodes is None else nodes
    tokens = sum(n.tokens for n in nodes[1:])
    tree = TreeView(budget=max(1, len(nodes) - 1), walked_nodes=len(nodes) - 1, walked_tokens=tokens, cut_nodes=0,
                    cut_tokens=0, cut_exact=True, nodes=nodes)
    census = Census(complete=True, node_count=len(nodes) - 1, total_tokens=tokens,
                    lock_ref_histogram=hist if hist is not None else {0: 3, 1: 2, -1: 1}, digest=digest,
                    age_s=0.1, seconds=0.001)
    values = {
        "schema_version": SCHEMA_VERSION, "rank": rank, "instance": instance, "seq": seq, "time": when,
        "monotonic": 110.0, "seconds": 0.001, "cache_class": "RadixCache", "walkable": True, "reason": "",
        "page_size": 16, "capacity_tokens": 4096, "available_tokens": 1000, "evictable_tokens": 2000,
        "protected_tokens": 32, "hooks_state": "active", "counters": counters or Counters(lock_ops=10, unlock_ops=9),
        "events_seq": events_seq, "census": census, "tree": tree,
    }
    values.update(changes)
    return Snapshot(**values)


def wide_snapshot(n: int, **kw) -> Snapshot:
    """A root with n children, every tenth one locked: the worst shape for a tree view."""
    rows = [node(-1, 0, 1, 0, children=n, subtree=n * 16)]
    rows += [node(0, 16, 1 if i % 10 == 0 else 0, i + 1) for i in range(n)]
    return make_snapshot(nodes=tuple(rows), **kw)


def event_page(events: list[Event], *, since: int, instance: str = "aa11", rank: int = 0, more: bool = False,
               dropped: int = 0) -> bytes:
    latest = events[-1].seq if events else since
    page = EventPage(SCHEMA_VERSION, rank, instance, since, latest, latest, dropped, more, tuple(events))
    return encode_json(page.to_dict())


def health_body(*, instance: str = "aa11", status: str = "ok", rank: int = 0, message: str = "") -> bytes:
    h = Health(SCHEMA_VERSION, rank, instance, status, "active", 3, 10, 0.1, 0.001, 0.5, 256, message)
    return encode_json(h.to_dict())


@dataclass
class Answer:
    status: int = 200
    body: bytes | Callable[[dict[str, list[str]]], bytes] = b""
    delay_s: float = 0.0
    content_type: str = "application/json"
    length: bool = True  # send Content-Length (else the body ends when the connection closes)
    stream_bytes: int = 0  # instead of body: this many bytes, written in 1 MiB chunks


@dataclass
class StubServer:
    """A real HTTP server on 127.0.0.1; `answers[path]` says what each path returns."""

    answers: dict[str, Answer] = field(default_factory=dict)
    hits: dict[str, int] = field(default_factory=dict)
    queries: list[tuple[str, dict[str, list[str]]]] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"


@contextlib.contextmanager
def stub_server() -> Iterator[StubServer]:
    stub = StubServer()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            query = parse_qs(parts.query)
            stub.hits[parts.path] = stub.hits.get(parts.path, 0) + 1
            stub.queries.append((parts.path, query))
            answer = stub.answers.get(parts.path, Answer(404, b'{"schema_version":1,"error":"no such route"}'))
            if answer.delay_s:
                time.sleep(answer.delay_s)
            try:
                self.send_response(answer.status)
                self.send_header("Content-Type", answer.content_type)
                if answer.stream_bytes:
                    if answer.length:
                        self.send_header("Content-Length", str(answer.stream_bytes))
                    self.end_headers()
                    chunk = b"x" * (1024 * 1024)
                    sent = 0
                    while sent < answer.stream_bytes:
                        self.wfile.write(chunk)
                        sent += len(chunk)
                    return
                body = answer.body(query) if callable(answer.body) else answer.body
                if answer.length:
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    stub.server = server
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield stub
    finally:
        server.shutdown()
        server.server_close()


def start_sim(workdir: Path, *flags: str, timeout_s: float = 30.0) -> tuple[subprocess.Popen, str, Path]:
    """`python -m radixtop sim` as a real process; (process, base URL, log file)."""
    from radixtop.sim.cli import sim_argv

    workdir.mkdir(parents=True, exist_ok=True)
    ready = workdir / "sim.port"
    ready.unlink(missing_ok=True)
    log = workdir / "sim.log"
    out = open(workdir / "sim.out", "ab")  # noqa: SIM115 - the child holds it
    proc = subprocess.Popen(
        sim_argv("--step-ms", "1", *flags, ready_file=ready, log_file=log),
        stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
    )
    out.close()
    deadline = time.monotonic() + timeout_s
    while not (ready.exists() and ready.read_text().strip()):
        if proc.poll() is not None:
            raise RuntimeError(f"the simulator exited: {(workdir / 'sim.out').read_text()[-500:]}")
        if time.monotonic() > deadline:
            stop(proc)
            raise RuntimeError("the simulator did not start in time")
        time.sleep(0.05)
    return proc, f"http://127.0.0.1:{int(ready.read_text())}", log


def stop(proc: subprocess.Popen, timeout_s: float = 5.0) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout_s)
