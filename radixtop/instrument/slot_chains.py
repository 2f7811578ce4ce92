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

read_walk() runs on the scheduler thread (the core's own walks); build() runs on the endpoint's
thread. Standard library only (the rows are torch tensors: read with `.tolist()`).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import Any

from radixtop.schema import Branch, Census, TreeView, heaviest_first

__all__ = ["MAX_WALK_SLOTS", "SlotWalk", "build", "read_walk", "walkable"]

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


def _plain(values: Any) -> list[int]:
    return values.tolist() if hasattr(values, "tolist") else list(values)


@dataclass(frozen=True)
class _Chain:
    first: int  # its first slot
    tokens: int
    locked: bool
    parent: int  # the parent chain's index, -1 under the root
    position: int  # of its first slot


def _chains(walk: SlotWalk) -> tuple[list[_Chain], list[list[int]], int]:
    """The chains in parent-before-child order, each chain's children, and the slot count."""
    slots = _plain(walk.slots)
    position = dict(zip(slots, _plain(walk.positions), strict=True))
    prev = dict(zip(slots, _plain(walk.prevs), strict=True))
    unlocked = set(_plain(walk.unlocked))
    successors: dict[int, list[int]] = {}
    for slot, before in prev.items():
        successors.setdefault(before, []).append(slot)

    def continues(slot: int, after: int) -> bool:  # slot extends the chain ending at `after`
        return (
            len(successors.get(after, ())) == 1 and (slot in unlocked) == (after in unlocked)
            and position[slot] == position[after] + 1
        )

    chains: list[_Chain] = []
    children: list[list[int]] = []
    chain_of_last: dict[int, int] = {}  # a chain's last slot -> its index
    starts = sorted((position[s], s) for s in slots if prev[s] not in position or not continues(s, prev[s]))
    for pos, first in starts:  # by position: a parent chain always starts before its children
        length, last = 1, first
        while True:
            nxt = successors.get(last)
            if nxt is None or len(nxt) != 1 or not continues(nxt[0], last):
                break
            last = nxt[0]
            length += 1
        parent = chain_of_last.get(prev[first], -1)
        index = len(chains)
        chains.append(_Chain(first, length, first not in unlocked, parent, pos))
        children.append([])
        if parent >= 0:
            children[parent].append(index)
        chain_of_last[last] = index
    return chains, children, len(slots)


def build(walk: SlotWalk, budget: int) -> tuple[TreeView, Census]:
    """The tree view (heaviest subtrees first within `budget` nodes) and the census of all chains."""
    started = time.monotonic()
    chains, children, total = _chains(walk)
    subtree = [c.tokens for c in chains]
    for i in range(len(chains) - 1, -1, -1):  # children come after their parents
        parent = chains[i].parent
        if parent >= 0:
            subtree[parent] += subtree[i]
    branches = [
        Branch(c.first, c.tokens, 1 if c.locked else 0, subtree[i], tuple(children[i])) for i, c in enumerate(chains)
    ]
    tree = heaviest_first(branches, [i for i, c in enumerate(chains) if c.parent < 0], budget)
    locked_nodes = sum(1 for c in chains if c.locked)
    shape = hashlib.blake2b(digest_size=8)
    for c in sorted(chains, key=lambda c: (c.position, c.tokens, c.locked)):
        shape.update(f"{c.position},{c.tokens},{int(c.locked)};".encode())
    census = Census(
        complete=True, node_count=len(chains), total_tokens=total,
        lock_ref_histogram={k: v for k, v in ((0, len(chains) - locked_nodes), (1, locked_nodes)) if v},
        digest=shape.hexdigest(), age_s=0.0, seconds=time.monotonic() - started, slices=1, span_s=0.0,
    )
    return tree, census
