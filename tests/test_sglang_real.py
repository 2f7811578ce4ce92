"""radixtop's instrumentation against the real SGLang: sglang==0.5.23's own RadixCache and
UnifiedRadixCache (Python and Rust TreeCore) on a CPU torch, hooked by the same attach() and
safe point the plugin installs, read over real loopback HTTP and parsed with radixtop.schema,
and held against the cache's own evictable_size(), protected_size() and an independent walk of
its tree. Two tests start scheduler processes the way SGLang does (multiprocessing spawn, then
load_plugins()): one through the plugin entry point, one through radixtop.instrument.launcher.

The real-SGLang tests need the environment .ci/sglang-tests builds (requirements/sglang-cpu.txt);
elsewhere they skip, saying so. The tests of the glue that needs no sglang run everywhere.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import select
import socket
import subprocess
import sys
import threading
import time
import types
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from sglang_gate import HELPERS, why_not

from radixtop.instrument import launcher, plugin, slot_chains
from radixtop.instrument import sglang as glue
from radixtop.instrument.hooks import HOOKED_METHODS
from radixtop.instrument.sglang import (
    InstrumentConfig,
    SafePoints,
    attach,
    describe_cache,
)
from radixtop.schema import (
    DEFAULT_BASE_PORT,
    EVENTS_PATH,
    HEALTH_PATH,
    INSTRUMENT_PORT_SPAN,
    METRICS_PATH,
    SNAPSHOT_PATH,
    parse_events,
    parse_health,
    parse_snapshot,
)

REPO = Path(__file__).resolve().parents[1]
NO_SGLANG = why_not()
needs_sglang = pytest.mark.skipif(NO_SGLANG is not None, reason=NO_SGLANG or "")
if NO_SGLANG is None:
    import real_cache


CONFIG = InstrumentConfig(base_port=0, interval_s=0.05)  # any free port; snapshots as often as the duty cap allows


# ----------------------------------------------------------------------------------------------
# Helpers


def get(url: str, timeout: float = 10.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def settle(inst, since: float):
    """Iterate the 'scheduler' until a snapshot whose census was taken after `since`, then read
    that snapshot over HTTP. The first GET marks the endpoint as watched (2 snapshots/s)."""
    url = inst.endpoint.url + SNAPSHOT_PATH
    get(url)
    deadline = time.monotonic() + 15
    while True:
        inst.endpoint.want_capture()  # a reader's request, without blocking this 'scheduler' thread
        inst.safe_point()
        snap = inst.endpoint.latest()[0]
        if (
            snap is not None
            and snap.census is not None
            and snap.census.complete
            and snap.monotonic - snap.census.age_s >= since
        ):
            break
        assert time.monotonic() < deadline, "no fresh snapshot within 15 s"
        time.sleep(0.01)
    status, body = get(url)
    assert status == 200, body
    return parse_snapshot(body)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def assert_matches_cache(snap, cache, driver_tally=None) -> None:
    """The endpoint's figures are the cache's own, and a walk of the tree agrees with both."""
    figures = real_cache.walk(cache)
    alloc = cache.token_to_kv_pool_allocator
    assert (snap.evictable_tokens, snap.protected_tokens) == (cache.evictable_size(), cache.protected_size())
    assert (snap.evictable_tokens, snap.protected_tokens) == (figures.evictable, figures.protected)
    assert (snap.capacity_tokens, snap.available_tokens, snap.page_size) == (
        alloc.size, alloc.available_size(), cache.page_size
    )
    assert snap.walkable and snap.reason == ""
    census = snap.census
    assert census.complete and census.node_count == figures.nodes and census.total_tokens == figures.tokens
    assert census.lock_ref_histogram == figures.histogram
    tree = snap.tree
    assert tree.cut_nodes == 0 and tree.walked_nodes == figures.nodes  # small trees fit the budget
    rows = {(r.id, r.tokens, r.lock_ref, r.evicted) for r in tree.nodes[1:]}
    assert rows == figures.rows
    if driver_tally is not None:
        c = snap.counters
        t = driver_tally
        assert (c.lock_ops, c.unlock_ops) == (t.locks, t.unlocks)
        assert (c.evict_calls, c.evictions, c.evicted_tokens) == (t.evict_calls, t.evictions, t.evicted_tokens)
        assert c.instrument_errors == 0


@pytest.fixture
def closing():
    """Instrumentations made by a test, closed after it (endpoints stopped, hooks off)."""
    made = []
    yield made
    for inst in made:
        inst.close()


# ----------------------------------------------------------------------------------------------
# The real RadixCache


@needs_sglang
@pytest.mark.parametrize("page_size", [1, 4])
def test_radix_cache_endpoint_figures_match_the_cache_and_a_walk(page_size, closing):
    cache = real_cache.radix_cache(size=600, page_size=page_size)
    inst = attach(cache, rank=0, config=CONFIG)
    assert inst is not None
    closing.append(inst)
    driver = real_cache.Driver(cache, page_size=page_size, evict_with="evict").run(40)
    assert driver.tally.evictions > 5  # the pool is small: evictions under pressure happened
    snap = settle(inst, time.monotonic())
    assert snap.cache_class == "RadixCache" and snap.hooks_state == "active" and snap.rank == 0
    assert_matches_cache(snap, cache, driver.tally)
    # RadixCache's evict_for_alloc forwards to evict: counted once.
    driver.evict_with = "evict_for_alloc"
    driver.run(20)
    driver.finish_all()
    snap = settle(inst, time.monotonic())
    assert_matches_cache(snap, cache, driver.tally)
    assert snap.protected_tokens == 0 and set(snap.census.lock_ref_histogram) == {0}
    status, text = get(inst.endpoint.url + METRICS_PATH)
    assert status == 200
    assert f'radixtop_evicted_tokens_total{{rank="0"}} {driver.tally.evicted_tokens}' in text.decode()
    assert f'radixtop_lock_ops_total{{rank="0"}} {driver.tally.locks}' in text.decode()


@needs_sglang
@pytest.mark.parametrize("backend", ["radix", "unified-python"])
def test_an_incremental_census_converges_to_a_walk_of_the_real_tree_while_requests_run(backend):
    from radixtop.instrument.snapshot import SnapshotConfig, TreeSnapshotter

    cache = real_cache.radix_cache(size=4000) if backend == "radix" else real_cache.unified_cache(size=4000)
    driver = real_cache.Driver(cache, seed=3).run(60)
    shot = TreeSnapshotter(SnapshotConfig(census_slice=8))  # small slices: many safe points
    # While requests keep running between slices, the census finishes without error...
    for _ in range(2000):
        shot.census_step(cache)
        driver.request()
        if shot.census().complete:
            break
    moving = shot.census()
    assert moving.complete and moving.slices > 10 and moving.span_s > 0
    assert sum(moving.lock_ref_histogram.values()) == moving.node_count
    # ...and, once the tree rests, a census is exact: the walk's own figures.
    shot = TreeSnapshotter(SnapshotConfig(census_slice=8))
    steps = 0
    while shot.census() is None or not shot.census().complete:
        shot.census_step(cache)
        steps += 1
        assert steps < 5000
    census = shot.census()
    figures = real_cache.walk(cache)
    assert steps == census.slices > 10
    assert (census.node_count, census.total_tokens, census.lock_ref_histogram) == (
        figures.nodes, figures.tokens, figures.histogram
    )
    assert census.digest == TreeSnapshotter().take(cache, force_census=True).census.digest


@needs_sglang
def test_double_unlock_on_radix_cache_is_counted_and_reported(closing):
    cache = real_cache.radix_cache(size=600)
    inst = attach(cache, rank=3, config=CONFIG)
    closing.append(inst)
    driver = real_cache.Driver(cache).run(12)
    node, receipt = driver.running.pop(0)
    driver.unlock(node, receipt)
    driver.unlock(node, receipt)  # RadixCache never checks: lock_ref goes to -1 silently
    assert node.lock_ref == -1
    snap = settle(inst, time.monotonic())
    assert snap.rank == 3 and snap.counters.negative_lock_ref == 1
    assert snap.census.lock_ref_histogram.get(-1) == 1
    assert_matches_cache(snap, cache, driver.tally)  # the -1 node counts as evictable, as the cache counts it
    _, body = get(inst.endpoint.url + EVENTS_PATH + "?since=0")
    page = parse_events(body)
    negatives = [e for e in page.events if e.kind == "negative_lock_ref"]
    assert len(negatives) == 1 and negatives[0].node_id == node.id and negatives[0].lock_ref == -1
    assert "double unlock" in negatives[0].message
    _, text = get(inst.endpoint.url + METRICS_PATH)
    assert 'radixtop_negative_lock_ref_total{rank="3"} 1' in text.decode()
    assert 'radixtop_lock_ref_nodes{rank="3",lock_ref="<0"} 1' in text.decode()


@needs_sglang
def test_an_eviction_that_meets_locked_nodes_on_radix_cache_is_counted_as_evict_short_locked(closing):
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    cache = real_cache.radix_cache(size=600)
    inst = attach(cache, rank=0, config=CONFIG)
    closing.append(inst)
    driver = real_cache.Driver(cache).run(12)  # a window of running requests holds its nodes locked
    locked, evictable = cache.protected_size(), cache.evictable_size()
    assert locked > 0 and evictable > 0
    before = inst.hooks.evict_short_locked
    # Ask for every cached token: eviction frees the unlocked ones and stops at the locked ones.
    asked = locked + evictable
    freed = cache.evict(EvictParams(num_tokens=asked)).num_tokens_evicted
    assert freed == evictable < asked and cache.protected_size() == locked and cache.evictable_size() == 0
    assert inst.hooks.evict_short_locked == before + 1
    snap = settle(inst, time.monotonic())
    assert snap.counters.evict_short_locked == before + 1 and snap.protected_tokens == locked
    _, body = get(inst.endpoint.url + EVENTS_PATH + "?since=0")
    shorts = [e for e in parse_events(body).events if e.kind == "evict_short"]
    assert shorts[-1].tokens == freed and shorts[-1].requested == asked
    assert f"while {locked} tokens were locked" in shorts[-1].message
    _, text = get(inst.endpoint.url + METRICS_PATH)
    assert f'radixtop_evict_short_locked_total{{rank="0"}} {before + 1}' in text.decode()
    # With nothing locked, an eviction that comes up short met no locked node: not counted.
    driver.finish_all()
    assert cache.protected_size() == 0
    evictable = cache.evictable_size()
    assert cache.evict(EvictParams(num_tokens=evictable + 100)).num_tokens_evicted == evictable  # short by 100
    assert inst.hooks.evict_short_locked == before + 1


@needs_sglang
def test_an_evict_that_raises_inside_radix_cache_is_an_evict_failure_and_the_error_passes_through(closing):
    """The seed's failure surfaces from eviction itself. The narrowest seam that makes sglang's own
    RadixCache.evict raise: the KV allocator's free_segment, which it calls for the first leaf."""
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    cache = real_cache.radix_cache(size=600)
    inst = attach(cache, rank=1, config=CONFIG)
    closing.append(inst)
    driver = real_cache.Driver(cache).run(12)
    assert cache.evict(EvictParams(num_tokens=1)).num_tokens_evicted > 0  # the real path works
    allocator = cache.token_to_kv_pool_allocator
    error = RuntimeError("Failed to lock memory page during dynamic prefix eviction")

    def failing(*args, **kwargs):
        raise error

    allocator.free_segment = failing
    evictable = cache.evictable_size()
    with pytest.raises(RuntimeError) as caught:
        cache.evict(EvictParams(num_tokens=5))
    assert caught.value is error and cache.evictable_size() == evictable  # raised before any change
    del allocator.free_segment  # the class's own again: the cache serves on
    assert cache.evict(EvictParams(num_tokens=5)).num_tokens_evicted > 0
    snap = settle(inst, time.monotonic())
    assert snap.counters.evict_failures == 1
    assert snap.counters.evict_calls == driver.tally.evict_calls + 3  # the driver's, and these three
    assert_matches_cache(snap, cache)
    _, body = get(inst.endpoint.url + EVENTS_PATH + "?since=0")
    failures = [e for e in parse_events(body).events if e.kind == "evict_failure"]
    assert len(failures) == 1 and failures[0].message == f"RuntimeError: {error}"
    _, text = get(inst.endpoint.url + METRICS_PATH)
    assert 'radixtop_evict_failures_total{rank="1"} 1' in text.decode()


