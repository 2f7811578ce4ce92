"""A radix (prefix) cache with SGLang's shape and semantics, without torch.

Mirrored API: ``sglang/srt/mem_cache/radix_cache.py`` and ``base_prefix_cache.py`` of the sglang
0.5.23 wheel (the legacy ``RadixCache``, which 0.5.23 still ships next to the default
``UnifiedRadixCache``). What radixtop's instrumentation looks at has the same names, argument
order and meaning:

* ``RadixCache.root_node``, ``page_size``, ``token_to_kv_pool_allocator`` (``size``,
  ``available_size()``), ``disable``, ``evictable_leaves``;
* ``TreeNode.children`` (a dict keyed by :func:`get_child_key`: the first token, or the tuple of
  the first page's tokens when ``page_size > 1``), ``parent``, ``key`` (a :class:`RadixKey`),
  ``value`` (a list of KV slot indices; ``None`` once evicted), ``lock_ref``,
  ``last_access_time``, ``creation_time``, ``hit_count``, ``priority``, ``id``;
* ``match_prefix(params)``, ``insert(params)``, ``evict(params)``, ``inc_lock_ref(node)``,
  ``dec_lock_ref(node, params=None)``, ``lock(node)`` / ``unlock(lock)``, ``checkpoint(req, *,
  up_to)``, ``evictable_size()``, ``protected_size()``, ``total_size()``, ``reset()``,
  ``all_values_flatten()``, ``path_device_indices(node)``, ``pretty_print()``.

0.5.23 passes parameter objects; so does this module: :class:`MatchPrefixParams`,
:class:`InsertParams`, :class:`EvictParams` (and the result types :class:`MatchResult`,
:class:`InsertResult`, :class:`EvictResult`, :class:`IncLockRefResult`,
:class:`DecLockRefResult`) carry the fields the plain KV radix cache uses and nothing for
mamba/SWA/HiCache. For callers written against older releases, ``match_prefix`` and ``insert``
also take a bare :class:`RadixKey` (or list of token ids) and ``evict`` a bare token count; the
simulator itself always passes parameter objects. ``cache_finished_req`` / ``cache_unfinished_req``
(the pre-0.5.23 names) are kept as thin wrappers over 0.5.23's checkpoint / free / unlock sequence.

Semantics kept on purpose, including the sharp edges:

* keys are page-aligned when ``page_size > 1``: only whole pages are matched or inserted;
* ``inc_lock_ref`` / ``dec_lock_ref`` walk from the node to the root, moving a node's size
  between evictable and protected when its ``lock_ref`` leaves or reaches 0;
* ``dec_lock_ref`` does NOT check ``lock_ref >= 0``: a double unlock silently leaves -1, and a
  node with a negative ``lock_ref`` counts as unlocked (it can be evicted). Catching that is the
  instrumentation's job, as it is on a real server;
* ``evict`` pops unlocked leaves from a heap ordered by the eviction policy (``lru`` by
  ``last_access_time``; also ``lfu``, ``fifo``, ``mru``, ``filo``, ``priority``), frees their
  slots and pushes a parent that became an unlocked leaf.

Deliberate differences: node ids come from a counter per cache (a real server has one process
per rank, so every rank numbers its nodes from 0; the simulator runs all ranks in one process and
wants the same ids on every rank); the clock behind ``last_access_time`` is strictly increasing
per cache and heap ties break on node id, so replicated ranks evict in the same order; there is
no ``req_to_token_pool`` (a request carries its own ``kv_indices`` list, see :class:`CacheReq`).
"""

from __future__ import annotations

import heapq
import itertools
import operator
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, cast

from radixtop.sim.pool import TokenToKVPoolAllocator

__all__ = [
    "CacheInitParams",
    "CacheReq",
    "DecLockRefParams",
    "DecLockRefResult",
    "EvictParams",
    "EvictResult",
    "IncLockRefResult",
    "InsertParams",
    "InsertResult",
    "MatchPrefixParams",
    "MatchResult",
    "RadixCache",
    "RadixCacheError",
    "RadixKey",
    "TreeLock",
    "TreeNode",
    "EVICTION_POLICIES",
    "get_child_key",
    "page_align_keys",
]


class RadixCacheError(RuntimeError):
    """The error class of seed 000 ("Failed to lock memory page during dynamic prefix eviction")."""


# ----------------------------------------------------------------------------- keys


