"""instrument/: snapshots, hooks and the debug endpoint, on real loopback HTTP.

Most tests drive the simulator's RadixCache (SGLang's shape and semantics). A tiny SGLang-shaped
tree built here covers what the simulator cannot be: older SGLang APIs (evict(num_tokens)
returning None), trees 10k deep, caches whose KV "tensors" must never be touched, and caches that
cannot be walked (the Rust TreeCore, a disabled cache).
"""

from __future__ import annotations

import gc
import inspect
import json
import logging
import random
import re
import socket
import struct
import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_sim_radix import Req  # the minimal request a checkpoint reads

from radixtop import schema
from radixtop.instrument.endpoint import (
    Instrumentation,
    InstrumentEndpoint,
    is_loopback,
)
from radixtop.instrument.hooks import HOOKED_METHODS, CacheHooks, EventRing
from radixtop.instrument.snapshot import (
    SnapshotConfig,
    TreeSnapshotter,
    find_root,
    run_census,
)
from radixtop.schema import HEALTH_PATH, INSTRUMENT_PORT_SPAN, parse_events, parse_health, parse_snapshot
from radixtop.sim.pool import TokenToKVPoolAllocator
from radixtop.sim.radix import (
    EvictParams,
    InsertParams,
    MatchPrefixParams,
    RadixCache,
    RadixKey,
)

# ---------------------------------------------------------------------------------------------
# Fixtures: the simulator's cache, and a tiny SGLang-shaped tree


def sim_cache(size: int = 4096, page_size: int = 1) -> RadixCache:
    alloc = TokenToKVPoolAllocator(size, page_size, store_contents=False)
    return RadixCache.create_simulated(mock_allocator=alloc, page_size=page_size)


def insert(cache: RadixCache, tokens: list[int]):
    slots = cache.token_to_kv_pool_allocator.alloc(len(tokens))
    assert slots is not None
    result = cache.insert(InsertParams(key=RadixKey(tokens), value=slots))
    cache.token_to_kv_pool_allocator.free(slots[: result.prefix_len])  # the tree kept its own
    return cache.match_prefix(MatchPrefixParams(key=RadixKey(tokens))).last_device_node


def filled_sim_cache(n_prompts: int = 40, seed: int = 7) -> RadixCache:
    rng = random.Random(seed)
    cache = sim_cache(8192)
    system = list(range(1000, 1016))
    for _ in range(n_prompts):
        insert(cache, system + [rng.randrange(50) for _ in range(rng.randrange(1, 12))])
    return cache


def direct_walk(cache):
    """Every node below the root: (count, tokens, histogram) by a plain stack walk."""
    count, tokens, hist = 0, 0, {}
    stack = list(cache.root_node.children.values())
    while stack:
        node = stack.pop()
        count += 1
        tokens += len(node.key)
        hist[node.lock_ref] = hist.get(node.lock_ref, 0) + 1
        stack.extend(node.children.values())
    return count, tokens, hist


class Key:
    def __init__(self, ids):
        self.token_ids = list(ids)

    def __len__(self):
        return len(self.token_ids)


class Untouchable:
    """Stands in for a KV tensor: any use beyond `is None` fails the test."""

    def _boom(self, *args, **kwargs):
        raise AssertionError("instrumentation touched a KV tensor")

    __len__ = __iter__ = __bool__ = __getitem__ = __int__ = __index__ = __float__ = item = _boom


class Node:
    _ids = iter(range(10**9))

    def __init__(self, parent=None, ids=(), lock_ref=0):
        self.children = {}
        self.parent = parent
        self.key = Key(ids)
        self.value = Untouchable()
        self.lock_ref = lock_ref
        self.last_access_time = time.monotonic()
        self.hit_count = 0
        self.id = next(Node._ids)
        if parent is not None:
            parent.children[(ids[0] if ids else None, self.id)] = self


class Allocator:
    def __init__(self, size):
        self.size = size
        self.free = size // 2

    def available_size(self):
        return self.free


class MiniCache:
    """SGLang's pre-0.5 RadixCache API: evict(num_tokens) returns None."""

    def __init__(self):
        self.root_node = Node(lock_ref=1)
        self.root_node.value = []
        self.page_size = 1
        self.token_to_kv_pool_allocator = Allocator(1000)
        self.evictable_size_ = 0
        self.protected_size_ = 0

    def add(self, parent, ids, lock_ref=0):
        node = Node(parent or self.root_node, ids, lock_ref)
        self.evictable_size_ += len(ids)
        return node

    def chain(self, depth, width=1):
        node = self.root_node
        for i in range(depth):
            node = self.add(node, list(range(i, i + width)))
        return node

    def inc_lock_ref(self, node):
        while node is not self.root_node:
            if node.lock_ref == 0:
                self.evictable_size_ -= len(node.key)
                self.protected_size_ += len(node.key)
            node.lock_ref += 1
            node = node.parent

    def dec_lock_ref(self, node):
        while node is not self.root_node:
            if node.lock_ref == 1:
                self.evictable_size_ += len(node.key)
                self.protected_size_ -= len(node.key)
            node.lock_ref -= 1
            node = node.parent

    def evict(self, num_tokens, evict_callback=None):
        freed = min(num_tokens, self.evictable_size_)
        self.evictable_size_ -= freed  # bookkeeping is all the hooks look at

    def evictable_size(self):
        return self.evictable_size_

    def protected_size(self):
        return self.protected_size_


@pytest.fixture
def endpoint_factory():
    made = []

    def make(**kwargs):
        kwargs.setdefault("port", 0)
        kwargs.setdefault("min_interval_s", 0.0)
        ep = InstrumentEndpoint(**kwargs)
        made.append(ep)
        return ep

    yield make
    for ep in made:
        ep.stop()


# ---------------------------------------------------------------------------------------------
# Snapshots


def test_snapshot_matches_the_sim_cache_and_a_direct_walk():
    cache = filled_sim_cache()
    node = insert(cache, list(range(1000, 1016)) + [1, 2, 3])
    cache.inc_lock_ref(node)
    snap = TreeSnapshotter(SnapshotConfig(max_nodes=10_000)).take(cache)
    count, tokens, hist = direct_walk(cache)
    assert snap.walkable and snap.reason == ""
    assert snap.cache_class == "RadixCache"
    assert snap.evictable_tokens == cache.evictable_size()
    assert snap.protected_tokens == cache.protected_size() > 0
    assert snap.capacity_tokens == 8192
    assert snap.available_tokens == cache.token_to_kv_pool_allocator.available_size()
    assert snap.census.complete and snap.census.node_count == count
    assert snap.census.total_tokens == tokens == cache.evictable_size() + cache.protected_size()
    assert snap.census.lock_ref_histogram == hist
    tree = snap.tree
    assert tree.walked_nodes == count and tree.walked_tokens == tokens
    assert (tree.cut_nodes, tree.cut_tokens, tree.cut_exact) == (0, 0, True)
    assert tree.nodes[0].parent == -1
    assert all(0 <= row.parent < i for i, row in enumerate(tree.nodes) if i)
    # The root's subtree weight is the whole tree; locked nodes come first.
    assert tree.nodes[0].subtree_tokens == tokens
    locked = [i for i, row in enumerate(tree.nodes[1:], 1) if row.lock_ref]
    assert locked == list(range(1, len(locked) + 1))
    assert parse_snapshot(snap.to_json()) == snap


def test_budgeted_walk_takes_the_heaviest_subtrees_and_counts_the_cut():
    cache = MiniCache()
    heavy = cache.add(None, list(range(50)))
    for i in range(5):
        cache.add(heavy, [i] * 10)
    light = [cache.add(None, [900 + i]) for i in range(20)]
    snap = TreeSnapshotter(SnapshotConfig(max_nodes=6)).take(cache)
    rows = snap.tree.nodes
    assert snap.tree.walked_nodes == 6
    assert [r.id for r in rows[1:]][0] == heavy.id
    assert {r.id for r in rows[1:]} == {heavy.id} | {c.id for c in heavy.children.values()}
    assert snap.tree.cut_exact
    assert snap.tree.cut_nodes == len(light)
    assert snap.tree.cut_tokens == len(light)
    assert snap.census.node_count == 26


