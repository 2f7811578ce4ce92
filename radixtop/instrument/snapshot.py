"""Snapshots of an SGLang-shaped radix tree, taken on the scheduler thread at a safe point.

Runs inside the host's scheduler: standard library only, never reads KV tensors (`node.value is
None` and len(node.key) only), never recurses (trees 10k deep are fine), never indexes a node's
`children` (SGLang's is a defaultdict: a lookup would insert).

Keys are read as `getattr(key, "token_ids", key)`: SGLang's RadixKey keeps them in .token_ids,
older releases use plain lists.

Two node shapes are walked: RadixCache's TreeNode (`node.lock_ref`, `node.value`) and the Python
TreeCore's UnifiedTreeNode behind UnifiedRadixCache (`node.component_data[FULL].lock_ref` and
`.value`, FULL being component 0); `node_shape(root)` tells which. The Rust TreeCore keeps its
tree out of Python's reach: sizes only, and the reason says how to get the tree.

Two walks with separate cost bounds:
- the detail walk (every snapshot) visits at most `max_nodes` nodes best-first (locked nodes first,
  then the heaviest subtree by tokens), so its cost does not grow with the tree;
- the census (full walk: node count, lock_ref histogram, shape digest, subtree weights) runs only
  while its measured cost stays under `census_duty` of the scheduler's time, and stops after
  `census_max_nodes` nodes, so one census is one bounded pause. Between censuses the detail walk
  orders nodes by the last census's weights and estimates what it cut.
"""

from __future__ import annotations

import heapq
import time
from bisect import bisect_left
from dataclasses import dataclass
from typing import Any

from radixtop.schema import (
    MAX_HEAD_TOKENS,
    MAX_TREE_NODES,
    SCHEMA_VERSION,
    Census,
    Counters,
    NodeRow,
    Snapshot,
    TreeView,
)

_MASK64 = (1 << 64) - 1
_K1, _K2, _K3 = 0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9  # odd 64-bit mixers
_RUST_CORE_HINT = "restart the server with SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python to see the tree"


@dataclass(frozen=True)
class SnapshotConfig:
    max_nodes: int = 256  # detail-walk budget, and the server-side cap on ?budget=
    census_max_nodes: int = 50_000  # a census stops here (bounds one pause); 0 disables it
    census_duty: float = 0.0025  # at most this fraction of scheduler time goes to censuses
    head_tokens: int = 4  # token ids shown per node (the start of its key)
    max_scan: int = 1024  # children the detail walk may look at (bounds it on very wide nodes)

    def __post_init__(self) -> None:
        if not 0 <= self.max_nodes <= MAX_TREE_NODES:
            raise ValueError(f"max_nodes must be in [0, {MAX_TREE_NODES}], got {self.max_nodes}")
        if self.census_max_nodes < 0 or not 0 <= self.census_duty <= 1:
            raise ValueError("census_max_nodes must be >= 0 and census_duty in [0, 1]")
        if not 0 <= self.head_tokens <= MAX_HEAD_TOKENS or self.max_scan < 1:
            raise ValueError(f"head_tokens must be in [0, {MAX_HEAD_TOKENS}] and max_scan >= 1")


# ----------------------------------------------------------------------------------------------
# Reading the cache without trusting it


def _int_or_none(value: Any) -> int | None:
    # Plain ints only: int() of a tensor would call .item() and sync the GPU.
    return value if type(value) is int else None


def _call_int(obj: Any, name: str) -> int | None:
    try:
        fn = getattr(obj, name, None)
        return _int_or_none(fn()) if callable(fn) else None
    except Exception:
        return None


@dataclass(frozen=True)
class CacheSizes:
    page_size: int | None
    capacity_tokens: int | None
    available_tokens: int | None
    evictable_tokens: int | None
    protected_tokens: int | None


def read_sizes(cache: Any) -> CacheSizes:
    """O(1) figures every SGLang prefix cache has, whatever its tree looks like."""
    try:
        alloc = getattr(cache, "token_to_kv_pool_allocator", None)
        capacity = _int_or_none(getattr(alloc, "size", None)) if alloc is not None else None
        page = _int_or_none(getattr(cache, "page_size", None))
    except Exception:
        alloc, capacity, page = None, None, None
    return CacheSizes(
        page_size=page,
        capacity_tokens=capacity,
        available_tokens=_call_int(alloc, "available_size") if alloc is not None else None,
        evictable_tokens=_call_int(cache, "evictable_size"),
        protected_tokens=_call_int(cache, "protected_size"),
    )


