"""The earlier snapshots a rank's view keeps, to step back through (and for the bundle).

Between two polls a few hundred of a tree's nodes change (the paths running requests touch), the
rest come back as they were. So a kept snapshot is its header (the Snapshot without rows) and an
array of indices into one table of distinct rows shared by every snapshot of the rank, each row
counted by the snapshots that use it and let go with the last. A row keeps its parent as the
parent's node id, not its position, so a tree whose order shifted (heaviest subtree first) still
shares its rows; positions are worked out again when a snapshot is looked at. Bounded by count
and by bytes, the oldest let go first.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import partial
from itertools import compress, repeat
from operator import add, is_, itemgetter
from typing import Any

from radixtop.probes.radix_tree import no_gc_pauses
from radixtop.schema import NodeRow, Snapshot

KEPT_SNAPSHOTS = 1_000  # per rank: half an hour of polls every 2 s
KEPT_BYTES = 128 << 20  # per rank, the index arrays and the distinct rows together
ROW_BYTES = 300  # a distinct row held, near enough (measured: 240 B; its ids and head are shared)
HEADER_BYTES = 2_000  # a snapshot's header (its census and counters)

_Key = tuple[Any, ...]  # a NodeRow with its parent as (node id, -1), or (None, position) when it has no id


@dataclass(frozen=True, slots=True)
class Kept:
    time: float  # time.time() it was fetched
    header: Snapshot  # the snapshot with its tree's rows left out
    rows: array[int] | None  # indices into the store's table; None: no tree
    cost: int


class SnapshotStore:
    def __init__(self, *, max_count: int = KEPT_SNAPSHOTS, max_bytes: int = KEPT_BYTES) -> None:
        self.max_count = max_count
        self.max_bytes = max_bytes
        self._kept: deque[Kept] = deque()
        self._index: dict[_Key, int] = {}
        self._rows: list[_Key | None] = []
        self._uses: array[int] = array("I")
        self._free: list[int] = []
        self.bytes = 0

    @property
    def distinct_rows(self) -> int:
        return len(self._index)

    def add(self, at: float, snapshot: Snapshot) -> None:
        """Keep a snapshot, letting the oldest go past the count or the bytes."""
        tree = snapshot.tree
        rows = None
        if tree is not None:
            nodes = tree.nodes
            with no_gc_pauses(freeze=False):  # the new rows have no cycles: no collection walks them as they come
                rows = array("I", (self._intern(_key(node, nodes)) for node in nodes))
            snapshot = replace(snapshot, tree=replace(tree, nodes=()))
        kept = Kept(at, snapshot, rows, HEADER_BYTES + (len(rows) * rows.itemsize if rows is not None else 0))
        self._kept.append(kept)
        self.bytes += kept.cost
        while len(self._kept) > self.max_count or (self.bytes > self.max_bytes and len(self._kept) > 1):
            self._drop(self._kept.popleft())

    def load(self, kept: Kept) -> Snapshot:
        """A kept snapshot whole again (its rows' parents back to positions). Each column is one
        C loop (map, zip, dict), not a Python call per row: it is on the UI thread, at a key press."""
        if kept.rows is None or kept.header.tree is None:
            return kept.header
        with no_gc_pauses(freeze=False):
            keys: list[Any] = list(map(self._rows.__getitem__, kept.rows))  # a kept row is never let go: no None
            ids = list(map(_ID, keys))
            position = dict(zip(ids, range(len(keys))))
            parent_ids = list(map(_PARENT_ID, keys))
            parents = list(map(position.get, parent_ids, repeat(0)))
            for i in compress(range(len(keys)), map(is_, parent_ids, repeat(None))):
                parents[i] = keys[i][2]  # the root, or a parent without an id: its position was kept
            nodes = tuple(map(_NEW_ROW, map(add, zip(ids, parents), map(_AFTER_PARENT, keys))))
        return replace(kept.header, tree=replace(kept.header.tree, nodes=nodes))

    def __len__(self) -> int:
        return len(self._kept)

    def __getitem__(self, i: int) -> Kept:
        return self._kept[i]

    def __iter__(self) -> Iterator[Kept]:
        return iter(self._kept)

    def index_of(self, kept: Kept) -> int | None:
        for i, k in enumerate(self._kept):
            if k is kept:
                return i
        return None

    def newest(self, n: int) -> list[tuple[float, Snapshot]]:
        """The newest `n`, whole (for a bundle)."""
        return [(k.time, self.load(k)) for k in (list(self._kept)[-n:] if n > 0 else [])]

    def _intern(self, key: _Key) -> int:
        at = self._index.get(key)
        if at is None:
            if self._free:
                at = self._free.pop()
                self._rows[at] = key
                self._uses[at] = 0
            else:
                at = len(self._rows)
                self._rows.append(key)
                self._uses.append(0)
            self._index[key] = at
            self.bytes += ROW_BYTES
        self._uses[at] += 1
        return at

    def _drop(self, kept: Kept) -> None:
        self.bytes -= kept.cost
        for at in kept.rows or ():
            self._uses[at] -= 1
            if not self._uses[at]:
                key = self._rows[at]
                self._rows[at] = None
                if key is not None:
                    del self._index[key]
                self._free.append(at)
                self.bytes -= ROW_BYTES


def _key(node: NodeRow, nodes: tuple[NodeRow, ...]) -> _Key:
    parent_id = nodes[node.parent].id if node.parent >= 0 else None
    return (node.id, parent_id, -1 if parent_id is not None else node.parent, *node[2:])


_ID, _PARENT_ID, _AFTER_PARENT = itemgetter(0), itemgetter(1), itemgetter(slice(3, None))
_NEW_ROW = partial(tuple.__new__, NodeRow)  # NodeRow(*fields), without a Python call per row
