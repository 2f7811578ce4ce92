"""Snapshots of an SGLang-shaped radix tree, read on the scheduler thread at a safe point.

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
  then the heaviest subtree by tokens), looking at most at `max_scan` children, so its cost does
  not grow with the tree. On the scheduler thread it only reads: capture() returns raw tuples
  (a Capture); Capture.build() checks and converts them into a Snapshot on another thread, where
  the endpoint also serialises it;
- the census (node count, lock_ref histogram, shape digest, subtree weights for the detail walk's
  order) covers the whole tree, `census_slice` units of work per census_step() (one safe point),
  the endpoint spacing the steps so they take at most `census_duty` of the scheduler's time: no
  long pause, whatever the tree's size. A census says over how many slices and seconds it was
  assembled (Census.slices, span_s) and how old its first slice is (age_s).
"""

from __future__ import annotations

import heapq
import time
from array import array
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from radixtop.instrument import holders as holders_mod
from radixtop.instrument import slot_chains
from radixtop.schema import (
    MAX_HEAD_TOKENS,
    MAX_TREE_NODES,
    SCHEMA_VERSION,
    Census,
    Counters,
    Holder,
    NodeRow,
    Sharer,
    Snapshot,
    TreeView,
)

_MASK64 = (1 << 64) - 1
_K1, _K2, _K3 = 0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9  # odd 64-bit mixers
_RUST_CORE_HINT = "restart the server with SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python to see the tree"
_RUST_WALK_NOTE = (
    "Rust TreeCore: the tree rebuilt from its KV-canary walk (a node = an unbranched run of slots of "
    "one lock state); lock counts (locked or not only), hits and last access are unknown, and token ids "
    "are known only on the paths of requests that hold or held a lock there"
)


@dataclass(frozen=True)
class SnapshotConfig:
    # Detail-walk budget (and the server-side cap on ?budget=): 128 rows is three screens of the
    # radix pane, and 128 / 512 keeps 2 captures/s of a 100k-node tree with the census under 0.8 %
    # of the scheduler thread (256 / 1024 took 1.2-1.6 % on the shared box, benchmarks/README.md).
    max_nodes: int = 128
    census_max_nodes: int = 2_000_000  # a census gives up (complete=False) past this (a memory bound); 0: no census
    census_slice: int = 192  # census work per step (a node counted or expanded; 4 leaves): a few hundred µs
    census_duty: float = 0.003  # at most this fraction of scheduler time goes to census steps
    # Token ids sent per node (the start of its key): the radix pane decodes them into a row's text,
    # and 32 fill a wide pane's column. Against 4, for a 128-row walk (measured): +7 % capture time on
    # the scheduler thread (16 us of 250), and the endpoint's JSON from 10 KB to 32 KB.
    head_tokens: int = 32
    max_scan: int = 512  # children the detail walk may look at (bounds it on very wide nodes)

    def __post_init__(self) -> None:
        if not 0 <= self.max_nodes <= MAX_TREE_NODES:
            raise ValueError(f"max_nodes must be in [0, {MAX_TREE_NODES}], got {self.max_nodes}")
        if self.census_max_nodes < 0 or self.census_slice < 0 or not 0 <= self.census_duty <= 1:
            raise ValueError("census_max_nodes and census_slice must be >= 0 and census_duty in [0, 1]")
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


def rust_core(cache: Any) -> Any:
    """The cache's Rust TreeCore when its KV-canary walk can rebuild the tree (slot_chains.py)."""
    core = _attr(cache, "tree_core")
    return core if core is not None and "Rust" in type(core).__name__ and slot_chains.walkable(core) else None


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
# Census: a full walk, a bounded slice at a time


@dataclass
class _CensusResult:
    census: Census  # age_s 0; _aged() fills it in when published
    started_at: float  # time.monotonic() when the first slice began (the oldest figure in it)
    taken_at: float  # time.monotonic() when the last slice ended
    hints: dict[int, int]  # id(node) -> subtree tokens, for the heaviest part of the tree
    keep: list[Any]  # the hinted nodes, held so their ids cannot be reused while hints are in use
    activity: tuple[Any, ...] | None = None  # the tree's mutation counters at the first slice (None: none to read)


