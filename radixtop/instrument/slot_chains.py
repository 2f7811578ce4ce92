"""The Rust TreeCore's tree, rebuilt from its KV-canary walk (SGLang 0.5.23's default core keeps
its nodes out of Python's reach: `node_by_id` and `root_node` raise).

`tree_core.walk_for_kv_canary(unlocked_only, swa_resident_only)` returns one row per device slot
the tree holds: the slot, its position in its sequence, and the slot before it (-1 at a root).
Two walks, all slots and unlocked slots only, give the structure and which slots are locked:
slots chain through `prev`; a chain branches where a slot has several successors; a node here is
a maximal unbranched chain of one lock state. That is the radix tree up to what the walk cannot
show: a node whose only child was split off and later evicted reads as one node with it, and
per-node lock_ref counts, hit counts, last access and token ids are unknown (the snapshot says
`lock_detail="locked-only"`: lock_ref 1 means locked, by some count).

The token ids of the paths requests hold locked, or held and let go of while the nodes stay, are
known from the requests themselves: build() takes each such path (the device slots
`path_device_indices` gives for the lock's node, read at the safe point) and the request's ids,
names the request's node (the chain holding the path's last slot) and fills the head of every
chain on that path with the ids at its positions
(the walk's positions index the request's prompt, then its output). Heads stay empty for chains
no holder's path runs through, and a head stops where the request's ids end or are not plain ints;
where a tree's key is not the request's ids position for position (EAGLE's bigram keys), the ids
shown are the request's, not the key's.

read_walk() runs on the scheduler thread (the core's own walks); build() runs on the endpoint's
thread, which shares the scheduler's GIL: it works on the rows in torch, whole-walk operations in
place of a Python step per slot (benchmarks/rust_walk_bench.py).
"""

from __future__ import annotations

import hashlib
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from radixtop.schema import Branch, Census, TreeView, heaviest_first

__all__ = ["MAX_WALK_SLOTS", "HeldPath", "SlotWalk", "build", "read_walk", "walkable"]

# The walks are one pause of the scheduler, about 15 ms per 100k slots on a 2-core machine
# (benchmarks/rust_walk_bench.py): past this a snapshot is sizes only rather than a long stall.
MAX_WALK_SLOTS = 262_144


@dataclass(frozen=True)
class SlotWalk:
    slots: Any  # int sequences, or the walk's tensors
    positions: Any
    prevs: Any
    unlocked: Any  # the slots of unlocked nodes


def walkable(core: Any) -> bool:
    return callable(getattr(core, "walk_for_kv_canary", None))


def read_walk(core: Any) -> SlotWalk:
    """Both walks (scheduler thread: the tree is consistent at the safe point). The rows are new
    tensors the core hands over: build() turns them into lists on the endpoint's thread."""
    every = core.walk_for_kv_canary(False, False)
    free = core.walk_for_kv_canary(True, False)
    return SlotWalk(every.slot_indices, every.positions, every.prev_slot_indices, free.slot_indices)


class HeldPath(NamedTuple):
    """A path a request holds locked: its last device slot (None: unknown) and the request's token
    id at a position (None where it has none)."""

    last_slot: int | None
    token_at: Callable[[int], int | None] | None


