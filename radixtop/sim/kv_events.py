"""The simulator's kv-events (`--kv-events-config`), as SGLang publishes them: a recorder per DP
rank's cache (BlockStored per new node's pages, BlockRemoved per evicted node, AllBlocksCleared
on reset, like sglang.srt.mem_cache.events) and a publisher per DP rank (ZMQ PUB on the
configured port + rank, topic/sequence/batch frames, a replay ROUTER keeping the last
buffer_steps batches; like sglang.srt.disaggregation.kv_events.ZmqEventPublisher).

Block hashes chain each page to its parent's hash, so a page's hash depends only on its prefix
(a node split changes none). A wildcard host binds 127.0.0.1: the simulator serves this machine.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from radixtop.kv_wire import (
    END_SEQ,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    encode_batch,
    seq_bytes,
)

if TYPE_CHECKING:
    import zmq

WILDCARD_HOSTS = ("*", "0.0.0.0", "::", "[::]")
FLUSH_S = 0.005  # a scheduler step's worth: events of one flush go out as one batch


def page_hash(parent: int | None, tokens: list[int]) -> int:
    digest = hashlib.sha256()
    if parent is not None:
        digest.update(parent.to_bytes(8, "big", signed=True))
    for t in tokens:
        digest.update(int(t).to_bytes(8, "little", signed=True))
    return int.from_bytes(digest.digest()[:8], "big", signed=True)


class KvEventRecorder:
    """One cache's events, queued until the publisher takes them (under a lock: two threads)."""

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self._lock = threading.Lock()
        self._queue: list[Any] = []

    def _pages(self, node: Any) -> tuple[int | None, list[tuple[int, list[int]]]]:
        """(the hash before the node's first page, [(hash, tokens)] of its pages)."""
        path: list[Any] = []
        above = node.parent
        while above is not None and above.parent is not None:
            path.append(above)
            above = above.parent
        parent: int | None = None
        size = self.page_size
        for a in reversed(path):
            toks = list(a.key.token_ids)
            for i in range(0, len(toks), size):
                parent = page_hash(parent, toks[i : i + size])
        first = parent
        pages = []
        toks = list(node.key.token_ids)
        for i in range(0, len(toks), size):
            parent = page_hash(parent, toks[i : i + size])
            pages.append((parent, toks[i : i + size]))
        return first, pages

    def record_store(self, node: Any) -> None:
        parent, pages = self._pages(node)
        if not pages:
            return
        event = BlockStored(
            block_hashes=[h for h, _ in pages],
            parent_block_hash=parent,
            token_ids=[t for _, toks in pages for t in toks],
            block_size=self.page_size,
            lora_id=None,
            medium="GPU",
        )
        with self._lock:
            self._queue.append(event)

    def record_remove(self, node: Any) -> None:
        _, pages = self._pages(node)
        if pages:
            with self._lock:
                self._queue.append(BlockRemoved(block_hashes=[h for h, _ in pages], medium="GPU"))

    def record_all_cleared(self) -> None:
        with self._lock:
            self._queue.append(AllBlocksCleared())

    def take(self) -> list[Any]:
        with self._lock:
            events, self._queue = self._queue, []
        return events


def _offset(endpoint: str | None, rank: int) -> str | None:
    if not endpoint or rank == 0:
        return endpoint
    base, _, port = endpoint.rpartition(":")
    return f"{base}:{int(port) + rank}"


def _loopback(endpoint: str) -> str:
    host_port = endpoint[len("tcp://") :]
    host, _, port = host_port.rpartition(":")
    return f"tcp://127.0.0.1:{port}" if host in WILDCARD_HOSTS else endpoint


class KvEventPublisher:
    """One DP rank's PUB and replay ROUTER, served by a thread that flushes the recorder."""

    def __init__(self, recorder: KvEventRecorder, config: dict[str, Any], dp_rank: int) -> None:
        import zmq

        self.recorder = recorder
        self.dp_rank = dp_rank
        self.topic = str(config.get("topic") or "").encode()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=int(config.get("buffer_steps") or 10_000))
        self._seq = 0
        self._ctx = zmq.Context()
        endpoint = _offset(str(config.get("endpoint") or "tcp://*:5557"), dp_rank)
        assert endpoint is not None
        bind = config.get("bind")
        host = endpoint[len("tcp://") :].rpartition(":")[0]
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.setsockopt(zmq.SNDHWM, int(config.get("hwm") or 100_000))
        if bind if isinstance(bind, bool) else host in WILDCARD_HOSTS:  # SGLang's heuristic
            self._pub.bind(_loopback(endpoint))
        else:
            self._pub.connect(endpoint)
        self._replay = None
        replay = _offset(config.get("replay_endpoint"), dp_rank)
        if replay:
            self._replay = self._ctx.socket(zmq.ROUTER)
            self._replay.setsockopt(zmq.LINGER, 0)
            self._replay.bind(_loopback(replay))
        self._running = True
        self._thread = threading.Thread(target=self._serve, name=f"sim-kv-events-{dp_rank}", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while self._running:
            replay = self._replay
            if replay is not None and replay.poll(0):
                self._answer_replay(replay)
            events = self.recorder.take()
            if events:
                payload = encode_batch(EventBatch(ts=time.time(), events=events, attn_dp_rank=self.dp_rank))
                self._pub.send_multipart((self.topic, seq_bytes(self._seq), payload))
                self._buffer.append((self._seq, payload))
                self._seq += 1
            else:
                time.sleep(FLUSH_S)

    def _answer_replay(self, replay: zmq.Socket[bytes]) -> None:
        frames = replay.recv_multipart()
        if len(frames) != 3:
            return  # SGLang logs and ignores such a request
        client, _, start = frames
        first = int.from_bytes(start, "big", signed=True)
        for seq, payload in list(self._buffer):
            if seq >= first:
                replay.send_multipart((client, b"", self.topic, seq_bytes(seq), payload))
        replay.send_multipart((client, b"", b"", END_SEQ, b""))

    def close(self) -> None:
        self._running = False
        self._thread.join(timeout=1.0)
        for sock in (self._pub, self._replay):
            if sock is not None:
                sock.close(0)
        self._ctx.term()


def parse_config(text: str) -> dict[str, Any]:
    """--kv-events-config's JSON; ValueError with one line."""
    try:
        cfg = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"--kv-events-config is not JSON: {exc}") from None
    if not isinstance(cfg, dict):
        raise ValueError("--kv-events-config must be a JSON object")
    if cfg.get("publisher", "null") not in ("zmq", "null"):
        raise ValueError(f"--kv-events-config: unknown publisher {cfg.get('publisher')!r} (zmq or null)")
    endpoint = str(cfg.get("endpoint") or "tcp://*:5557")
    if not endpoint.startswith("tcp://") or not endpoint.rpartition(":")[2].isdigit():
        raise ValueError(f"--kv-events-config: the simulator publishes on tcp://HOST:PORT only, got {endpoint!r}")
    return cfg


def start_publishers(caches: dict[int, Any], tp_size: int, config: dict[str, Any]) -> list[KvEventPublisher]:
    """A recorder on each DP group's first TP rank (SGLang publishes from attn-TP rank 0)."""
    if config.get("publisher", "null") != "zmq":
        return []
    out = []
    for rank, cache in sorted(caches.items()):
        if rank % max(1, tp_size):
            continue
        recorder = KvEventRecorder(cache.page_size)
        cache.kv_events = recorder
        recorder.record_all_cleared()  # what SGLang's cache sends when it starts
        out.append(KvEventPublisher(recorder, config, rank // max(1, tp_size)))
    return out