CLASSIC, UNIFIED = "classic", "unified"
_FULL = 0  # sglang's ComponentType.FULL: the index of the full-attention KV in component_data


def node_shape(node: Any) -> str | None:
    """CLASSIC for RadixCache's TreeNode, UNIFIED for the Python TreeCore's node, else None."""
    if hasattr(node, "lock_ref"):
        return CLASSIC
    data = getattr(node, "component_data", None)
    if isinstance(data, (list, tuple)) and len(data) > _FULL and hasattr(data[_FULL], "lock_ref"):
        return UNIFIED
    return None


def _attr(obj: Any, name: str) -> Any:
    # Some caches expose properties that raise (the Rust TreeCore's root_node is NotImplemented).
    try:
        return getattr(obj, name, None)
    except Exception:
        return None


def find_root(cache: Any) -> tuple[Any, str]:
    """(root node, "") when the tree can be walked from Python, else (None, why not, plainly)."""
    cls = type(cache).__name__
    try:
        if getattr(cache, "disable", False) is True:
            return None, f"{cls}: the radix cache is disabled (--disable-radix-cache), so there is no tree"
        core = _attr(cache, "tree_core")
        core_name = type(core).__name__ if core is not None else "its tree core"
        rust = (
            f"{cls} keeps its tree in {core_name} (the Rust TreeCore), which Python cannot walk: "
            f"sizes only; {_RUST_CORE_HINT}"
        )
        if core is not None and "Rust" in core_name:
            return None, rust
        root = _attr(core, "root_node") if core is not None else None
        if root is None:
            root = _attr(cache, "root_node")
        if root is not None and isinstance(getattr(root, "children", None), dict) and node_shape(root) is not None:
            return root, ""
        if core is not None or "Unified" in cls:
            return None, rust
        return None, f"{cls} has no root_node with a children dict: sizes only"
    except Exception as exc:
        return None, f"{cls}: reading the tree root failed ({type(exc).__name__}): sizes only"


# ----------------------------------------------------------------------------------------------
# Census: one bounded full walk


@dataclass
class _CensusResult:
    census: Census
    taken_at: float  # time.monotonic()
    hints: dict[int, int]  # id(node) -> subtree tokens, for the heaviest part of the tree


def run_census(root: Any, limit: int, hint_cap: int, unified: bool = False) -> _CensusResult:
    """Breadth-first over the whole tree (at most `limit` non-root nodes), iteratively.
    `unified`: the nodes are UnifiedTreeNodes (see node_shape).

    The loop allocates no GC-tracked objects per node (list appends and int arithmetic only), so
    a census of a big tree does not set off garbage collections in the host."""
    started = time.perf_counter()
    nodes = [root]
    parents = [-1]
    tokens = [0]
    hashes = [0]
    hist: dict[int, int] = {}
    add_node, add_parent, add_tokens, add_hash = nodes.append, parents.append, tokens.append, hashes.append
    hist_get = hist.get
    digest = 0
    total = 0
    complete = True
    i = 0
    while i < len(nodes):
        children = nodes[i].children
        if children:
            if len(nodes) + len(children) > limit + 1:
                complete = False
                break
            h = hashes[i]
            for child in children.values():
                key = child.key
                ids = getattr(key, "token_ids", key)
                n = len(ids)
                lr = child.component_data[0].lock_ref if unified else child.lock_ref
                hist[lr] = hist_get(lr, 0) + 1
                # The node's shape hash chains its parent's, so it depends on the whole path.
                ch = ((h ^ (n * _K1)) * _K2 + (hash(ids[0]) * _K3 + hash(ids[-1]) if n else 0)) & _MASK64
                ch ^= ch >> 31
                digest += ch
                total += n
                add_node(child)
                add_parent(i)
                add_tokens(n)
                add_hash(ch)
        i += 1
    # Subtree weights: BFS order puts every child after its parent, so one reverse pass sums them.
    weights = tokens
    for j in range(len(nodes) - 1, 0, -1):
        weights[parents[j]] += weights[j]
    hints = _heavy_hints(nodes, parents, weights, hint_cap)
    census = Census(
        complete=complete,
        node_count=len(nodes) - 1,
        total_tokens=total,
        lock_ref_histogram=hist,
        digest=f"{digest & _MASK64:016x}" if complete else "",
        age_s=0.0,
        seconds=time.perf_counter() - started,
    )
    return _CensusResult(census=census, taken_at=time.monotonic(), hints=hints)