_WALK, _SUM, _HINTS, _FREE, _DONE = 0, 1, 2, 3, 4


class CensusRun:
    """One census of the whole tree, advanced a bounded slice at a time by step() (a safe point
    each), with its state (a BFS queue as flat lists, the node being expanded, the partial sums)
    kept between slices. Then a reverse pass, also sliced, sums subtree weights and keeps the
    heaviest `hint_cap` of them for the detail walk.

    The tree moves between slices. A node is counted when its parent is expanded, and every node
    has one parent at a time, so nothing is counted twice: a node evicted before its parent is
    expanded is never seen; one evicted after is counted (it was there) and, being a leaf, expands
    to nothing; a node split after it was counted keeps its count (the new node above it hangs
    under a parent already expanded, so it is not seen). The result is therefore a census
    assembled over `slices` safe points (its `span_s`), not an instant: it is exact when the tree
    did not move meanwhile, as any one-slice census is.

    The per-node loop allocates one short-lived tuple (for hash()) and keeps no object per node
    beyond the node references themselves."""

    def __init__(self, root: Any, *, unified: bool = False, hint_cap: int = 1024, max_nodes: int = 0) -> None:
        self.root = root
        self.unified = unified
        self.hint_cap = max(1, hint_cap)
        self.max_nodes = max_nodes  # 0: no cap (a memory bound, not a pause bound)
        self.nodes: list[Any] = [root]
        # Flat C arrays, not lists: no int object per entry, so dropping them at the end is free
        # (freeing 300k ints took a few ms: the longest pause of a census in lists).
        self.parents = array("q", [-1])
        self.tokens = array("q", [0])  # then subtree weights, after the reverse pass
        self.hashes = array("q", [0])
        self.histogram: Counter[Any] = Counter()
        self.digest = 0
        self.total = 0
        self.complete = True
        self.phase = _WALK
        self.i = 0  # the next node to expand
        self.pending: list[Any] | None = None  # children of nodes[i] not yet counted (a wide node)
        self.pos = 0
        self.j = 0  # the reverse pass's next index
        self.heap: list[tuple[int, int]] = []
        self.floor = -1
        self.slices = 0
        self.seconds = 0.0
        self.started_at = time.monotonic()
        self.counted = 0  # nodes counted, once the walk is over
        self.keep: list[Any] = []
        self.hints: dict[int, int] = {}
        self.result: _CensusResult | None = None
        self.activity: tuple[Any, ...] | None = None  # the tree's mutation counters at the first slice (the owner's)

    @property
    def done(self) -> bool:
        return self.phase == _DONE

    @property
    def node_count(self) -> int:
        return self.counted if self.phase != _WALK else len(self.nodes) - 1

    def step(self, work: int) -> bool:
        """Do about `work` units (a node counted, a node expanded, four leaves passed, four
        nodes summed, one hint kept, eight references dropped); True
        once the census is done (then `result` is set)."""
        started = time.thread_time()
        self.slices += 1
        try:
            if self.phase == _WALK:
                work = self._walk(work)
            if self.phase == _SUM and work > 0:
                work = self._sum(work * 4) // 4
            if self.phase == _HINTS and work > 0:
                work = self._hints(work)
            if self.phase == _FREE and work > 0:
                self._free(work * 8)
        finally:
            self.seconds += time.thread_time() - started
        if self.phase == _DONE and self.result is None:
            self._finish()
        return self.phase == _DONE

    def _walk(self, work: int) -> int:
        nodes, parents, tokens, hashes = self.nodes, self.parents, self.tokens, self.hashes
        lock_refs: list[Any] = []  # this slice's; counted into the histogram at its end (in C)
        add_node, add_parent, add_tokens, add_hash, add_lr = (
            nodes.append, parents.append, tokens.append, hashes.append, lock_refs.append,
        )
        unified = self.unified
        limit = self.max_nodes + 1 if self.max_nodes else 1 << 62
        i, pending, pos = self.i, self.pending, self.pos
        digest, total = self.digest, self.total
        while work > 0:
            if pending is None:
                if i >= len(nodes):
                    self.phase = _SUM
                    self.j = len(nodes) - 1
                    self.counted = len(nodes) - 1
                    break
                children = nodes[i].children
                if not children:
                    i += 1
                    if not i & 3:  # a leaf is one attribute read: four of them make a unit
                        work -= 1
                    continue
                work -= 1
                if len(nodes) + len(children) > limit:
                    self.complete = False
                    self.counted = len(nodes) - 1
                    self.phase = _FREE  # no weights from half a tree
                    break
                pending, pos = list(children.values()), 0  # a copy: the dict may change between slices
            end = min(len(pending), pos + work)
            h = hashes[i]
            for child in pending[pos:end] if pos or end < len(pending) else pending:
                key = child.key
                ids = getattr(key, "token_ids", key)
                n = len(ids)
                add_lr(child.component_data[0].lock_ref if unified else child.lock_ref)
                # The node's shape hash chains its parent's, so it depends on the whole path.
                ch = hash((h, n, ids[0], ids[-1])) if n else hash((h, 0))
                digest += ch
                total += n
                add_node(child)
                add_parent(i)
                add_tokens(n)
                add_hash(ch)
            work -= end - pos
            pos = end
            if pos >= len(pending):
                pending = None
                i += 1
        self.i, self.pending, self.pos = i, pending, pos
        self.digest, self.total = digest, total
        self.histogram.update(lock_refs)
        return work

    def _sum(self, work: int) -> int:
        # BFS order puts every node after its parent, so a reverse pass sums subtree weights, and a
        # node's weight is final when the pass reaches it: keep the heaviest hint_cap on the way.
        weights, parents, heap, cap = self.tokens, self.parents, self.heap, self.hint_cap
        heappush, heapreplace = heapq.heappush, heapq.heapreplace
        floor = self.floor
        j = self.j
        stop = max(0, j - work)
        while j > stop:
            w = weights[j]
            weights[parents[j]] += w
            if w > floor:
                if len(heap) < cap:
                    heappush(heap, (w, j))
                    if len(heap) == cap:
                        floor = heap[0][0]
                else:
                    heapreplace(heap, (w, j))
                    floor = heap[0][0]
            j -= 1
        done = self.j - j
        self.j, self.floor = j, floor
        if j <= 0:
            self.phase = _HINTS
            self.j = 0
            self.hints[id(self.root)] = self.tokens[0]
        return work - done

    def _hints(self, work: int) -> int:
        # The heaviest nodes are scattered in memory: touching a thousand of them is a slice's work.
        nodes, weights, heap, keep, hints = self.nodes, self.tokens, self.heap, self.keep, self.hints
        j = self.j
        stop = min(len(heap), j + work)
        for _, k in heap[j:stop]:
            node = nodes[k]
            keep.append(node)
            hints[id(node)] = weights[k]
        work -= stop - j
        self.j = stop
        if stop >= len(heap):
            self.phase = _FREE
        return work

    def _free(self, work: int) -> None:
        # Dropping 100k node references touches 100k nodes: a slice at a time, too.
        del self.nodes[max(1, len(self.nodes) - work) :]
        if len(self.nodes) <= 1:
            self.phase = _DONE

    def _finish(self) -> None:
        keep, hints = (self.keep, self.hints) if self.complete else ([], {})
        census = Census(
            complete=self.complete,
            node_count=self.counted,
            total_tokens=self.total,
            lock_ref_histogram=dict(self.histogram),
            digest=f"{self.digest & _MASK64:016x}" if self.complete else "",
            age_s=0.0,
            seconds=self.seconds,
            slices=self.slices,
            span_s=max(0.0, time.monotonic() - self.started_at),
        )
        self.result = _CensusResult(census, self.started_at, time.monotonic(), hints, keep)
        # Drop the walk's state: only the result lives on.
        self.nodes, self.parents, self.tokens, self.hashes = [], array("q"), array("q"), array("q")
        self.pending, self.heap, self.keep, self.hints = None, [], [], {}

    def partial(self) -> Census:
        """What the census has counted so far (complete=False: a lower bound, no digest)."""
        return Census(
            complete=False,
            node_count=self.node_count,
            total_tokens=self.total,
            lock_ref_histogram=dict(self.histogram),
            digest="",
            age_s=max(0.0, time.monotonic() - self.started_at),
            seconds=self.seconds,
            slices=self.slices,
            span_s=max(0.0, time.monotonic() - self.started_at),
        )


