"""A misbehaving kv-events publisher on loopback, run as a process of its own by the tests:
``python tests/kv_publisher.py MODE PUB_PORT REPLAY_PORT [SIZE_MIB]``.

It binds SGLang's PUB and replay ROUTER on 127.0.0.1, waits (at most 60 s) for a subscriber,
prints ``subscribed``, sends what MODE says, prints ``sent``, and leaves when its stdin closes
(at most 120 s later). Modes:

- ``huge``: the replay answers its first request with one SIZE_MIB frame, and the live stream
  sends one such frame: a peer that wants to be held in memory.
- ``gaps``: 40 batches numbered 0, 2, 4, ... (a gap before each), and a replay ROUTER that never
  answers.
- ``far``: one batch numbered 2**63 - 1, then batches 1..99 (the replay answers with nothing).
- ``stale_root``: store A; store B under A; remove A; store A under B; remove B; then 10 more roots.
"""

from __future__ import annotations

import sys
import threading
import time

import zmq
from zmq.utils.monitor import recv_monitor_message

from radixtop.kv_wire import END_SEQ, BlockRemoved, BlockStored, EventBatch, encode_batch, seq_bytes

WAIT_S = 60.0
LINGER_S = 120.0


def stored(hashes: list[int], parent: int | None, tokens: list[int]) -> BlockStored:
    return BlockStored(block_hashes=hashes, parent_block_hash=parent, token_ids=tokens, block_size=1, lora_id=None)


def batch(events: list) -> bytes:
    return encode_batch(EventBatch(ts=time.time(), events=events))


def main() -> None:
    mode, pub_port, replay_port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    size = int(sys.argv[4]) << 20 if len(sys.argv) > 4 else 0
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.SNDHWM, 0)
    pub.setsockopt(zmq.LINGER, 0)
    monitor = pub.get_monitor_socket()
    pub.bind(f"tcp://127.0.0.1:{pub_port}")
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(f"tcp://127.0.0.1:{replay_port}")
    blob = b"\x93" + b"\x00" * size if size else b""

    def serve_replay() -> None:
        answered = False
        while True:
            try:
                frames = router.recv_multipart()
            except zmq.ZMQError:
                return
            if mode == "gaps":
                continue  # a replay endpoint that never answers
            if mode == "huge" and not answered:
                answered = True
                router.send_multipart([frames[0], b"", b"", seq_bytes(0), blob])
                continue
            router.send_multipart([frames[0], b"", b"", END_SEQ, b""])

    threading.Thread(target=serve_replay, daemon=True).start()
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if monitor.poll(200) and recv_monitor_message(monitor)["event"] == zmq.EVENT_ACCEPTED:
            break
    time.sleep(1.0)  # the subscription reaches the publisher after the connection
    print("subscribed", flush=True)

    def send(seq: int, payload: bytes) -> None:
        pub.send_multipart([b"", seq_bytes(seq), payload])

    if mode == "huge":
        send(1, blob)
    elif mode == "gaps":
        for i in range(40):
            send(2 * i, batch([stored([10_000 + i], None, [i])]))
    elif mode == "far":
        send(2**63 - 1, batch([stored([1], None, [1])]))
        for i in range(1, 100):
            send(i, batch([stored([100 + i], None, [i])]))
    elif mode == "stale_root":
        steps = [
            [stored([1], None, [1])],  # A, a root
            [stored([2], 1, [2])],  # B under A
            [BlockRemoved(block_hashes=[1])],  # A first: B is shown under the root
            [stored([1], 2, [3])],  # A again, under B
            [BlockRemoved(block_hashes=[2])],  # B: its parent's hash names a block again
        ] + [[stored([i * 10], None, [i])] for i in range(3, 13)]
        for seq, events in enumerate(steps):
            send(seq, batch(events))
    print("sent", flush=True)
    end = time.monotonic() + LINGER_S
    while time.monotonic() < end and sys.stdin.readline():
        pass


if __name__ == "__main__":
    main()
