"""The kv-events mirror against the simulator's publisher on real ZMQ sockets on 127.0.0.1: the
mirror matches the cache it is published from, catches up through the replay endpoint (from the
start, and after a gap), says what it lost, and survives garbage and a dead publisher."""

from __future__ import annotations

import asyncio
import json
import random
import socket
import time

import pytest
import zmq

from radixtop.kv_wire import BlockStored, EventBatch, encode_batch, seq_bytes
from radixtop.probes.kv_events import KvEventsProbe
from radixtop.probes.kv_events_config import KvEventsSource, from_argv, from_server_info
from radixtop.probes.kv_mirror import SOURCE, BlockMirror
from radixtop.session.radix_board import RadixBoard
from radixtop.sim.kv_events import KvEventPublisher, KvEventRecorder
from radixtop.sim.radix import InsertParams, RadixCache, RadixKey


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cache_prefixes(cache: RadixCache) -> set[tuple[int, ...]]:
    """Every page's whole token path in the simulator's cache."""
    out: set[tuple[int, ...]] = set()
    stack = [(cache.root_node, ())]
    while stack:
        node, above = stack.pop()
        for child in node.children.values():
            toks = tuple(child.key.token_ids)
            for i in range(0, len(toks), cache.page_size):
                out.add(above + toks[: i + cache.page_size])
            stack.append((child, above + toks))
    return out


def grow(cache: RadixCache, rng: random.Random, n: int) -> None:
    """Prompts that share prefixes (so nodes split), then evictions."""
    stems = [[rng.randrange(1000) for _ in range(rng.choice((4, 8, 12)))] for _ in range(4)]
    for _ in range(n):
        key = rng.choice(stems) + [rng.randrange(1000) for _ in range(rng.choice((4, 8)))]
        cache.insert(InsertParams(key=RadixKey(key)))
        if rng.random() < 0.3:
            cache.evict(rng.choice((4, 8, 16)))


def wait_until(probe: KvEventsProbe, predicate, timeout_s: float = 10.0):
    deadline = time.monotonic() + timeout_s
    sample = None
    while time.monotonic() < deadline:
        sample = asyncio.run(probe.poll())
        if predicate(sample):
            return sample
        time.sleep(0.05)
    raise AssertionError(f"timed out; last status {sample.status if sample else None}, note {probe.note()}")


@pytest.fixture
def published():
    """A simulator cache (page 4) publishing on free loopback ports, with a replay endpoint."""
    pub_port, replay_port = free_port(), free_port()
    cache = RadixCache.create_simulated(page_size=4)
    recorder = KvEventRecorder(cache.page_size)
    cache.kv_events = recorder
    recorder.record_all_cleared()
    config = {"publisher": "zmq", "endpoint": f"tcp://127.0.0.1:{pub_port}", "bind": True,
              "replay_endpoint": f"tcp://127.0.0.1:{replay_port}"}
    publisher = KvEventPublisher(recorder, config, 0)
    source = KvEventsSource(0, f"tcp://127.0.0.1:{pub_port}", "", f"tcp://127.0.0.1:{replay_port}")
    try:
        yield cache, publisher, source
    finally:
        publisher.close()


def test_the_mirror_matches_the_cache_it_is_published_from(published) -> None:
    cache, _, source = published
    rng = random.Random(7)
    grow(cache, rng, 40)  # published before the mirror subscribes: the replay brings it
    probe = KvEventsProbe(source)
    try:
        wait_until(probe, lambda s: probe.mirror.prefixes() == cache_prefixes(cache))
        grow(cache, rng, 60)  # and live from here on
        sample = wait_until(probe, lambda s: probe.mirror.prefixes() == cache_prefixes(cache))
        assert len(cache_prefixes(cache)) > 20
        assert sample.status.state == "ok", sample.status
        assert sample.source == SOURCE and sample.locks_known is False
        assert not probe.began_mid_stream and probe.lost == 0
        # The view has the cache's shape: one node per chain of pages without a branch, all tokens.
        tree = sample.snapshot.tree
        assert tree.walked_tokens == sum(len(n.key.token_ids) for n in cache.iter_nodes() if n is not cache.root_node)
        assert tree.cut_nodes == 0
    finally:
        asyncio.run(probe.aclose())


