"""Who holds each locked node of one snapshot: the scheduler's requests (Snapshot.holders) placed
on the rows, and the locked nodes no request accounts for; and who used a node before (the requests
that let go of their locks while their nodes stay cached, Snapshot.sharers), placed the same way.

A request's lock holds its node and every node above it, so a row is held by the requests whose
node is the row or one below it. Where the rows carry lock counts, a count above its holders is a
lock no request holds (leaked, or taken by the cache itself, as HiCache's write-back does); a
count below them is a lock released more than once. Where the walk says only locked-or-not (the
Rust core), a locked row no request covers is the one thing it can tell. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from radixtop.schema import Holder, Sharer, Snapshot

_Placed = TypeVar("_Placed", Holder, Sharer)


@dataclass(frozen=True, slots=True)
class LockHolders:
    known: bool  # the snapshot says which requests hold locks
    held_by: dict[int, tuple[Holder, ...]] = field(default_factory=dict)  # row -> the holders covering it
    deepest: dict[int, tuple[Holder, ...]] = field(default_factory=dict)  # row -> the holders whose node it is
    unplaced: int = 0  # holders whose node is not among the rows sent
    unheld: tuple[int, ...] = ()  # locked rows with more locks than holders (every holder placed)
    overheld: tuple[int, ...] = ()  # rows with fewer locks than holders (counts known)
    leaks: tuple[int, ...] = ()  # the unheld rows no unheld row lies below: where such a lock was taken
    used_by: dict[int, tuple[Sharer, ...]] = field(default_factory=dict)  # row -> earlier requests through it

    @classmethod
    def of(cls, snapshot: Snapshot | None) -> LockHolders:
        holders = getattr(snapshot, "holders", None)
        tree = getattr(snapshot, "tree", None)
        if snapshot is None or holders is None or tree is None:
            return cls(known=False)
        nodes = tree.nodes
        row_of = {n.id: row for row, n in enumerate(nodes) if n.id is not None}
        held, deepest, unplaced = _place(holders, row_of, nodes)
        used, _, _ = _place(getattr(snapshot, "sharers", None) or (), row_of, nodes)
        counts = snapshot.lock_detail == "counts"
        unheld: list[int] = []
        overheld: list[int] = []
        for row in range(1, len(nodes)):
            lock_ref = nodes[row].lock_ref
            n = len(held.get(row, ()))
            if lock_ref > 0 and not unplaced and (n < lock_ref if counts else n == 0):
                unheld.append(row)
            elif counts and n > max(0, lock_ref):
                overheld.append(row)
        above = {nodes[row].parent for row in unheld}
        return cls(
            known=True,
            held_by={row: tuple(hs) for row, hs in held.items()},
            deepest={row: tuple(sorted(hs, key=lambda h: -h.held_s)) for row, hs in deepest.items()},
            unplaced=unplaced,
            unheld=tuple(unheld),
            overheld=tuple(overheld),
            leaks=tuple(row for row in unheld if row not in above),
            used_by={row: tuple(sorted(us, key=lambda u: u.released_s)) for row, us in used.items()},
        )

    def unheld_locks(self, snapshot: Snapshot, row: int) -> int:
        """How many of the row's locks no request holds (1 for a locked row of the Rust core's walk)."""
        lock_ref = snapshot.tree.nodes[row].lock_ref if snapshot.tree is not None else 0
        if snapshot.lock_detail != "counts":
            return 1 if row in self.unheld else 0
        return max(0, lock_ref - len(self.held_by.get(row, ())))


def _place(
    records: Sequence[_Placed], row_of: dict[int, int], nodes: Sequence[Any]
) -> tuple[dict[int, list[_Placed]], dict[int, list[_Placed]], int]:
    """Each row's records covering it (a record's node and every node above it), each row's
    records whose node it is, and how many records name no row sent."""
    covering: dict[int, list[_Placed]] = {}
    deepest: dict[int, list[_Placed]] = {}
    unplaced = 0
    for r in records:
        row = row_of.get(r.node) if r.node is not None else None
        if row is None or row == 0:
            unplaced += 1
            continue
        deepest.setdefault(row, []).append(r)
        while row > 0:  # parents are earlier rows: the walk ends at the root
            covering.setdefault(row, []).append(r)
            row = nodes[row].parent
    return covering, deepest, unplaced
