"""The sim's RadixCache and KV pool: SGLang's semantics, checked by properties and by cases."""

from __future__ import annotations

import heapq
import itertools
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from radixtop.sim.pool import TokenToKVPoolAllocator
from radixtop.sim.radix import (
    CacheInitParams,
    EvictParams,
    EvictResult,
    InsertParams,
    MatchPrefixParams,
    RadixCache,
    RadixKey,
    TreeLock,
    TreeNode,
    get_child_key,
)


def make(size: int = 64, page_size: int = 1, policy: str = "lru", clock=None) -> RadixCache:
    pool = TokenToKVPoolAllocator(size, page_size)
    return RadixCache(
        CacheInitParams(
            token_to_kv_pool_allocator=pool, page_size=page_size, eviction_policy=policy, clock=clock
        )
    )


def ticking_clock():
    counter = itertools.count(1)
    return lambda: float(next(counter))


class Req:
    """The minimal request the cache's checkpoint / cache_finished_req need."""

    extra_key = None

    def __init__(self, tokens: list[int]) -> None:
        self.fill_ids = tokens
        self.kv_indices: list[int] = []
        self.cache_protected_len = 0
        self.last_node: TreeNode | None = None
        self.lock: TreeLock | None = None


def run_request(cache: RadixCache, tokens: list[int]) -> Req | None:
    """What the scheduler does for one request: match, lock, allocate the rest, then finish."""
    pool = cache.token_to_kv_pool_allocator
    ps = cache.page_size
    req = Req(tokens)
    match = cache.match_prefix(MatchPrefixParams(key=RadixKey(tokens[: len(tokens) - 1])))
    m = len(match.device_indices)
    req.kv_indices = list(match.device_indices)
    req.cache_protected_len = m
    req.last_node = match.last_device_node
    req.lock = cache.lock(match.last_device_node)
    pages = -(-len(tokens) // ps) - m // ps
    if pool.available_size() < pages * ps:
        cache.evict(EvictParams(num_tokens=pages * ps - pool.available_size()))
    got = pool.alloc_pages(pages)
    if got is None:
        cache.unlock(req.lock)
        return None
    req.kv_indices.extend(pool.page_slots(got)[: len(tokens) - m])
    cache.cache_finished_req(req)
    return req


def path_nodes(node: TreeNode, root: TreeNode) -> list[TreeNode]:
    out = []
    while node is not root:
        out.append(node)
        node = node.parent
    return out


class RadixMachine(RuleBasedStateMachine):
    """Random requests, locks, unlocks and evictions; the accounting must always add up."""

    @initialize(page_size=st.sampled_from([1, 2, 4]))
    def setup(self, page_size: int) -> None:
        self.cache = make(size=48, page_size=page_size, clock=ticking_clock())
        self.pool = self.cache.token_to_kv_pool_allocator
        self.held: list[TreeLock] = []

    tokens = st.lists(st.integers(0, 3), min_size=1, max_size=14)

    @rule(tokens=tokens)
    def finish_request(self, tokens: list[int]) -> None:
        req = run_request(self.cache, tokens)
        if req is None:
            return
        # Roundtrip: what a request inserted matches back, whole pages, with its own slots.
        aligned = len(tokens) // self.cache.page_size * self.cache.page_size
        match = self.cache.match_prefix(MatchPrefixParams(key=RadixKey(tokens)))
        assert len(match.device_indices) == aligned
        assert match.device_indices == req.kv_indices[:aligned]

    @rule(tokens=tokens)
    def lock_prefix(self, tokens: list[int]) -> None:
        match = self.cache.match_prefix(MatchPrefixParams(key=RadixKey(tokens)))
        assert len(match.device_indices) % self.cache.page_size == 0
        assert len(match.device_indices) <= len(tokens)
        if match.last_device_node is not self.cache.root_node:
            self.held.append(self.cache.lock(match.last_device_node))

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def unlock_one(self, data) -> None:
        lock = self.held.pop(data.draw(st.integers(0, len(self.held) - 1)))
        self.cache.unlock(lock)

    @rule(num_tokens=st.integers(0, 60))
    def evict(self, num_tokens: int) -> None:
        locked = {
            id(n): (n, list(n.value))
            for lock in self.held
            for n in path_nodes(lock.node, self.cache.root_node)
        }
        before = self.pool.available_size()
        result = self.cache.evict(EvictParams(num_tokens=num_tokens))
        assert self.pool.available_size() - before == result.num_tokens_evicted
        free_slots = set(self.pool.page_slots(self.pool.free_pages))
        for node, value in locked.values():
            assert not node.evicted, f"evict freed locked node {node.id}"
            assert not free_slots & set(value), f"slots of locked node {node.id} went back to the pool"

    @precondition(lambda self: not self.held)
    @rule()
    def reset(self) -> None:
        self.cache.reset()
        self.pool.clear()

    @invariant()
    def pool_accounting(self) -> None:
        c = self.cache
        assert self.pool.available_size() + c.evictable_size() + c.protected_size() == self.pool.size
        assert c.total_size() == c.evictable_size() + c.protected_size()

    @invariant()
    def tree_shape(self) -> None:
        c = self.cache
        protected = evictable = 0
        for node in c.iter_nodes():
            assert node.lock_ref >= 0
            assert len(node.key) % c.page_size == 0 and len(node.key) == len(node.value)
            assert node.parent.children[get_child_key(node.key, c.page_size)] is node
            if node.lock_ref > 0:
                protected += len(node.key)
            else:
                evictable += len(node.key)
        assert (protected, evictable) == (c.protected_size(), c.evictable_size())
        # Every slot is either free or in the tree, never both, never twice.
        in_tree = c.all_values_flatten()
        free = self.pool.page_slots(self.pool.free_pages)
        assert len(set(in_tree)) == len(in_tree)
        assert not set(in_tree) & set(free)


RadixMachine.TestCase.settings = settings(
    max_examples=35, stateful_step_count=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestRadixMachine = RadixMachine.TestCase


@settings(max_examples=50, deadline=None)
@given(
    page_size=st.sampled_from([1, 2, 4, 8]),
    seqs=st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=20), min_size=1, max_size=6),
    probe=st.lists(st.integers(0, 2), max_size=20),
)
def test_match_is_page_aligned_and_a_real_prefix(page_size, seqs, probe):
    cache = make(size=4096, page_size=page_size)
    for seq in seqs:
        cache.insert(InsertParams(key=RadixKey(seq)))
    match = cache.match_prefix(MatchPrefixParams(key=RadixKey(probe)))
    n = len(match.device_indices)
    assert n % page_size == 0
    # Inserted without values, the tree stores the token ids themselves (SGLang's debug fallback).
    assert match.device_indices == probe[:n]
    # n is exactly the longest shared prefix with any inserted sequence, in whole pages.
    best = 0
    for s in seqs:
        k = 0
        while k < min(len(s), len(probe)) and s[k] == probe[k]:
            k += 1
        best = max(best, k // page_size * page_size)
    assert n == best


def test_page_aligned_insert_and_match():
    cache = make(page_size=4)
    result = cache.insert(InsertParams(key=RadixKey(list(range(10))), value=list(range(100, 110))))
    assert result.prefix_len == 0
    assert cache.evictable_size() == 8  # the partial last page is not cached
    assert len(cache.match_prefix(MatchPrefixParams(key=RadixKey(list(range(7))))).device_indices) == 4
    match = cache.match_prefix(MatchPrefixParams(key=RadixKey(list(range(10)))))
    assert match.device_indices == list(range(100, 108))
    assert match.device_prefix_len == 8
    child = next(iter(cache.root_node.children))
    assert child == (0, 1, 2, 3)  # children keyed by the first page, as SGLang's get_child_key


def test_split_keeps_lock_and_values():
    cache = make()
    cache.insert(InsertParams(key=RadixKey([1, 2, 3, 4]), value=[11, 12, 13, 14]))
    node = cache.match_prefix(MatchPrefixParams(key=RadixKey([1, 2, 3, 4]))).last_device_node
    cache.inc_lock_ref(node)
    match = cache.match_prefix(MatchPrefixParams(key=RadixKey([1, 2, 9])))
    upper = match.last_device_node
    assert upper.key.token_ids == [1, 2] and upper.value == [11, 12]
    assert upper.lock_ref == 1 and node.parent is upper and node.value == [13, 14]
    assert cache.protected_size() == 4 and cache.evictable_size() == 0


def test_lock_ref_walks_to_root_and_moves_sizes():
    cache = make()
    cache.insert(InsertParams(key=RadixKey([1, 2, 3]), value=[1, 2, 3]))
    cache.insert(InsertParams(key=RadixKey([1, 2, 4, 5]), value=[1, 2, 7, 8]))
    leaf = cache.match_prefix(MatchPrefixParams(key=RadixKey([1, 2, 4, 5]))).last_device_node
    assert cache.inc_lock_ref(leaf).delta == -4
    assert [n.lock_ref for n in path_nodes(leaf, cache.root_node)] == [1, 1]
    assert cache.protected_size() == 4 and cache.evictable_size() == 1
    assert cache.dec_lock_ref(leaf).delta == 4
    assert cache.protected_size() == 0 and cache.evictable_size() == 5


def test_double_unlock_goes_negative_silently_and_the_node_becomes_evictable():
    cache = make()
    cache.insert(InsertParams(key=RadixKey([1, 2, 3]), value=[1, 2, 3]))
    node = cache.match_prefix(MatchPrefixParams(key=RadixKey([1, 2, 3]))).last_device_node
    cache.inc_lock_ref(node)
    cache.dec_lock_ref(node)
    cache.dec_lock_ref(node)  # legacy SGLang: no check, no error
    assert node.lock_ref == -1
    cache.inc_lock_ref(node)  # a later holder brings it to 0: "locked", yet evictable
    assert node.lock_ref == 0
    assert cache.evict(EvictParams(num_tokens=3)).num_tokens_evicted == 3
    assert node.evicted


def test_evict_is_lru_over_unlocked_leaves_and_climbs_to_parents():
    cache = make(clock=ticking_clock())
    for seq in ([1, 1], [2, 2], [3, 3]):
        cache.insert(InsertParams(key=RadixKey(seq), value=seq))
    cache.match_prefix(MatchPrefixParams(key=RadixKey([1, 1])))  # touch: 1 is now the newest
    cache.evict(EvictParams(num_tokens=2))
    assert sorted(cache.root_node.children) == [1, 3]
    # A parent whose children all went is pushed back and evicted in the same call.
    cache.reset()
    cache.insert(InsertParams(key=RadixKey([5, 6]), value=[5, 6]))
    cache.insert(InsertParams(key=RadixKey([5, 7]), value=[5, 7]))
    assert cache.evict(EvictParams(num_tokens=3)).num_tokens_evicted == 3
    assert cache.total_size() == 0


@pytest.mark.parametrize(
    ("policy", "survivor"),
    [("lru", [2, 2]), ("mru", [1, 1]), ("fifo", [3, 3]), ("filo", [1, 1]), ("lfu", [2, 2])],
)
def test_eviction_policies(policy, survivor):
    cache = make(policy=policy, clock=ticking_clock())
    for seq in ([1, 1], [2, 2], [3, 3]):
        cache.insert(InsertParams(key=RadixKey(seq), value=seq))
    cache.insert(InsertParams(key=RadixKey([2, 2]), value=[2, 2]))  # 2 gets a second hit
    cache.evict(EvictParams(num_tokens=4))
    # Access order 1, 3, 2 (re-inserting 2 touched it); creation order 1, 2, 3; 2 has two hits.
    assert [n.key.token_ids for n in cache.iter_nodes()] == [survivor]


def test_unknown_policy_is_a_clear_error():
    with pytest.raises(ValueError, match="Unknown eviction policy: nope"):
        make(policy="nope")


def test_legacy_call_forms_are_accepted():
    cache = make()
    assert cache.insert(RadixKey([4, 5, 6]), [40, 50, 60]).prefix_len == 0
    assert cache.match_prefix(RadixKey([4, 5])).device_indices == [40, 50]
    assert cache.match_prefix([4, 5, 6]).device_indices == [40, 50, 60]
    assert cache.evict(3).num_tokens_evicted == 3


def test_disabled_cache_matches_and_keeps_nothing():
    pool = TokenToKVPoolAllocator(32)
    cache = RadixCache(CacheInitParams(disable=True, token_to_kv_pool_allocator=pool))
    assert cache.insert(InsertParams(key=RadixKey([1, 2]), value=[1, 2])).prefix_len == 0
    assert cache.match_prefix(MatchPrefixParams(key=RadixKey([1, 2]))).device_indices == []
    req = run_request(cache, [1, 2, 3])
    assert req is not None
    assert pool.available_size() == pool.size and cache.total_size() == 0


def test_checkpoint_frees_duplicates_and_relocks():
    cache = make(size=32, page_size=2)
    pool = cache.token_to_kv_pool_allocator
    first = run_request(cache, [1, 2, 3, 4, 5])
    assert first is not None and cache.evictable_size() == 4
    # A second request that computed the same pages itself (no match) gives its copies back.
    req = Req([1, 2, 3, 4, 9, 9])
    req.last_node = cache.root_node
    req.lock = cache.lock(cache.root_node)
    req.kv_indices = pool.page_slots(pool.alloc_pages(3))
    own = list(req.kv_indices)
    cache.checkpoint(req, up_to=6)
    assert req.kv_indices[:4] == first.kv_indices[:4]  # now points at the tree's pages
    assert req.kv_indices[4:] == own[4:]
    assert req.cache_protected_len == 6 and req.last_node.lock_ref == 1
    assert pool.available_size() + cache.evictable_size() + cache.protected_size() == pool.size
    cache.cache_finished_req(req)
    assert cache.protected_size() == 0
    assert pool.available_size() + cache.evictable_size() == pool.size


def test_node_ids_count_per_cache_so_replicated_ranks_agree():
    a, b = make(), make()
    for cache in (a, b):
        cache.insert(InsertParams(key=RadixKey([1, 2, 3]), value=[1, 2, 3]))
        cache.match_prefix(MatchPrefixParams(key=RadixKey([1, 9])))
    assert [(n.id, n.key.token_ids) for n in a.iter_nodes()] == [
        (n.id, n.key.token_ids) for n in b.iter_nodes()
    ]
    assert a.root_node.id == 0


def test_pool_pages_and_sglang_style_free():
    pool = TokenToKVPoolAllocator(20, page_size=4)
    assert pool.size == 20 and pool.available_size() == 20
    slots = pool.alloc(8)
    assert slots == [4, 5, 6, 7, 8, 9, 10, 11]  # page 0 is SGLang's reserved padding page
    with pytest.raises(ValueError, match="multiple of page_size"):
        pool.alloc(3)
    pool.free([5])  # freeing any slot of a page frees the page
    assert pool.available_size() == 16
    assert pool.alloc(4) == [4, 5, 6, 7]  # most recently freed first
    assert pool.alloc(40) is None
    pool.free([4])
    pool.free([4])  # like SGLang: no double-free check, the page is listed twice
    assert pool.available_size() == 20


def test_pool_contents_survive_free_like_gpu_memory():
    pool = TokenToKVPoolAllocator(8)
    slots = pool.alloc(2)
    pool.write(slots, [77, 78], first_position=5)
    pool.free(slots)
    pool.clear()
    assert pool.read(slots[1]) == (78, 6)
    assert pool.page_of(slots[0]) in pool.written_pages


class OrderEveryLeafCache(RadixCache):
    """SGLang's own evict: every unlocked leaf put in a heap on every call, and the parents that
    call leaves unlocked and childless pushed as it goes. The cache keeps its heap across calls
    instead; both must take the same leaves in the same order."""

    def evict(self, params: EvictParams | int) -> EvictResult:
        num_tokens = params.num_tokens if isinstance(params, EvictParams) else int(params)
        heap = [(self._priority_of(n), n.id, n) for n in self.evictable_leaves]
        heapq.heapify(heap)
        num_evicted = 0
        while num_evicted < num_tokens and heap:
            _, _, x = heapq.heappop(heap)
            num_evicted += len(x.value or ())
            self._delete_leaf(x)
            parent = x.parent
            assert parent is not None
            if len(parent.children) == 0 and parent.lock_ref == 0 and parent is not self.root_node:
                heapq.heappush(heap, (self._priority_of(parent), parent.id, parent))
        return EvictResult(num_tokens_evicted=num_evicted)


def tree_state(cache: RadixCache) -> list[tuple]:
    return sorted(
        (n.id, tuple(n.key.token_ids), n.lock_ref, n.parent.id if n.parent else None, n.hit_count)
        for n in cache.iter_nodes()
    ) + [("sizes", cache.evictable_size(), cache.protected_size(), tuple(sorted(n.id for n in cache.evictable_leaves)))]


@pytest.mark.parametrize("policy", ["lru", "lfu", "fifo", "mru", "filo", "priority"])
@pytest.mark.parametrize("page_size", [1, 2])
def test_the_kept_leaf_heap_evicts_what_ordering_every_leaf_evicts(policy: str, page_size: int) -> None:
    for seed in range(12):
        rng = random.Random(seed)
        params = dict(page_size=page_size, eviction_policy=policy)
        caches = [cls(CacheInitParams(**params, clock=ticking_clock())) for cls in (RadixCache, OrderEveryLeafCache)]
        locks: list[list[TreeLock]] = [[], []]
        for _ in range(300):
            op = rng.choice(["insert", "insert", "match", "lock", "unlock", "unlock-twice", "evict"])
            tokens = [rng.randrange(3) for _ in range(rng.randrange(1, 13))]
            amount = rng.randrange(1, 12)
            which = rng.randrange(1 << 30)
            priority = rng.randrange(4)
            for cache, held in zip(caches, locks):
                if op == "insert":
                    cache.insert(InsertParams(key=RadixKey(tokens), priority=priority))
                elif op == "match":
                    cache.match_prefix(MatchPrefixParams(key=RadixKey(tokens)))
                elif op == "lock":
                    node = cache.match_prefix(MatchPrefixParams(key=RadixKey(tokens))).last_device_node
                    held.append(cache.lock(node))
                elif op.startswith("unlock") and held:
                    lock = held.pop(which % len(held))
                    if lock.node.value is not None:  # the node a lock names can be evicted once unlocked
                        cache.unlock(lock)
                        if op == "unlock-twice":  # a double unlock leaves lock_ref below zero
                            cache.unlock(lock)
                elif op == "evict":
                    cache.evict(EvictParams(num_tokens=amount))
            assert tree_state(caches[0]) == tree_state(caches[1])


@pytest.mark.parametrize("policy", ["lru", "mru", "lfu"])
def test_an_access_time_set_from_outside_to_nan_still_lets_eviction_end(policy: str) -> None:
    cache = make(policy=policy)
    for tokens in ([1, 2, 3], [5, 6], [7]):
        cache.insert(InsertParams(key=RadixKey(tokens)))
    cache.evict(EvictParams(num_tokens=1))  # the heap holds the keys as they were
    left = cache.evictable_size()
    for node in cache.iter_nodes():
        node.last_access_time = float("nan")
    assert cache.evict(EvictParams(num_tokens=10)).num_tokens_evicted == left > 0
    assert cache.evictable_size() == 0 and not cache.evictable_leaves


class ReferenceCheckpoints(RadixCache):
    """Checkpoint and release as 0.5.23 spells them: insert from the root, free the duplicates,
    unlock, lock the new end (and for a release, unlock it again)."""

    def checkpoint(self, req, *, up_to):  # type: ignore[no-untyped-def]
        if self.disable:
            return
        key = RadixKey(req.fill_ids[:up_to], req.extra_key).page_aligned(self.page_size)
        kv = req.kv_indices
        result = self.insert(InsertParams(key=key, value=kv[: len(key)]))
        self.token_to_kv_pool_allocator.free(kv[req.cache_protected_len : result.prefix_len])
        node = result.last_device_node
        kv[req.cache_protected_len : len(key)] = self.path_device_indices(node)[req.cache_protected_len :]
        req.cache_protected_len = len(key)
        self.unlock(req.lock)
        req.lock = self.lock(node)
        req.last_node = node

    def cache_finished_req(self, req, is_insert=True):  # type: ignore[no-untyped-def]
        owned = len(req.kv_indices)
        if is_insert and not self.disable:
            self.checkpoint(req, up_to=owned)
        self.token_to_kv_pool_allocator.free(req.kv_indices[req.cache_protected_len : owned])
        self.unlock(req.lock)
        req.lock = None


def cache_state(cache: RadixCache) -> tuple:
    """Everything a checkpoint may change: every node's fields, the sizes, the leaves, the pool."""
    nodes = sorted([cache.root_node, *cache.iter_nodes()], key=lambda n: n.id)
    return (
        [(n.id, n.key.token_ids, n.value, n.lock_ref, n.hit_count, n.priority, n.last_access_time,
          n.parent.id if n.parent else None) for n in nodes],
        cache.evictable_size(), cache.protected_size(), sorted(n.id for n in cache.evictable_leaves),
        list(cache.token_to_kv_pool_allocator.free_pages),
    )


class PromptReq:
    """A request as SGLang's Req keeps its tokens: the prompt and the outputs, joined on reading."""

    extra_key = None

    def __init__(self, tokens: list[int]) -> None:
        self.origin_input_ids = tokens
        self.output_ids: list[int] = []
        self.kv_indices: list[int] = []
        self.cache_protected_len = 0
        self.last_node: TreeNode | None = None
        self.lock: TreeLock | None = None

    @property
    def fill_ids(self) -> list[int]:
        return self.origin_input_ids + self.output_ids


def req_state(req: Req | PromptReq) -> tuple:
    lock = (req.lock.node.id, req.lock.receipt.node_id) if req.lock else None
    return req.fill_ids, req.kv_indices, req.cache_protected_len, req.last_node.id if req.last_node else None, lock


def scheduler_step(
    cache: RadixCache, running: list[Req | PromptReq], rng: random.Random, op: str, tokens: list[int],
    kind: type[Req | PromptReq] = Req,
) -> None:
    """One scheduler-like operation on ``cache``; ``rng`` picks the same request on every replica."""
    pool = cache.token_to_kv_pool_allocator
    ps = cache.page_size

    def pages(n: int) -> list[int] | None:
        if pool.available_size() < n * ps:
            cache.evict(EvictParams(num_tokens=n * ps - pool.available_size()))
        return pool.alloc_pages(n)

    if op == "admit":
        req = kind(list(tokens))
        req.extra_key = "x" if tokens[0] == 3 else None
        match = cache.match_prefix(MatchPrefixParams(key=RadixKey(tokens[: len(tokens) - 1], req.extra_key)))
        m = len(match.device_indices)
        req.kv_indices, req.cache_protected_len = list(match.device_indices), m
        req.last_node, req.lock = match.last_device_node, cache.lock(match.last_device_node)
        got = pages(-(-len(tokens) // ps) - m // ps)
        if got is None:
            cache.unlock(req.lock)
            return
        req.kv_indices.extend(pool.page_slots(got)[: len(tokens) - m])
        cache.checkpoint(req, up_to=len(req.kv_indices))
        running.append(req)
        return
    if op == "evict":
        cache.evict(EvictParams(num_tokens=rng.randrange(1, 40)))
        return
    if not running:
        return
    req = running[rng.randrange(len(running))]
    if op == "decode":
        n = len(req.kv_indices)
        got = pages(1) if n % ps == 0 else [None]
        if got is None:
            return
        req.kv_indices.append(got[0] * ps if got[0] is not None else req.kv_indices[-1] + 1)
        (req.output_ids if isinstance(req, PromptReq) else req.fill_ids).append(rng.randrange(4))
    elif op == "checkpoint":
        cache.checkpoint(req, up_to=len(req.kv_indices))
    elif op in ("finish", "retract"):
        running.remove(req)
        cache.cache_finished_req(req, is_insert=op == "finish")
    elif op == "double-unlock":  # the fault: the node's count goes below what its holders hold
        cache.dec_lock_ref(req.last_node)


@settings(max_examples=100, deadline=None)
@given(
    page_size=st.sampled_from([1, 2, 4]),
    policy=st.sampled_from(["lru", "lfu", "mru"]),
    steps=st.lists(
        st.tuples(
            st.sampled_from(["admit", "admit", "decode", "decode", "checkpoint", "finish", "retract", "double-unlock",
                             "evict"]),
            st.lists(st.integers(0, 3), min_size=1, max_size=12),
        ),
        min_size=10,
        max_size=60,
    ),
    seed=st.integers(0, 1000),
    kind=st.sampled_from([Req, PromptReq]),  # fill_ids alone, or SGLang's prompt and outputs
    observed=st.booleans(),
)
def test_checkpoint_and_release_do_and_call_what_inserting_from_the_root_and_relocking_do(
    page_size, policy, steps, seed, kind, observed
):
    """The same tree, sizes and requests as 0.5.23's spelling; and where something replaced the
    lock pair (as radixtop's instrument does), the same inc_lock_ref / dec_lock_ref calls too."""
    caches = [RadixCache(CacheInitParams(token_to_kv_pool_allocator=TokenToKVPoolAllocator(40, page_size),
                                         page_size=page_size, eviction_policy=policy, clock=ticking_clock()))
              for _ in range(2)]
    caches[1].__class__ = ReferenceCheckpoints
    # What hooks on the lock pair see (radixtop's instrument and its holder tracker): the same calls.
    calls: list[list[tuple[str, int]]] = [[], []]

    def observed_class(base, seen):  # type: ignore[no-untyped-def]
        class Observed(base):  # type: ignore[misc,valid-type]
            def inc_lock_ref(self, node):  # type: ignore[no-untyped-def]
                seen.append(("inc", node.id))
                return super().inc_lock_ref(node)

            def dec_lock_ref(self, node, params=None):  # type: ignore[no-untyped-def]
                seen.append(("dec", node.id))
                return super().dec_lock_ref(node, params)

        return Observed

    for cache, seen in zip(caches, calls) if observed else ():
        cache.__class__ = observed_class(type(cache), seen)
    running: list[list[Req | PromptReq]] = [[], []]
    for op, tokens in steps:
        for cache, reqs in zip(caches, running):
            scheduler_step(cache, reqs, random.Random(seed), op, tokens, kind)
        seed += 1
        assert cache_state(caches[0]) == cache_state(caches[1])
        assert [req_state(r) for r in running[0]] == [req_state(r) for r in running[1]]
        assert calls[0] == calls[1]


@settings(max_examples=200, deadline=None)
@given(
    page_size=st.sampled_from([1, 2, 4, 16]),
    pages=st.lists(st.integers(0, 20), max_size=8),
    cut=st.integers(0, 70),
    start=st.integers(0, 15),
    extra=st.lists(st.integers(0, 350), max_size=6),
)
def test_the_pages_of_a_row_are_the_pages_of_its_slots_one_by_one(page_size, pages, cut, start, extra):
    pool = TokenToKVPoolAllocator(20 * 16, page_size)
    first = pages[0] if pages else 0
    stretch = list(range(first, min(first + len(pages), pool.num_pages + 1)))  # consecutive pages
    for chosen in (pages, stretch):
        row = pool.page_slots(chosen)  # the pool's own slot objects, as a request's row holds them
        assert row == [p * page_size + i for p in chosen for i in range(page_size)]
        for slots in (row, row[:cut], row[start:cut], row + extra, [s + 0 * s for s in row], extra):
            assert pool.pages_of(slots) == list(dict.fromkeys(s // page_size for s in slots))