def _heavy_hints(nodes: list[Any], parents: list[int], weights: list[int], cap: int) -> dict[int, int]:
    """Subtree weights for the nodes a best-first walk from the root would meet first (<= cap)."""
    hints: dict[int, int] = {id(nodes[0]): weights[0]}
    heap = [(-weights[0], 0)]
    n = len(nodes)
    while heap and len(hints) < cap:
        _, i = heapq.heappop(heap)
        # Children of i are contiguous in BFS order, and `parents` is sorted.
        j = bisect_left(parents, i, 1)
        while j < n and parents[j] == i and len(hints) < cap:
            hints[id(nodes[j])] = weights[j]
            heapq.heappush(heap, (-weights[j], j))
            j += 1
    return hints


# ----------------------------------------------------------------------------------------------
# Detail walk: bounded best-first


@dataclass
class _Walk:
    rows: list[NodeRow]
    walked_tokens: int
    exhausted: bool  # every node was visited (nothing cut)


_new_row = tuple.__new__  # builds a NodeRow in C, skipping the NamedTuple's Python-level __new__


def _row(node: Any, parent_row: int, tokens: int, ids: Any, weight: int | None, head_n: int, unified: bool = False) -> NodeRow:
    nid = getattr(node, "id", None)
    hits = getattr(node, "hit_count", None)
    last = getattr(node, "last_access_time", None)
    if type(last) is not float or not -1e300 < last < 1e300:  # also drops NaN
        last = float(last) if type(last) is int and -1e300 < last < 1e300 else None
    head = ids[:head_n] if head_n else ()
    for t in head:
        if type(t) is not int:  # e.g. EAGLE's bigram keys: not token ids we can show
            head = ()
            break
    held = node.component_data[_FULL] if unified else node
    return _new_row(
        NodeRow,
        (
            nid if type(nid) is int else None,
            parent_row,
            tokens,
            held.lock_ref,
            held.value is None,  # the only thing ever asked of a KV tensor
            hits if type(hits) is int else None,
            last,
            len(node.children),
            weight,
            tuple(head),
        ),
    )


def walk_tree(root: Any, budget: int, hints: dict[int, int], head_n: int, scan_limit: int, unified: bool = False) -> _Walk:
    """Best-first from the root: at most `budget` nodes, at most `scan_limit` children looked at."""
    heappush, heappop, hints_get = heapq.heappush, heapq.heappop, hints.get
    root_key = getattr(root, "key", None)
    root_ids = getattr(root_key, "token_ids", root_key) if root_key is not None else ()
    rows = [_row(root, -1, len(root_ids), root_ids, hints_get(id(root)), head_n, unified)]
    heap: list[tuple[int, int, int, Any, int]] = []
    counter = 0
    walked_tokens = 0
    truncated = pending = False
    node, row_index = root, 0
    while True:
        if len(rows) > budget:
            pending = bool(node.children)  # the last node taken has children we did not look at
            break
        for child in node.children.values():
            if counter >= scan_limit:
                truncated = True
                break
            weight = hints_get(id(child))
            if weight is None:
                key = child.key
                weight = len(getattr(key, "token_ids", key))
            # Locked (or negative) nodes first, then the heaviest subtree; counter keeps it stable.
            locked = child.component_data[0].lock_ref if unified else child.lock_ref
            heappush(heap, (0 if locked else 1, -weight, counter, child, row_index))
            counter += 1
        if not heap:
            break
        node, row_index = heappop(heap)[3:]
        key = node.key
        ids = getattr(key, "token_ids", key)
        n = len(ids)
        walked_tokens += n
        rows.append(_row(node, row_index, n, ids, hints_get(id(node)), head_n, unified))
        row_index = len(rows) - 1
    return _Walk(rows=rows, walked_tokens=walked_tokens, exhausted=not heap and not truncated and not pending)


# ----------------------------------------------------------------------------------------------
# The snapshotter (scheduler thread only)


