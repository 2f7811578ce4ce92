"""The tree SGLang prints at a failure, read back from the log: both print forms, the rows among
other lines, split by another rank's rows, over several batches; the radix pane's view of it and
the bundle's copy. The rows here are SGLang 0.5.23's print format; tests/test_sglang_real.py holds
the reader to the prints of the real caches."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

from incident_helpers import start_sim, wait_for

from radixtop.diagnosis.printed_tree import PrintedTreeReader, parse_row, printed_snapshot, read_printed_trees
from radixtop.probes.radix_tree import TreeIndex
from radixtop.session.printed import PrintedTrees
from radixtop.session.radix_board import RadixBoard

OOM = [
    "[2026-12-05 10:00:00.250 TP1] Prefill out of memory. Try to lower your batch size.",
    "Try to allocate 64 tokens.",
    "Available tokens: 304 (available_size=48 + evictable_size=256)",
]
# RadixCache._print_helper with page_size 1: print(" " * indent, len(key), key.token_ids[:10], f"r={lock_ref}")
LEGACY = [
    " 0 [] r=1",
    "   12 [5, 6, 7, 8, 9, 10, 11, 12, 13, 14] r=0",
    "   14 array('q', [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]) r=2",
    "     3 array('q', [99, 98, 97]) r=1",
    "     15 [(15, 16), (16, 17), (17, 18)] r=-1",
    "#tokens: 44",
]
# UnifiedTreeCore.pretty_print (the Rust core prints "Full=")
UNIFIED = [
    " [1] 0 full_lock=1 Full=no",
    "   [3] 14 full_lock=1 Full=yes",
    "     [2] 15 full_lock=0 Full=yes",
    "     [4] 3 full_lock=1 Full=yes",
    "   [5] 12 full_lock=0 Full=yes",
]


def test_rows_of_both_forms_and_lines_that_only_look_like_rows() -> None:
    form, node = parse_row("     3 array('q', [99, 98, 97]) r=1")
    assert form == "radix-cache" and (node.depth, node.tokens, node.lock_ref, node.head) == (2, 3, 1, (99, 98, 97))
    form, node = parse_row("   [3] 14 full_lock=1 full=yes swa=no mamba=yes")
    assert form == "unified" and (node.depth, node.node_id, node.tokens, node.lock_ref) == (1, 3, 14, 1)
    assert node.components == (("full", True), ("swa", False), ("mamba", True))
    assert parse_row("   15 [(15, 16), (16, 17)] r=0")[1].head == (15, 16)  # bigram keys: the first of each pair
    assert parse_row(" 0 [] r=1\r")[1].depth == 0  # a carriage return at the end
    for text in ("  12 [1, 2] r=0",  # an even indent is no print of SGLang's
                 "12 [1, 2] r=0", "[2026-12-05 10:00:00] got [1, 2] r=0", "   [3] 14 full_lock=x"):
        assert parse_row(text) is None, text


def test_a_legacy_print_after_its_error_line_gives_the_tree_its_rank_time_and_pool() -> None:
    (tree,) = read_printed_trees(["noise", *OOM, *LEGACY, "after"])
    assert tree.form == "radix-cache" and tree.complete and tree.total_tokens == 44 == tree.tokens
    assert [(n.depth, n.tokens, n.lock_ref) for n in tree.nodes] == [
        (0, 0, 1), (1, 12, 0), (1, 14, 2), (2, 3, 1), (2, 15, -1)]
    t = tree.trigger
    assert (t.rank, t.requested, t.available, t.evictable) == ("TP1", 64, 48, 256)
    assert t.text == "Prefill out of memory. Try to lower your batch size." and t.epoch is not None
    assert tree.rank_number == 1 and (tree.first_line, tree.last_line) == (5, 9)
    assert "4 nodes" in tree.describe() and "17 locked" in tree.describe()

    snap = printed_snapshot(tree, rank=1, seq=1, budget=100)
    rows = snap.tree.nodes
    assert snap.tree.walked_nodes == 4 and snap.tree.cut_nodes == 0 and snap.tree.walked_tokens == 44
    assert (snap.available_tokens, snap.evictable_tokens, snap.protected_tokens) == (48, 256, 17)
    assert snap.time == t.epoch and snap.cache_class == "RadixCache"
    # heaviest first: the 14-token node (32 tokens below it) before the 12-token one; parents point back
    by_head = {r.head[:1]: r for r in rows[1:]}
    assert rows[1].tokens == 14 and rows[1].subtree_tokens == 32
    assert rows[by_head[(99,)].parent] is rows[1] and by_head[(15,)].lock_ref == -1
    index = TreeIndex.build(snap)
    assert index.marks[0] & TreeIndex.LOCKED and index.marks[0] & TreeIndex.NEGATIVE


def test_the_unified_print_of_either_core_has_node_ids_and_no_total_line() -> None:
    reader = PrintedTreeReader()
    assert reader.feed(["[2026-12-05 10:00:00 TP0] Sanity check FAILED (2 violations across 5 nodes):"]) == []
    (open_tree,) = reader.feed(UNIFIED)
    assert open_tree.form == "unified" and not open_tree.complete and open_tree.trigger.rank == "TP0"
    assert [n.node_id for n in open_tree.nodes] == [1, 3, 2, 4, 5] and open_tree.locked_tokens == 17
    (ended,) = reader.feed(["next"] * 200)  # a print has ended when other lines have followed it long enough
    assert ended.complete and ended.nodes == open_tree.nodes
    assert reader.feed(["more"]) == []


def test_a_parent_locked_less_than_its_child_is_a_lock_released_twice() -> None:
    healthy = [" 0 [] r=1", "   8 [1, 2] r=3", "     4 [3] r=2", "     4 [4] r=1", "   8 [9] r=0"]
    (tree,) = read_printed_trees(healthy)
    assert tree.inverted_locks == 0 and "released twice" not in tree.describe()  # the root's 1 is no lock
    (tree,) = read_printed_trees([*healthy[:2], "     4 [3] r=4", "       2 [5] r=5", *healthy[3:]])
    assert tree.inverted_locks == 2 and tree.describe().startswith("2 node(s) locked less than a child")


def test_rows_among_other_lines_and_out_of_place_rows_are_counted_not_guessed() -> None:
    # stdout's block buffer lands between stderr's lines; another rank's rows split this one's
    lines = [*OOM, LEGACY[0], "[2026-12-05 10:00:01] INFO: 127.0.0.1 - GET /health 200", LEGACY[1], LEGACY[2],
             "         7 [1, 2] r=0",  # three levels deeper than the row before: not this tree's
             LEGACY[3], "[(17, 18)] r=0", LEGACY[4], LEGACY[5]]
    (tree,) = read_printed_trees(lines)
    assert len(tree.nodes) == 5 and tree.skipped_rows == 1 and tree.tokens == 44
    assert "1 rows out of place (skipped)" in tree.describe()


def test_a_print_split_over_batches_grows_then_a_second_failure_starts_a_new_tree() -> None:
    reader = PrintedTreeReader()
    assert reader.feed(OOM) == []
    (first,) = reader.feed(LEGACY[:3])
    assert not first.complete and len(first.nodes) == 3 and first.trigger is not None
    (grown,) = reader.feed(LEGACY[3:])
    assert grown.complete and len(grown.nodes) == 5 and grown.first_line == first.first_line
    (second,) = reader.feed([*OOM, *LEGACY])
    assert second.first_line > grown.last_line and second.complete
    # a batch with neither a row nor an error line costs one substring test and returns nothing
    assert reader.feed(["[2026-12-05 10:00:02 TP0] Decode batch, #running-req: 8"] * 1000) == []


def test_the_board_turns_to_the_first_ranks_print_and_keeps_it_beside_the_live_ranks() -> None:
    printed = PrintedTrees()
    board = RadixBoard()
    tp0 = [line.replace("TP1", "TP0") for line in OOM]
    for sample in printed.feed("server.log", [*tp0, *LEGACY, *OOM, *LEGACY]):
        board.add(sample)
    labels = {v.name: v for v in board.ranks.values()}
    assert set(labels) == {"printed TP0", "printed TP1"}
    view = labels["printed TP0"]
    assert board.focus == view.url and board.focus_seq == 1  # TP1's print of the same failure does not steal it
    assert view.rank == 0 and view.locks_known and view.source.startswith("printed by the server at ")
    assert view.snapshot.tree.walked_nodes == 4 and view.index is not None
    assert "RadixCache print after 'Prefill out of memory" in view.source_note


def test_the_simulator_prints_its_tree_as_sglang_does_and_the_reader_takes_it_whole(tmp_path: Path) -> None:
    """The double-unlock fault leaves the tree counting as evictable what no eviction frees; the
    prefill's allocation then fails as SGLang's does, each rank printing its tree into the log."""
    sim = start_sim(tmp_path, "--max-total-tokens", "4096", "--page-size", "16", "--max-running-requests", "32",
                    "--tp-size", "2", "--fault", "double-unlock:seed=7")
    load = subprocess.Popen([sys.executable, "-m", "radixtop.incident.replay.load", "--url", sim.url],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        printed = re.compile(r"^#tokens: \d+$", re.MULTILINE)  # the print's last line, not the pool's log line
        assert wait_for(lambda: printed.search(sim.log.read_text(errors="replace")), 60), sim.log.read_text()[-3000:]
        time.sleep(0.5)
    finally:
        load.kill()
        load.wait(10)
        sim.stop()
    trees = read_printed_trees(sim.log.read_text().splitlines())
    assert [t.trigger.rank for t in trees][:2] == ["TP0", "TP1"]
    first = trees[0]
    assert first.complete and first.skipped_rows == 0 and first.total_tokens == first.tokens > 0
    t = first.trigger
    assert t.available is not None and t.available + t.evictable >= t.requested  # evictable, but not freed
    # the failure the print explains: a node the fault left locked less than its children
    assert first.inverted_locks >= 1 and "locked less than a child (a lock released twice)" in first.describe()


def test_the_bundle_keeps_each_print_as_a_snapshot(tmp_path: Path) -> None:
    from radixtop.incident.bundle.bundle import take_bundle

    log = tmp_path / "server.log"
    log.write_text("\n".join(["[2026-12-05 09:59:59 TP0] Prefill batch, #new-seq: 1", *OOM, *LEGACY, "done"]) + "\n")
    result = take_bundle(tmp_path / "out", logs=[str(log)], archive=False)
    (kept,) = sorted((result.path / "radix" / "printed").glob("*.json"))
    doc = json.loads(kept.read_text())
    assert doc["after"]["rank"] == "TP1" and doc["after"]["evictable"] == 256
    assert doc["snapshot"]["rank"] == 1 and doc["snapshot"]["tree"]["walked_nodes"] == 4
    assert doc["tail_lines"] == [5, 9] and "RadixCache print" in doc["what"]