class RadixKey:
    """A sequence of token ids (plus an optional namespace, as SGLang's ``extra_key``)."""

    __slots__ = ("token_ids", "extra_key")

    def __init__(self, token_ids: Sequence[int], extra_key: str | None = None) -> None:
        self.token_ids: list[int] = token_ids if isinstance(token_ids, list) else list(token_ids)
        self.extra_key = extra_key

    def __len__(self) -> int:
        return len(self.token_ids)

    def __iter__(self) -> Iterator[int]:
        return iter(self.token_ids)

    def __getitem__(self, idx: int | slice) -> RadixKey:
        if isinstance(idx, slice):
            return RadixKey(self.token_ids[idx], self.extra_key)
        return RadixKey([self.token_ids[idx]], self.extra_key)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, RadixKey)
            and self.extra_key == other.extra_key
            and self.token_ids == other.token_ids
        )

    __hash__ = None  # type: ignore[assignment]  # mutable, like SGLang's

    def __repr__(self) -> str:
        preview = self.token_ids[:10]
        more = "..." if len(self.token_ids) > 10 else ""
        return f"RadixKey(extra_key={self.extra_key!r}, token_ids={preview}{more})"

    def page_aligned(self, page_size: int) -> RadixKey:
        if len(self.token_ids) % page_size == 0:
            return self
        return self[: len(self) // page_size * page_size]

    def child_key(self, page_size: int = 1) -> Any:
        return get_child_key(self, page_size)

    def match(self, other: RadixKey, page_size: int = 1) -> int:
        """Length of the shared prefix, rounded down to whole pages."""
        if self.extra_key != other.extra_key:
            raise ValueError(
                "RadixKey.match needs the same extra_key on both sides, "
                f"got {self.extra_key!r} and {other.extra_key!r}"
            )
        return _match_len(self.token_ids, other.token_ids, 0, len(other.token_ids), page_size)


def _match_len(t0: list[int], t1: list[int], offset: int, end: int, page_size: int) -> int:
    """Shared prefix of ``t0`` and ``t1[offset:end]``, in whole pages, without slicing ``t1`` whole."""
    n = min(len(t0), end - offset)
    matched = n
    # One compare first: most steps of a walk match the whole node. Else gallop in doubling
    # windows (one C-level slice compare each), then bisect the window holding the first
    # difference: no per-token Python loop on long shared prefixes.
    if (t0 if n == len(t0) else t0[:n]) != t1[offset : offset + n]:
        lo, step = 0, 1
        while lo < n:
            hi = min(lo + step, n)
            if t0[lo:hi] != t1[offset + lo : offset + hi]:
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    if t0[lo:mid] == t1[offset + lo : offset + mid]:
                        lo = mid
                    else:
                        hi = mid
                matched = lo
                break
            lo = hi
            step *= 2
    if page_size > 1:
        matched = matched // page_size * page_size
    return matched


def _child_key_at(tokens: list[int], offset: int, page_size: int, extra_key: str | None) -> Any:
    plain = tokens[offset] if page_size == 1 else tuple(tokens[offset : offset + page_size])
    return plain if extra_key is None else (extra_key, plain)


def get_child_key(key: RadixKey, page_size: int = 1) -> Any:
    """The dict key a child is stored under: its first token, or its first page as a tuple."""
    plain = key.token_ids[0] if page_size == 1 else tuple(key.token_ids[:page_size])
    return plain if key.extra_key is None else (key.extra_key, plain)


def page_align_keys(key: list[int], page_size: int) -> list[int]:
    if page_size == 1:
        return key
    return key[: len(key) // page_size * page_size]


# ----------------------------------------------------------------------------- parameter objects
# Those made per call (a match, an insert, a lock, an eviction) keep their fields in slots: no
# instance dict to make and fill each time.


@dataclass
class CacheInitParams:
    disable: bool = False
    token_to_kv_pool_allocator: TokenToKVPoolAllocator | None = None
    page_size: int = 1
    eviction_policy: str = "lru"
    req_to_token_pool: Any = None
    # Simulator-only: the time source for last_access_time / creation_time.
    clock: Callable[[], float] | None = None


@dataclass(slots=True)
class MatchPrefixParams:
    key: RadixKey


class MatchResult(NamedTuple):
    device_indices: list[int]
    last_device_node: TreeNode
    last_host_node: TreeNode
    best_match_node: TreeNode
    host_hit_length: int = 0

    @property
    def device_prefix_len(self) -> int:
        """0.5.23 returns the matched length instead of the indices; both are here."""
        return len(self.device_indices)


@dataclass(slots=True)
class InsertParams:
    key: RadixKey | None = None
    value: list[int] | None = None
    priority: int = 0
    chunked: bool = False
    # Tokens of this key the same request already inserted (their hit_count was counted then).
    inserted_len: int = 0


@dataclass(slots=True)
class InsertResult:
    prefix_len: int
    last_device_node: TreeNode | None = None


@dataclass(slots=True)
class EvictParams:
    num_tokens: int = 0


@dataclass(slots=True)
class EvictResult:
    num_tokens_evicted: int = 0


@dataclass(slots=True)
class IncLockRefResult:
    delta: int | None = None
    node_id: int | None = None

    def to_dec_params(self) -> DecLockRefParams:
        return DecLockRefParams(node_id=self.node_id)


@dataclass(slots=True)
class DecLockRefParams:
    node_id: int | None = None


@dataclass(slots=True)
class DecLockRefResult:
    delta: int | None = None


@dataclass(slots=True)
class TreeLock:
    """What ``lock`` hands a holder; ``unlock`` gives it back (0.5.23's ``TreeLock``)."""

    node: TreeNode
    receipt: DecLockRefParams = field(default_factory=DecLockRefParams)


class CacheReq(Protocol):
    """What ``checkpoint`` / ``cache_finished_req`` need from a request (duck-typed).

    ``fill_ids``: the tokens whose KV the request holds, in position order;
    ``kv_indices``: the KV slot of each position the request has written (its req_to_token row);
    ``cache_protected_len``: how many leading positions the tree owns;
    ``last_node`` / ``lock``: the node it holds locked and the lock receipt.

    A request that also has SGLang's ``origin_input_ids`` and ``output_ids`` (whose join is its
    ``fill_ids``) gives a key within its prompt from ``origin_input_ids``, without the join.
    """

    kv_indices: list[int]
    cache_protected_len: int
    last_node: TreeNode | None
    lock: TreeLock | None

    @property
    def fill_ids(self) -> list[int]: ...

    @property
    def extra_key(self) -> str | None: ...


def _key_tokens(req: CacheReq, up_to: int, page_size: int) -> tuple[list[int], int]:
    """Tokens that begin with the request's first ``up_to`` fill ids, and the length of their
    page-aligned key: its prompt itself where the key lies within it."""
    loose: Any = req  # the engine's requests have both lists; a duck-typed one may have neither
    prompt: list[int] | None
    outputs: list[int] | None
    try:
        prompt, outputs = loose.origin_input_ids, loose.output_ids
    except AttributeError:
        prompt = outputs = None
    if prompt is not None and outputs is not None:
        key_len = min(up_to, len(prompt) + len(outputs)) // page_size * page_size
        if key_len <= len(prompt):
            return prompt, key_len
    tokens = req.fill_ids
    return tokens, min(up_to, len(tokens)) // page_size * page_size


# ----------------------------------------------------------------------------- tree


class TreeNode:
    counter = 0  # used only when a node is built outside a cache, as SGLang's global counter

    def __init__(self, id: int | None = None, priority: int = 0) -> None:  # noqa: A002 - SGLang's name
        self.children: dict[Any, TreeNode] = {}
        self.parent: TreeNode | None = None
        self.key: RadixKey | None = None
        self.value: list[int] | None = None
        self.lock_ref = 0
        now = time.monotonic()
        self.last_access_time = now
        self.creation_time = now
        self.hit_count = 0
        self.hash_value: list[str] | None = None
        self.priority = priority
        if id is None:
            id = TreeNode.counter
            TreeNode.counter += 1
        self.id = id

    @property
    def evicted(self) -> bool:
        return self.value is None

    def __lt__(self, other: TreeNode) -> bool:
        return self.last_access_time < other.last_access_time

    def __repr__(self) -> str:
        size = len(self.key) if self.key is not None else 0
        return f"TreeNode(id={self.id}, len={size}, lock_ref={self.lock_ref})"


# A node in the tree has a key, and a parent unless it is the root; its value is there until it is
# evicted. mypy is told so by these typed getters, which check nothing: a fault that breaks this
# fails where SGLang's own code fails, with the same error. (C getters: the walks call them a lot.)
_key = cast(Callable[[TreeNode], RadixKey], operator.attrgetter("key"))
_value = cast(Callable[[TreeNode], list[int]], operator.attrgetter("value"))
_parent = cast(Callable[[TreeNode], TreeNode], operator.attrgetter("parent"))


class _Policy:
    """An eviction order: the unlocked leaf with the smallest of these fields goes first (their
    tuple when several; negated, for the newest first). Read by C loops over all leaves at once."""

    __slots__ = ("_get", "_negate", "key_of")

    def __init__(self, *fields: str, negate: bool = False) -> None:
        self._get: Callable[[TreeNode], Any] = operator.attrgetter(*fields)
        self._negate = negate  # one field only: a tuple has no negation
        # A node's key as the cache reads it on every push and pop: the C getter itself where
        # nothing is negated.
        self.key_of: Callable[[TreeNode], Any] = self if negate else self._get

    def __call__(self, node: TreeNode) -> Any:
        value = self._get(node)
        return -value if self._negate else value

    def keys(self, nodes: Iterable[TreeNode]) -> Iterator[Any]:
        """``map(self, nodes)``, without a Python call per node."""
        values = map(self._get, nodes)
        return map(operator.neg, values) if self._negate else values


EVICTION_POLICIES: dict[str, _Policy] = {
    "lru": _Policy("last_access_time"),
    "lfu": _Policy("hit_count", "last_access_time"),
    "fifo": _Policy("creation_time"),
    "mru": _Policy("last_access_time", negate=True),
    "filo": _Policy("creation_time", negate=True),
    "priority": _Policy("priority", "last_access_time"),
}
_NODE_ID = operator.attrgetter("id")


def _strict_clock(base: Callable[[], float]) -> Callable[[], float]:
    """A monotonic clock that never returns the same value twice (ties would make ranks differ).
    A closure: every stamp of a walk calls it, and a function is called more cheaply than an
    object's __call__."""
    last = float("-inf")

    def clock() -> float:
        nonlocal last
        now = base()
        if now <= last:
            now = last + 1e-9
        last = now
        return now

    return clock


def _as_key(obj: Any) -> RadixKey:
    if isinstance(obj, RadixKey):
        return obj
    if isinstance(obj, (list, tuple)):
        return RadixKey(list(obj))
    raise TypeError(f"expected a RadixKey or a list of token ids, got {type(obj).__name__}")


class RadixCache:
    def __init__(self, params: CacheInitParams) -> None:
        policy = params.eviction_policy.lower()
        if policy not in EVICTION_POLICIES:
            raise ValueError(
                f"Unknown eviction policy: {params.eviction_policy}. "
                f"Supported policies: {', '.join(repr(p) for p in EVICTION_POLICIES)}."
            )
        if params.page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {params.page_size}")
        self.disable = params.disable
        self.req_to_token_pool = params.req_to_token_pool
        self.token_to_kv_pool_allocator = params.token_to_kv_pool_allocator
        self.page_size = params.page_size
        self.eviction_policy = policy
        self._priority_of = EVICTION_POLICIES[policy]
        self._leaf_key = self._priority_of.key_of
        self.clock = _strict_clock(params.clock or time.monotonic)
        self._node_ids = itertools.count()
        self.evictable_leaves: set[TreeNode] = set()
        # Every evictable leaf's (eviction key, id, node), pushed when it becomes one and whenever
        # its key moves; older entries stay until popped or the heap is rebuilt. evict() pops it
        # instead of ordering every leaf on each call, which was most of a step on a full pool.
        self._leaf_heap: list[tuple[Any, int, TreeNode]] = []
        self.kv_events: Any = None  # radixtop.sim.kv_events.KvEventRecorder when --kv-events-config is given
        self.reset()

    @classmethod
    def create_simulated(
        cls,
        disable: bool = False,
        mock_allocator: TokenToKVPoolAllocator | None = None,
        page_size: int = 1,
        eviction_policy: str = "lru",
        clock: Callable[[], float] | None = None,
    ) -> RadixCache:
        return cls(
            CacheInitParams(
                disable=disable,
                token_to_kv_pool_allocator=mock_allocator,
                page_size=page_size,
                eviction_policy=eviction_policy,
                clock=clock,
            )
        )

    def _new_node(self, priority: int = 0) -> TreeNode:
        node = TreeNode(id=next(self._node_ids), priority=priority)
        now = self.clock()
        node.last_access_time = now
        node.creation_time = now
        return node

    ##### Public API #####

    def reset(self) -> None:
        self.root_node = self._new_node(priority=-sys.maxsize)
        self.root_node.key = RadixKey([])
        self.root_node.value = []
        self.root_node.lock_ref = 1
        self.root_node.hash_value = []
        self.evictable_size_ = 0
        self.protected_size_ = 0
        self.evictable_leaves.clear()
        self._leaf_heap.clear()
        if self.kv_events is not None:
            self.kv_events.record_all_cleared()

    def match_prefix(self, params: MatchPrefixParams) -> MatchResult:
        """Longest cached page-aligned prefix of ``params.key``; splits a node if the match ends inside it."""
        key = params.key if isinstance(params, MatchPrefixParams) else _as_key(params)
        n = len(key.token_ids)
        if self.disable or n == 0:
            return self._empty_match()
        if n % self.page_size:
            key = key.page_aligned(self.page_size)
            if len(key.token_ids) == 0:
                return self._empty_match()
        values, last_node = self._match_prefix_helper(self.root_node, key)
        indices: list[int] = []
        for v in values:
            indices.extend(v)
        return MatchResult(indices, last_node, last_node, last_node)

    def insert(self, params: InsertParams, value: list[int] | None = None) -> InsertResult:
        """Insert a page-aligned key; returns how much of it was already cached."""
        if not isinstance(params, InsertParams):
            params = InsertParams(key=_as_key(params), value=value)
        if self.disable:
            return InsertResult(prefix_len=0)
        if params.key is None:
            raise ValueError("InsertParams.key is required")
        key = params.key.page_aligned(self.page_size)
        val = params.value
        # Debug/test fallback, as SGLang: the token ids stand in for slot indices.
        val = list(key.token_ids) if val is None else val[: len(key)]  # a copy either way
        if len(val) != len(key):
            raise ValueError(f"insert needs one value per key token: {len(key)} tokens, {len(val)} values")
        prefix_len, last_node = self._insert_helper(
            self.root_node, key, val, params.priority, params.inserted_len
        )
        return InsertResult(prefix_len=prefix_len, last_device_node=last_node)

    def evict(self, params: EvictParams | int) -> EvictResult:
        """Free at least ``num_tokens`` by deleting unlocked leaves in policy order."""
        num_tokens = params.num_tokens if isinstance(params, EvictParams) else int(params)
        if self.disable:
            return EvictResult()
        leaves = self.evictable_leaves
        heap = self._leaf_heap
        priority_of = self._leaf_key
        allocator = self.token_to_kv_pool_allocator
        # SGLang's loop takes the leaves there are when it starts and, of the parents it leaves
        # childless, those at lock_ref 0; one below 0 (a double unlock) waits for the next call.
        later: set[TreeNode] = set()
        set_aside: list[tuple[Any, int, TreeNode]] = []
        # A popped entry whose key has moved since gets one fresh entry per call, which alone
        # then counts for its node: bounded even for a key set from outside that never equals
        # itself (NaN).
        renewed: dict[TreeNode, Any] = {}
        num_evicted = 0
        while num_evicted < num_tokens and heap:
            entry = heapq.heappop(heap)
            key, _, x = entry
            if x not in leaves:
                continue  # evicted, locked or a parent since
            if x in renewed:
                if key is not renewed[x]:
                    continue
            elif key != priority_of(x):
                renewed[x] = fresh = priority_of(x)
                heapq.heappush(heap, (fresh, x.id, x))
                continue
            if x in later:
                set_aside.append(entry)
                continue
            slots = _value(x)  # an evictable leaf is not evicted yet
            if allocator is not None:
                allocator.free(slots)
            num_evicted += len(slots)
            self._delete_leaf(x)
            if self.kv_events is not None:
                self.kv_events.record_remove(x)
            parent = _parent(x)
            if parent in leaves and parent.lock_ref != 0:
                later.add(parent)
        for entry in set_aside:
            heapq.heappush(heap, entry)
        return EvictResult(num_tokens_evicted=num_evicted)

    def inc_lock_ref(self, node: TreeNode) -> IncLockRefResult:
        if self.disable:
            return IncLockRefResult(delta=0)
        delta = 0
        anchor = node
        while node is not self.root_node:
            delta -= self._lock_one(node)
            node = _parent(node)
        return IncLockRefResult(delta=delta, node_id=anchor.id)

    def _lock_one(self, node: TreeNode) -> int:
        """One node's part of ``inc_lock_ref``: the tokens it moves from evictable to protected."""
        size = 0
        if node.lock_ref == 0:
            size = len(_key(node).token_ids)
            self.evictable_size_ -= size
            self.protected_size_ += size
        node.lock_ref += 1
        if node.lock_ref > 0:  # what _update_leaf_status does first, without the call
            self.evictable_leaves.discard(node)
        else:
            self._update_leaf_status(node)
        return size

    def dec_lock_ref(self, node: TreeNode, params: DecLockRefParams | None = None) -> DecLockRefResult:
        # No lock_ref >= 0 check, on purpose (see the module docstring).
        if self.disable:
            return DecLockRefResult(delta=0)
        delta = 0
        root, leaves = self.root_node, self.evictable_leaves
        while node is not root:
            if node.lock_ref == 1:
                size = len(_key(node).token_ids)
                self.evictable_size_ += size
                self.protected_size_ -= size
                delta += size
            node.lock_ref -= 1
            if node.lock_ref > 0:  # what _update_leaf_status does first, without the call
                leaves.discard(node)
            else:
                self._update_leaf_status(node)
            if node.parent is None:
                raise AssertionError("This request holds the node from another tree")
            node = node.parent
        return DecLockRefResult(delta=delta)

    def lock(self, node: TreeNode) -> TreeLock:
        return TreeLock(node, self.inc_lock_ref(node).to_dec_params())

    def unlock(self, lock: TreeLock | None) -> None:
        if lock is not None:
            self.dec_lock_ref(lock.node, lock.receipt)

    def checkpoint(self, req: CacheReq, *, up_to: int) -> None:
        """Put the request's first ``up_to`` tokens in the tree and move its lock to the new end.

        0.5.23's replacement for ``cache_unfinished_req``: insert the page-aligned key, free the
        request's duplicate slots for pages the tree already had, point the request's row at
        the tree's slots, and relock at the deepest node.
        """
        if self.disable:
            return
        new_last_node = self._insert_row(req, up_to, locking=True)
        if self._lock_pair_is_own():
            self._move_lock(req, new_last_node)
        else:  # as 0.5.23 moves it: what replaced the pair sees the calls a real server makes
            self.unlock(req.lock)
            req.lock = self.lock(new_last_node)
        req.last_node = new_last_node

    def cache_unfinished_req(self, req: CacheReq, chunked: bool = False) -> None:
        """Pre-0.5.23 name: cache what the request has computed so far, keep it locked."""
        self.checkpoint(req, up_to=len(req.kv_indices))

    def cache_finished_req(self, req: CacheReq, is_insert: bool = True) -> None:
        """Pre-0.5.23 name of the release path: checkpoint, free the private tail, unlock."""
        owned = len(req.kv_indices)
        if is_insert and not self.disable:
            if not self._lock_pair_is_own():
                self.checkpoint(req, up_to=owned)  # 0.5.23's release, call for call
            else:
                # The checkpoint's lock on the new end would be let go of below: only the old one goes.
                new_last_node = self._insert_row(req, owned)
                self.unlock(req.lock)
                req.lock = None
                req.last_node = new_last_node
        if self.token_to_kv_pool_allocator is not None:
            self.token_to_kv_pool_allocator.free(req.kv_indices[req.cache_protected_len : owned])
        self.unlock(req.lock)
        req.lock = None

    def evictable_size(self) -> int:
        return self.evictable_size_

    def protected_size(self) -> int:
        # Tokens held by a lock.
        return self.protected_size_

    def total_size(self) -> int:
        return self._total_size_helper()

    def supports_prefix_sharing(self) -> bool:
        return not self.disable

    def is_root(self, node: TreeNode) -> bool:
        return node is self.root_node

    def all_values_flatten(self) -> list[int]:
        values: list[int] = []
        stack = list(self.root_node.children.values())
        while stack:
            node = stack.pop()
            values.extend(node.value or ())
            stack.extend(node.children.values())
        return values

    def path_device_indices(self, node: TreeNode) -> list[int]:
        parts: list[list[int]] = []
        while node is not self.root_node:
            parts.append(_value(node))
            node = _parent(node)
        out: list[int] = []
        for part in reversed(parts):
            out.extend(part)
        return out

    def _insert_row(self, req: CacheReq, up_to: int, *, locking: bool = False) -> TreeNode:
        """A checkpoint's insert: the page-aligned key of the request's first ``up_to`` tokens
        into the tree, its duplicate slots freed, its row pointed at the tree's; the new end.
        ``locking``: the caller locks the new end at once (see _insert_walk)."""
        tokens, key_len = _key_tokens(req, up_to, self.page_size)
        kv = req.kv_indices
        protected = req.cache_protected_len
        if len(kv) < key_len:
            raise ValueError(f"insert needs one value per key token: {key_len} tokens, {len(kv)} values")
        found = self._insert_below(req.last_node, protected, tokens, key_len, req.extra_key, kv, locking)
        if found is None:
            found = self._insert_helper(self.root_node, RadixKey(tokens[:key_len], req.extra_key), kv[:key_len])
        prefix_len, new_last_node = found
        if self.token_to_kv_pool_allocator is not None:
            self.token_to_kv_pool_allocator.free(kv[protected:prefix_len])
        # SGLang matches the key again here for the tree's slots: the walk insert just made ends
        # at that node and stamped its path last, so the path's slots are those, and a second
        # stamp would keep every node in the same order of access. Past the pages the tree had
        # (prefix_len) the path's slots are the row's own, which the new node took: only where
        # the tree had pages beyond the protected ones does the row change.
        if prefix_len > protected:
            kv[protected:prefix_len] = self._path_slots(new_last_node, key_len, protected)[: prefix_len - protected]
        req.cache_protected_len = key_len
        return new_last_node

    def _path_slots(self, node: TreeNode, length: int, start: int) -> list[int]:
        """The slots of ``node``'s path from position ``start`` on; the path is ``length`` tokens
        long (AssertionError where the tree says otherwise). The part before is not joined."""
        parts: list[list[int]] = []
        end = length
        while node is not self.root_node:
            value = _value(node)
            begin = end - len(value)
            if end > start:
                parts.append(value if begin >= start else value[start - begin :])
            end = begin
            node = _parent(node)
        if end != 0:
            raise AssertionError(f"len(new_indices)={length - end}, key_len={length}")
        out: list[int] = []
        for part in reversed(parts):
            out.extend(part)
        return out

    def _insert_below(
        self,
        anchor: TreeNode | None,
        depth: int,
        tokens: list[int],
        n: int,
        extra: str | None,
        value: list[int],
        locking: bool = False,
    ) -> tuple[int, TreeNode] | None:
        """What inserting the key ``tokens[:n]`` (namespace ``extra``) from the root does, walking
        on from ``anchor``: a request's locked node, whose path is the key's first ``depth``
        tokens (the tree put them there and holds them). Its ancestors get the walk's stamps
        without their keys compared again. None where ``anchor`` is not such a node (evicted, of
        another tree, another length)."""
        if anchor is None or anchor.value is None or depth > n:  # value None: evicted
            return None
        root = self.root_node
        path: list[TreeNode] = []
        length = 0
        node = anchor
        while node is not root:
            path.append(node)
            length += len(_key(node).token_ids)
            parent = node.parent
            if parent is None:
                return None
            node = parent
        if length != depth:
            return None
        access_time = self.clock()
        root.last_access_time = access_time  # never an evictable leaf, so not _touched
        if root.priority < 0:
            root.priority = 0  # max(priority, 0), as the insert's walk sets it
        leaves = self.evictable_leaves
        for node in path:
            node.last_access_time = access_time
            if node.priority < 0:
                node.priority = 0
            node.hit_count += 1
            if node in leaves:  # self._touched(node), inline: these are most of a release's steps
                self._push_leaf(node)
        if depth == n:
            return depth, anchor
        return self._insert_walk(anchor, depth, tokens, n, extra, value, access_time, 0, 0, locking)

    def _lock_pair_is_own(self) -> bool:
        """Whether the class's inc_lock_ref and dec_lock_ref are this module's. Only then may a
        checkpoint move a lock in one pass, and a release skip the lock it would take and let go
        of at once: what replaced the pair on the class (radixtop's instrument, SGLang's hook
        registry, a subclass) must see the calls a 0.5.23 server makes, and counts them. (The
        instance's own dict is not read: making it costs every attribute read of the cache.)"""
        cls = type(self)
        return (cls.inc_lock_ref, cls.dec_lock_ref) == _OWN_LOCK_PAIR

    def _move_lock(self, req: CacheReq, node: TreeNode) -> None:
        """``unlock(req.lock)`` then ``req.lock = lock(node)`` in one pass where the old lock's
        node is on ``node``'s path: only the nodes below it change their lock count."""
        old = req.lock
        if old is None:
            req.lock = self.lock(node)
            return
        below: list[TreeNode] = []
        walk = node
        while walk is not old.node and walk is not self.root_node:
            below.append(walk)
            walk = _parent(walk)
        if walk is not old.node:
            self.unlock(old)
            req.lock = self.lock(node)
            return
        for x in below:
            self._lock_one(x)
        req.lock = TreeLock(node, DecLockRefParams(node_id=node.id))

    def iter_nodes(self) -> Iterator[TreeNode]:
        """Every node below the root, parents before children (simulator helper for tests and tools)."""
        stack = list(self.root_node.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def pretty_print(self) -> None:
        for line in self.printed_lines():
            print(line)

    def printed_lines(self) -> Iterator[str]:
        """SGLang's pretty_print, line by line: `print(" " * indent, len(key), ids[:10], "r=N")`
        (print's separator puts one more space in front), then the total."""
        stack = [(self.root_node, 0)]
        while stack:
            node, indent = stack.pop()
            key = _key(node)
            yield f"{' ' * indent} {len(key)} {key.token_ids[:10]} r={node.lock_ref}"
            for child in node.children.values():
                stack.append((child, indent + 2))
        yield f"#tokens: {self.total_size()}"

    ##### Internal helpers #####

    def _empty_match(self) -> MatchResult:
        return MatchResult([], self.root_node, self.root_node, self.root_node)

    def _match_prefix_helper(self, node: TreeNode, key: RadixKey) -> tuple[list[list[int]], TreeNode]:
        # SGLang's algorithm; walks an offset into the key instead of re-slicing it per level.
        access_time = self.clock()
        node.last_access_time = access_time
        leaves = self.evictable_leaves
        if node in leaves:  # self._touched(node), inline
            self._push_leaf(node)
        page_size = self.page_size
        tokens, extra = key.token_ids, key.extra_key
        n = len(tokens)
        offset = 0
        value: list[list[int]] = []
        while offset < n:
            child = node.children.get(_child_key_at(tokens, offset, page_size, extra))
            if child is None:
                break
            child.last_access_time = access_time
            if child in leaves:  # self._touched(child), inline: a step of every match
                self._push_leaf(child)
            child_key = _key(child)
            prefix_len = _match_len(child_key.token_ids, tokens, offset, n, page_size)
            if prefix_len < len(child_key.token_ids):
                new_node = self._split_node(child_key, child, prefix_len)
                value.append(_value(new_node))
                node = new_node
                break
            value.append(_value(child))
            node = child
            offset += prefix_len
        return value, node

    def _split_node(self, key: RadixKey, child: TreeNode, split_len: int) -> TreeNode:
        # new_node -> child; the new node inherits what describes the shared prefix.
        new_node = self._new_node(priority=child.priority)
        new_node.last_access_time = child.last_access_time
        new_node.hit_count = child.hit_count
        new_node.children = {key[split_len:].child_key(self.page_size): child}
        new_node.parent = child.parent
        new_node.lock_ref = child.lock_ref
        child_key, child_value = _key(child), _value(child)
        new_node.key = child_key[:split_len]
        new_node.value = child_value[:split_len]
        child.parent = new_node
        child.key = child_key[split_len:]
        child.value = child_value[split_len:]
        _parent(new_node).children[key.child_key(self.page_size)] = new_node
        return new_node

    def _insert_helper(
        self,
        node: TreeNode,
        key: RadixKey,
        value: list[int],
        priority: int = 0,
        inserted_len: int = 0,
    ) -> tuple[int, TreeNode]:
        priority = priority or 0
        access_time = self.clock()
        node.last_access_time = access_time
        node.priority = max(node.priority, priority)
        self._touched(node)
        if len(key) == 0:
            return 0, node
        tokens, extra = key.token_ids, key.extra_key
        return self._insert_walk(node, 0, tokens, len(tokens), extra, value, access_time, priority, inserted_len)

    def _insert_walk(
        self,
        node: TreeNode,
        offset: int,
        tokens: list[int],
        n: int,
        extra: str | None,
        value: list[int],
        access_time: float,
        priority: int,
        inserted_len: int,
        locking: bool = False,
    ) -> tuple[int, TreeNode]:
        """The insert of the key ``tokens[:n]`` walking down from ``node``, which holds its first
        ``offset`` tokens. ``locking``: the caller locks the new end before anything else runs,
        so a new leaf is not made an evictable leaf first (it would leave the set at once, and
        its heap entry would only be popped as stale later)."""
        page_size = self.page_size
        child_key = None
        while offset < n:
            child_key = _child_key_at(tokens, offset, page_size, extra)
            child = node.children.get(child_key)
            if child is None:
                break
            child_key = None  # it named this child: the new node below needs its own
            node = child
            node.last_access_time = access_time
            node_key = _key(node)
            prefix_len = _match_len(node_key.token_ids, tokens, offset, n, page_size)
            offset += prefix_len
            if prefix_len < len(node_key.token_ids):
                self._touched(node)  # the part split off below keeps the new access time
                node = self._split_node(node_key, node, prefix_len)
            node.priority = max(node.priority, priority)
            if offset > inserted_len:
                node.hit_count += 1
            self._touched(node)
        if offset < n:
            new_node = self._new_node(priority=priority)
            new_node.last_access_time = access_time
            new_node.parent = node
            new_node.key = RadixKey(tokens[offset:n], extra)
            new_node.value = value[offset:n]
            if n > inserted_len:
                new_node.hit_count += 1
            if child_key is None:
                child_key = _child_key_at(tokens, offset, page_size, extra)
            node.children[child_key] = new_node
            self.evictable_size_ += n - offset
            self._update_leaf_status(node)
            if not locking:
                self._update_leaf_status(new_node)
            if self.kv_events is not None:
                self.kv_events.record_store(new_node)
            node = new_node
        return offset, node

    def _delete_leaf(self, node: TreeNode) -> None:
        node_key, parent = _key(node), _parent(node)
        key = _child_key_at(node_key.token_ids, 0, self.page_size, node_key.extra_key)
        removed = parent.children.pop(key, None)
        if removed is not node:
            raise AssertionError(f"parent does not have child key, {key}")
        self.evictable_size_ -= len(node_key.token_ids)
        self.evictable_leaves.discard(node)
        # SGLang marks the node evicted by dropping its slots; the parent link stays.
        node.value = None
        self._update_leaf_status(parent)

    def _update_leaf_status(self, node: TreeNode) -> None:
        # node.value is None: node.evicted, without a property call (every lock step comes here).
        leaves = self.evictable_leaves
        if node.value is None or node.lock_ref > 0 or node is self.root_node:
            leaves.discard(node)
            return
        for child in node.children.values():
            if child.value is not None:
                leaves.discard(node)
                return
        if node not in leaves:
            leaves.add(node)
            self._push_leaf(node)

    def _touched(self, node: TreeNode) -> None:
        """``node``'s access time, hit count or priority moved: an evictable leaf's entry follows."""
        if node in self.evictable_leaves:
            self._push_leaf(node)

    def _push_leaf(self, node: TreeNode) -> None:
        heap, leaves = self._leaf_heap, self.evictable_leaves
        heapq.heappush(heap, (self._leaf_key(node), node.id, node))
        if len(heap) > 2 * len(leaves) + 64:  # mostly stale entries: start again from the leaves
            # (in place: evict() holds the list) iterating the unchanged set three times in one order
            heap[:] = zip(self._priority_of.keys(leaves), map(_NODE_ID, leaves), leaves)
            heapq.heapify(heap)

    def _total_size_helper(self) -> int:
        total = 0
        stack = [self.root_node]
        while stack:
            node = stack.pop()
            total += len(_value(node))
            for child in node.children.values():
                if not child.evicted:
                    stack.append(child)
        return total


# The lock pair as this module defines it, before anything wraps it (RadixCache._lock_pair_is_own).
_OWN_LOCK_PAIR = (RadixCache.inc_lock_ref, RadixCache.dec_lock_ref)