def flight_record_of(inst):
    """The rank's flight record, read back from disk as a bundle would."""
    from radixtop.instrument.flight import record_name
    from radixtop.schema import FlightRecord

    path = Path(inst.endpoint.flight_dir) / record_name(inst.endpoint.rank, os.getpid())
    return FlightRecord.from_dict(json.loads(path.read_bytes()))


def assert_record_is_the_cache_at_the_raise(record, figures, cache, tally) -> None:
    snap = record.snapshot
    assert (snap.evictable_tokens, snap.protected_tokens) == figures[:2]
    census = snap.census
    assert census.complete and (census.node_count, census.lock_ref_histogram) == figures[2:]
    c = snap.counters
    assert (c.lock_ops, c.unlock_ops) == (tally.locks, tally.unlocks)
    assert record.pid == os.getpid() and record.rank == snap.rank


@needs_sglang
def test_an_evict_that_raises_inside_radix_cache_leaves_a_flight_record_of_the_cache_at_that_moment(closing):
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    cache = real_cache.radix_cache(size=600)
    inst = attach(cache, rank=2, config=CONFIG)
    closing.append(inst)
    driver = real_cache.Driver(cache).run(12)  # some requests still running: locked nodes
    tree = real_cache.walk(cache)
    figures = (cache.evictable_size(), cache.protected_size(), tree.nodes, tree.histogram)
    assert figures[1] > 0 and len(tree.histogram) > 1
    error = RuntimeError("Failed to lock memory page during dynamic prefix eviction")

    def failing(*args, **kwargs):
        raise error

    cache.token_to_kv_pool_allocator.free_segment = failing
    with pytest.raises(RuntimeError) as caught:
        cache.evict(EvictParams(num_tokens=5))
    assert caught.value is error
    record = flight_record_of(inst)
    assert_record_is_the_cache_at_the_raise(record, figures, cache, driver.tally)
    assert [(t.kind, t.message) for t in record.triggers] == [("evict_failure", f"RuntimeError: {error}")]
    assert record.events[-1].kind == "evict_failure"