def run_census(root: Any, limit: int, hint_cap: int, unified: bool = False) -> _CensusResult:
    """A whole census in one go (at most `limit` non-root nodes; 0: no limit): for tests, the
    benchmark and force_census. The endpoint slices it instead (CensusRun.step)."""
    run = CensusRun(root, unified=unified, hint_cap=hint_cap, max_nodes=limit)
    while not run.step(1 << 30):
        pass
    assert run.result is not None
    return run.result


# ----------------------------------------------------------------------------------------------
# Detail walk: bounded best-first


@dataclass
class _Walk:
    rows: list[tuple[Any, ...]]  # raw rows (see _capture_row); NodeRows once Capture.build() cleans them
    walked_tokens: int
    exhausted: bool  # every node was visited (nothing cut)


_new_row = tuple.__new__  # builds a NodeRow in C, skipping the NamedTuple's Python-level __new__
_COUNTER_BITS = 32
_COUNTER_MASK = (1 << _COUNTER_BITS) - 1
_UNLOCKED = 1 << 50  # heap keys: locked (or negative) nodes first, then the heaviest, then the first seen


def _capture_row(
    node: Any, parent_row: int, tokens: int, ids: Any, weight: int | None, head_n: int, unified: bool
) -> tuple[Any, ...]:
    """What must be read while the scheduler owns the tree, as read: no checks, no conversions
    (Capture.build() does those on the endpoint's thread). The head is a slice: a copy of the
    token ids for lists and arrays, so the scheduler may change the key afterwards."""
    try:
        nid, hits, last = node.id, node.hit_count, node.last_access_time
    except AttributeError:
        nid, hits, last = (
            getattr(node, "id", None), getattr(node, "hit_count", None), getattr(node, "last_access_time", None)
        )
    held = node.component_data[_FULL] if unified else node
    return (
        nid, parent_row, tokens, held.lock_ref, held.value is None, hits, last, len(node.children), weight,
        ids[:head_n] if head_n else (),
    )