def test_locked_nodes_come_before_heavier_unlocked_ones():
    cache = MiniCache()
    cache.add(None, list(range(500)))
    small = cache.add(None, [7])
    cache.inc_lock_ref(small)
    snap = TreeSnapshotter(SnapshotConfig(max_nodes=1)).take(cache)
    assert snap.tree.nodes[1].id == small.id


def test_a_tree_ten_thousand_deep_is_walked_without_recursion():
    cache = MiniCache()
    leaf = cache.chain(10_000)
    cache.inc_lock_ref(leaf)
    snap = TreeSnapshotter(SnapshotConfig(max_nodes=200)).take(cache, force_census=True)
    assert snap.census.complete and snap.census.node_count == 10_000
    assert snap.census.lock_ref_histogram == {1: 10_000}
    assert snap.tree.walked_nodes == 200 and snap.tree.cut_nodes == 9_800
    # The wire format is flat: a deep tree does not nest the JSON.
    assert parse_snapshot(snap.to_json()).tree.walked_nodes == 200


def test_never_touches_kv_tensors_or_turns_tensors_into_ints():
    cache = MiniCache()
    cache.chain(5)
    cache.token_to_kv_pool_allocator.size = Untouchable()  # e.g. a tensor: must not be int()-ed
    snap = TreeSnapshotter().take(cache)
    assert snap.walkable and snap.capacity_tokens is None
    assert snap.available_tokens == 500


def test_digest_tells_shapes_apart_and_ignores_order_and_locks():
    def build(order, lock=False):
        cache = MiniCache()
        for ids in order:
            node = cache.add(None, ids)
            cache.add(node, ids[:1] * 3)
        if lock:
            cache.inc_lock_ref(next(iter(cache.root_node.children.values())))
        return TreeSnapshotter().take(cache).census.digest

    a = build([[1, 2], [3, 4, 5], [6]])
    assert a == build([[6], [3, 4, 5], [1, 2]])  # another insertion order, same shape
    assert a == build([[1, 2], [3, 4, 5], [6]], lock=True)
    assert a != build([[1, 2], [3, 4], [6]])
    assert a != build([[1, 2], [3, 4, 5]])
    assert len(a) == 16


def test_rust_core_and_disabled_caches_report_sizes_and_say_why():
    class UnifiedRadixCache:
        def __init__(self):
            self.tree_core = type("RustTreeCore", (), {})()
            self.page_size = 16
            self.token_to_kv_pool_allocator = Allocator(4096)

        def evictable_size(self):
            return 100

        def protected_size(self):
            return 30

    snap = TreeSnapshotter().take(UnifiedRadixCache())
    assert not snap.walkable and snap.tree is None and snap.census is None
    assert "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python" in snap.reason
    assert "RustTreeCore" in snap.reason
    assert (snap.evictable_tokens, snap.protected_tokens, snap.capacity_tokens, snap.page_size) == (100, 30, 4096, 16)
    assert parse_snapshot(snap.to_json()) == snap

    disabled = sim_cache()
    disabled.disable = True
    root, why = find_root(disabled)
    assert root is None and "disabled" in why


def test_a_tree_that_breaks_mid_walk_is_reported_not_raised():
    cache = MiniCache()
    node = cache.add(None, [1, 2])
    node.key = object()  # no len(): the walk fails
    snap = TreeSnapshotter().take(cache)
    assert not snap.walkable
    assert "walking the tree failed (TypeError" in snap.reason
    assert snap.evictable_tokens == 2


def test_census_is_duty_limited_and_the_cut_is_then_estimated():
    cache = filled_sim_cache()
    shot = TreeSnapshotter(SnapshotConfig(max_nodes=3, census_duty=1e-9))
    first = shot.take(cache)
    assert first.tree.cut_exact and first.census.age_s < 1
    insert(cache, [5, 5, 5, 5])
    time.sleep(0.01)
    second = shot.take(cache)
    assert second.census.age_s >= 0.01  # the same census, older: its cost bought a long rest
    assert second.census.node_count == first.census.node_count
    assert not second.tree.cut_exact
    assert second.tree.cut_tokens == cache.evictable_size() + cache.protected_size() - second.tree.walked_tokens
    forced = shot.take(cache, force_census=True)
    assert forced.tree.cut_exact and forced.census.node_count == first.census.node_count + 1


def test_census_stops_at_its_node_limit():
    cache = MiniCache()
    for i in range(50):
        cache.add(None, [i])
    result = run_census(cache.root_node, limit=10, hint_cap=100)
    assert not result.census.complete and result.census.digest == ""
    snap = TreeSnapshotter(SnapshotConfig(max_nodes=5, census_max_nodes=10)).take(cache)
    assert not snap.census.complete
    assert snap.tree.cut_nodes is None and not snap.tree.cut_exact


# ---------------------------------------------------------------------------------------------
# Hooks


def test_instance_hooks_count_lock_unlock_evict_on_the_sim_cache():
    gc.collect()  # caches other tests hooked and dropped unregister themselves
    cache = filled_sim_cache()
    other = filled_sim_cache()
    originals = {name: inspect.unwrap(RadixCache.__dict__[name]) for name in HOOKED_METHODS}
    hooks = CacheHooks()
    assert hooks.install(cache) and hooks.state == "active"
    assert hooks.install(cache)  # idempotent
    # Nothing is written into the instance (that would slow the host's own attribute reads); the
    # class gets dispatching wrappers that pass other instances straight through.
    assert type(cache) is RadixCache and not any(name in cache.__dict__ for name in HOOKED_METHODS)
    assert all(RadixCache.__dict__[name] is not originals[name] for name in HOOKED_METHODS)
    node = insert(cache, list(range(1000, 1016)) + [9])
    cache.inc_lock_ref(node)
    cache.dec_lock_ref(node)
    other.inc_lock_ref(insert(other, [1, 2]))  # another instance: not counted
    before = cache.evictable_size()
    result = cache.evict(EvictParams(num_tokens=5))
    c = hooks.counters()
    assert (c.lock_ops, c.unlock_ops) == (1, 1)
    assert c.evict_calls == 1 and c.evictions == 1
    assert c.evicted_tokens == result.num_tokens_evicted == before - cache.evictable_size()
    assert c.negative_lock_ref == 0 and c.instrument_errors == 0
    events, latest, dropped, more = hooks.events.read(0)
    assert [e.kind for e in events] == ["evict"] and events[0].requested == 5
    hooks.uninstall()
    hooks.uninstall()  # idempotent
    assert all(RadixCache.__dict__[name] is originals[name] for name in HOOKED_METHODS)
    cache.inc_lock_ref(node)
    assert hooks.counters().lock_ops == 1 and hooks.state == "off"


@pytest.mark.parametrize("target", ["instance", "class"])
def test_the_hooks_count_a_chunked_requests_locks_on_the_sim_as_on_a_real_server(target):
    """0.5.23 admits a request with a lock, moves it at each chunk's checkpoint (unlock the old
    end, lock the new one) and releases with a last checkpoint and an unlock: a request of two
    chunks is 3 locks and 3 unlocks. The simulator moves a lock in one pass when nobody watches
    the pair; hooked, it must make the calls a real server makes, or the counters read low."""
    gc.collect()
    cache = filled_sim_cache()
    hooks = CacheHooks()
    hooks.install(cache if target == "instance" else RadixCache)
    try:
        pool = cache.token_to_kv_pool_allocator
        tokens = list(range(1000, 1016)) + [7, 8, 9, 10, 11, 12]
        match = cache.match_prefix(MatchPrefixParams(key=RadixKey(tokens[:-1])))
        req = Req(tokens)
        req.kv_indices = list(match.device_indices)
        req.cache_protected_len = len(req.kv_indices)
        req.last_node, req.lock = match.last_device_node, cache.lock(match.last_device_node)
        req.kv_indices += pool.alloc(len(tokens) - len(req.kv_indices))
        cache.checkpoint(req, up_to=len(tokens) - 3)  # the first chunk
        cache.cache_finished_req(req)  # the rest, and the release
        c = hooks.counters()
        assert (c.lock_ops, c.unlock_ops) == (3, 3)
        assert c.negative_lock_ref == 0 and c.instrument_errors == 0
        assert all(node.lock_ref == 0 for node in cache.iter_nodes())
    finally:
        hooks.uninstall()