@needs_sglang
@pytest.mark.parametrize("backend", ["python", "rust"])
def test_a_double_unlock_inside_unified_cache_leaves_a_flight_record_of_the_cache_at_that_moment(closing, backend):
    cache = real_cache.unified_cache(size=600, backend=backend)
    inst = attach(cache, rank=0, config=CONFIG)
    closing.append(inst)
    driver = real_cache.Driver(cache).run(40)
    node, receipt = driver.running.pop(0)
    driver.unlock(node, receipt)
    since = time.monotonic()
    for _ in range(1000):  # the last safe point before the failure: the record's `before`
        inst.endpoint.want_capture()
        inst.safe_point()
        snap = inst.endpoint.latest()[0]
        if snap is not None and snap.monotonic >= since:
            break
        time.sleep(0.01)
    figures = (cache.evictable_size(), cache.protected_size())
    with pytest.raises(BaseException) as caught:  # the core refuses a second unlock of the same lock
        cache.dec_lock_ref(node, receipt.to_dec_params())
    record = flight_record_of(inst)
    snap = record.snapshot
    assert (snap.counters.lock_ops, snap.counters.unlock_ops) == (driver.tally.locks, driver.tally.unlocks + 1)
    assert record.triggers[0].kind == "unlock_failure" and type(caught.value).__name__ in record.triggers[0].message
    assert (record.before.evictable_tokens, record.before.protected_tokens) == figures
    if backend == "python":
        assert (snap.evictable_tokens, snap.protected_tokens) == figures
        tree = real_cache.walk(cache)
        assert snap.census.complete and (snap.census.node_count, snap.census.lock_ref_histogram) == (
            tree.nodes, tree.histogram
        )
    else:
        # The Rust core panicked: it cannot be read any more, and the record says so; the sizes
        # and the tree (rebuilt from its walk) are those of the last safe point (`before`).
        assert (snap.evictable_tokens, snap.protected_tokens) == (None, None)
        assert not snap.walkable and snap.census is None
        assert record.before.walkable and record.before.lock_detail == "locked-only"
        assert sum(r.tokens for r in record.before.tree.nodes[1:] if r.lock_ref) == figures[1]


# ----------------------------------------------------------------------------------------------
# UnifiedRadixCache (0.5.23's default) on both tree cores


@needs_sglang
def test_unified_cache_on_the_python_core_is_walked_and_counted(closing):
    cache = real_cache.unified_cache(size=600, backend="python")
    assert type(cache.tree_core).__name__ == "UnifiedTreeCore"
    assert describe_cache(cache).kind == "unified-python"
    inst = attach(cache, rank=0, config=CONFIG)
    closing.append(inst)
    driver = real_cache.Driver(cache).run(40)  # evicts through evict_for_alloc, as 0.5.23's allocator does
    assert driver.tally.evictions > 5
    snap = settle(inst, time.monotonic())
    assert snap.cache_class == "UnifiedRadixCache" and snap.walkable
    assert_matches_cache(snap, cache, driver.tally)
    # The Python core asserts on a double unlock: the host's own error passes through, counted.
    node, receipt = driver.running.pop(0)
    driver.unlock(node, receipt)
    with pytest.raises(AssertionError, match="lock_ref=0"):
        cache.dec_lock_ref(node, receipt.to_dec_params())
    snap = settle(inst, time.monotonic())
    assert snap.counters.unlock_failures == 1 and snap.counters.negative_lock_ref == 0
    _, body = get(inst.endpoint.url + EVENTS_PATH + "?since=0")
    failures = [e for e in parse_events(body).events if e.kind == "unlock_failure"]
    assert len(failures) == 1 and "AssertionError" in failures[0].message


@needs_sglang
def test_unified_cache_on_the_rust_core_is_rebuilt_from_its_walk_with_sizes_and_counters(closing, caplog):
    cache = real_cache.unified_cache(size=600, backend="rust")
    assert type(cache.tree_core).__name__ == "RustUnifiedTreeCore"
    info = describe_cache(cache)
    assert info.kind == "unified-rust" and info.walkable
    with caplog.at_level(logging.INFO, logger="radixtop.instrument"):
        inst = attach(cache, rank=0, config=CONFIG)
    closing.append(inst)
    assert any("KV-canary walk" in r.getMessage() for r in caplog.records)
    driver = real_cache.Driver(cache).run(40)
    get(inst.endpoint.url + SNAPSHOT_PATH)
    deadline = time.monotonic() + 15
    while not inst.safe_point():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    _, body = get(inst.endpoint.url + SNAPSHOT_PATH)
    snap = parse_snapshot(body)
    assert snap.walkable and snap.lock_detail == "locked-only" and "KV-canary walk" in snap.reason
    assert (snap.evictable_tokens, snap.protected_tokens) == (cache.evictable_size(), cache.protected_size())
    locked = sum(row.tokens for row in snap.tree.nodes[1:] if row.lock_ref)
    assert snap.tree.cut_nodes == 0 and locked == cache.protected_size()  # the rebuilt tree's locks are the core's
    assert snap.census.total_tokens == cache.evictable_size() + cache.protected_size()
    assert snap.available_tokens == cache.token_to_kv_pool_allocator.available_size()
    c = snap.counters
    assert (c.lock_ops, c.unlock_ops, c.evictions, c.evicted_tokens) == (
        driver.tally.locks, driver.tally.unlocks, driver.tally.evictions, driver.tally.evicted_tokens,
    )
    # A double unlock panics the Rust core, which then refuses every call: counted, and the
    # endpoint keeps serving what it can still read (the pool), saying why the tree is gone.
    node, receipt = driver.running.pop(0)
    driver.unlock(node, receipt)
    with pytest.raises(RuntimeError, match="panicked"):
        cache.dec_lock_ref(node, receipt.to_dec_params())
    time.sleep(0.6)
    get(inst.endpoint.url + SNAPSHOT_PATH)
    deadline = time.monotonic() + 15
    while not inst.safe_point():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    snap = parse_snapshot(get(inst.endpoint.url + SNAPSHOT_PATH)[1])
    assert snap.counters.unlock_failures == 1 and snap.evictable_tokens is None and snap.available_tokens is not None
    assert not snap.walkable and "walk failed" in snap.reason
    assert parse_health(get(inst.endpoint.url + HEALTH_PATH)[1]).status == "ok"