def walk_tree(
    root: Any, budget: int, hints: dict[int, int], head_n: int, scan_limit: int, unified: bool = False
) -> _Walk:
    """Best-first from the root: at most `budget` nodes, at most `scan_limit` children looked at.

    The heap holds plain ints (priority << 32 | arrival), the candidates sit in two lists indexed
    by arrival: no tuple per child and int comparisons only (tuples made the heap the walk's
    biggest cost). With a census's hints, a scanned child is ordered by its hinted subtree weight
    and an unhinted one (lighter than every hinted node) by arrival: its key is not read until it
    is taken, so a scan touches one object per child. Without hints, the child's own key length."""
    heappush, heappop, hints_get = heapq.heappush, heapq.heappop, hints.get
    scan_limit = min(scan_limit, _COUNTER_MASK)
    root_key = getattr(root, "key", None)
    root_ids = getattr(root_key, "token_ids", root_key) if root_key is not None else ()
    rows = [_capture_row(root, -1, len(root_ids), root_ids, hints_get(id(root)), head_n, unified)]
    add_row = rows.append
    heap: list[int] = []
    cands: list[Any] = []
    cand_parents: list[int] = []
    add_cand, add_cand_parent = cands.append, cand_parents.append
    counter = 0
    walked_tokens = 0
    truncated = pending = False
    read_keys = not hints
    node, row_index = root, 0
    while True:
        if len(rows) > budget:
            pending = bool(node.children)  # the last node taken has children we did not look at
            break
        children = node.children
        if children:
            if counter + len(children) > scan_limit:
                truncated = True
            for child in children.values():
                if counter >= scan_limit:
                    break
                weight = hints_get(id(child))
                if weight is None:
                    if read_keys:
                        key = child.key
                        weight = len(getattr(key, "token_ids", key))
                    else:
                        weight = 0
                locked = child.component_data[0].lock_ref if unified else child.lock_ref
                heappush(heap, ((_UNLOCKED - weight if locked == 0 else -weight) << _COUNTER_BITS) | counter)
                add_cand(child)
                add_cand_parent(row_index)
                counter += 1
        if not heap:
            break
        c = heappop(heap) & _COUNTER_MASK
        node = cands[c]
        key = node.key
        ids = getattr(key, "token_ids", key)
        n = len(ids)
        walked_tokens += n
        add_row(_capture_row(node, cand_parents[c], n, ids, hints_get(id(node)), head_n, unified))
        row_index = len(rows) - 1
    return _Walk(rows=rows, walked_tokens=walked_tokens, exhausted=not heap and not truncated and not pending)


