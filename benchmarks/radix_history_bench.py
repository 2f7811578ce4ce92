"""Stepping back through the radix pane's kept snapshots: memory and the time of one step.

    python benchmarks/radix_history_bench.py [--quick] [--snapshots N] [--nodes N] [--churn F] [--expanded N]

A rank's view keeps every snapshot the pane received (session/snapshot_store.py): a header and an
array of indices into a table of distinct rows that all its snapshots share. Here 1,000 snapshots
of 10,000 nodes each go through the board as the probe hands them over, made with radixtop's own
schema as a busy server's polls look: between two polls `--churn` of the nodes change (hit count,
access time, lock: the paths running requests touch; 2 % by default, 200 nodes), some are evicted
and inserted, and the siblings' order shifts. Then the pane's step is timed as a key press costs
it: the cursor moved to a kept snapshot (RankView.step, to a random one other than the one shown),
the snapshot made whole and indexed (RankView.shown), and the pane's tree given it
(RadixTreeView.set_tree, which flattens the rows it lists: the root's children and a path of
`--expanded` nodes opened by hand), with the cyclic collector set as the app sets it.

The peer in the same run: the same snapshots held as Snapshot objects (what the board kept
before), measured on a tenth of them and scaled (the thousand would take gigabytes).
Targets: a step under 50 ms; the kept snapshots under 150 MiB.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_rows import row  # noqa: E402

from radixtop.probes.radix import RadixSample  # noqa: E402
from radixtop.probes.radix_tree import TreeIndex  # noqa: E402
from radixtop.probes.status import SourceState  # noqa: E402
from radixtop.schema import SCHEMA_VERSION, Counters, NodeRow, Snapshot, TreeView  # noqa: E402
from radixtop.session.radix_board import RadixBoard  # noqa: E402

URL = "http://127.0.0.1:39100"


class BusyTree:
    """A tree of `nodes` nodes whose polls change as a busy server's do."""

    def __init__(self, nodes: int, churn: float, rng: random.Random) -> None:
        self.rng = rng
        self.churn = churn
        self.next_id = nodes + 1
        self.rows = [NodeRow(None, -1, 0, 1, False, None, None, 64, nodes * 32, ())]
        for i in range(1, nodes + 1):
            parent = 0 if i <= 64 else rng.randrange(max(1, i - 300), i)
            self.rows.append(self._row(i, parent, 1_000.0))

    def _row(self, node_id: int, parent: int, now: float) -> NodeRow:
        rng = self.rng
        return NodeRow(node_id, parent, 16 * rng.randint(1, 4), rng.choice((0, 0, 0, 1)), False, rng.randint(0, 50),
                       now - rng.random() * 600, 0, None, tuple(rng.randrange(128_000) for _ in range(8)))

    def poll(self, seq: int) -> Snapshot:
        rng, rows = self.rng, self.rows
        now = 1_000.0 + seq * 2
        n = len(rows) - 1
        for i in rng.sample(range(1, n + 1), int(n * self.churn)):  # the paths running requests touch
            r = rows[i]
            rows[i] = r._replace(hit_count=(r.hit_count or 0) + 1, last_access=now, lock_ref=rng.choice((0, 1, 2)))
        for _ in range(max(1, n // 500)):  # an eviction and an insertion: a leaf replaced
            i = rng.randrange(65, n + 1)
            rows[i] = self._row(self.next_id, rows[i].parent, now)
            self.next_id += 1
        a = rng.randrange(1, 64)  # siblings' order shifts (heaviest subtree first)
        rows[a], rows[a + 1] = rows[a + 1], rows[a]  # (their children now name the other as parent)
        tree = TreeView(n, n, sum(r.tokens for r in rows), 0, 0, True, tuple(rows))
        return Snapshot(SCHEMA_VERSION, 0, "aa11", seq, 1_700_000_000.0 + seq * 2, now, 0.01, "RadixCache", True, "",
                        16, 1 << 22, 1 << 20, 1 << 21, 1 << 19, "active",
                        Counters(lock_ops=seq * 10, unlock_ops=seq * 10), seq * 10, None, tree)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="200 snapshots")
    parser.add_argument("--snapshots", type=int, default=None)
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--churn", type=float, default=0.02)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--expanded", type=int, default=8, help="nodes of one path expanded in the pane")
    args = parser.parse_args()
    count = args.snapshots or (200 if args.quick else 1_000)
    from radixtop.tui.app import GC_YOUNG_THRESHOLD

    _, older, oldest = gc.get_threshold()  # the collector as the app sets it up
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)
    rng = random.Random(7)
    tree = BusyTree(args.nodes, args.churn, rng)

    board = RadixBoard()
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    adding = []
    for seq in range(count + 1):
        snap = tree.poll(seq)
        began = time.perf_counter()
        board.add(RadixSample(URL, SourceState("ok"), 1_700_000_000.0 + seq * 2, rank=0, snapshot=snap))
        adding.append(time.perf_counter() - began)
        del snap
    view = board.ranks[URL]
    gc.collect()
    kept = tracemalloc.get_traced_memory()[0] - base  # the store and the latest snapshot
    tracemalloc.stop()
    # tracemalloc's teardown frees its table of traces (one small malloc'd entry per live block)
    # into glibc's fast bins; the next malloc over 1 KiB merges them all, tens of milliseconds the
    # app never pays (it never traces). Paid here, before the steps, and printed.
    began = time.perf_counter()
    bytes(4096)
    teardown = time.perf_counter() - began

    from radixtop.widgets.radix import RadixTreeView

    pane = RadixTreeView()  # the pane's tree, headless: set_tree flattens what it lists
    pane.set_tree(*view.shown())
    nodes = view.snapshot.tree.nodes if view.snapshot is not None and view.snapshot.tree is not None else ()
    index = view.index or TreeIndex.build(view.snapshot)
    on = 0
    for _ in range(args.expanded):  # a path opened by hand: the heaviest child, and its, and on
        kids = index.children[on] if index is not None else ()
        if not kids:
            break
        on = kids[0]
        pane.expanded.add(nodes[on].id)
    steps = []
    listed = []
    for _ in range(args.steps):
        at = len(view.earlier) if view.cursor is None else view.cursor
        to = at
        while to == at:  # a kept snapshot not shown now: made whole and indexed again
            to = rng.randrange(len(view.earlier))
        began = time.perf_counter()
        view.step(to - at)  # what a key press costs: the cursor moved, the snapshot made whole and
        shown, index = view.shown()  # indexed, the pane's rows flattened
        pane.set_tree(shown, index)
        steps.append(time.perf_counter() - began)
        assert shown is not None and index is not None and len(shown.tree.nodes) == args.nodes + 1
        assert view.cursor == to and pane.rows
        listed.append(len(pane.rows))

    sample = max(2, count // 10)
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    held = [BusyTree(args.nodes, args.churn, random.Random(i)).poll(0) for i in range(sample)]
    held_bytes = (tracemalloc.get_traced_memory()[0] - base) * count / sample
    tracemalloc.stop()
    del held

    mib = 1 << 20
    p50, worst = statistics.median(steps) * 1e3, max(steps) * 1e3
    p95 = sorted(steps)[int(len(steps) * 0.95) - 1] * 1e3
    print(f"{count:,} snapshots of {args.nodes:,} nodes, {args.churn:.0%} of the nodes changed a poll; "
          f"{len(view.earlier):,} kept, {view.earlier.distinct_rows:,} distinct rows")
    print(f"radixtop (shared rows): {kept / mib:.1f} MiB (tracemalloc); a step median {p50:.1f} ms, "
          f"p95 {p95:.1f} ms, max {worst:.1f} ms over {args.steps} ({statistics.median(listed):.0f} rows listed, "
          f"{len(pane.expanded)} nodes expanded); keeping one on the UI thread: median "
          f"{statistics.median(adding) * 1e3:.1f} ms")
    print(f"tracemalloc's teardown, paid before the steps: {teardown * 1e3:.1f} ms")
    print(f"peer (Snapshot objects held): {held_bytes / mib:,.0f} MiB for {count:,} (measured on {sample}, scaled)")
    row(f"radix pane: {count:,} kept snapshots of {args.nodes:,} nodes, memory", f"{kept / mib:.0f} MiB",
        f"Snapshot objects held: {held_bytes / mib:,.0f} MiB", "< 150 MiB", kept < 150 * mib)
    row(f"radix pane: a step back among {count:,} kept snapshots of {args.nodes:,} nodes",
        f"median {p50:.1f} ms, p95 {p95:.1f} ms, max {worst:.1f} ms", "objects held: nothing to rebuild",
        "< 50 ms", worst < 50)
    print(f"Command: python benchmarks/radix_history_bench.py{' --quick' if args.quick else ''}")


if __name__ == "__main__":
    main()