PRINT_TRIGGER = "[2026-12-05 10:00:00 TP0] Prefill out of memory. Try to lower your batch size."


def printed(cache, capfd):
    """The cache's own pretty_print (the Rust core prints from Rust, to fd 1), read back."""
    from radixtop.diagnosis.printed_tree import read_printed_trees

    capfd.readouterr()
    cache.pretty_print()
    out = capfd.readouterr().out
    (tree,) = read_printed_trees([PRINT_TRIGGER, *out.splitlines()])
    assert tree.skipped_rows == 0 and tree.trigger is not None, out[:2000]
    assert tree.inverted_locks == 0  # a healthy cache: every parent holds its children's locks
    return tree


@needs_sglang
@pytest.mark.parametrize("page_size", [1, 4])
def test_radix_caches_print_is_read_back_node_for_node(page_size, capfd):
    cache = real_cache.radix_cache(size=600, page_size=page_size)
    driver = real_cache.Driver(cache, page_size=page_size).run(40)
    assert driver.tally.evictions > 0 and driver.running  # split, evicted, and locked by running requests
    tree = printed(cache, capfd)
    figures = real_cache.walk(cache)
    assert tree.form == "radix-cache" and tree.complete and tree.total_tokens == cache.total_size() == tree.tokens
    assert len(tree.nodes) - 1 == figures.nodes and tree.tokens == figures.tokens
    assert tree.locked_tokens == cache.protected_size() > 0
    walked = []
    stack = list(cache.root_node.children.values())
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        walked.append((len(node.key), node.lock_ref, tuple(int(t) for t in node.key.token_ids[:10])))
    assert sorted((n.tokens, n.lock_ref, n.head) for n in tree.nodes[1:]) == sorted(walked)


@needs_sglang
def test_unified_trees_print_is_read_back_node_for_node_on_both_cores(capfd):
    trees = {}
    for backend in ("python", "rust"):
        cache = real_cache.unified_cache(size=600, backend=backend)
        real_cache.Driver(cache).run(40)
        tree = trees[backend] = printed(cache, capfd)
        assert tree.form == "unified" and tree.locked_tokens == cache.protected_size() > 0
        assert tree.tokens == cache.evictable_size() + cache.protected_size()
        if backend == "python":
            figures = real_cache.walk(cache)
            assert {(n.node_id, n.tokens, n.lock_ref) for n in tree.nodes[1:]} == {r[:3] for r in figures.rows}
    # the same requests on both cores: the same tree, as each printed it
    python, rust = ([(n.depth, n.tokens, n.lock_ref) for n in trees[b].nodes] for b in ("python", "rust"))
    assert sorted(python) == sorted(rust)


def canonical(rows) -> list[tuple[int, int, bool]]:
    """A tree as (depth in tokens, tokens, locked) of maximal unbranched runs of one lock state:
    what the Rust core's walk can show of any tree."""
    by_id = {i: r for i, r in enumerate(rows)}
    kids: dict[int, list[int]] = {}
    for i, r in enumerate(rows[1:], 1):
        kids.setdefault(r.parent, []).append(i)
    out = []
    stack = [(i, 0) for i in kids.get(0, [])]
    while stack:
        i, depth = stack.pop()
        tokens, locked = by_id[i].tokens, by_id[i].lock_ref > 0
        while len(kids.get(i, [])) == 1 and (by_id[kids[i][0]].lock_ref > 0) == locked:
            i = kids[i][0]
            tokens += by_id[i].tokens
        out.append((depth, tokens, locked))
        stack.extend((k, depth + tokens) for k in kids.get(i, []))
    return sorted(out)


@needs_sglang
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_rust_cores_rebuilt_tree_is_the_python_cores_after_the_same_operations(seed):
    """The same requests (splits, locks, evictions) on both tree cores: the tree rebuilt from the
    Rust core's walk has the Python core's structure, and its sizes are the core's own."""
    from radixtop.instrument.snapshot import SnapshotConfig, TreeSnapshotter

    trees = {}
    for backend in ("python", "rust"):
        cache = real_cache.unified_cache(size=500, backend=backend)
        driver = real_cache.Driver(cache, seed=seed).run(60)
        assert driver.tally.evictions > 0 and driver.running  # evicted, and some requests hold locks
        snap = TreeSnapshotter(SnapshotConfig(max_nodes=10_000)).take(cache, force_census=True)
        assert snap.walkable and snap.tree.cut_nodes == 0
        assert (snap.evictable_tokens, snap.protected_tokens) == (cache.evictable_size(), cache.protected_size())
        locked = sum(row.tokens for row in snap.tree.nodes[1:] if row.lock_ref > 0)
        assert locked == cache.protected_size()
        trees[backend] = canonical(snap.tree.nodes)
    assert trees["rust"] == trees["python"]


def walk(*chains: tuple[int, list[int], bool]) -> slot_chains.SlotWalk:
    """A Rust-core walk from (prev slot of the first, slots, locked) runs, positions following prev."""
    slots, positions, prevs, unlocked = [], [], [], []
    position = {-1: -1}
    for before, run, locked in chains:
        for i, slot in enumerate(run):
            prev = before if i == 0 else run[i - 1]
            slots.append(slot)
            prevs.append(prev)
            position[slot] = position[prev] + 1
            positions.append(position[slot])
            if not locked:
                unlocked.append(slot)
    return slot_chains.SlotWalk(slots, positions, prevs, unlocked)