_HEAD_TYPES = (list, tuple, array)


def _clean_row(raw: tuple[Any, ...]) -> NodeRow:
    """A raw row as NodeRow, with the checks _capture_row left out: plain ints only (int() of a
    tensor would sync the GPU), finite floats, token ids that are ints (EAGLE's bigram keys are
    not)."""
    nid, parent, tokens, lock_ref, evicted, hits, last, children, weight, head = raw
    if type(last) is not float or not -1e300 < last < 1e300:  # also drops NaN
        last = float(last) if type(last) is int and -1e300 < last < 1e300 else None
    if type(head) in _HEAD_TYPES:
        head = tuple(head)
        for t in head:
            if type(t) is not int:
                head = ()
                break
    else:
        head = ()
    return _new_row(
        NodeRow,
        (
            nid if type(nid) is int else None,
            parent,
            tokens,
            lock_ref,
            evicted,
            hits if type(hits) is int else None,
            last,
            children,
            weight,
            head,
        ),
    )


# ----------------------------------------------------------------------------------------------
# Capture (scheduler thread) and build (any other thread)


@dataclass(frozen=True)
class Capture:
    """What a snapshot read on the scheduler thread, as plain values and raw row tuples; build()
    turns it into a checked Snapshot (and the endpoint serialises that) on another thread."""

    rank: int
    instance: str
    seq: int
    time: float
    monotonic: float
    seconds: float
    cache_class: str
    walkable: bool
    reason: str
    sizes: CacheSizes
    hooks_state: str
    counters: Counters
    events_seq: int
    census: Census | None
    budget: int
    rows: tuple[tuple[Any, ...], ...] | None  # None: no tree
    walked_tokens: int
    cut_nodes: int | None
    cut_tokens: int | None
    cut_exact: bool
    slot_walk: slot_chains.SlotWalk | None = None  # the Rust TreeCore's walk, rebuilt in build()
    holders: tuple[holders_mod.RawHolder, ...] | None = None  # None: unknown
    sharers: tuple[holders_mod.RawHolder, ...] | None = None  # None: not remembered
    marks: tuple[Any, ...] = ()  # node ids, or on the Rust core locked paths' slots
    head_tokens: int = 0  # the Rust core: ids of a held path's chains sent per row

    def build(self) -> Snapshot:
        return self.build_marked()[0]

    def build_marked(self) -> tuple[Snapshot, tuple[int | None, ...]]:
        """The Snapshot, and each mark's node as the rows name it (None: unknown)."""
        if self.slot_walk is not None:
            return self._build_rebuilt(self.slot_walk)
        marks = tuple(m if type(m) is int else None for m in self.marks)
        holders = None if self.holders is None else holders_mod.named(self.holders)
        sharers = None if self.sharers is None else holders_mod.named_sharers(self.sharers)
        tree = None
        if self.rows is not None:
            tree = TreeView(
                budget=self.budget,
                walked_nodes=len(self.rows) - 1,
                walked_tokens=self.walked_tokens,
                cut_nodes=self.cut_nodes,
                cut_tokens=self.cut_tokens,
                cut_exact=self.cut_exact,
                nodes=tuple(map(_clean_row, self.rows)),
            )
        return self._snapshot(tree, "counts", holders, sharers), marks

    def _build_rebuilt(self, walk: slot_chains.SlotWalk) -> tuple[Snapshot, tuple[int | None, ...]]:
        """The Rust core: the tree rebuilt from the walk, the holders' and sharers' paths named and
        their heads filled from the requests' ids (slot_chains.build)."""
        raw, used = self.holders or (), self.sharers or ()
        held = [slot_chains.HeldPath(holders_mod.last_slot(h.node), _ids_reader(h.ids)) for h in (*raw, *used)]
        held += [slot_chains.HeldPath(holders_mod.last_slot(m), None) for m in self.marks]
        walked, census, ends = slot_chains.build(walk, self.budget, held, self.head_tokens)
        n, m = len(raw), len(raw) + len(used)
        holders = None if self.holders is None else holders_mod.named(raw, ends[:n])
        sharers = None if self.sharers is None else holders_mod.named_sharers(used, ends[n:m])
        rebuilt = replace(self, slot_walk=None, rows=None, census=census, walkable=True, reason=_RUST_WALK_NOTE)
        return rebuilt._snapshot(walked, "locked-only", holders, sharers), ends[m:]

    def _snapshot(
        self, tree: TreeView | None, lock_detail: str, holders: tuple[Holder, ...] | None,
        sharers: tuple[Sharer, ...] | None,
    ) -> Snapshot:
        s = self.sizes
        return Snapshot(
            schema_version=SCHEMA_VERSION,
            rank=self.rank,
            instance=self.instance,
            seq=self.seq,
            time=self.time,
            monotonic=self.monotonic,
            seconds=self.seconds,
            cache_class=self.cache_class,
            walkable=self.walkable,
            reason=self.reason,
            page_size=s.page_size,
            capacity_tokens=s.capacity_tokens,
            available_tokens=s.available_tokens,
            evictable_tokens=s.evictable_tokens,
            protected_tokens=s.protected_tokens,
            hooks_state=self.hooks_state,
            counters=self.counters,
            events_seq=self.events_seq,
            census=self.census,
            tree=tree,
            lock_detail=lock_detail,
            holders=holders,
            sharers=sharers,
        )


