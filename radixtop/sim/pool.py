"""A finite KV slot pool with SGLang's allocator shape, plus what the "GPU memory" holds.

Mirrors ``sglang.srt.mem_cache.allocator.TokenToKVPoolAllocator`` /
``PagedTokenToKVPoolAllocator`` (0.5.23) where radixtop looks: ``size``, ``page_size``,
``available_size()``, ``alloc(need_size)``, ``free(indices)``, ``clear()``. As in SGLang, slot 0
is reserved (the padding slot) and pages are numbered from 1; ``free`` releases whole pages
(the unique ``index // page_size``) and, like SGLang, does not check for double frees: a page freed
twice sits twice in the free list, which is what a real accounting bug looks like.

The free list is a stack: the most recently freed page is handed out first (SGLang prepends freed
pages to ``free_pages`` and allocates from the front). Freed slots keep their old contents, as GPU
memory does, so a stale read returns whatever the previous owner wrote.

The contents store is the simulator's stand-in for the K/V tensors: per slot, the token id and
the position written there. The model reads it back through :meth:`read`, so a request that reads
the wrong slots computes from the wrong "KV" and its output changes.
"""

from __future__ import annotations

import operator
import time
from array import array
from collections.abc import Callable, Iterable, Sequence
from itertools import repeat

__all__ = ["TokenToKVPoolAllocator"]