@needs_sglang
def test_the_rust_cores_rows_carry_a_held_paths_ids_and_nothing_else() -> None:
    # A 6-slot locked trunk, a 4-slot locked branch held by a request, a 3-slot unlocked branch.
    rebuilt = walk((-1, [10, 11, 12, 13, 14, 15], True), (15, [20, 21, 22, 23], True), (15, [30, 31, 32], False))
    ids = list(range(700, 710))
    held = [slot_chains.HeldPath(23, lambda p: ids[p] if p < len(ids) else None),
            slot_chains.HeldPath(999, None)]  # a slot the walk does not have
    tree, census, ends = slot_chains.build(rebuilt, 64, held, head_n=4)
    assert ends == (20, None) and census.node_count == 3
    heads = {row.id: row.head for row in tree.nodes}
    assert heads == {None: (), 10: (700, 701, 702, 703), 20: (706, 707, 708, 709), 30: ()}
    # A path ending inside a chain gives its ids only up to its end.
    tree, _, ends = slot_chains.build(rebuilt, 64, [slot_chains.HeldPath(12, lambda p: ids[p])], head_n=32)
    assert ends == (10,) and {row.id: row.head for row in tree.nodes}[10] == (700, 701, 702)


@needs_sglang
def test_the_rebuild_does_not_lean_on_the_walks_row_order_and_refuses_ragged_rows() -> None:
    """The Rust core happens to hand its rows over parents first; the chains come out the same from
    the rows in any order (in torch, as the core gives them), and rows of different lengths are refused."""
    import torch

    chains = ((-1, [10, 11, 12, 13, 14, 15], True), (15, [20, 21, 22, 23], True), (15, [30, 31, 32], False),
              (31, [40], False), (-1, [50, 51], False))
    given = walk(*chains)
    rows = (torch.tensor(list(reversed(v))) for v in (given.slots, given.positions, given.prevs))
    flipped = slot_chains.SlotWalk(*rows, torch.tensor(given.unlocked))
    ids = list(range(800, 810))
    held = [slot_chains.HeldPath(22, lambda p: ids[p] if p < len(ids) else None)]
    first, census, ends = slot_chains.build(given, 64, held, head_n=4)
    second, census2, ends2 = slot_chains.build(flipped, 64, held, head_n=4)
    assert first == second and census.digest == census2.digest and ends == ends2 == (20,)
    # the unlocked branch splits where another run hangs off it: 30-31, then 32 and 40 apart
    assert census.node_count == 6 and census.total_tokens == 16
    assert {(row.id, row.tokens, row.lock_ref) for row in first.nodes[1:]} == {
        (10, 6, 1), (20, 4, 1), (30, 2, 0), (32, 1, 0), (40, 1, 0), (50, 2, 0)}
    # The digest is the shape's: other slots for the same chains keep it, a lock or a length changes it.
    moved = walk(*((b + 100 if b >= 0 else -1, [s + 100 for s in run], locked) for b, run, locked in chains))
    unlocked = walk(*chains[:2], (15, [30, 31, 32], True), *chains[3:])
    longer = walk(*chains[:4], (-1, [50, 51, 52], False))
    digests = [slot_chains.build(w, 64)[1].digest for w in (given, moved, unlocked, longer)]
    assert digests[0] == digests[1] and len(set(digests)) == 3, digests
    with pytest.raises(ValueError, match="differ in length"):
        slot_chains.build(slot_chains.SlotWalk([1, 2], [0, 1], [-1], []), 64)



# ----------------------------------------------------------------------------------------------
# The scheduler's safe point, in this process


class SchedulerStandIn:
    """The attributes the safe point reads from SGLang's Scheduler (ranks as SGLang < 0.5.23 kept them)."""

    def __init__(self, cache, tp_rank=0, pp_rank=0, tp_size=1) -> None:
        self.tree_cache = cache
        self.tp_rank, self.pp_rank, self.tp_size = tp_rank, pp_rank, tp_size
        self.calls = 0

    def process_input_requests(self, recv_reqs):
        self.calls += 1
        return len(recv_reqs)


@needs_sglang
def test_safe_point_hook_attaches_to_the_schedulers_cache_and_follows_a_replacement():
    points = SafePoints(config_source=lambda: InstrumentConfig(base_port=free_port() - 3, interval_s=0.05))
    cache = real_cache.radix_cache(size=600)
    scheduler = SchedulerStandIn(cache, tp_rank=1, pp_rank=1, tp_size=2)  # rank 1 + 2 * 1 = 3
    assert glue.scheduler_rank(scheduler) == 3
    try:
        points.at(scheduler)
        (inst,) = points.instruments()
        assert inst.endpoint.rank == 3 and inst.endpoint.port == inst.endpoint.requested_port
        driver = real_cache.Driver(cache).run(10)
        snap = settle(inst, time.monotonic())
        assert snap.counters.lock_ops == driver.tally.locks and snap.rank == 3
        # The scheduler swaps its cache: the safe point follows and counts on the new one.
        other = real_cache.radix_cache(size=600)
        scheduler.tree_cache = other
        points.at(scheduler)
        driver2 = real_cache.Driver(other, seed=5).run(5)
        assert inst.cache is other
        snap = settle(inst, time.monotonic())
        assert snap.counters.lock_ops == driver.tally.locks + driver2.tally.locks
        assert (snap.evictable_tokens, snap.protected_tokens) == (other.evictable_size(), other.protected_size())
    finally:
        points.close()


@needs_sglang
def test_the_registry_shaped_around_hook_runs_the_safe_point_then_the_scheduler(monkeypatch):
    # The hook uses the process's SAFE_POINTS, configured from the environment: any free port
    # here, not the default 39100 (which a real server on this machine may hold).
    for name in (glue.ENV_HOST, glue.ENV_TOKEN, glue.ENV_BUDGET, glue.ENV_INTERVAL):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(glue.ENV_PORT, "0")
    cache = real_cache.radix_cache(size=600)
    scheduler = SchedulerStandIn(cache)
    original = SchedulerStandIn.process_input_requests
    glue.SAFE_POINTS.close()
    try:
        assert glue.around_process_input_requests(original, scheduler, [1, 2]) == 2
        (inst,) = glue.SAFE_POINTS.instruments()
        assert scheduler.calls == 1 and inst.cache is cache
        assert inst.endpoint.requested_port == 0 and inst.endpoint.port not in (None, 0, DEFAULT_BASE_PORT)
        assert parse_health(get(inst.endpoint.url + HEALTH_PATH)[1]).status == "ok"
    finally:
        glue.SAFE_POINTS.close()


