"""A radix snapshot parsed and indexed for lazy display, and freed without freezing the UI.

Pure: bytes in, a Snapshot and a TreeIndex out; no I/O. A 100,000-node snapshot is parsed row by
row with the cyclic GC paused, pacing itself so that the UI thread gets the GIL, and freed on a
daemon thread a few thousand rows at a time (`discard`).
"""

from __future__ import annotations

import contextlib
import gc
import json
import re
import sys
import threading
import time
from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from itertools import compress
from operator import itemgetter
from typing import Any, overload

from radixtop.schema import (
    MAX_PAYLOAD_BYTES,
    MAX_TREE_NODES,
    NodeRow,
    Snapshot,
    parse_snapshot,
)

SPLICE_PARSE_BYTES = 256 * 1024  # larger answers are parsed row by row (see _parse_spliced)

# ----------------------------------------------------------------------------------------------
# The tree, indexed for lazy display


@dataclass(frozen=True, slots=True)
class TreeIndex:
    """Children of each row (locked first, then the heaviest subtree) and which rows lead to a lock.

    `marks[row]` is a bit set: 1 the row or a descendant holds a lock (lock_ref > 0), 2 the row or
    a descendant has a negative lock_ref (a double unlock). `children` is a tuple of every row's
    children (`build`), or sorts a row's children when first asked for them (`lazy`)."""

    children: Sequence[tuple[int, ...]]
    marks: bytes
    depth_max: int

    LOCKED = 1
    NEGATIVE = 2

    @classmethod
    def build(cls, snapshot: Snapshot) -> TreeIndex | None:
        tree = snapshot.tree
        if tree is None:
            return None
        nodes = tree.nodes
        n = len(nodes)
        kids: list[list[int]] = [[] for _ in range(n)]
        marks = bytearray(n)
        depth = [0] * n
        for i in range(1, n):
            p = nodes[i].parent
            kids[p].append(i)
            depth[i] = depth[p] + 1
        for i in range(n - 1, -1, -1):  # children come after their parent: one backward pass
            lr = nodes[i].lock_ref
            if lr > 0:
                marks[i] |= cls.LOCKED
            elif lr < 0:
                marks[i] |= cls.NEGATIVE
            if i:
                marks[nodes[i].parent] |= marks[i]

        def weight(row: int) -> tuple[int, int, int]:
            node = nodes[row]
            sub = node.subtree_tokens if node.subtree_tokens is not None else node.tokens
            return (-(marks[row] & cls.NEGATIVE), -(marks[row] & cls.LOCKED), -sub)

        ordered = tuple(tuple(sorted(k, key=weight)) if len(k) > 1 else tuple(k) for k in kids)
        return cls(ordered, bytes(marks), max(depth) if depth else 0)

    @classmethod
    def lazy(cls, snapshot: Snapshot) -> TreeIndex | None:
        """The same index, its rows' children sorted only when asked for: for a snapshot looked at
        on the UI thread (an earlier one stepped to), of whose thousands of rows the pane lists
        the root's children and the expanded paths. Its columns are read in C loops (no object per
        row but the ints), its marks walked up from the locked rows only."""
        tree = snapshot.tree
        if tree is None:
            return None
        nodes = tree.nodes
        n = len(nodes)
        parents = list(map(_PARENT, nodes))
        lock_refs = list(map(_LOCK_REF, nodes))
        marks = bytearray(n)
        for row in compress(range(n), lock_refs):  # a row and its ancestors, up to one marked already
            bit = cls.LOCKED if lock_refs[row] > 0 else cls.NEGATIVE
            while row >= 0 and not marks[row] & bit:
                marks[row] |= bit
                row = parents[row]
        depth = [0] * n
        for i in range(1, n):  # children come after their parent
            depth[i] = depth[parents[i]] + 1
        weights = [t if s is None else s for t, s in zip(map(_TOKENS, nodes), map(_SUBTREE_TOKENS, nodes))]
        frozen = bytes(marks)
        return cls(_SortedOnDemand(parents, weights, frozen), frozen, max(depth) if depth else 0)


_PARENT, _TOKENS, _LOCK_REF, _SUBTREE_TOKENS = (itemgetter(NodeRow._fields.index(f))
                                                 for f in ("parent", "tokens", "lock_ref", "subtree_tokens"))


