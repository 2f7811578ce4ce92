"""Real SGLang prefix caches on the CPU, a scheduler-shaped workload, and an independent tree walk.

Imports sglang and torch: use only where they are installed (the environment .ci/sglang-tests
builds). Shared by tests/test_sglang_real.py, its spawned child processes and
benchmarks/instrument_bench.py --real. Caches are built as SGLang's own tests build them: a
TokenToKVPoolAllocator on the CPU with no KV buffers behind it (kvcache=None), so node values
are real slot-index tensors and nothing else.
"""

from __future__ import annotations

import random
import warnings
from array import array
from dataclasses import dataclass, field
from typing import Any

warnings.filterwarnings("ignore", message=".*support.*currently.*")  # sglang's CUDA-only notes

import torch
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
from sglang.srt.mem_cache.base_prefix_cache import (
    EvictParams,
    InsertParams,
    MatchPrefixParams,
)
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache


def allocator(size: int) -> TokenToKVPoolAllocator:
    return TokenToKVPoolAllocator(size=size, dtype=torch.float16, device="cpu", kvcache=None, need_sort=False)


def radix_cache(size: int = 4096, page_size: int = 1) -> RadixCache:
    return RadixCache(
        CacheInitParams(
            disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=allocator(size), page_size=page_size
        )
    )


def unified_cache(size: int = 4096, backend: str = "python", page_size: int = 1) -> UnifiedRadixCache:
    params = CacheInitParams(
        disable=False,
        req_to_token_pool=None,
        token_to_kv_pool_allocator=allocator(size),
        page_size=page_size,
        tree_components=(ComponentType.FULL,),
        tree_core_backend=backend,
    )
    return UnifiedRadixCache(params)


def key(tokens: list[int]) -> RadixKey:
    return RadixKey(array("q", tokens))


@dataclass
class Tally:
    """What the driver itself did, to hold the hooks' counters against."""

    locks: int = 0
    unlocks: int = 0
    evict_calls: int = 0  # outermost evict / evict_for_alloc calls
    evictions: int = 0  # of those, the ones that freed something
    evicted_tokens: int = 0
    inserts: int = 0
    skipped: int = 0  # requests that found the pool full of locked tokens


@dataclass
class Driver:
    """A scheduler-shaped stream on one cache: match, lock the prefix, evict for the allocation,
    insert, move the lock to the new leaf, keep a window of running requests locked."""

    cache: Any
    page_size: int = 1
    window: int = 8
    seed: int = 1
    evict_with: str = "evict_for_alloc"  # what SGLang 0.5.23's allocator calls; "evict" also works
    tally: Tally = field(default_factory=Tally)
    running: list[tuple[Any, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.alloc = self.cache.token_to_kv_pool_allocator
        self.systems = [[self.rng.randrange(1, 32000) for _ in range(self.rng.randrange(16, 64))] for _ in range(4)]

    def prompt(self) -> list[int]:
        tokens = self.rng.choice(self.systems) + [
            self.rng.randrange(1, 32000) for _ in range(self.rng.randrange(8, 40))
        ]
        return tokens[: len(tokens) // self.page_size * self.page_size]

    def lock(self, node: Any) -> Any:
        self.tally.locks += 1
        return self.cache.inc_lock_ref(node)

    def unlock(self, node: Any, receipt: Any) -> None:
        self.tally.unlocks += 1
        self.cache.dec_lock_ref(node, receipt.to_dec_params())

    def evict(self, tokens: int) -> None:
        result = getattr(self.cache, self.evict_with)(EvictParams(num_tokens=tokens))
        self.tally.evict_calls += 1
        if result.num_tokens_evicted > 0:
            self.tally.evictions += 1
            self.tally.evicted_tokens += result.num_tokens_evicted

    def request(self, tokens: list[int] | None = None) -> None:
        tokens = self.prompt() if tokens is None else tokens
        match = self.cache.match_prefix(MatchPrefixParams(key=key(tokens)))
        node = match.last_device_node
        receipt = self.lock(node)
        need = len(tokens) - match.device_prefix_len
        if self.alloc.available_size() < need:
            self.evict(need - self.alloc.available_size())
        slots = self.alloc.alloc(need) if need else torch.empty((0,), dtype=torch.int64)
        if slots is None:  # the pool is held by running requests: finish the oldest instead
            self.tally.skipped += 1
            self.unlock(node, receipt)
            self.finish_oldest()
            return
        value = torch.cat([self.cache.path_device_indices(node), slots])
        # prev_prefix_len: the slots this request already held from the tree (UnifiedRadixCache frees
        # the rest of any duplicate itself; RadixCache leaves that to the caller, as SGLang does).
        params = InsertParams(key=key(tokens), value=value, prev_prefix_len=match.device_prefix_len)
        result = self.cache.insert(params)
        self.tally.inserts += 1
        if result.prefix_len > match.device_prefix_len and not hasattr(self.cache, "tree_core"):
            self.alloc.free(value[match.device_prefix_len : result.prefix_len])
        leaf = self.cache.match_prefix(MatchPrefixParams(key=key(tokens))).last_device_node
        leaf_receipt = self.lock(leaf)
        self.unlock(node, receipt)
        self.running.append((leaf, leaf_receipt))
        if len(self.running) > self.window:
            self.finish_oldest()

    def finish_oldest(self) -> None:
        if self.running:
            self.unlock(*self.running.pop(0))

    def finish_all(self) -> None:
        while self.running:
            self.finish_oldest()

    def run(self, n: int) -> Driver:
        for _ in range(n):
            self.request()
        return self


# ----------------------------------------------------------------------------------------------
# An independent walk: what the tree holds, read without radixtop's code


@dataclass
class TreeFigures:
    nodes: int
    tokens: int
    evictable: int  # tokens on nodes with KV and lock_ref <= 0 (RadixCache counts -1 as evictable)
    protected: int  # tokens on nodes with KV and lock_ref > 0
    histogram: dict[int, int]
    rows: set[tuple[int, int, int, bool]]  # (id, tokens, lock_ref, evicted) per non-root node


def root_of(cache: Any) -> Any:
    core = getattr(cache, "tree_core", None)
    return core.root_node if core is not None else cache.root_node


def held(node: Any) -> Any:
    """Where lock_ref and value live: the node (RadixCache) or its FULL component data."""
    return node.component_data[ComponentType.FULL] if hasattr(node, "component_data") else node


def walk(cache: Any) -> TreeFigures:
    root = root_of(cache)
    stack = list(root.children.values())
    nodes = tokens = evictable = protected = 0
    histogram: dict[int, int] = {}
    rows = set()
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        data = held(node)
        n = len(node.key)
        nodes += 1
        tokens += n
        histogram[data.lock_ref] = histogram.get(data.lock_ref, 0) + 1
        if data.value is not None:
            if data.lock_ref > 0:
                protected += n
            else:
                evictable += n
        rows.add((node.id, n, data.lock_ref, data.value is None))
    return TreeFigures(nodes, tokens, evictable, protected, histogram, rows)