# ----------------------------------------------------------------------------------------------
# Bad input: the server keeps serving


@needs_sglang
def test_a_base_port_another_server_holds_moves_the_endpoint_to_the_next_free_port(closing):
    """Two servers on a node with the plugin and the default base: the second's rank 0 serves on
    the next free port of the window discovery searches, not nowhere."""
    cache = real_cache.radix_cache(size=600)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        inst = attach(cache, rank=0, config=InstrumentConfig(base_port=port))
        assert inst is not None
        closing.append(inst)
        assert port < inst.endpoint.port < port + INSTRUMENT_PORT_SPAN
        assert parse_health(get(inst.endpoint.url + HEALTH_PATH)[1]).rank == 0


@needs_sglang
def test_port_in_use_is_one_log_line_and_leaves_the_cache_untouched(caplog):
    cache = real_cache.radix_cache(size=600)
    originals = {name: type(cache).__dict__.get(name) for name in HOOKED_METHODS}
    with socket.socket() as first:
        first.bind(("127.0.0.1", 0))
        port = first.getsockname()[1]
    held = []
    try:  # the whole window taken (by us, or already by someone else)
        for p in range(port, min(port + INSTRUMENT_PORT_SPAN, 65536)):
            s = socket.socket()
            # As the endpoint binds (SO_REUSEADDR): a port a server left in TIME_WAIT after a long
            # run is one it could take, so it is held here too.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", p))
                s.listen()
                held.append(s)
            except OSError:
                s.close()
        with caplog.at_level(logging.INFO, logger="radixtop.instrument"):
            inst = attach(cache, rank=0, config=InstrumentConfig(base_port=port))
    finally:
        for s in held:
            s.close()
    if inst is not None:
        inst.close()  # its hooks off the class again, or every later test would see them
    assert inst is None
    assert any("in use" in r.getMessage() for r in caplog.records)
    assert {name: type(cache).__dict__.get(name) for name in HOOKED_METHODS} == originals  # hooks off again
    real_cache.Driver(cache).run(10)  # and the cache serves on


@needs_sglang
def test_token_is_required_off_loopback(caplog):
    cache = real_cache.radix_cache(size=600)
    with caplog.at_level(logging.INFO, logger="radixtop.instrument"):
        assert attach(cache, config=InstrumentConfig(host="0.0.0.0")) is None
    assert any("without a bearer token" in r.getMessage() for r in caplog.records)


@needs_sglang
def test_concurrent_clients_and_one_that_hangs_up_mid_request(closing):
    cache = real_cache.radix_cache(size=2000)
    inst = attach(cache, rank=0, config=CONFIG)
    closing.append(inst)
    driver = real_cache.Driver(cache)
    driver.run(10)
    settle(inst, time.monotonic())
    base = inst.endpoint.url
    problems: list[str] = []
    stop = time.monotonic() + 3

    def client(path: str) -> None:
        while time.monotonic() < stop:
            status, body = get(base + path)
            if status == 503:  # more clients than the endpoint's connection slots: told to retry
                continue
            try:
                assert status == 200
                {
                    SNAPSHOT_PATH: parse_snapshot, EVENTS_PATH + "?since=0": parse_events, HEALTH_PATH: parse_health
                }.get(path, bytes)(body)
            except Exception as exc:
                problems.append(f"{path}: {status} {exc}")

    def hang_up() -> None:
        while time.monotonic() < stop:
            with socket.create_connection(("127.0.0.1", inst.endpoint.port)) as s:
                s.sendall(b"GET " + SNAPSHOT_PATH.encode() + b" HTTP/1.0\r\n\r\n")
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST on close

    paths = [SNAPSHOT_PATH, EVENTS_PATH + "?since=0", HEALTH_PATH, METRICS_PATH] * 2
    threads = [threading.Thread(target=client, args=(p,)) for p in paths] + [threading.Thread(target=hang_up)]
    for t in threads:
        t.start()
    while time.monotonic() < stop:  # the scheduler keeps working and snapshotting meanwhile
        driver.request()
        inst.safe_point()
    for t in threads:
        t.join(20)
    assert not problems, problems[:3]
    snap = settle(inst, time.monotonic())
    assert_matches_cache(snap, cache, driver.tally)


@needs_sglang
def test_hooks_take_themselves_off_after_repeated_failures_and_the_cache_serves_on(closing):
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams
    from sglang.srt.mem_cache.radix_cache import RadixCache

    class BrokenSizes(RadixCache):
        def protected_size(self):  # read by the evict hook after every short evict: radixtop's own error each time
            raise RuntimeError("sizes unavailable")

    params = real_cache.CacheInitParams(
        disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=real_cache.allocator(600), page_size=1
    )
    cache = BrokenSizes(params)
    originals = {name: RadixCache.__dict__[name] for name in HOOKED_METHODS}
    inst = attach(cache, rank=0, config=CONFIG)
    closing.append(inst)
    assert all(RadixCache.__dict__[name] is not originals[name] for name in HOOKED_METHODS)
    for _ in range(25):
        assert cache.evict(EvictParams(num_tokens=1)).num_tokens_evicted == 0  # SGLang's evict runs every time
    assert inst.hooks.state == "disabled" and "instrument errors" in inst.hooks.disabled_reason
    assert {name: RadixCache.__dict__[name] for name in HOOKED_METHODS} == originals
    get(inst.endpoint.url + SNAPSHOT_PATH)
    assert inst.safe_point()
    snap = parse_snapshot(get(inst.endpoint.url + SNAPSHOT_PATH)[1])
    assert snap.hooks_state == "disabled" and snap.counters.instrument_errors == 20 and snap.protected_tokens is None
    health = parse_health(get(inst.endpoint.url + HEALTH_PATH)[1])
    assert health.status == "degraded" and "hooks disabled" in health.message


# ----------------------------------------------------------------------------------------------
# Scheduler processes started as SGLang starts them


def _read_child(proc_conn, proc, timeout: float) -> dict:
    assert proc_conn.poll(timeout), "the scheduler child reported nothing"
    report = proc_conn.recv()
    assert "error" not in report, report.get("error")
    return report