class TreeSnapshotter:
    """Keeps the census schedule and weight hints between snapshots. Not thread-safe by design:
    call it from the thread that mutates the tree, at a point where the tree is consistent."""

    def __init__(self, config: SnapshotConfig | None = None) -> None:
        self.config = config or SnapshotConfig()
        self._census: _CensusResult | None = None
        self._next_census_at = 0.0
        self._root_id: int | None = None
        self.last_census_seconds = 0.0  # what the census cost in the latest take() (0: none ran)

    def take(
        self,
        cache: Any,
        *,
        rank: int = 0,
        instance: str = "0",
        seq: int = 0,
        counters: Counters | None = None,
        hooks_state: str = "off",
        events_seq: int = 0,
        force_census: bool = False,
    ) -> Snapshot:
        """Never raises for a strange cache: what cannot be read is reported in `reason`."""
        started = time.perf_counter()
        self.last_census_seconds = 0.0
        sizes = read_sizes(cache)
        root, reason = find_root(cache)
        census: Census | None = None
        tree: TreeView | None = None
        if root is not None:
            try:
                census, tree = self._walk(root, sizes, force_census)
            except Exception as exc:  # a tree we do not understand: still report the sizes
                reason = f"walking the tree failed ({type(exc).__name__}: {str(exc)[:200]}): sizes only"
                census, tree, root = None, None, None
        return Snapshot(
            schema_version=SCHEMA_VERSION,
            rank=rank,
            instance=instance,
            seq=seq,
            time=time.time(),
            monotonic=time.monotonic(),
            seconds=time.perf_counter() - started,
            cache_class=type(cache).__name__[:200],
            walkable=root is not None,
            reason=reason,
            page_size=sizes.page_size,
            capacity_tokens=sizes.capacity_tokens,
            available_tokens=sizes.available_tokens,
            evictable_tokens=sizes.evictable_tokens,
            protected_tokens=sizes.protected_tokens,
            hooks_state=hooks_state,
            counters=counters or Counters(),
            events_seq=events_seq,
            census=census,
            tree=tree,
        )

    def _walk(self, root: Any, sizes: CacheSizes, force_census: bool) -> tuple[Census | None, TreeView]:
        cfg = self.config
        now = time.monotonic()
        unified = node_shape(root) == UNIFIED
        if id(root) != self._root_id:  # a reset() replaced the root: old hints are meaningless
            self._census, self._root_id, self._next_census_at = None, id(root), 0.0
        fresh = False
        if cfg.census_max_nodes and (force_census or (cfg.census_duty > 0 and now >= self._next_census_at)):
            result = run_census(root, cfg.census_max_nodes, cfg.max_scan, unified)
            self._census = result
            fresh = True
            cost = self.last_census_seconds = result.census.seconds
            self._next_census_at = now + (cost / cfg.census_duty if cfg.census_duty > 0 else float("inf"))
        hints = self._census.hints if self._census is not None else {}
        walk = walk_tree(root, cfg.max_nodes, hints, cfg.head_tokens, cfg.max_scan, unified)
        walked = len(walk.rows) - 1
        census = _aged(self._census) if self._census is not None else None
        cut_nodes: int | None
        cut_tokens: int | None
        if walk.exhausted:
            cut_nodes, cut_tokens, exact = 0, 0, True
        elif fresh and census is not None and census.complete:
            cut_nodes = max(0, census.node_count - walked)
            cut_tokens = max(0, census.total_tokens - walk.walked_tokens)
            exact = True
        else:
            exact = False
            cut_nodes = max(0, census.node_count - walked) if census is not None and census.complete else None
            resident = (
                sizes.evictable_tokens + sizes.protected_tokens
                if sizes.evictable_tokens is not None and sizes.protected_tokens is not None
                else None
            )
            cut_tokens = max(0, resident - walk.walked_tokens) if resident is not None else None
        tree = TreeView(
            budget=cfg.max_nodes,
            walked_nodes=walked,
            walked_tokens=walk.walked_tokens,
            cut_nodes=cut_nodes,
            cut_tokens=cut_tokens,
            cut_exact=exact,
            nodes=tuple(walk.rows),
        )
        return census, tree


def _aged(result: _CensusResult) -> Census:
    c = result.census
    return Census(
        complete=c.complete,
        node_count=c.node_count,
        total_tokens=c.total_tokens,
        lock_ref_histogram=c.lock_ref_histogram,
        digest=c.digest,
        age_s=max(0.0, time.monotonic() - result.taken_at),
        seconds=c.seconds,
    )