def test_a_gap_is_filled_from_the_replay_endpoint(published) -> None:
    cache, publisher, source = published
    probe = KvEventsProbe(source)
    try:
        wait_until(probe, lambda s: s.status.state == "ok")
        # The subscriber misses batches (as after a slow poll past the high-water mark): drop them
        # at the publisher's PUB socket but keep them in its replay buffer.
        real = publisher._pub
        dropped = []

        class Dropping:
            def send_multipart(self, frames):
                dropped.append(frames[1])

        publisher._pub = Dropping()
        grow(cache, random.Random(3), 30)
        deadline = time.monotonic() + 5
        while len(dropped) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        publisher._pub = real
        grow(cache, random.Random(4), 5)
        sample = wait_until(probe, lambda s: probe.mirror.prefixes() == cache_prefixes(cache))
        assert dropped and probe.lost == 0 and sample.status.state == "ok"
    finally:
        asyncio.run(probe.aclose())


def test_lost_batches_garbage_and_a_dead_publisher_are_lines_not_crashes() -> None:
    pub_port = free_port()
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind(f"tcp://127.0.0.1:{pub_port}")
    probe = KvEventsProbe(KvEventsSource(0, f"tcp://127.0.0.1:{pub_port}"))  # no replay endpoint
    board = RadixBoard()
    try:
        wait_until(probe, lambda s: s.status.state in ("ok", "degraded"))
        stored = BlockStored(block_hashes=[11, 12], parent_block_hash=None, token_ids=[1, 2, 3, 4], block_size=2,
                             lora_id=None)
        ok = encode_batch(EventBatch(ts=time.time(), events=[stored]))

        def send_until(frames, predicate):
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                pub.send_multipart(frames)
                sample = asyncio.run(probe.poll())
                board.add(sample)
                if predicate(sample):
                    return sample
                time.sleep(0.05)
            raise AssertionError(probe.note())

        send_until([b"", seq_bytes(0), ok], lambda s: len(probe.mirror.blocks) == 2)
        sample = send_until([b"", seq_bytes(5), b"\xc1garbage"], lambda s: probe.malformed > 0)
        assert sample.status.state == "degraded" and "batch #5" in sample.status.message
        assert probe.lost == 4  # seq 1..4 never came and no replay endpoint could bring them
        assert "4 batches lost" in probe.note() and "malformed" in probe.note()
        assert len(probe.mirror.blocks) == 2  # nothing collected was lost
        pub.close(0)
        sample = wait_until(probe, lambda s: s.status.state == "down")
        assert "no publisher answers" in sample.status.message
        board.add(sample)
        view = board.ranks[probe.url]
        assert view.snapshot is not None and view.snapshot.tree.walked_tokens == 4  # the last tree is kept
    finally:
        asyncio.run(probe.aclose())
        ctx.term()


def test_the_mirror_attaches_orphans_and_counts_what_it_never_saw() -> None:
    m = BlockMirror()
    m.apply([BlockStored(block_hashes=[1, 2], parent_block_hash=99, token_ids=[5, 6], block_size=1, lora_id=None)])
    assert m.unknown_parents == 1 and m.prefixes() == {(5,), (5, 6)}
    from radixtop.kv_wire import AllBlocksCleared, BlockRemoved

    m.apply([BlockRemoved(block_hashes=[1, 42])])
    assert m.unknown_removes == 1 and m.prefixes() == {(6,)}  # its child is shown under the root
    m.apply([AllBlocksCleared()])
    assert not m.blocks and m.tokens == 0


def test_publishers_are_found_in_server_info_and_argv_on_loopback_only() -> None:
    cfg = json.dumps({"publisher": "zmq", "endpoint": "tcp://*:6000", "replay_endpoint": "tcp://*:6100"})
    found, why = from_server_info({"kv_events_config": cfg, "dp_size": 2}, "http://127.0.0.1:30000")
    assert why == "" and [s.endpoint for s in found] == ["tcp://127.0.0.1:6000", "tcp://127.0.0.1:6001"]
    assert [s.replay_endpoint for s in found] == ["tcp://127.0.0.1:6100", "tcp://127.0.0.1:6101"]
    assert not found[0].sub_binds  # a wildcard host: the publisher binds, radixtop connects
    block = {"publisher": "zmq", "endpoint_host": "*", "endpoint_port_base": 7000, "topic": "kv", "dp_size": 1,
             "replay_endpoint_port_base": 7001}
    found, _ = from_server_info({"kv_events": block}, "http://localhost:30000")
    assert found == [KvEventsSource(0, "tcp://localhost:7000", "kv", "tcp://localhost:7001")]
    found, why = from_argv(["--kv-events-config", json.dumps({"publisher": "zmq", "endpoint": "tcp://10.1.2.3:5557"})])
    assert found == [] and "not on loopback" in why
    found, _ = from_argv([f"--kv-events-config={json.dumps({'publisher': 'zmq', 'endpoint': 'tcp://127.0.0.1:5557'})}"])
    assert found[0].sub_binds  # a concrete host without bind: SGLang's PUB connects, radixtop binds
    assert from_argv(["--port", "30000"]) == ([], "")