def _check_child_endpoint(report: dict, port: int, rank: int) -> None:
    assert report["port"] == port  # base port + rank
    snap = parse_snapshot(get(f"http://127.0.0.1:{port}{SNAPSHOT_PATH}")[1])
    f = report["figures"]
    assert snap.rank == rank and snap.cache_class == "RadixCache" and snap.hooks_state == "active"
    assert (snap.evictable_tokens, snap.protected_tokens) == (f["evictable_size"], f["protected_size"])
    assert (snap.evictable_tokens, snap.protected_tokens) == (f["evictable"], f["protected"])
    assert (snap.available_tokens, snap.capacity_tokens) == (f["available"], f["capacity"])
    assert snap.census.node_count == f["nodes"] and snap.census.total_tokens == f["tokens"]
    assert {str(k): v for k, v in snap.census.lock_ref_histogram.items()} == f["histogram"]
    t = report["tally"]
    assert (snap.counters.lock_ops, snap.counters.unlock_ops) == (t["locks"], t["unlocks"])
    assert (snap.counters.evictions, snap.counters.evicted_tokens) == (t["evictions"], t["evicted_tokens"])
    assert snap.counters.negative_lock_ref == 1
    _, body = get(f"http://127.0.0.1:{port}{EVENTS_PATH}?since=0")
    assert [e.node_id for e in parse_events(body).events if e.kind == "negative_lock_ref"] == [
        report["double_unlocked_node"]
    ]


@needs_sglang
def test_plugin_route_loads_in_a_spawned_scheduler_process(monkeypatch):
    base = free_port() - 1
    monkeypatch.setenv("RADIXTOP_INSTRUMENT", "1")
    monkeypatch.setenv("RADIXTOP_INSTRUMENT_PORT", str(base))
    monkeypatch.delenv("SGLANG_PLUGINS", raising=False)
    import scheduler_child

    ctx = multiprocessing.get_context("spawn")  # as SGLang starts its scheduler processes
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=scheduler_child.run, args=(child, "plugin", 1))
    proc.start()
    try:
        report = _read_child(parent, proc, 240)
        # load_plugins() found radixtop's entry point and HookRegistry applied its AROUND hook.
        assert Path(report["radixtop_file"]).resolve().is_relative_to(REPO), report["radixtop_file"]
        assert not report["watched_before_plugins"] and report["instrumented"] is False
        assert report["registry_hooks"] == 1 and report["registry_applied"]
        assert any("instrumentation registered" in line for line in report["logs"])
        assert any("rank 1 instrumented: RadixCache (radix)" in line for line in report["logs"])
        _check_child_endpoint(report, base + 1, rank=1)
    finally:
        parent.send("stop")
        proc.join(30)
        if proc.is_alive():
            proc.kill()


@needs_sglang
def test_launcher_route_instruments_spawned_schedulers_without_the_plugin(tmp_path):
    base = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RADIXTOP_", "SGLANG_PLUGINS"))}
    env["RADIXTOP_INSTRUMENT_PORT"] = str(base)
    env["PYTHONPATH"] = os.pathsep.join([str(HELPERS), str(REPO)])  # this checkout's radixtop, whatever is installed
    proc = subprocess.Popen(
        [sys.executable, "-m", "radixtop.instrument.launcher", "--module", "launch_target", "0"],
        cwd=tmp_path, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 240)
        assert ready, "the launched server printed nothing in 240 s"
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        report = json.loads(line)
        assert "error" not in report, report["error"]
        assert Path(report["radixtop_file"]).resolve().is_relative_to(REPO), report["radixtop_file"]
        assert report["launcher_env"]["RADIXTOP_INSTRUMENT"] == "1"
        assert report["launcher_env"]["PYTHONPATH"].split(os.pathsep)[0] == launcher.BOOTSTRAP_DIR
        # The bootstrap's watch wrapped the scheduler as its module loaded; the plugin stood aside.
        assert report["watched_before_plugins"] and report["instrumented"]
        assert report["registry_hooks"] == 0
        assert any("plugin route skipped" in line for line in report["logs"])
        _check_child_endpoint(report, base, rank=0)
    finally:
        proc.stdin.close()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


# ----------------------------------------------------------------------------------------------
# The glue that needs no sglang (runs everywhere)


def test_config_comes_from_the_environment_and_bad_values_are_one_line_each(caplog):
    env = {
        "RADIXTOP_INSTRUMENT_PORT": "41000",
        "RADIXTOP_INSTRUMENT_BUDGET": "64",
        "RADIXTOP_INSTRUMENT_INTERVAL": "0.25",
        "RADIXTOP_INSTRUMENT_HOST": "::1",
        "RADIXTOP_INSTRUMENT_TOKEN": "s3cret",
    }
    cfg = InstrumentConfig.from_env(env)
    assert (cfg.base_port, cfg.budget, cfg.interval_s, cfg.host, cfg.token) == (41000, 64, 0.25, "::1", "s3cret")
    assert (
        cfg.endpoint_ports() == {"base_port": 41000} and InstrumentConfig(base_port=0).endpoint_ports() == {"port": 0}
    )
    with caplog.at_level(logging.WARNING, logger="radixtop.instrument"):
        bad = InstrumentConfig.from_env({"RADIXTOP_INSTRUMENT_PORT": "http", "RADIXTOP_INSTRUMENT_BUDGET": "999999999"})
    assert bad == InstrumentConfig()
    assert len(caplog.records) == 2 and "RADIXTOP_INSTRUMENT_PORT='http'" in caplog.records[0].getMessage()
    assert glue.enabled({"RADIXTOP_INSTRUMENT": "1"}) and not glue.enabled({"RADIXTOP_INSTRUMENT": "true"})


def _python(code: str, env_extra: dict[str, str], pythonpath: str = "") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RADIXTOP_")}
    env.update(env_extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, str(REPO)) if p)
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=False
    )


def test_register_costs_nothing_unless_switched_on():
    code = (
        "import sys\n"
        "from radixtop.instrument.plugin import register\n"
        "register()\n"
        "print(sorted(m for m in sys.modules if m.startswith(('radixtop', 'sglang'))))\n"
    )
    done = _python(code, {})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['radixtop', 'radixtop.instrument', 'radixtop.instrument.plugin']"
    assert plugin.register() is None


def test_register_outside_a_scheduler_process_imports_nothing_and_registers_nothing():
    code = (
        "import logging, sys\n"
        "logging.basicConfig(level=logging.DEBUG, format='%(message)s')\n"
        "from radixtop.instrument.plugin import register\n"
        "register()\n"
        "print('scheduler imported:', 'sglang.srt.managers.scheduler' in sys.modules)\n"
    )
    done = _python(code, {"RADIXTOP_INSTRUMENT": "1"})
    assert done.returncode == 0, done.stderr
    assert "scheduler imported: False" in done.stdout
    assert "no SGLang scheduler in process" in done.stderr