@pytest.mark.parametrize("target", ["instance", "class"])
def test_every_evict_after_the_first_takes_the_exact_path_and_counts_the_same(target):
    gc.collect()
    cache = filled_sim_cache(n_prompts=120)
    hooks = CacheHooks()
    hooks.install(cache if target == "instance" else RadixCache)
    try:
        wrapper = RadixCache.__dict__["evict"]
        assert wrapper.__code__.co_name == "evict_exact"  # SGLang >= 0.5's evict(self, params) shape
        freed = []
        for ask in (5, 7, 0, 11):
            freed.append(cache.evict(EvictParams(num_tokens=ask)).num_tokens_evicted)
        # Lock everything left, then ask for more than can go: an evict short while locked.
        for node in [n for n in cache.iter_nodes() if not n.children]:
            cache.inc_lock_ref(node)
        short = cache.evict(EvictParams(num_tokens=50)).num_tokens_evicted
        c = hooks.counters()
        assert c.evict_calls == 5 and c.evictions == sum(1 for f in freed + [short] if f > 0)
        assert c.evicted_tokens == sum(freed) + short and short < 50
        assert c.evict_short_locked == 1 and c.instrument_errors == 0
        events = hooks.events.read(0)[0]
        assert [(e.tokens, e.requested) for e in events if e.kind == "evict"] == [
            (f, ask) for f, ask in zip(freed + [short], (5, 7, 0, 11, 50)) if f > 0
        ]
        assert [e.kind for e in events][-1] == "evict_short"
    finally:
        hooks.uninstall()


def test_double_unlock_on_the_sim_cache_is_counted_as_negative_lock_ref():
    cache = filled_sim_cache()
    hooks = CacheHooks()
    hooks.install(cache)
    node = insert(cache, list(range(1000, 1016)) + [42, 43])
    cache.inc_lock_ref(node)
    cache.dec_lock_ref(node)
    assert hooks.counters().negative_lock_ref == 0
    cache.dec_lock_ref(node)  # the bug SGLang does not check for
    c = hooks.counters()
    assert c.negative_lock_ref == 1 and c.unlock_ops == 2
    events = [e for e in hooks.events.read(0)[0] if e.kind == "negative_lock_ref"]
    assert events[0].node_id == node.id and events[0].lock_ref == -1
    snap = TreeSnapshotter().take(cache, counters=hooks.counters())
    assert snap.census.lock_ref_histogram.get(-1, 0) >= 1
    assert snap.counters.negative_lock_ref == 1


def test_class_hooks_patch_every_instance_and_restore_the_originals():
    class Cache(MiniCache):
        pass

    originals = {name: getattr(MiniCache, name) for name in HOOKED_METHODS}
    hooks = CacheHooks()
    assert hooks.install(Cache)
    a, b = Cache(), Cache()
    for cache in (a, b):
        cache.inc_lock_ref(cache.add(None, [1]))
    assert hooks.counters().lock_ops == 2
    # An instance of a hooked class is not wrapped a second time (no double counting).
    other = CacheHooks()
    assert not other.install(a)
    a.dec_lock_ref(next(iter(a.root_node.children.values())))
    assert hooks.counters().unlock_ops == 1 and other.counters().unlock_ops == 0
    hooks.uninstall()
    assert not any(name in Cache.__dict__ for name in HOOKED_METHODS)  # inherited again
    assert all(getattr(Cache, name) is originals[name] for name in HOOKED_METHODS)

    hooks2 = CacheHooks()
    hooks2.install(MiniCache)
    assert MiniCache.__dict__["inc_lock_ref"] is not originals["inc_lock_ref"]
    hooks2.uninstall()
    assert all(MiniCache.__dict__[name] is originals[name] for name in HOOKED_METHODS)


def test_old_evict_api_and_evictions_that_met_locked_nodes():
    cache = MiniCache()
    locked = cache.add(None, list(range(40)))
    cache.add(None, list(range(10)))
    cache.inc_lock_ref(locked)
    hooks = CacheHooks()
    hooks.install(cache)
    assert cache.evict(30) is None  # the host's return value is untouched
    c = hooks.counters()
    assert c.evictions == 1 and c.evicted_tokens == 10  # from evictable_size() before/after
    assert c.evict_short_locked == 1
    short = [e for e in hooks.events.read(0)[0] if e.kind == "evict_short"][0]
    assert (short.tokens, short.requested) == (10, 30) and "40 tokens were locked" in short.message
    cache.evict(num_tokens=5)  # nothing left to free: no eviction, still short and locked
    assert hooks.counters().evictions == 1 and hooks.counters().evict_short_locked == 2


def test_a_failing_lock_is_counted_and_the_host_exception_passes_through():
    class Boom(RuntimeError):
        pass

    cache = MiniCache()
    node = cache.add(None, [1])
    error = Boom("Failed to lock memory page during dynamic prefix eviction")

    def failing(self, n):
        raise error

    cache.inc_lock_ref = failing.__get__(cache)
    hooks = CacheHooks()
    hooks.install(cache)
    with pytest.raises(Boom) as caught:
        cache.inc_lock_ref(node)
    assert caught.value is error
    assert hooks.counters().lock_failures == 1
    event = hooks.events.read(0)[0][-1]
    assert event.kind == "lock_failure" and "Failed to lock memory page" in event.message
    hooks.uninstall()
    assert cache.__dict__["inc_lock_ref"].__func__ is failing  # the instance's own override is back


def test_an_evict_that_raises_is_counted_and_the_host_exception_passes_through():
    """The seed's RadixCacheError comes out of eviction itself: both wrapper shapes (SGLang >= 0.5's
    evict(params), whose fast path starts after an evict has reported what it freed, and the older
    evict(num_tokens)) count it as an evict_failure, with its event, and re-raise the host's own
    exception."""
    from radixtop.sim.radix import RadixCacheError

    error = RadixCacheError("Failed to lock memory page during dynamic prefix eviction")

    class FailingSim(RadixCache):
        fail = False

        def evict(self, params):  # exactly SGLang >= 0.5's shape
            if self.fail:
                raise error
            return super().evict(params)

    class FailingMini(MiniCache):
        fail = False

        def evict(self, num_tokens, evict_callback=None):  # the older shape
            if self.fail:
                raise error
            return super().evict(num_tokens, evict_callback)

    new = filled_sim_cache(n_prompts=4)
    new.__class__ = FailingSim
    old = FailingMini()
    old.add(None, list(range(10)))
    for cache, call in ((new, lambda c: c.evict(EvictParams(num_tokens=5))), (old, lambda c: c.evict(5))):
        hooks = CacheHooks()
        hooks.install(cache)
        call(cache)  # a good one first: the exact-shape wrapper's fast path from then on
        cache.fail = True
        with pytest.raises(RadixCacheError) as caught:
            call(cache)
        assert caught.value is error
        c = hooks.counters()
        assert (c.evict_calls, c.evict_failures, c.evictions, c.instrument_errors) == (2, 1, 1, 0)
        event = hooks.events.read(0)[0][-1]
        assert event.kind == "evict_failure" and event.message == f"RadixCacheError: {error}"
        cache.fail = False
        call(cache)  # counted again: the failure did not leave the hooks "inside an evict"
        assert hooks.counters().evict_calls == 3
        hooks.uninstall()


def test_counters_from_an_older_server_without_evict_failures_still_parse():
    doc = schema.Counters(evict_failures=3).to_dict()
    assert schema.Counters.from_dict(doc).evict_failures == 3
    del doc["evict_failures"]
    assert schema.Counters.from_dict(doc).evict_failures == 0
    del doc["lock_ops"]  # the others stay required
    with pytest.raises(ValueError):
        schema.Counters.from_dict(doc)


