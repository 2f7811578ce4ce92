"""One DP rank's cache rebuilt from SGLang's kv-events: a tree of blocks (pages) linked by their
parents' hashes, and its view in the debug endpoint's snapshot shape so that the radix board and
pane show it like any rank. Pure: events in, a Snapshot out; no I/O.

What kv-events cannot say is left unknown, never guessed: lock counts, hit counts, access times
and the pool's sizes. A node of the view is a chain of blocks without a branch (what a radix node
is), so the view's shape follows the cache's while every block stays countable.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from radixtop.schema import MAX_HEAD_TOKENS, Branch, Snapshot, TreeView, heaviest_first, rebuilt_snapshot

SOURCE = "kv-events: blocks, no locks"  # the pane names the source and what it cannot see
CACHE_CLASS = "kv-events mirror"


@dataclass(slots=True)
class Block:
    parent: int | None  # the parent block's hash; None under the root
    tokens: tuple[Any, ...]
    children: set[int] = field(default_factory=set)


class BlockMirror:
    """The blocks one publisher reported stored and not yet removed."""

    def __init__(self) -> None:
        self.blocks: dict[int, Block] = {}
        self.roots: set[int] = set()  # blocks shown under the root (parent None, or not mirrored)
        self.unknown_parents = 0  # stored under a block the mirror never saw (it began mid-stream)
        self.unknown_removes = 0  # removals of blocks the mirror never saw
        self.block_size: int | None = None
        self.tokens = 0

    def clear(self) -> None:
        self.blocks.clear()
        self.roots.clear()
        self.tokens = 0

    def apply(self, events: Iterable[Any]) -> None:
        """Events of radixtop.kv_wire, in order."""
        for ev in events:
            kind = type(ev).__name__
            if kind == "BlockStored":
                self._store(ev.block_hashes, ev.parent_block_hash, ev.token_ids, ev.block_size)
            elif kind == "BlockRemoved":
                for h in ev.block_hashes:
                    self._remove(h)
            elif kind == "AllBlocksCleared":
                self.clear()

    def _store(self, hashes: list[int], parent: int | None, token_ids: list[Any], size: int) -> None:
        if size > 0:
            self.block_size = size
        step = size if size > 0 else max(1, len(token_ids) // max(1, len(hashes)))
        for i, h in enumerate(hashes):
            tokens = tuple(token_ids[i * step : (i + 1) * step])
            if h in self.blocks:  # stored again (at-least-once delivery): the first link stands
                parent = h
                continue
            block = Block(parent, tokens)
            self.blocks[h] = block
            self.tokens += len(tokens)
            above = self.blocks.get(parent) if parent is not None else None
            if above is not None:
                above.children.add(h)
            else:
                if parent is not None:
                    self.unknown_parents += 1
                self.roots.add(h)
            parent = h

    def _remove(self, h: int) -> None:
        block = self.blocks.pop(h, None)
        if block is None:
            self.unknown_removes += 1
            return
        self.tokens -= len(block.tokens)
        # Always out of the roots: a parent removed and stored again under another block leaves
        # this block's parent hash naming a block that is not the one it hung under.
        self.roots.discard(h)
        above = self.blocks.get(block.parent) if block.parent is not None else None
        if above is not None:
            above.children.discard(h)
        for child in block.children:  # not SGLang's order (leaves go first): shown under the root
            below = self.blocks.get(child)
            if below is not None:
                below.parent = None  # its parent is gone: a block stored later under that hash is another
                self.roots.add(child)

    def prefixes(self) -> set[tuple[Any, ...]]:
        """Every block's whole token path from the root: what the cache holds, in comparable form."""
        out: set[tuple[Any, ...]] = set()
        stack = [(h, ()) for h in self.roots]
        while stack:
            h, above = stack.pop()
            block = self.blocks[h]
            path = above + block.tokens
            out.add(path)
            stack.extend((c, path) for c in block.children)
        return out

    # -- the view ---------------------------------------------------------------------------

    def _chains(self) -> tuple[dict[int, list[int]], dict[int, int]]:
        """Each node's blocks (a chain without a branch, keyed by its first block) and each
        node's subtree tokens."""
        chains: dict[int, list[int]] = {}
        order: list[int] = []
        stack = list(self.roots)
        while stack:
            first = stack.pop()
            chain = [first]
            while len(self.blocks[chain[-1]].children) == 1:
                chain.append(next(iter(self.blocks[chain[-1]].children)))
            chains[first] = chain
            order.append(first)
            stack.extend(self.blocks[chain[-1]].children)
        subtree: dict[int, int] = {}
        for first in reversed(order):  # children come after their parents in `order`
            chain = chains[first]
            own = sum(len(self.blocks[h].tokens) for h in chain)
            subtree[first] = own + sum(subtree[c] for c in self.blocks[chain[-1]].children)
        return chains, subtree

    def tree(self, budget: int) -> TreeView:
        """Root row first, then nodes heaviest subtree first (a prefix is a connected view)."""
        chains, subtree = self._chains()
        firsts = sorted(chains)  # index order is hash order: ties go to the lower hash
        index = {h: i for i, h in enumerate(firsts)}
        branches = []
        for h in firsts:
            chain = chains[h]
            tokens = sum(len(self.blocks[b].tokens) for b in chain)
            kids = tuple(index[c] for c in self.blocks[chain[-1]].children)
            branches.append(Branch(h, tokens, 0, subtree[h], kids))

        def head_of(i: int) -> tuple[int, ...]:
            head: list[int] = []
            for b in chains[firsts[i]]:
                tokens = self.blocks[b].tokens
                head.extend(t if isinstance(t, int) else int(t[0]) for t in tokens[: MAX_HEAD_TOKENS - len(head)])
                if len(head) >= MAX_HEAD_TOKENS:
                    break
            return tuple(head)

        return heaviest_first(branches, sorted(index[h] for h in self.roots), budget, head_of)

    def snapshot(self, *, rank: int, instance: str, seq: int, budget: int) -> Snapshot:
        """The mirror in the debug endpoint's shape; what kv-events do not carry is None."""
        started = time.process_time()
        tree = self.tree(budget)
        return rebuilt_snapshot(
            tree, rank=rank, instance=instance, seq=seq, when=time.time(), cache_class=CACHE_CLASS,
            page_size=self.block_size, lock_detail="none", seconds=time.process_time() - started,
        )