def test_launcher_builds_the_servers_command_line_and_environment():
    assert launcher.command(["--model-path", "m", "--port", "30000"]) == [
        sys.executable, "-m", "sglang.launch_server", "--model-path", "m", "--port", "30000",
    ]
    assert launcher.command(["--module", "my.server", "--", "--help"]) == [sys.executable, "-m", "my.server", "--help"]
    assert launcher.command(["--module=my.server"]) == [sys.executable, "-m", "my.server"]
    with pytest.raises(SystemExit, match="needs a module name"):
        launcher.command(["--module", "--tp", "2"])
    env = launcher.child_environment(
        {"PYTHONPATH": f"/a{os.pathsep}{launcher.BOOTSTRAP_DIR}", "RADIXTOP_INSTRUMENT": "0"}
    )
    assert env["RADIXTOP_INSTRUMENT"] == "1"
    assert env["PYTHONPATH"].split(os.pathsep) == [launcher.BOOTSTRAP_DIR, "/a"]
    assert (Path(launcher.BOOTSTRAP_DIR) / "sitecustomize.py").is_file()


def test_bootstrap_runs_the_sitecustomize_it_shadows_and_arms_the_watch(tmp_path):
    (tmp_path / "sitecustomize.py").write_text("import builtins\nbuiltins.SHADOWED_RAN = True\n")
    code = (
        "import builtins, sys; "
        "print(getattr(builtins, 'SHADOWED_RAN', False), type(sys.meta_path[0]).__name__ == '_SchedulerWatch')"
    )
    path = os.pathsep.join([launcher.BOOTSTRAP_DIR, str(tmp_path)])
    on = _python(code, {"RADIXTOP_INSTRUMENT": "1"}, pythonpath=path)
    assert on.returncode == 0, on.stderr
    assert on.stdout.strip() == "True True"
    off = _python(code, {}, pythonpath=path)
    assert off.stdout.strip() == "True False"  # still chained, nothing armed


def test_a_cache_radixtop_does_not_know_is_one_log_line_and_served_as_sizes(caplog, closing):
    class Mystery:  # no tree, no lock/evict methods: still some sizes
        token_to_kv_pool_allocator = None

        def evictable_size(self):
            return 7

        def protected_size(self):
            return 0

    info = describe_cache(Mystery())
    assert info.kind == "unknown" and not info.walkable and info.hooked_methods == ()
    with caplog.at_level(logging.INFO, logger="radixtop.instrument"):
        inst = attach(Mystery(), rank=0, config=CONFIG)
    closing.append(inst)
    assert any("unknown cache class Mystery" in r.getMessage() for r in caplog.records)
    get(inst.endpoint.url + SNAPSHOT_PATH)
    assert inst.safe_point()
    snap = parse_snapshot(get(inst.endpoint.url + SNAPSHOT_PATH)[1])
    assert not snap.walkable and snap.evictable_tokens == 7 and snap.hooks_state == "off"


def test_safe_point_errors_show_on_the_endpoint_until_it_switches_itself_off():
    class Sizes:  # an unknown cache with sizes: enough to attach an endpoint
        token_to_kv_pool_allocator = None

        def evictable_size(self):
            return 7

        def protected_size(self):
            return 0

    class BreaksLater:
        tp_rank = 0

        def __init__(self) -> None:
            self.reads = 0
            self.cache = Sizes()

        @property
        def tree_cache(self):  # read twice on the first visit (attach, then the safe point)
            self.reads += 1
            if self.reads > 2:
                raise RuntimeError("tree cache unreadable")
            return self.cache

    points = SafePoints(config_source=lambda: CONFIG)
    scheduler = BreaksLater()
    try:
        points.at(scheduler)
        (inst,) = points.instruments()
        url = inst.endpoint.url
        assert parse_health(get(url + HEALTH_PATH)[1]).status == "ok"
        for _ in range(5):
            points.at(scheduler)
        health = parse_health(get(url + HEALTH_PATH)[1])
        assert health.status == "degraded" and health.safe_point_errors == 5
        assert health.last_error == "safe point: RuntimeError: tree cache unreadable"
        assert "5 safe point error(s)" in health.message
        assert 'radixtop_safe_point_errors_total{rank="0"} 5' in get(url + METRICS_PATH)[1].decode()
        for _ in range(glue.MAX_SAFE_POINT_ERRORS):
            points.at(scheduler)
        assert points.disabled and not inst.endpoint.enabled and points.instruments() == []
        with pytest.raises(urllib.error.URLError):
            urllib.request.urlopen(url + HEALTH_PATH, timeout=5)
    finally:
        points.close()


def test_a_sglang_without_the_plugin_registry_is_one_log_line_naming_the_launcher(monkeypatch, caplog):
    scheduler_module = types.ModuleType(glue.SCHEDULER_MODULE)

    class Scheduler:
        def process_input_requests(self, recv_reqs):
            return recv_reqs

    scheduler_module.Scheduler = Scheduler
    monkeypatch.setitem(sys.modules, glue.SCHEDULER_MODULE, scheduler_module)  # a scheduler process
    monkeypatch.setitem(sys.modules, "sglang.srt.plugins.hook_registry", None)  # an SGLang before 0.5.12
    monkeypatch.setenv("RADIXTOP_INSTRUMENT", "1")
    with caplog.at_level(logging.DEBUG, logger="radixtop.instrument"):
        assert plugin._register() is False
    (line,) = [r for r in caplog.records if r.name == "radixtop.instrument"]
    assert line.levelno == logging.ERROR and "\n" not in line.getMessage()
    assert "no plugin hook registry" in line.getMessage()
    assert "python -m radixtop.instrument.launcher <sglang.launch_server args>" in line.getMessage()
    caplog.clear()
    plugin.register()  # the entry point itself: the same line, nothing raised, nothing wrapped
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == [line.getMessage()]
    assert not glue.is_instrumented(Scheduler.process_input_requests)


def test_safe_point_failures_are_counted_then_it_switches_itself_off(caplog):
    class Flaky:
        tp_rank = 0

        @property
        def tree_cache(self):
            raise RuntimeError("tree cache unreadable")

    points = SafePoints(config_source=lambda: CONFIG)
    scheduler = Flaky()
    with caplog.at_level(logging.WARNING, logger="radixtop.instrument"):
        for _ in range(glue.MAX_SAFE_POINT_ERRORS + 5):
            points.at(scheduler)  # never raises into the scheduler
    assert points.errors == glue.MAX_SAFE_POINT_ERRORS and points.disabled
    messages = [r.getMessage() for r in caplog.records]
    assert sum("safe point error #" in m for m in messages) == 3  # the first few, not every one
    assert any("switched off, the server keeps serving" in m for m in messages)