@dataclass(frozen=True)
class _Rebuilt:
    """The chains as columns, in parent-before-child order (chain i: first[i], tokens[i], ...),
    and the slot maps. Columns, not an object per chain: 4k frozen records would be a fifth of a
    100k-slot rebuild."""

    first: list[int]  # each chain's first slot
    tokens: list[int]
    locked: list[bool]
    parent: list[int]  # the parent chain's index, -1 under the root
    position: list[int]  # of its first slot
    digest: str  # of the chains' shapes (position, tokens, locked), whatever their slots or order
    by_parent: list[int]  # the chains ordered by parent (the roots first), ascending within each
    first_child: list[int]  # by_parent[first_child[p + 1]:first_child[p + 2]]: chain p's children
    slots: int
    row_of_slot: Any  # a tensor indexed by slot: its row in the walk, -1 where the walk lacks it
    positions: Any  # by row
    chain_of_row: Any  # by row: the index of the chain holding it

    def children(self, chain: int) -> tuple[int, ...]:
        """A chain's children, ascending; chain -1: the roots."""
        return tuple(self.by_parent[self.first_child[chain + 1] : self.first_child[chain + 2]])

    def _row(self, slot: int | None) -> int | None:
        if slot is None or not 0 <= slot < self.row_of_slot.numel():
            return None
        row = int(self.row_of_slot[slot])
        return None if row < 0 else row

    def chain_of(self, slot: int | None) -> int | None:
        """The index of the chain holding `slot`, None when the walk does not have it."""
        row = self._row(slot)
        return None if row is None else int(self.chain_of_row[row])

    def position_of(self, slot: int) -> int:
        """The position of a slot the walk has (chain_of says which)."""
        row = self._row(slot)
        assert row is not None
        return int(self.positions[row])


def _chains(walk: SlotWalk) -> _Rebuilt:
    """The chains in parent-before-child order, their shapes' digest, and the slot maps.

    In torch, the walk's own library (the Rust core hands its rows over as tensors), as whole-walk
    operations: a Python step per slot made a 100k-slot walk ~120 ms of the scheduler process's GIL,
    against a few ms here (benchmarks/README.md)."""
    import torch

    slots, positions, prevs, unlocked = (
        torch.as_tensor(values, dtype=torch.int64).reshape(-1)
        for values in (walk.slots, walk.positions, walk.prevs, walk.unlocked)
    )
    n = slots.numel()
    if n != positions.numel() or n != prevs.numel():
        raise ValueError(f"the walk's rows differ in length: {n}, {positions.numel()}, {prevs.numel()}")
    top = max([int(t.max()) for t in (slots, prevs, unlocked) if t.numel()] + [0]) + 1
    rows = torch.arange(n)
    row_of_slot = torch.full((top,), -1, dtype=torch.int64)
    row_of_slot[slots] = rows
    has_prev = prevs >= 0
    prev_slot = prevs.clamp(min=0)
    prev_row = torch.where(has_prev, row_of_slot[prev_slot], -1)  # -1: a root, or a slot outside the walk
    fanout = torch.bincount(prevs[has_prev], minlength=top)  # each slot's successors
    is_unlocked = torch.zeros(top, dtype=torch.bool)
    is_unlocked[unlocked] = True
    row_unlocked = is_unlocked[slots]
    before = prev_row.clamp(min=0)
    # A row continues the chain ending at its prev: the prev is in the walk and has no other
    # successor, the lock state is the same, and the position is the next one.
    continues = ((prev_row >= 0) & (fanout[prev_slot] == 1) & (row_unlocked == row_unlocked[before])
                 & (positions == positions[before] + 1))
    head = torch.where(continues, prev_row, rows)  # pointer jumping: each row's chain's first row
    for _ in range(64):  # doubles the reach each pass: 2**64 rows
        further = head[head]
        if torch.equal(further, head):
            break
        head = further
    starts = (~continues).nonzero().reshape(-1)
    # By position, then slot: a parent chain always starts before its children.
    starts = starts[torch.argsort(positions[starts] * top + slots[starts])]
    index_of_start = torch.full((n,), -1, dtype=torch.int64)
    index_of_start[starts] = torch.arange(starts.numel())
    chain_of_row = index_of_start[head]
    start_prev = prev_row[starts]  # a chain's prev is the last slot of its parent chain
    parents = torch.where(start_prev >= 0, chain_of_row[start_prev.clamp(min=0)], -1)
    tokens = torch.bincount(head, minlength=n)[starts]
    locked = ~row_unlocked[starts]
    first_position = positions[starts]
    # Each chain's children as a slice of the chains sorted by parent: a list per chain would be
    # 4k lists (and the collections they set off in the scheduler's process) for ~100 chains sent.
    by_parent = torch.argsort(parents, stable=True)
    first_child = torch.cumsum(torch.bincount(parents + 1, minlength=starts.numel() + 1), 0)
    return _Rebuilt(
        slots[starts].tolist(), tokens.tolist(), locked.tolist(), parents.tolist(), first_position.tolist(),
        _shape_digest(first_position, tokens, locked), by_parent.tolist(), [0, *first_child.tolist()],
        n, row_of_slot, positions, chain_of_row,
    )