class _SortedOnDemand(Sequence[tuple[int, ...]]):
    """Every row's children, in TreeIndex.build's order, each row's sorted when first asked for.
    The rows are held sorted by their parent (stable: in row order under each parent), so a
    row's children are one slice of them, found by bisection."""

    __slots__ = ("_by_parent", "_cache", "_marks", "_under", "_weights")

    def __init__(self, parents: list[int], weights: list[int], marks: bytes) -> None:
        self._by_parent = sorted(range(1, len(parents)), key=parents.__getitem__)
        self._under = list(map(parents.__getitem__, self._by_parent))
        self._weights = weights
        self._marks = marks
        self._cache: dict[int, tuple[int, ...]] = {}

    def __len__(self) -> int:
        return len(self._weights)

    @overload
    def __getitem__(self, row: int) -> tuple[int, ...]: ...

    @overload
    def __getitem__(self, row: slice) -> tuple[tuple[int, ...], ...]: ...

    def __getitem__(self, row: int | slice) -> tuple[int, ...] | tuple[tuple[int, ...], ...]:
        n = len(self._weights)
        if isinstance(row, slice):
            return tuple(self[i] for i in range(*row.indices(n)))
        if row < 0:
            row += n
        if not 0 <= row < n:
            raise IndexError("row out of range")
        got = self._cache.get(row)
        if got is None:
            lo = bisect_left(self._under, row)
            kids = self._by_parent[lo:bisect_right(self._under, row, lo)]
            if len(kids) > 1:
                marks, weights = self._marks, self._weights
                kids.sort(key=lambda r: (-(marks[r] & TreeIndex.NEGATIVE), -(marks[r] & TreeIndex.LOCKED), -weights[r]))
            got = self._cache[row] = tuple(kids)
        return got

    def __iter__(self) -> Iterator[tuple[int, ...]]:
        return (self[i] for i in range(len(self._weights)))

    def parts(self) -> list[Any]:
        """Its big members, to be freed a chunk at a time (see discard)."""
        return [self._by_parent, self._under, self._weights, self._cache]


def parse_and_index(data: bytes) -> tuple[Snapshot, TreeIndex | None]:
    """Parse (all checks of radixtop.schema) and index a snapshot; ValueError with one line."""
    if len(data) <= SPLICE_PARSE_BYTES:
        snapshot = parse_snapshot(data)
        return snapshot, TreeIndex.build(snapshot)
    with no_gc_pauses():
        spliced = _parse_spliced(data) if len(data) <= MAX_PAYLOAD_BYTES else None
        snapshot = spliced if spliced is not None else parse_snapshot(data)
        return snapshot, TreeIndex.build(snapshot)


_gc_lock = threading.Lock()
_gc_depth = 0
_gc_was_enabled = True


@contextlib.contextmanager
def no_gc_pauses(freeze: bool = True) -> Iterator[None]:
    """A big snapshot is a few hundred thousand new containers: with the cyclic GC on, its
    collections walk them (and the whole app) over and over, holding the GIL for 100+ ms at a time
    and freezing the UI thread. Off while building (its objects have no cycles; refcounting frees
    them), then (`freeze`, for a big one) frozen out of future collections, then on again."""
    global _gc_depth, _gc_was_enabled
    with _gc_lock:
        if _gc_depth == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_depth += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_depth -= 1
            if _gc_depth == 0:
                if freeze:
                    gc.freeze()
                if _gc_was_enabled:
                    gc.enable()


_NODES_KEY = re.compile(r'"nodes"\s*:\s*\[')
_WS = " \t\n\r"


def _parse_spliced(data: bytes) -> Snapshot | None:
    """A big snapshot parsed without one long C call: json.loads of a 6 MB answer holds the GIL
    for hundreds of milliseconds, which would freeze the UI thread however the parse is threaded.
    The tree's rows are decoded one at a time (raw_decode, so the interpreter can switch threads
    between rows), the rest of the document in one small call, and the whole then goes through
    Snapshot.from_dict's checks. None when the document is not shaped as expected: the caller
    then parses it whole (and reports its errors)."""
    try:
        text = data.decode("utf-8")
        m = _NODES_KEY.search(text)
        if m is None:
            return None
        decoded = _rows_from(text, m.end())
        if decoded is None:
            return None
        rows, end = decoded
        obj = json.loads(text[: m.start()] + '"nodes":[]' + text[end:])
        tree = obj.get("tree") if isinstance(obj, dict) else None
        if not isinstance(tree, dict) or tree.get("nodes") != [] or not rows:
            return None  # the key was somewhere else
    except (ValueError, RecursionError):
        return None
    # Everything but the rows after the root is checked by the schema on a one-row tree; then each
    # row by the schema's own row check, with the walked count checked as TreeView.from_dict does.
    walked = tree.get("walked_nodes")
    tree["nodes"], tree["walked_nodes"] = rows[:1], 0
    snapshot = Snapshot.from_dict(obj)
    if snapshot.tree is None:
        return snapshot
    if type(walked) is not int or walked < 0:
        raise ValueError(f"snapshot.tree.walked_nodes: expected an integer in [0, {2**63 - 1}], got {walked!r}")
    if walked != len(rows) - 1:
        raise ValueError(f"snapshot.tree.walked_nodes: says {walked} but {len(rows) - 1} non-root rows were sent")
    nodes = [snapshot.tree.nodes[0]]
    pace = _Pacer()
    try:
        for i in range(1, len(rows)):
            nodes.append(NodeRow.from_row(rows[i], i, "snapshot.tree.nodes"))
            if not i & 511:
                pace()
    except ValueError:
        raise
    except Exception as exc:  # as the schema's own guard does: never anything but a ValueError
        raise ValueError(f"snapshot: malformed ({type(exc).__name__})") from None
    return replace(snapshot, tree=replace(snapshot.tree, nodes=tuple(nodes), walked_nodes=walked))