def _no_path(_node: Any) -> None:
    return None


def _path_reader(cache: Any) -> Callable[[Any], Any]:
    """The cache's path_device_indices (a node's device slots, root to it), where it has one."""
    path_of = getattr(cache, "path_device_indices", None)
    return path_of if callable(path_of) else _no_path


def _mark(node: Any, path_of: Callable[[Any], Any] | None) -> Any:
    """A node named by the cache's API, as the capture keeps it: its path's slots on the Rust core
    (read now, on the calling thread), else its id."""
    if path_of is None:
        return node
    try:
        return path_of(node) if type(node) is int else None
    except Exception:  # a node the core does not have
        return None


def _ids_reader(ids: tuple[Any, Any] | None) -> Callable[[int], int | None] | None:
    if ids is None:
        return None
    return lambda position: holders_mod.token_at(ids, position)


# ----------------------------------------------------------------------------------------------
# The snapshotter (scheduler thread only)


class TreeSnapshotter:
    """Keeps the census in progress, the last finished census and its weight hints between
    snapshots. Not thread-safe by design: call capture(), census_step() and take() from the thread
    that mutates the tree, at a point where the tree is consistent; Capture.build() may run anywhere.

    take() is the one-call form (a census slice when the census duty allows, then capture + build);
    the endpoint calls census_step() and capture() on the scheduler thread and builds elsewhere."""

    def __init__(
        self, config: SnapshotConfig | None = None, activity: Callable[[], tuple[Any, ...]] | None = None
    ) -> None:
        """`activity`: the hooks' mutation counters (lock, unlock and evict calls; they only grow),
        read with the pool's sizes at a census's first slice and at each capture: the census is
        at rest (Census.at_rest) while they have not moved."""
        self.config = config or SnapshotConfig()
        self.activity = activity
        self._run: CensusRun | None = None  # the census in progress
        self._census: _CensusResult | None = None  # the last finished one
        self.fresh = False  # the last finished census began and ended in the latest census_step()
        self._next_census_at = 0.0  # take()'s own duty schedule
        self._root_id: int | None = None
        self.last_census_seconds = 0.0  # what census work cost in the latest take() (0: none ran)

    # -- the census ---------------------------------------------------------------------------

    def census_step(self, cache: Any, work: int | None = None) -> float:
        """Advance the census by one slice (`work` units, default config.census_slice); starts a
        new census when the last one finished. Returns the seconds it took. Never raises."""
        started = time.thread_time()
        self.fresh = False
        cfg = self.config
        if not cfg.census_slice or not cfg.census_max_nodes:
            return 0.0
        try:
            root, _ = find_root(cache)
            if root is None:
                self._run = None
                return time.thread_time() - started
            self._check_root(root)
            run = self._run
            if run is None:
                run = self._run = CensusRun(
                    root, unified=node_shape(root) == UNIFIED, hint_cap=cfg.max_scan, max_nodes=cfg.census_max_nodes
                )
                run.activity = self._activity(read_sizes(cache))
            result = run.result if run.step(work or cfg.census_slice) else None  # step() True: result is set
            if result is not None:
                result.activity = run.activity
                self._census, self._run = result, None
                self.fresh = run.slices == 1
        except Exception:
            self._run = None  # a tree we do not understand: start over next time (the walk reports why)
        return time.thread_time() - started

    def _check_root(self, root: Any) -> None:
        if id(root) != self._root_id:  # a reset() replaced the root: old figures are meaningless
            self._census, self._run, self._root_id, self._next_census_at = None, None, id(root), 0.0

    def finish_census(self, cache: Any) -> float:
        """A whole fresh census now, in one pause (force_census; tests and benchmarks)."""
        started = time.thread_time()
        self._run = None
        while True:
            self.census_step(cache, 1 << 30)
            if self._run is None:
                break
        return time.thread_time() - started

    def _activity(self, sizes: CacheSizes) -> tuple[Any, ...] | None:
        """What moves when the tree does: the hooks' counters and the pool's sizes (None: nothing
        readable, so rest cannot be told)."""
        pool = (sizes.evictable_tokens, sizes.protected_tokens, sizes.available_tokens)
        if self.activity is None:
            return pool if pool != (None, None, None) else None
        return (*self.activity(), *pool)

    def census(self, sizes: CacheSizes | None = None) -> Census | None:
        """The last finished census, aged; else the one in progress, marked incomplete. With the
        pool's sizes read now, a finished census also says whether the tree is at rest since its
        first slice (Census.at_rest)."""
        if self._census is not None:
            census = _aged(self._census)
            if sizes is not None and self._census.activity is not None:
                census = replace(census, at_rest=self._activity(sizes) == self._census.activity)
            return census
        return self._run.partial() if self._run is not None else None

    # -- snapshots ----------------------------------------------------------------------------

    def take(self, cache: Any, *, force_census: bool = False, **capture_args: Any) -> Snapshot:
        """Never raises for a strange cache: what cannot be read is reported in `reason`.
        Runs a census slice first when census_duty allows (force_census: a whole census), then
        capture(cache, **capture_args) (rank, instance, seq, counters, hooks_state, events_seq)
        and builds it, all on this thread."""
        return self.take_marked(cache, force_census=force_census, **capture_args)[0]

    def take_marked(
        self, cache: Any, *, force_census: bool = False, **capture_args: Any
    ) -> tuple[Snapshot, tuple[int | None, ...]]:
        """take(), and capture_args' `marks` as the snapshot's rows name them (Capture.build_marked)."""
        cfg = self.config
        now = time.monotonic()
        self.last_census_seconds = 0.0
        if force_census:
            self.last_census_seconds = self.finish_census(cache)
        elif cfg.census_duty > 0 and now >= self._next_census_at:
            cost = self.last_census_seconds = self.census_step(cache)
            self._next_census_at = now + cost / cfg.census_duty
        fresh, self.fresh = self.fresh, False
        return self.capture(cache, census_fresh=fresh, **capture_args).build_marked()

    def capture(
        self,
        cache: Any,
        *,
        rank: int = 0,
        instance: str = "0",
        seq: int = 0,
        counters: Counters | None = None,
        hooks_state: str = "off",
        events_seq: int = 0,
        census_fresh: bool = False,
        holders: Sequence[holders_mod.Seen] | None = None,
        released: OrderedDict[tuple[Any, int], holders_mod.Released] | None = None,
        marks: Sequence[Any] = (),
    ) -> Capture:
        """The scheduler-thread part of a snapshot: sizes, the detail walk's raw rows, the census
        figures, the lock holders (HolderTracker.latest; None: unknown) and the requests that let go
        of theirs (HolderTracker.released, whose gone nodes it forgets). `census_fresh`: the tree
        has not moved since census_step() set `fresh` (the same safe point), so the cut can be
        counted exactly. `marks`: nodes as the cache's API names them (a NodeId, a node's id),
        which Capture.build_marked() names as the rows do. Never raises for a strange cache."""
        started = time.thread_time()
        sizes = read_sizes(cache)
        root, reason = find_root(cache)
        census: Census | None = None
        walk: _Walk | None = None
        cut: tuple[int | None, int | None, bool] = (None, None, False)
        slot_walk = None
        path_of: Callable[[Any], Any] | None = None  # how a node is named: None, by its id
        if root is not None:
            try:
                self._check_root(root)
                census, walk, cut = self._walk(root, sizes, census_fresh)
            except Exception as exc:  # a tree we do not understand: still report the sizes
                reason = f"walking the tree failed ({type(exc).__name__}: {str(exc)[:200]}): sizes only"
                census, walk, root = None, None, None
        elif (core := rust_core(cache)) is not None:
            path_of = _no_path  # no walk: the Rust core's nodes cannot be named
            held = (sizes.evictable_tokens or 0) + (sizes.protected_tokens or 0)
            if held > slot_chains.MAX_WALK_SLOTS:
                reason = (f"the Rust TreeCore holds {held:,} slots: its walk would pause the scheduler for "
                          f"too long (over {slot_chains.MAX_WALK_SLOTS:,}), sizes only")
            else:
                try:
                    slot_walk = slot_chains.read_walk(core)
                    path_of = _path_reader(cache)
                except Exception as exc:  # a core that panicked, say: sizes only, and why
                    reason = f"the Rust TreeCore's walk failed ({type(exc).__name__}: {str(exc)[:200]}): sizes only"
        now = time.monotonic()
        raw = None if holders is None else holders_mod.raw_holders(holders, now, path_of)
        sharers = None
        if released is not None and path_of is not _no_path:
            sharers = holders_mod.raw_sharers(released, holders or (), now, path_of)
        marked = tuple(_mark(m, path_of) for m in marks)
        return Capture(
            rank=rank,
            instance=instance,
            seq=seq,
            time=time.time(),
            monotonic=now,
            seconds=time.thread_time() - started,
            cache_class=type(cache).__name__[:200],
            walkable=root is not None,
            reason=reason,
            sizes=sizes,
            hooks_state=hooks_state,
            counters=counters or Counters(),
            events_seq=events_seq,
            census=census,
            budget=self.config.max_nodes,
            head_tokens=self.config.head_tokens,
            rows=tuple(walk.rows) if walk is not None else None,
            walked_tokens=walk.walked_tokens if walk is not None else 0,
            cut_nodes=cut[0],
            cut_tokens=cut[1],
            cut_exact=cut[2],
            slot_walk=slot_walk,
            holders=raw,
            sharers=sharers,
            marks=marked,
        )

    def _walk(
        self, root: Any, sizes: CacheSizes, fresh: bool
    ) -> tuple[Census | None, _Walk, tuple[int | None, int | None, bool]]:
        cfg = self.config
        unified = node_shape(root) == UNIFIED
        hints = self._census.hints if self._census is not None else {}
        walk = walk_tree(root, cfg.max_nodes, hints, cfg.head_tokens, cfg.max_scan, unified)
        walked = len(walk.rows) - 1
        census = self.census(sizes)
        if walk.exhausted:
            return census, walk, (0, 0, True)
        if fresh and census is not None and census.complete:
            # The census began and ended at this safe point: the tree has not moved since.
            return census, walk, (
                max(0, census.node_count - walked), max(0, census.total_tokens - walk.walked_tokens), True
            )
        cut_nodes = max(0, census.node_count - walked) if census is not None and census.complete else None
        resident = (
            sizes.evictable_tokens + sizes.protected_tokens
            if sizes.evictable_tokens is not None and sizes.protected_tokens is not None
            else None
        )
        cut_tokens = max(0, resident - walk.walked_tokens) if resident is not None else None
        return census, walk, (cut_nodes, cut_tokens, False)


def _aged(result: _CensusResult) -> Census:
    # Aged from the census's first slice: everything in it is at least this old.
    return replace(result.census, age_s=max(0.0, time.monotonic() - result.started_at))
