"""Stepping back through a rank's kept snapshots: an earlier snapshot made whole again from the
shared rows is the snapshot that was kept (ids or none, parents where they were), and its index,
whose rows' children are sorted only when listed, says what the whole index built at once says."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from pane_helpers import make_snapshot

from radixtop.probes.radix import RadixSample
from radixtop.probes.radix_tree import TreeIndex, _release_parts, _tree_size
from radixtop.probes.status import SourceState
from radixtop.schema import NodeRow
from radixtop.session.radix_board import RadixBoard
from radixtop.session.snapshot_store import SnapshotStore
from radixtop.widgets.radix import RadixTreeView

URL = "http://127.0.0.1:39100"


@st.composite
def trees(draw: st.DrawFn) -> tuple[NodeRow, ...]:
    """A root and up to 60 rows, each under an earlier row; some without an id, some locked, some
    with a negative lock_ref, some without a subtree size."""
    n = draw(st.integers(0, 60))
    rows = [NodeRow(None if draw(st.booleans()) else 0, -1, 0, draw(st.sampled_from((0, 0, 1, -1))), False,
                    None, None, 0, draw(st.one_of(st.none(), st.integers(0, 500))), ())]
    for i in range(1, n + 1):
        rows.append(NodeRow(
            None if draw(st.integers(0, 9)) == 0 else i,
            draw(st.integers(0, i - 1)),
            draw(st.integers(0, 64)),
            draw(st.sampled_from((0, 0, 0, 1, 2, -1))),
            draw(st.booleans()),
            draw(st.one_of(st.none(), st.integers(0, 9))),
            draw(st.one_of(st.none(), st.floats(0, 100))),
            0,
            draw(st.one_of(st.none(), st.integers(0, 500))),
            tuple(draw(st.lists(st.integers(0, 99), max_size=3))),
        ))
    return tuple(rows)


@settings(max_examples=200, deadline=None)
@given(trees())
def test_the_lazy_index_says_what_the_whole_index_says(nodes: tuple[NodeRow, ...]) -> None:
    snap = make_snapshot(nodes=nodes)
    whole, lazy = TreeIndex.build(snap), TreeIndex.lazy(snap)
    assert whole is not None and lazy is not None
    assert lazy.marks == whole.marks and lazy.depth_max == whole.depth_max
    assert len(lazy.children) == len(whole.children)
    assert [lazy.children[r] for r in reversed(range(len(nodes)))][::-1] == list(whole.children)  # any order asked
    assert tuple(lazy.children) == whole.children and lazy.children[-1] == whole.children[-1]
    assert lazy.children[1:4] == whole.children[1:4]


@settings(max_examples=100, deadline=None)
@given(trees(), st.randoms(use_true_random=False))
def test_a_kept_snapshot_comes_back_whole_whatever_its_ids_and_order(nodes: tuple[NodeRow, ...], rng) -> None:
    store = SnapshotStore()
    snaps = []
    rows = list(nodes)
    for seq in range(4):
        if len(rows) > 2:  # a row changes, and two rows swap places (their children now under the other)
            i = rng.randrange(1, len(rows))
            rows[i] = rows[i]._replace(hit_count=(rows[i].hit_count or 0) + 1)
            a = rng.randrange(1, len(rows) - 1)
            if rows[a + 1].parent < a:
                rows[a], rows[a + 1] = rows[a + 1], rows[a]
        snaps.append(make_snapshot(seq=seq, nodes=tuple(rows)))
        store.add(float(seq), snaps[-1])
    assert [store.load(k) for k in store] == snaps


def test_a_step_lists_the_rows_the_whole_index_lists_and_frees_without_sorting_every_row() -> None:
    nodes = [NodeRow(None, -1, 0, 0, False, None, None, 3, 96, ())]
    nodes += [NodeRow(i, 0 if i <= 3 else i - 3, 16, 1 if i == 8 else 0, False, 1, 100.0, 1, 16 * (13 - i), ())
              for i in range(1, 13)]
    board = RadixBoard()
    for seq in range(3):
        snap = make_snapshot(seq=seq, when=1_000.0 + seq, nodes=tuple(nodes))
        board.add(RadixSample(URL, SourceState("ok"), 1_000.0 + seq, rank=0, snapshot=snap))
    view = board.ranks[URL]
    view.step(-1)
    shown, index = view.shown()
    assert shown is not None and index is not None and shown.seq == 1
    lazy, whole = RadixTreeView(), RadixTreeView()
    lazy.expanded = whole.expanded = {2, 5}
    lazy.set_tree(shown, index)
    whole.set_tree(shown, TreeIndex.build(shown))
    assert lazy.rows == whole.rows and [r for r, _, _ in lazy.rows] == [0, 2, 5, 8, 1, 3]
    assert index.children._cache.keys() == {0, 2, 5}  # type: ignore[attr-defined]  # the listed rows only
    assert _tree_size(index) == len(nodes) and len(_release_parts(index)) == 4