def _shape_digest(position: Any, tokens: Any, locked: Any) -> str:
    """A digest of the chains' (position, tokens, locked), sorted: equal for the same shape
    whatever the slots and the rows' order."""
    import torch

    shape = torch.stack((position, tokens, locked.to(torch.int64)), dim=1)
    if shape.numel():
        # One sort key: a position or a length is below the walk's row count (at most
        # MAX_WALK_SLOTS), so span * span * 2 fits int64.
        span = int(shape[:, :2].max()) + 1
        shape = shape[torch.argsort((shape[:, 0] * span + shape[:, 1]) * 2 + shape[:, 2])]
    return hashlib.blake2b(array("q", shape.reshape(-1).tolist()).tobytes(), digest_size=8).hexdigest()


def _heads(
    rebuilt: _Rebuilt, held: Sequence[HeldPath], ends: Sequence[int | None], head_n: int
) -> dict[int, tuple[int, ...]]:
    """Each chain on a held path: its first `head_n` token ids, from the request holding it (the
    longest any holder gives: a chain the path ends inside of is known only up to the path's end)."""
    heads: dict[int, tuple[int, ...]] = {}
    positions, lengths, parents = rebuilt.position, rebuilt.tokens, rebuilt.parent
    for path, end in zip(held, ends, strict=True):
        if end is None or path.token_at is None or path.last_slot is None:
            continue
        last_position = rebuilt.position_of(path.last_slot)
        index = end
        while index >= 0:
            position = positions[index]
            stop = min(position + min(lengths[index], head_n), last_position + 1)
            head = []
            for p in range(position, stop):
                token = path.token_at(p)
                if token is None:
                    break
                head.append(token)
            if len(head) > len(heads.get(index, ())):
                heads[index] = tuple(head)
            index = parents[index]
    return heads


class _Branches:
    """The chains as heaviest_first's branches, each made when asked for: it asks for the rows it
    sends and their children, not for the whole tree."""

    def __init__(self, count: int, branch: Callable[[int], Branch]) -> None:
        self._count, self._branch = count, branch

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, index: int) -> Branch:
        return self._branch(index)


def build(
    walk: SlotWalk, budget: int, held: Sequence[HeldPath] = (), head_n: int = 0
) -> tuple[TreeView, Census, tuple[int | None, ...]]:
    """The tree view (heaviest subtrees first within `budget` nodes), the census of all chains,
    and for each held path the id of the chain holding its last slot (None: not in the walk),
    with the heads of the chains on held paths filled in (`head_n` ids at most)."""
    started = time.monotonic()
    rebuilt = _chains(walk)
    count, parents, lengths, locked = len(rebuilt.first), rebuilt.parent, rebuilt.tokens, rebuilt.locked
    ends = [rebuilt.chain_of(path.last_slot) for path in held]
    heads = _heads(rebuilt, held, ends, head_n) if head_n else {}
    subtree = list(lengths)
    for i in range(count - 1, -1, -1):  # children come after their parents
        parent = parents[i]
        if parent >= 0:
            subtree[parent] += subtree[i]

    def branch(i: int) -> Branch:
        return Branch(rebuilt.first[i], lengths[i], 1 if locked[i] else 0, subtree[i], rebuilt.children(i))

    tree = heaviest_first(_Branches(count, branch), rebuilt.children(-1), budget, lambda i: heads.get(i, ()), subtree)
    locked_nodes = sum(locked)
    census = Census(
        complete=True, node_count=count, total_tokens=rebuilt.slots,
        lock_ref_histogram={k: v for k, v in ((0, count - locked_nodes), (1, locked_nodes)) if v},
        digest=rebuilt.digest, age_s=0.0, seconds=time.monotonic() - started, slices=1, span_s=0.0,
    )
    return tree, census, tuple(None if end is None else rebuilt.first[end] for end in ends)