def test_repeated_instrument_errors_disable_the_hooks_and_restore_methods(caplog):
    class Broken(MiniCache):
        def evictable_size(self):
            raise KeyError("bookkeeping gone")

    cache = Broken()
    cache.add(None, [1, 2, 3])
    hooks = CacheHooks(max_errors=4)
    hooks.install(cache)
    with caplog.at_level(logging.WARNING, logger="radixtop.instrument"):
        for _ in range(3):
            assert cache.evict(1) is None  # the host never sees our failures
    assert hooks.state == "disabled"
    assert "evict" not in cache.__dict__
    kinds = [e.kind for e in hooks.events.read(0)[0]]
    assert kinds.count("instrument_error") == 4 and kinds[-1] == "hooks_disabled"
    assert hooks.counters().instrument_errors == 4
    assert any("disabled" in r.getMessage() for r in caplog.records)
    assert all(r.name == "radixtop.instrument" for r in caplog.records)
    assert not hooks.install(cache)


def test_around_hooks_fit_a_registry_that_patches_the_class_itself():
    # What SGLang's HookRegistry does for an AROUND hook on "module.Class.method".
    class Cache(MiniCache):
        pass

    hooks = CacheHooks(max_errors=1)
    originals = {}
    for name, around in hooks.around_hooks().items():
        original = getattr(Cache, name)
        originals[name] = original

        def wrapper(*args, _around=around, _original=original, **kwargs):
            return _around(_original, *args, **kwargs)

        setattr(Cache, name, wrapper)
    cache = Cache()
    node = cache.add(None, [1])
    cache.inc_lock_ref(node)
    cache.dec_lock_ref(node)
    cache.dec_lock_ref(node)
    assert hooks.state == "active"
    assert (hooks.counters().lock_ops, hooks.counters().negative_lock_ref) == (1, 1)
    hooks.disable("test")
    cache.inc_lock_ref(node)  # passes straight through once disabled
    assert hooks.counters().lock_ops == 1 and node.lock_ref == 0


def test_event_ring_is_bounded_incremental_and_counts_drops():
    ring = EventRing(capacity=5, clock=lambda: 1.0)
    for i in range(12):
        ring.push("evict", tokens=i)
    events, latest, dropped, more = ring.read(0, limit=3)
    assert latest == 12 and dropped == 7 and more
    assert [e.seq for e in events] == [8, 9, 10]
    events, latest, dropped, more = ring.read(10)
    assert [e.seq for e in events] == [11, 12] and dropped == 0 and not more
    assert ring.read(12) == ((), 12, 0, False)
    assert ring.read(99) == ((), 12, 0, False)
    assert ring.dropped_total == 7


# ---------------------------------------------------------------------------------------------
# The endpoint over real loopback HTTP


_HTTP = httpx.Client(timeout=10)  # one client: building its SSL context per request is slow here


def get(ep, path, **kwargs):
    return _HTTP.get(ep.url + path, **kwargs)


def test_endpoint_serves_snapshot_events_health_and_metrics(endpoint_factory):
    cache = filled_sim_cache()
    hooks = CacheHooks()
    hooks.install(cache)
    ep = endpoint_factory(rank=3, hooks=hooks, config=SnapshotConfig(max_nodes=50))
    assert ep.start() and ep.enabled
    assert get(ep, schema.SNAPSHOT_PATH).status_code == 503  # before the first safe point
    assert parse_health(get(ep, schema.HEALTH_PATH).content).status == "starting"

    node = insert(cache, list(range(1000, 1016)) + [7, 7])
    cache.inc_lock_ref(node)
    cache.dec_lock_ref(node)
    cache.dec_lock_ref(node)
    freed = cache.evict(EvictParams(num_tokens=3)).num_tokens_evicted
    assert ep.safe_point(cache)

    snap = parse_snapshot(get(ep, schema.SNAPSHOT_PATH).content)
    count, tokens, hist = direct_walk(cache)
    assert snap.rank == 3 and snap.instance == ep.instance and snap.seq == 1
    assert snap.evictable_tokens == cache.evictable_size() and snap.protected_tokens == cache.protected_size()
    assert snap.census.node_count == count and snap.census.lock_ref_histogram == hist
    assert snap.counters.negative_lock_ref == 1 and snap.counters.evicted_tokens == freed >= 3
    assert snap.hooks_state == "active" and snap.events_seq == 2

    page = parse_events(get(ep, schema.EVENTS_PATH, params={"since": 0}).content)
    assert [e.kind for e in page.events] == ["negative_lock_ref", "evict"]
    assert page.next_since == 2 and page.latest_seq == 2 and not page.more
    page = parse_events(get(ep, schema.EVENTS_PATH, params={"since": 1}).content)
    assert [e.seq for e in page.events] == [2]
    page = parse_events(get(ep, schema.EVENTS_PATH, params={"since": 2}).content)
    assert page.events == () and page.next_since == 2

    health = parse_health(get(ep, schema.HEALTH_PATH).content)
    assert health.status == "ok" and health.snapshots == 1 and health.max_budget == 50

    response = get(ep, schema.METRICS_PATH)
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    families = {f.name: f for f in text_string_to_metric_families(response.text)}
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
    assert samples[("radixtop_negative_lock_ref_total", (("rank", "3"),))] == 1
    assert samples[("radixtop_evicted_tokens_total", (("rank", "3"),))] == freed
    assert samples[("radixtop_evictable_tokens", (("rank", "3"),))] == cache.evictable_size()
    negative = sum(v for k, v in hist.items() if k < 0)
    assert negative >= 2  # the double unlock drove the whole path (leaf and shared prefix) below zero
    assert samples[("radixtop_lock_ref_nodes", (("lock_ref", "<0"), ("rank", "3")))] == negative
    assert families["radixtop_lock_ops"].type == "counter"
    assert families["radixtop_hooks_active"].type == "gauge"
    assert all(s.labels.get("rank") == "3" for f in families.values() for s in f.samples)


def test_budget_can_lower_but_never_raise_the_server_cap(endpoint_factory):
    cache = filled_sim_cache()
    ep = endpoint_factory(config=SnapshotConfig(max_nodes=8))
    ep.start()
    ep.safe_point(cache)
    full = parse_snapshot(get(ep, schema.SNAPSHOT_PATH).content)
    assert full.tree.walked_nodes == 8
    two = parse_snapshot(get(ep, schema.SNAPSHOT_PATH, params={"budget": 2}).content)
    assert two.tree.nodes == full.tree.nodes[:3]
    assert two.tree.cut_nodes == full.tree.cut_nodes + 6
    more = parse_snapshot(get(ep, schema.SNAPSHOT_PATH, params={"budget": 10_000}).content)
    assert more.tree.walked_nodes == 8
    bad = get(ep, schema.SNAPSHOT_PATH, params={"budget": "lots"})
    assert bad.status_code == 400 and "budget must be a whole number" in schema.parse_error(bad.content)
    assert get(ep, "/nope").status_code == 404
    assert _HTTP.post(ep.url + schema.SNAPSHOT_PATH).status_code == 405
    assert get(ep, schema.EVENTS_PATH, params={"since": "-1"}).status_code == 400


def test_safe_point_is_rate_limited_and_duty_capped(endpoint_factory):
    cache = filled_sim_cache()
    ep = endpoint_factory(min_interval_s=60.0)
    assert not ep.safe_point(cache)  # not serving: no work at all
    ep.start()
    assert ep.safe_point(cache)
    assert not ep.safe_point(cache)
    assert parse_health(get(ep, schema.HEALTH_PATH).content).safe_points == 3

    capped = endpoint_factory(min_interval_s=0.0, max_duty=1e-6)
    capped.start()
    assert capped.safe_point(cache)
    assert not capped.safe_point(cache)  # its own cost / max_duty is a long rest