class TokenToKVPoolAllocator:
    """``size`` tokens of KV memory, handed out in pages of ``page_size`` slots."""

    def __init__(
        self,
        size: int,
        page_size: int = 1,
        *,
        store_contents: bool = True,
        clock: Callable[[], float] = time.monotonic,
        stamp_pages: bool = True,
    ) -> None:
        """``stamp_pages``: alloc_pages records each page's allocation time in page_alloc_time (the
        block-boundary fault reads them; without it nothing does)."""
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        if size < page_size:
            raise ValueError(f"pool size ({size} tokens) must hold at least one page of {page_size}")
        self.page_size = page_size
        self.num_pages = size // page_size
        # Capacity is whole pages only, as SGLang rounds max_total_num_tokens down to the page size.
        self.size = self.num_pages * page_size
        self.device = "cpu"
        self.clock = clock
        self.store_contents = store_contents
        self.stamp_pages = stamp_pages
        slots = (self.num_pages + 1) * page_size
        # -1 marks "never written"; slot 0 / page 0 is the reserved padding page.
        self.kv_token = array("q", [-1]) * slots if store_contents else array("q")
        self.kv_pos = array("q", [-1]) * slots if store_contents else array("q")
        self.page_alloc_time = array("d", [0.0]) * (self.num_pages + 1)
        self.written_pages: set[int] = set()
        self.free_pages: list[int] = []
        # Every slot and every page number, made once: the rows and node values built from them
        # share their int objects, so pages_of compares a row with its pages' slots by identity,
        # not value by value, and the slots of consecutive pages are one slice. Each page's slots
        # are a tuple of the same objects, for pages that are not. (A page of one slot is its
        # slot: nothing to make.)
        self._slots = list(range(slots if page_size > 1 else 0))
        self._pages = list(range(self.num_pages + 1 if page_size > 1 else 0))
        self._slots_of_page = [
            tuple(self._slots[p * page_size : (p + 1) * page_size]) for p in self._pages
        ]
        self.clear()

    # ----- SGLang's allocator surface -----

    def clear(self) -> None:
        """Every page free again (SGLang's ``clear()``, used by flush_cache). Contents survive."""
        # Stack top is the end of the list: page 1 is handed out first after a clear.
        self.free_pages = list(range(self.num_pages, 0, -1))

    def available_size(self) -> int:
        return len(self.free_pages) * self.page_size

    def alloc(self, need_size: int) -> list[int] | None:
        """``need_size`` slot indices (a multiple of page_size when paged), or None when short."""
        if self.page_size > 1 and need_size % self.page_size:
            raise ValueError(f"paged alloc needs a multiple of page_size {self.page_size}, got {need_size}")
        pages = self.alloc_pages(-(-need_size // self.page_size))
        if pages is None:
            return None
        return self.page_slots(pages)

    def free(self, free_index: Iterable[int]) -> None:
        """Return the pages holding these slots to the free list (no double-free check, as SGLang)."""
        if isinstance(free_index, list) and not free_index:
            return  # as often as not a request frees none of its slots: no maps built for that
        pages = self.pages_of(free_index)
        if not pages:
            return
        # Freed pages go on top of the stack, lowest first out, so reuse order is deterministic.
        pages.reverse()
        self.free_pages.extend(pages)

    # ----- page-level helpers the scheduler uses -----

    def alloc_pages(self, num_pages: int) -> list[int] | None:
        if num_pages <= 0:
            return []
        if num_pages > len(self.free_pages):
            return None
        taken = self.free_pages[-num_pages:]
        del self.free_pages[-num_pages:]
        taken.reverse()
        if self.stamp_pages:
            now = self.clock()
            alloc_time = self.page_alloc_time
            for page in taken:
                alloc_time[page] = now
        return taken

    def page_slots(self, pages: Sequence[int]) -> list[int]:
        """The slots of ``pages`` (this pool's, 0..num_pages), page after page."""
        page_size = self.page_size
        if page_size == 1:
            return list(pages)
        if pages:
            first, count = pages[0], len(pages)
            if pages[-1] - first == count - 1 and pages == self._pages[first : first + count]:
                return self._slots[first * page_size : (first + count) * page_size]  # one stretch
        slots: list[int] = []
        slots_of_page = self._slots_of_page
        for page in pages:  # a tuple's items are added at once: faster than chaining them one by one
            slots += slots_of_page[page]
        return slots

    def pages_of(self, slots: Iterable[int]) -> list[int]:
        """The pages holding ``slots``, each once, in the order they first appear."""
        page_size = self.page_size
        if page_size == 1:
            return list(dict.fromkeys(slots))
        if isinstance(slots, list) and slots and slots[0] % page_size == 0:
            # A request's row from a page boundary, or a node's share of one, is its pages' slots in
            # order (the last page perhaps cut short): then every page_size-th slot names a page,
            # and the check that the rest follow compares the same int objects. Most such rows
            # are one stretch of consecutive pages: one slice of the pool's slots to compare.
            start = slots[0]
            end = start + len(slots)
            if 0 <= start and slots == self._slots[start:end]:
                return self._pages[start // page_size : -(-end // page_size)]
            pages = list(map(operator.floordiv, slots[::page_size], repeat(page_size)))
            if 0 <= min(pages) and max(pages) <= self.num_pages:
                own = self.page_slots(pages)
                if slots == (own if len(own) == len(slots) else own[: len(slots)]):
                    return list(dict.fromkeys(pages))
        return list(dict.fromkeys(map(operator.floordiv, slots, repeat(page_size))))

    def page_of(self, slot: int) -> int:
        return slot // self.page_size

    # ----- the KV contents ("what the GPU memory holds") -----

    def write(self, slots: Sequence[int], tokens: Sequence[int], first_position: int) -> None:
        """Store token ids at ``slots`` for consecutive positions starting at ``first_position``."""
        if not self.store_contents:
            return
        kv_token, kv_pos = self.kv_token, self.kv_pos
        page_size = self.page_size
        written = self.written_pages
        pos = first_position
        for slot, tok in zip(slots, tokens):
            kv_token[slot] = tok
            kv_pos[slot] = pos
            pos += 1
        if len(slots) == 1:
            written.add(slots[0] // page_size)
        else:
            written.update({s // page_size for s in slots})

    def read(self, slot: int) -> tuple[int, int]:
        """(token id, position) last written at ``slot``; (-1, -1) if never written."""
        return self.kv_token[slot], self.kv_pos[slot]
