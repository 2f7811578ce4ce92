"""The kv-events mirror against SGLang 0.5.23's own publisher (ZmqEventPublisher, with its replay
ROUTER) and its own RadixCache's event recorder, on real sockets on 127.0.0.1: the mirror built
from what SGLang publishes holds exactly the pages of the cache it publishes from, with evictions,
whether it subscribed before the first batch or caught up through the replay endpoint.

Run by .ci/sglang-tests in its environment; skipped where sglang is not installed."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest
from sglang_gate import why_not

NO_SGLANG = why_not("sglang.srt.disaggregation.kv_events", "zmq")
pytestmark = pytest.mark.skipif(NO_SGLANG is not None, reason=NO_SGLANG or "")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cache_pages(cache) -> set[tuple[int, ...]]:
    """Every page's whole token path in SGLang's tree, read without radixtop's code."""
    out: set[tuple[int, ...]] = set()
    stack = [(cache.root_node, ())]
    while stack:
        node, above = stack.pop()
        for child in node.children.values():
            toks = tuple(int(t) for t in child.key.token_ids)
            for i in range(0, len(toks), cache.page_size):
                out.add(above + toks[: i + cache.page_size])
            stack.append((child, above + toks))
    return out


def kv_cache(page_size: int, size: int):
    import real_cache
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.radix_cache import RadixCache

    return RadixCache(CacheInitParams(
        disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=real_cache.allocator(size),
        page_size=page_size, enable_kv_cache_events=True,
    ))


def publish_step(cache, publisher) -> None:
    """What SchedulerKvEventsPublisher.publish_kv_events does after each scheduler step."""
    from sglang.srt.disaggregation.kv_events import KVEventBatch

    events = cache.take_events()
    if events:
        publisher.publish(KVEventBatch(ts=time.time(), events=events))


@pytest.mark.parametrize(("page_size", "subscribe_after"), [(1, 0), (4, 30)])
def test_the_mirror_of_sglangs_own_publisher_matches_the_cache(page_size: int, subscribe_after: int) -> None:
    import real_cache
    from sglang.srt.disaggregation.kv_events import ZmqEventPublisher

    from radixtop.probes.kv_events import KvEventsProbe
    from radixtop.probes.kv_events_config import KvEventsSource

    pub_port, replay_port = free_port(), free_port()
    cache = kv_cache(page_size, size=900)  # small: the driver's stream evicts
    publisher = ZmqEventPublisher(attn_dp_rank=0, endpoint=f"tcp://127.0.0.1:{pub_port}", bind=True,
                                  replay_endpoint=f"tcp://127.0.0.1:{replay_port}", topic="kv")
    source = KvEventsSource(0, f"tcp://127.0.0.1:{pub_port}", "kv", f"tcp://127.0.0.1:{replay_port}")
    probe = KvEventsProbe(source)
    driver = real_cache.Driver(cache, page_size=page_size, seed=page_size)
    try:
        publish_step(cache, publisher)  # the AllBlocksCleared SGLang's cache records when it starts
        for _ in range(subscribe_after):  # published before the mirror subscribes: the replay brings them
            driver.request()
            publish_step(cache, publisher)
        sample = asyncio.run(probe.poll())
        for _ in range(120):
            driver.request()
            publish_step(cache, publisher)
        driver.finish_all()
        cache.evict(real_cache.EvictParams(num_tokens=200))
        publish_step(cache, publisher)
        assert driver.tally.evictions > 0  # removals were published, not only stores
        want = cache_pages(cache)
        deadline = time.monotonic() + 15
        while probe.mirror.prefixes() != want and time.monotonic() < deadline:
            sample = asyncio.run(probe.poll())
            time.sleep(0.05)
        got = probe.mirror.prefixes()
        assert got == want, f"{len(got - want)} pages too many, {len(want - got)} missing; {probe.note()}"
        assert len(want) > 50
        assert sample.status.state == "ok", sample.status
        assert probe.lost == 0 and probe.malformed == 0 and not probe.began_mid_stream
        assert sample.snapshot.page_size == page_size
        assert sample.snapshot.tree.walked_tokens == probe.mirror.tokens
        assert probe.mirror.tokens == cache.total_size()
    finally:
        asyncio.run(probe.aclose())
        publisher.shutdown()