def test_captures_follow_the_readers_and_a_reader_gets_a_fresh_one(endpoint_factory):
    """Capture on demand: no capture while nobody reads; a reader finding the published capture
    older than min_interval_s gets one taken at the scheduler's next safe point; a second reader
    within min_interval_s gets that same one."""
    cache = filled_sim_cache()
    ep = endpoint_factory(min_interval_s=0.5, max_duty=1.0)
    ep.start()
    stop = threading.Event()

    def scheduler() -> None:  # the scheduler's loop: a safe point every 5 ms
        for _ in range(2000):
            if stop.is_set():
                return
            ep.safe_point(cache)
            time.sleep(0.005)

    loop = threading.Thread(target=scheduler, daemon=True)
    loop.start()
    try:
        for _ in range(200):
            if ep._seq:
                break
            time.sleep(0.01)
        assert ep._seq == 1, "one capture at start, so health has something to show"
        time.sleep(0.8)  # past min_interval_s, nobody reading
        assert ep._seq == 1 and ep.health().snapshots == 1
        asked = time.monotonic()
        snap = parse_snapshot(get(ep, schema.SNAPSHOT_PATH).content)
        assert snap.seq == 2 and snap.monotonic >= asked, "taken for this reader, after it asked"
        again = parse_snapshot(get(ep, schema.SNAPSHOT_PATH).content)
        assert again.seq == 2, "young enough: served as it is"
        time.sleep(0.8)
        assert ep._seq == 2, "nobody read since: nothing captured"
    finally:
        stop.set()
        loop.join(timeout=10)


def test_every_metrics_scrape_is_true_when_scraped_whether_or_not_a_snapshot_was_asked_for(endpoint_factory):
    """Prometheus as the only reader: each scrape's gauges come from a capture taken for it, so the
    tree's node count and the pool's sizes are the cache's at that scrape, while the tree grows;
    a scheduler that stops answering makes a scrape wait fresh_wait_s at most, then it gets the
    figures it has."""
    cache = filled_sim_cache(n_prompts=3)
    ep = endpoint_factory(min_interval_s=0.0, max_duty=1.0, fresh_wait_s=2.0)
    ep.start()
    lock = threading.Lock()
    running = threading.Event()
    running.set()
    stop = threading.Event()

    def scheduler() -> None:  # the host's loop: a safe point each iteration, while it runs
        for _ in range(200_000):
            if stop.is_set():
                return
            if running.is_set():
                with lock:
                    ep.safe_point(cache)
            time.sleep(0.002)

    def gauge(text: str, name: str) -> float:
        match = re.search(rf'^{name}\{{rank="0"\}} (\S+)$', text, re.MULTILINE)
        assert match, text
        return float(match.group(1))

    thread = threading.Thread(target=scheduler, daemon=True)
    thread.start()
    try:
        for round_ in range(4):
            with lock:  # the tree changes between scrapes, between two safe points
                for i in range(25):
                    insert(cache, [7_000 + round_ * 100 + i, round_, i])
                count, _, _ = direct_walk(cache)
                evictable = cache.evictable_size()
            text = get(ep, schema.METRICS_PATH).text
            assert gauge(text, "radixtop_evictable_tokens") == evictable  # the first scrape after the change
            deadline = time.monotonic() + 10
            while gauge(text, "radixtop_tree_nodes") != count and time.monotonic() < deadline:
                text = get(ep, schema.METRICS_PATH).text  # the census may need a slice or two more
            assert gauge(text, "radixtop_tree_nodes") == count
        running.clear()  # a stuck scheduler: the scrape still answers, after fresh_wait_s at most
        time.sleep(0.05)
        started = time.monotonic()
        text = get(ep, schema.METRICS_PATH).text
        # waited, did not hang
        assert time.monotonic() - started < 2.0 + 8.0 and gauge(text, "radixtop_tree_nodes") == count
    finally:
        stop.set()
        thread.join(5)


def test_a_second_server_on_the_node_takes_the_next_free_port_of_the_window(endpoint_factory):
    """Two servers with the instrument on one node (one per GPU, say): the second one's rank 0
    finds base + 0 taken and serves on the next free port, where discovery still looks."""
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    try:
        base = squatter.getsockname()[1]
        first = endpoint_factory(port=None, base_port=base, rank=0)
        assert first.start() and base < first.port < base + INSTRUMENT_PORT_SPAN
        second = endpoint_factory(port=None, base_port=base, rank=0)
        assert second.start() and second.port not in (base, first.port) and second.port < base + INSTRUMENT_PORT_SPAN
        assert httpx.get(f"{second.url}{HEALTH_PATH}", timeout=5).json()["rank"] == 0
    finally:
        squatter.close()


def test_port_in_use_logs_one_line_and_the_host_carries_on(endpoint_factory, caplog):
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    try:
        port = squatter.getsockname()[1]
        ep = endpoint_factory(port=port)
        with caplog.at_level(logging.INFO, logger="radixtop.instrument"):
            assert ep.start() is False
        assert not ep.enabled and "in use" in ep.disabled_reason
        lines = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(lines) == 1 and "\n" not in lines[0].getMessage() and lines[0].name == "radixtop.instrument"
        assert ep.safe_point(filled_sim_cache()) is False
    finally:
        squatter.close()


def test_port_is_the_base_port_plus_the_rank(endpoint_factory):
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    free = probe.getsockname()[1]
    probe.close()
    ep = endpoint_factory(rank=2, base_port=free - 2, port=None)
    assert ep.requested_port == free
    if not ep.start():  # another process took the port in between: one retry on a fresh one
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
        probe.close()
        ep = endpoint_factory(rank=2, base_port=free - 2, port=None)
        assert ep.start(), ep.disabled_reason
    assert ep.port == free


def test_bearer_token_required_off_loopback_and_checked_when_set(endpoint_factory):
    refused = endpoint_factory(host="0.0.0.0")
    assert refused.start() is False and "bearer token" in refused.disabled_reason
    assert is_loopback("127.0.0.1") and is_loopback("::1") and not is_loopback("0.0.0.0")

    ep = endpoint_factory(token="s3cret")
    ep.start()
    assert get(ep, schema.HEALTH_PATH).status_code == 401
    assert get(ep, schema.HEALTH_PATH, headers={"Authorization": "Bearer nope"}).status_code == 401
    assert get(ep, schema.HEALTH_PATH, headers={"Authorization": "Bearer s3cret"}).status_code == 200


def test_concurrent_clients_while_the_scheduler_mutates_the_tree(endpoint_factory):
    cache = filled_sim_cache()
    hooks = CacheHooks()
    hooks.install(cache)
    ep = endpoint_factory(hooks=hooks, max_connections=64)
    ep.start()
    ep.safe_point(cache)
    stop = threading.Event()
    failures: list[str] = []

    def scheduler():
        rng = random.Random(1)
        while not stop.is_set():
            node = insert(cache, list(range(1000, 1016)) + [rng.randrange(200) for _ in range(4)])
            cache.inc_lock_ref(node)
            cache.dec_lock_ref(node)
            if cache.token_to_kv_pool_allocator.available_size() < 2000:
                cache.evict(EvictParams(num_tokens=500))
            ep.safe_point(cache)
            time.sleep(0.001)  # a scheduler iteration also waits on the GPU, releasing the GIL

    def client(i):
        with httpx.Client(timeout=10) as http:
            for _ in range(10):
                try:
                    parse_snapshot(http.get(ep.url + schema.SNAPSHOT_PATH).content)
                    parse_events(http.get(ep.url + schema.EVENTS_PATH).content)
                    assert "radixtop_lock_ops_total" in http.get(ep.url + schema.METRICS_PATH).text
                except Exception as exc:  # collected, asserted below
                    failures.append(f"{type(exc).__name__}: {exc}")

    sched = threading.Thread(target=scheduler)
    sched.start()
    clients = [threading.Thread(target=client, args=(i,)) for i in range(6)]
    for t in clients:
        t.start()
    for t in clients:
        t.join(60)
    stop.set()
    sched.join(10)
    assert failures == []
    assert hooks.counters().instrument_errors == 0 and ep.snapshot_errors == 0


def _hang_up_early(ep) -> None:
    """A request, then a reset (not a close) before any of the response has come."""
    s = socket.create_connection(("127.0.0.1", ep.port))
    s.sendall(f"GET {schema.SNAPSHOT_PATH} HTTP/1.0\r\nHost: x\r\n\r\n".encode())
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()