def _rows_from(text: str, i: int) -> tuple[list[Any], int] | None:
    """The rows of the JSON array that starts at ``i`` (after its ``[``), one raw_decode each, and
    where the array ends; None when it is not a well-formed array of at most MAX_TREE_NODES + 1."""
    decoder = json.JSONDecoder()
    rows: list[Any] = []
    n = len(text)
    while i < n and text[i] in _WS:
        i += 1
    if i < n and text[i] == "]":
        return rows, i + 1
    pace = _Pacer()
    while True:
        if len(rows) > MAX_TREE_NODES + 1:
            return None
        row, i = decoder.raw_decode(text, i)
        rows.append(row)
        if not len(rows) & 511:
            pace()
        while i < n and text[i] in _WS:
            i += 1
        if i >= n:
            return None
        c = text[i]
        i += 1
        if c == "]":
            return rows, i
        if c != ",":
            return None
        while i < n and text[i] in _WS:
            i += 1


class _Pacer:
    """Called now and then from a long loop on a worker thread: after every few milliseconds of
    work, sleep a little, so the UI thread gets the GIL at once instead of at the interpreter's
    next switch (which, on a loaded machine, can be a whole OS time slice away)."""

    def __init__(self, work_s: float = 0.004, rest_s: float = 0.001) -> None:
        self.work_s, self.rest_s = work_s, rest_s
        self.since = time.perf_counter()

    def __call__(self) -> None:
        now = time.perf_counter()
        if now - self.since >= self.work_s:
            time.sleep(self.rest_s)
            self.since = time.perf_counter()


# ----------------------------------------------------------------------------------------------
# Freeing a big tree without freezing the UI

BIG_TREE_NODES = 20_000  # smaller trees are freed where they are dropped (a few ms at most)
_RELEASE_CHUNK = 4_000


class _Graveyard:
    """Freeing a 100,000-node snapshot is one C loop of a million decrefs: ~100 ms holding the
    GIL, on whichever thread drops the last reference, usually the UI's. `discard()` hands the
    object to a daemon thread instead, which waits until it holds the only reference and then
    frees the rows a few thousand at a time, resting between chunks."""

    def __init__(self) -> None:
        self._pending: dict[int, tuple[float, Any]] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def discard(self, obj: Any) -> None:
        if obj is None or _tree_size(obj) < BIG_TREE_NODES:
            return
        with self._lock:
            self._pending.setdefault(id(obj), (time.monotonic(), obj))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="radixtop-release", daemon=True)
                self._thread.start()
        self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait(1.0)
            self._wake.clear()
            time.sleep(0.5)  # let the UI drop its references first
            with self._lock:
                keys = list(self._pending)
            for key in keys:
                with self._lock:
                    entry = self._pending.pop(key, None)
                if entry is None:
                    continue
                since, obj = entry
                del entry
                # `obj` and getrefcount's argument: anyone else still uses it, so wait
                if sys.getrefcount(obj) > 2 and time.monotonic() - since < 60:
                    with self._lock:
                        self._pending.setdefault(key, (since, obj))
                    del obj
                    continue
                rows = _release_parts(obj)
                del obj  # cheap now: `rows` keeps the members alive
                while rows:
                    del rows[-_RELEASE_CHUNK:]
                    time.sleep(0.001)
            if self._pending:
                self._wake.set()


def _tree_size(obj: Any) -> int:
    if isinstance(obj, Snapshot):
        return len(obj.tree.nodes) if obj.tree is not None else 0
    if isinstance(obj, TreeIndex):
        return len(obj.children)
    return 0


def _release_parts(obj: Any) -> list[Any]:
    """A list holding the big parts' members, so that dropping `obj` itself is cheap."""
    if isinstance(obj, Snapshot) and obj.tree is not None:
        return list(obj.tree.nodes)
    if isinstance(obj, TreeIndex):
        children = obj.children
        return children.parts() if isinstance(children, _SortedOnDemand) else list(children)
    return []


_graveyard = _Graveyard()


def discard(obj: Any) -> None:
    """Drop a (possibly big) Snapshot or TreeIndex without freeing it on the calling thread."""
    _graveyard.discard(obj)


