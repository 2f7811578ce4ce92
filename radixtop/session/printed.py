"""The trees SGLang printed into the followed logs, as radix samples the board shows beside the
live ranks: one view per file and printing rank, the newest print replacing the one before.

A print is the server's own picture of its cache at the failure (`diagnosis/printed_tree.py`); on
a server without radixtop's instrument it is the only one, so it gets a view of its own, named
"printed" with the rank and time of the error line it followed.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from radixtop.diagnosis.printed_tree import PrintedTree, PrintedTreeReader, printed_snapshot
from radixtop.probes.radix import DEFAULT_BUDGET, RadixSample
from radixtop.probes.radix_tree import TreeIndex
from radixtop.probes.status import SourceState

SOURCE = "printed by the server"
MAX_FILES = 64  # readers kept, one per followed file: a glob of rotating files stays bounded


class PrintedTrees:
    def __init__(self, *, budget: int = DEFAULT_BUDGET) -> None:
        self.budget = budget
        self._readers: dict[str, PrintedTreeReader] = {}
        self._seq = 0

    def feed(self, source: str, texts: Sequence[str], found: frozenset[str] | None = None) -> list[RadixSample]:
        """`found`: the needles the lines hold (PrintedTreeReader.feed), when already looked for."""
        reader = self._readers.get(source)
        if reader is None:
            if len(self._readers) >= MAX_FILES:
                self._readers.pop(next(iter(self._readers)))
            reader = self._readers[source] = PrintedTreeReader()
        return [self._sample(source, tree) for tree in reader.feed(texts, found)]

    def _sample(self, source: str, tree: PrintedTree) -> RadixSample:
        self._seq += 1
        trigger = tree.trigger
        rank_name = trigger.rank if trigger is not None else None
        rank = tree.rank_number
        snap = printed_snapshot(tree, rank=rank, seq=self._seq, budget=self.budget)
        at = time.strftime("%H:%M:%S", time.localtime(snap.time))
        who = rank_name or "a rank (unnamed)"
        return RadixSample(
            url=f"printed {rank_name or '?'} {source}",
            status=SourceState("ok", "", snap.time),
            time=time.time(),
            rank=rank,
            snapshot=snap,
            index=TreeIndex.build(snap),
            source=f"{SOURCE} at {at} ({who})",
            source_note=tree.describe(),
            label=f"printed {rank_name}" if rank_name else "printed",
        )