def _wait_for(predicate, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_clients_that_hang_up_before_their_answer_are_counted_with_one_log_line_per_30s(endpoint_factory, caplog):
    # No snapshot yet: each snapshot request waits fresh_wait_s for the scheduler before it
    # answers, so every client here has reset its connection before the server writes a byte.
    ep = endpoint_factory(fresh_wait_s=0.3)
    ep.start()
    with caplog.at_level(logging.INFO, logger="radixtop.instrument"):
        for _ in range(5):
            _hang_up_early(ep)
        _wait_for(lambda: ep.client_disconnects == 5, f"5 disconnects counted, got {ep.client_disconnects}")
        # One INFO line for the five (at most one per 30 s), the rest counted...
        lines = [r for r in caplog.records if "disconnected" in r.getMessage()]
        assert len(lines) == 1 and lines[0].levelno == logging.INFO, [r.getMessage() for r in caplog.records]
        assert "rank 0" in lines[0].getMessage() and "more since" not in lines[0].getMessage()
        health = parse_health(get(ep, schema.HEALTH_PATH).content)
        assert health.client_disconnects == 5
        assert re.search(
            r'^radixtop_client_disconnects_total\{rank="0"\} 5$', get(ep, schema.METRICS_PATH).text, re.MULTILINE
        )
        # ...and the next line, once the 30 s are up, says how many it left out.
        ep._disconnects._last_line -= 31
        _hang_up_early(ep)
        _wait_for(lambda: ep.client_disconnects == 6, "the sixth disconnect counted")
        lines = [r.getMessage() for r in caplog.records if "disconnected" in r.getMessage()]
        assert len(lines) == 2 and "(4 more since the last such line)" in lines[1], lines


def test_clients_that_vanish_mid_response_do_not_disturb_the_server(endpoint_factory, capfd):
    cache = MiniCache()
    for i in range(6000):
        cache.add(None, list(range(i % 50 + 1)))
    ep = endpoint_factory(config=SnapshotConfig(max_nodes=6000, max_scan=10_000))
    ep.start()
    ep.safe_point(cache)
    size = len(ep.latest()[1])
    assert size > 200_000  # bigger than the first socket buffers: the server is often still writing
    for _ in range(5):
        s = socket.create_connection(("127.0.0.1", ep.port))
        s.sendall(f"GET {schema.SNAPSHOT_PATH} HTTP/1.0\r\nHost: x\r\n\r\n".encode())
        s.recv(1024)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # reset, not close
        s.close()
    half = socket.create_connection(("127.0.0.1", ep.port))
    half.sendall(b"GET /radixtop/v1/sna")  # and one that never finishes its request
    ok = get(ep, schema.SNAPSHOT_PATH)
    assert ok.status_code == 200 and len(ok.content) == size
    half.close()
    time.sleep(0.2)
    assert "Traceback" not in capfd.readouterr().err


def test_more_clients_than_slots_get_503_one_log_line_and_a_count(endpoint_factory, caplog):
    ep = endpoint_factory(max_connections=1)
    ep.start()
    ep.safe_point(MiniCache())
    holder = socket.create_connection(("127.0.0.1", ep.port))  # takes the only slot, says nothing
    try:
        with caplog.at_level(logging.INFO, logger="radixtop.instrument"):
            for _ in range(3):
                assert get(ep, schema.HEALTH_PATH).status_code == 503
        lines = [r for r in caplog.records if "slots busy" in r.getMessage()]
        assert len(lines) == 1 and lines[0].levelno == logging.INFO, [r.getMessage() for r in caplog.records]
        assert "all 1 connection slots busy" in lines[0].getMessage()
        assert ep.clients_refused == 3
    finally:
        holder.close()
    # The slot comes back once the silent client leaves; health and /metrics show the count.
    _wait_for(lambda: get(ep, schema.HEALTH_PATH).status_code == 200, "the slot was not released")
    # One slot: the previous answer's thread may still hold it for a moment after the client has
    # read the answer, so each read waits for a 200.
    answers = {}

    def read(path: str) -> bool:
        answers[path] = get(ep, path)
        return answers[path].status_code == 200

    _wait_for(lambda: read(schema.HEALTH_PATH), "health not answered")
    refused = ep.clients_refused  # 3, and any the waits met before the slot came back
    health = parse_health(answers[schema.HEALTH_PATH].content)
    assert health.clients_refused == refused >= 3 and health.client_disconnects == 0
    _wait_for(lambda: read(schema.METRICS_PATH), "/metrics not answered")
    refused = ep.clients_refused
    metrics = answers[schema.METRICS_PATH].text
    assert re.search(rf'^radixtop_clients_refused_total\{{rank="0"\}} {refused}$', metrics, re.MULTILINE), metrics
    families = {f.name for f in text_string_to_metric_families(metrics)}
    assert {"radixtop_clients_refused", "radixtop_client_disconnects", "radixtop_safe_point_errors"} <= families


def test_safe_point_errors_reported_by_the_host_show_in_health_and_metrics(endpoint_factory):
    ep = endpoint_factory()
    ep.start()
    ep.safe_point(MiniCache())
    assert parse_health(get(ep, schema.HEALTH_PATH).content).status == "ok"
    ep.note_safe_point_error(2, RuntimeError("tree cache unreadable\nsecond line"))
    health = parse_health(get(ep, schema.HEALTH_PATH).content)
    assert health.status == "degraded" and health.safe_point_errors == 2
    assert health.last_error == "safe point: RuntimeError: tree cache unreadable"
    assert "2 safe point error(s)" in health.message and "tree cache unreadable" in health.message
    metrics = get(ep, schema.METRICS_PATH).text
    assert re.search(r'^radixtop_safe_point_errors_total\{rank="0"\} 2$', metrics, re.MULTILINE), metrics


def test_health_from_an_older_server_without_the_optional_fields_still_parses(endpoint_factory):
    ep = endpoint_factory()
    ep.start()
    ep.safe_point(MiniCache())
    d = json.loads(get(ep, schema.HEALTH_PATH).content)
    for key in ("safe_point_errors", "last_error", "client_disconnects", "clients_refused"):
        assert key in d
        del d[key]
    old = parse_health(json.dumps(d))
    assert (old.safe_point_errors, old.last_error, old.client_disconnects, old.clients_refused) == (0, "", 0, 0)


def test_instrumentation_wires_hooks_endpoint_and_safe_point_in_three_calls():
    cache = filled_sim_cache()
    inst = Instrumentation(cache, rank=1, port=0, min_interval_s=0.0)
    try:
        assert inst.start()
        port = inst.endpoint.port
        node = insert(cache, [3, 1, 4, 1, 5])
        cache.inc_lock_ref(node)
        assert inst.safe_point()
        snap = parse_snapshot(_HTTP.get(inst.endpoint.url + schema.SNAPSHOT_PATH).content)
        assert snap.rank == 1 and snap.counters.lock_ops == 1 and snap.protected_tokens == 5
    finally:
        inst.close()
    assert "inc_lock_ref" not in cache.__dict__ and not inst.endpoint.enabled
    with pytest.raises(httpx.TransportError):
        _HTTP.get(f"http://127.0.0.1:{port}{schema.HEALTH_PATH}", timeout=1)


def test_instance_ids_and_snapshot_seq_let_clients_detect_a_restart(endpoint_factory):
    cache = filled_sim_cache()
    a, b = endpoint_factory(), endpoint_factory()
    a.start(), b.start()
    a.safe_point(cache), b.safe_point(cache)
    sa = parse_snapshot(get(a, schema.SNAPSHOT_PATH).content)
    sb = parse_snapshot(get(b, schema.SNAPSHOT_PATH).content)
    assert sa.instance != sb.instance
    assert sa.census.digest == sb.census.digest  # same tree, same digest
    page = json.loads(get(a, schema.EVENTS_PATH, params={"since": 50}).content)
    assert page["next_since"] == 0  # the client was ahead: start over


# ---------------------------------------------------------------------------------------------
# Boundaries and bounds


def test_instrument_imports_only_the_standard_library_and_the_schema():
    import subprocess
    import sys

    code = (
        "import sys; before = set(sys.modules)\n"
        "import radixtop.instrument.endpoint, radixtop.instrument.hooks, radixtop.instrument.snapshot\n"
        "new = set(sys.modules) - before\n"
        "bad = sorted(m for m in new if m.split('.')[0] not in sys.stdlib_module_names"
        " and m.split('.')[0] != 'radixtop')\n"
        "ours = sorted(m for m in new if m.startswith('radixtop')"
        " and not m.startswith(('radixtop.instrument', 'radixtop.schema')) and m != 'radixtop')\n"
        "print(bad, ours)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[] []"


def test_wide_nodes_are_scanned_only_up_to_the_limit_and_the_rest_counted_as_cut():
    cache = MiniCache()
    for i in range(300):
        cache.add(None, [i] * (1 + i % 7))
    snap = TreeSnapshotter(SnapshotConfig(max_nodes=200, max_scan=50)).take(cache, force_census=True)
    assert snap.tree.walked_nodes == 50  # only the children it looked at could be taken
    assert snap.tree.cut_exact and snap.tree.cut_nodes == 250
    assert snap.tree.walked_tokens + snap.tree.cut_tokens == snap.census.total_tokens


def test_the_census_advances_a_slice_per_step_within_its_duty_and_does_not_stall_detail_snapshots(endpoint_factory):
    cache = MiniCache()
    for i in range(3000):
        cache.add(None, [i, i])
    ep = endpoint_factory(config=SnapshotConfig(max_nodes=10, census_duty=0.005, census_slice=200), max_duty=0.01)
    ep.start()
    ep._last_watch = time.monotonic()  # a client is reading: the census runs at its full duty
    started = time.monotonic()
    assert ep.safe_point(cache)
    # One slice, not the whole tree: the published census is the one in progress, a lower bound.
    assert ep._census_steps == 1
    partial = ep.latest()[0].census
    assert not partial.complete and 0 < partial.node_count <= 200 and partial.digest == ""
    step = ep._census_cost
    assert ep._census_next_at - started >= step / 0.005 - 0.01
    # The next detail snapshot waits for its own cost / (max_duty - census_duty), not the census's.
    assert ep._next_at - started <= ep._last_cost / 0.005 + 0.05
    # Stepping on, the census finishes with the whole tree's figures, assembled over many slices.
    for _ in range(200):
        ep._census_next_at = ep._next_at = 0.0
        ep.want_capture()  # a reader asked (captures are on demand)
        ep.safe_point(cache)
        census = ep.latest()[0].census
        if census.complete:
            break
    assert census.complete and census.node_count == 3000 and census.total_tokens == 6000
    assert census.lock_ref_histogram == {0: 3000}
    assert census.slices == ep._census_steps >= 3000 // 200  # a unit per node counted, at least
    assert census.age_s >= census.span_s > 0


def test_a_census_is_at_rest_until_the_hooks_counters_or_the_pool_move(endpoint_factory):
    """Census.at_rest: the tree's mutation counters (the hooks' lock, unlock and evict calls, the
    pool's sizes) unchanged from the census's first slice to the snapshot; it travels in the JSON."""
    cache = filled_sim_cache()
    hooks = CacheHooks()
    hooks.install(cache)
    ep = endpoint_factory(hooks=hooks, max_duty=1.0, config=SnapshotConfig(census_duty=1e-9))

    def snapshot_census():
        ep.want_capture()
        ep._next_at = 0.0
        assert ep.safe_point(cache)
        return parse_snapshot(ep.latest()[1]).census

    assert ep.start()
    assert ep._snapshotter.census() is None
    ep._snapshotter.finish_census(cache)
    census = snapshot_census()
    assert census.complete and census.at_rest is True
    node = max(cache.root_node.children.values(), key=lambda n: len(n.children))
    cache.inc_lock_ref(node)
    cache.dec_lock_ref(node)  # the same shape and sizes, but a request touched the tree
    moved = snapshot_census()
    assert moved.digest == census.digest and moved.at_rest is False
    ep._snapshotter.finish_census(cache)
    assert snapshot_census().at_rest is True, "a census begun after the move is at rest again"
    # Without hooks the pool's sizes tell: an insert moves the evictable tokens.
    shot = TreeSnapshotter()
    shot.finish_census(cache)
    assert shot.capture(cache).census.at_rest is True
    insert(cache, list(range(5000, 5010)))
    assert shot.capture(cache).census.at_rest is False
    # A cache with nothing to read: rest cannot be told.
    mini = MiniCache()
    mini.add(None, [1, 2])
    del mini.token_to_kv_pool_allocator
    mini.evictable_size = mini.protected_size = None
    bare = TreeSnapshotter()
    bare.finish_census(mini)
    assert bare.capture(mini).census.at_rest is None


def test_an_incremental_census_converges_to_a_direct_walk_of_the_sim_cache():
    cache = filled_sim_cache(n_prompts=300)
    for node in random.Random(3).sample(list(cache.iter_nodes()), 20):
        cache.inc_lock_ref(node)
    shot = TreeSnapshotter(SnapshotConfig(census_slice=16))
    steps = 0
    while shot.census() is None or not shot.census().complete:
        shot.census_step(cache)
        steps += 1
        assert steps < 10_000
    census = shot.census()
    whole = TreeSnapshotter().take(cache, force_census=True).census
    count, tokens, hist = direct_walk(cache)
    assert steps > 10 and census.slices == steps
    assert (census.node_count, census.total_tokens, census.lock_ref_histogram) == (count, tokens, hist)
    assert census.digest == whole.digest and whole.slices == 1
    # Its weights order the detail walk as a one-pause census's would.
    a = TreeSnapshotter(SnapshotConfig(max_nodes=30, census_slice=16))
    while a.census() is None or not a.census().complete:
        a.census_step(cache)
    b = TreeSnapshotter(SnapshotConfig(max_nodes=30))
    b.finish_census(cache)
    assert a.capture(cache).build().tree.nodes == b.capture(cache).build().tree.nodes


def test_nodes_evicted_or_split_mid_census_neither_crash_it_nor_count_twice():
    from radixtop.instrument.snapshot import CensusRun

    cache = filled_sim_cache(n_prompts=200)
    before, _, _ = direct_walk(cache)
    run = CensusRun(cache.root_node, max_nodes=10**6)

    class NoTwice(list):  # the census's queue: every node it counts is appended here once
        def append(self, node):
            assert all(node is not n for n in self), "a node counted twice"
            super().append(node)

    run.nodes = NoTwice(run.nodes)
    run.step(40)
    cache.evict(EvictParams(num_tokens=300))  # leaves go: some counted already, some not yet reached
    # An insert that splits nodes already counted (a shorter prefix of existing keys).
    insert(cache, list(range(1000, 1008)) + [999])
    run.step(40)
    cache.evict(EvictParams(num_tokens=200))
    while run.phase == 0:  # the walk phase, in small slices while the tree keeps moving
        run.step(25)
        insert(cache, [5000 + run.slices, 1])
    while not run.step(25):
        pass
    census = run.result.census
    after, _, _ = direct_walk(cache)
    assert census.complete and census.node_count == run.counted
    assert sum(census.lock_ref_histogram.values()) == census.node_count
    assert after - run.slices < census.node_count <= before + 1 + run.slices  # what was there when reached
    assert census.slices == run.slices > 5


def test_a_tree_reset_mid_census_starts_the_census_over_on_the_new_root():
    cache = MiniCache()
    for i in range(400):
        cache.add(None, [i, i, i])
    shot = TreeSnapshotter(SnapshotConfig(census_slice=50))
    for _ in range(3):
        shot.census_step(cache)
    assert not shot.census().complete and shot.census().node_count > 0
    cache.root_node = Node(lock_ref=1)  # flush_cache: a new, smaller tree
    for i in range(7):
        cache.add(None, [i])
    for _ in range(50):
        shot.census_step(cache)
        if shot.census() is not None and shot.census().complete:
            break
    census = shot.census()
    assert census.complete and census.node_count == 7 and census.total_tokens == 7


def test_serialising_happens_on_the_endpoint_thread_not_the_scheduler(endpoint_factory, monkeypatch):
    from radixtop.instrument import endpoint as endpoint_module
    from radixtop.instrument.snapshot import Capture

    threads: dict[str, set[int]] = {"build": set(), "to_json": set()}
    real_build, real_encode = Capture.build, endpoint_module.encode_snapshot

    def build(self):
        threads["build"].add(threading.get_ident())
        return real_build(self)

    def encode(snap):
        threads["to_json"].add(threading.get_ident())
        return real_encode(snap)

    monkeypatch.setattr(Capture, "build", build)
    monkeypatch.setattr(endpoint_module, "encode_snapshot", encode)
    cache = filled_sim_cache()
    ep = endpoint_factory()
    ep.start()
    scheduler = threading.get_ident()
    assert ep.safe_point(cache)
    assert threads == {"build": set(), "to_json": set()}  # the scheduler only captured
    with httpx.Client() as client:
        first = client.get(ep.url + schema.SNAPSHOT_PATH)
        second = client.get(ep.url + schema.SNAPSHOT_PATH)
    assert first.status_code == second.status_code == 200 and first.content == second.content
    snap = parse_snapshot(first.content)
    assert snap.tree.walked_nodes > 0 and snap.census is not None
    assert len(threads["build"]) == 1 and len(threads["to_json"]) == 1  # built once, for both clients
    assert scheduler not in threads["build"] | threads["to_json"]


def test_the_snapshot_json_encoded_in_pieces_is_the_same_bytes():
    from radixtop.instrument.endpoint import encode_snapshot

    cache = filled_sim_cache(n_prompts=300)
    for budget in (0, 10, 64, 65, 200, 10_000):
        snap = TreeSnapshotter(SnapshotConfig(max_nodes=budget)).take(cache, force_census=True)
        assert encode_snapshot(snap) == snap.to_json()
    assert snap.tree.walked_nodes > 200  # the last one came in several pieces
    unwalkable = TreeSnapshotter().take(type("NoTree", (), {})())
    assert unwalkable.tree is None and encode_snapshot(unwalkable) == unwalkable.to_json()


def test_capture_holds_raw_reads_and_build_does_the_checks():
    from radixtop.instrument.snapshot import walk_tree

    cache = MiniCache()
    node = cache.add(None, [1, 2, 3, 4, 5])
    node.hit_count = 2.5  # not an int: shown as null
    node.last_access_time = float("nan")
    node.id = "n1"
    bigram = cache.add(None, [(1, 2), (2, 3)])  # EAGLE's bigram keys: not token ids to show
    walk = walk_tree(cache.root_node, 10, {}, 3, 100)
    raw = {r[0]: r for r in walk.rows}
    assert list(raw["n1"][-1]) == [1, 2, 3]  # a copy of the first token ids, not yet checked
    assert raw["n1"][5] == 2.5
    shot = TreeSnapshotter(SnapshotConfig(head_tokens=3))
    rows = {r.tokens: r for r in shot.capture(cache).build().tree.nodes[1:]}
    assert (
        rows[5].id is None and rows[5].hit_count is None and rows[5].last_access is None and rows[5].head == (1, 2, 3)
    )
    assert rows[2].head == () and rows[2].id == bigram.id


def test_with_hints_a_scan_orders_by_them_and_reads_no_key_it_does_not_take():
    """A census's weight hints order the scanned children (locked first, then hinted by weight,
    then the rest by arrival) and an unhinted child's key is read only if the walk takes it."""
    from radixtop.instrument.snapshot import walk_tree

    reads = []

    class CountedNode(Node):
        @property
        def key(self):
            reads.append(self.id)
            return self._key

        @key.setter
        def key(self, value):
            self._key = value

    cache = MiniCache()
    kids = [CountedNode(cache.root_node, [i] * (i + 1)) for i in range(40)]
    kids[5].lock_ref = 1
    hints = {id(kids[7]): 900, id(kids[3]): 500, id(cache.root_node): 2000}
    walk = walk_tree(cache.root_node, 4, hints, 2, 100)
    taken = [r[0] for r in walk.rows[1:]]
    assert taken == [kids[5].id, kids[7].id, kids[3].id, kids[0].id]
    assert sorted(reads) == sorted(taken), "keys of children scanned but not taken were read"
    # Without hints (no census yet) the scan reads every child's key for its own length.
    reads.clear()
    walk = walk_tree(cache.root_node, 4, {}, 2, 100)
    assert [r[0] for r in walk.rows[1:]] == [kids[5].id, kids[39].id, kids[38].id, kids[37].id]
    assert len(reads) == 40 + 4


def test_nodes_that_are_not_tree_nodes_switch_off_the_path_check_quietly():
    class IdCache(MiniCache):  # like a TreeCore that hands out integer node ids
        def dec_lock_ref(self, node_id):
            return None

    cache = IdCache()
    hooks = CacheHooks()
    hooks.install(cache)
    for _ in range(50):
        cache.dec_lock_ref(17)
    assert hooks.counters().unlock_ops == 50
    assert hooks.counters().instrument_errors == 0 and hooks.state == "active"


def test_several_caches_in_one_process_count_into_their_own_hooks_until_the_last_leaves():
    gc.collect()  # caches other tests hooked and dropped unregister themselves
    originals = {name: inspect.unwrap(RadixCache.__dict__[name]) for name in HOOKED_METHODS}
    caches = [filled_sim_cache(seed=s) for s in range(3)]
    ranks = [CacheHooks() for _ in caches]
    for hooks, cache in zip(ranks, caches):
        assert hooks.install(cache)
    assert not CacheHooks().install(caches[0])  # one cache, one set of hooks
    nodes = [insert(cache, [77, i]) for i, cache in enumerate(caches)]
    for i, (cache, node) in enumerate(zip(caches, nodes)):
        for _ in range(i + 1):
            cache.inc_lock_ref(node)
    assert [h.counters().lock_ops for h in ranks] == [1, 2, 3]
    ranks[0].uninstall()
    caches[0].inc_lock_ref(nodes[0])  # no longer counted; the others still are
    caches[2].inc_lock_ref(nodes[2])
    assert [h.counters().lock_ops for h in ranks] == [1, 2, 4]
    assert RadixCache.__dict__["inc_lock_ref"] is not originals["inc_lock_ref"]
    ranks[1].uninstall()
    ranks[2].uninstall()
    assert all(RadixCache.__dict__[name] is originals[name] for name in HOOKED_METHODS)


def test_a_hooked_cache_that_is_dropped_unregisters_itself():
    gc.collect()
    originals = {name: inspect.unwrap(RadixCache.__dict__[name]) for name in HOOKED_METHODS}
    hooks = CacheHooks()
    cache = filled_sim_cache()
    hooks.install(cache)
    assert hooks.state == "active"
    del cache
    gc.collect()
    assert hooks.state == "off"
    assert all(RadixCache.__dict__[name] is originals[name] for name in HOOKED_METHODS)


def test_a_rust_core_too_big_to_walk_is_sizes_only_and_says_why(monkeypatch):
    """The Rust TreeCore's walk is one pause of the scheduler: past the cap, no walk at all."""
    from radixtop.instrument import slot_chains

    class RustUnifiedTreeCore:  # the shape snapshot.py looks for: a walk, no Python nodes
        walks = 0

        def walk_for_kv_canary(self, unlocked_only, swa_resident_only):
            RustUnifiedTreeCore.walks += 1
            raise AssertionError("walked a core over the cap")

    class UnifiedRadixCache:
        tree_core = RustUnifiedTreeCore()

        def evictable_size(self):
            return slot_chains.MAX_WALK_SLOTS

        def protected_size(self):
            return 1

    snap = TreeSnapshotter().take(UnifiedRadixCache())
    assert RustUnifiedTreeCore.walks == 0 and not snap.walkable and snap.tree is None
    assert (
        f"{slot_chains.MAX_WALK_SLOTS + 1:,} slots" in snap.reason
        and snap.evictable_tokens == slot_chains.MAX_WALK_SLOTS
    )


def test_an_endpoint_refused_for_want_of_a_token_says_to_set_the_token_not_the_port(caplog):
    from radixtop.instrument.config import ENV_PORT, ENV_TOKEN, InstrumentConfig
    from radixtop.instrument.sglang import attach

    with caplog.at_level(logging.ERROR, logger="radixtop.instrument"):
        assert attach(MiniCache(), rank=0, config=InstrumentConfig(host="0.0.0.0", base_port=0)) is None
    lines = [r.getMessage() for r in caplog.records if "not instrumented" in r.getMessage()]
    assert len(lines) == 1 and "bearer token" in lines[0], lines
    assert ENV_TOKEN in lines[0] and ENV_PORT not in lines[0]
