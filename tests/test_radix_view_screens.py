"""Screens of each view of the radix pane (pytest-textual-snapshot): a rank as it failed, its safe
point before, the tree the server printed, an earlier moment, two ranks side by side, a node's
details; at 80x24 in NO_COLOR where a person on a small terminal would read them."""

from __future__ import annotations

import pytest
from pane_helpers import make_snapshot
from test_printed_tree import LEGACY, OOM
from test_radix_holders import HOLDERS, OK, T0, URL, PaneApp, _flight, held_tree

from radixtop.probes.radix import RadixSample
from radixtop.probes.radix_tree import TreeIndex
from radixtop.session.flight_views import flight_sample
from radixtop.session.printed import PrintedTrees
from radixtop.session.radix_board import RadixBoard
from radixtop.widgets.radix import RadixPane


def _failed_board() -> RadixBoard:
    board = RadixBoard()
    board.add(flight_sample(_flight(3)))
    return board


def _kept_board() -> RadixBoard:
    """Ranks 0 and 1 polled three times each; the middle poll of each has requests holding locks."""
    board = RadixBoard()
    for i in range(3):
        for rank in (0, 1):
            at = T0 + 2 * i + rank
            nodes, holders = (held_tree(), HOLDERS) if i == 1 else (None, ())
            snap = make_snapshot(rank=rank, seq=10 * rank + i, when=at, nodes=nodes, holders=holders)
            board.add(RadixSample(f"http://127.0.0.1:{39100 + rank}", OK, at, rank=rank, snapshot=snap,
                                  index=TreeIndex.build(snap)))
    return board


def _pane(board: RadixBoard, *keys: str, moments: int = 0, now: float = T0 + 6):
    async def run(pilot) -> None:
        pane = pilot.app.query_one(RadixPane)
        pane.show(board, now=now)
        pane.tree_view.focus()
        if moments:
            pane.step_moment(moments)
        await pilot.press(*keys)
        await pilot.pause()

    return run


@pytest.fixture
def no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")


def test_a_rank_as_it_failed_80x24_no_color(snap_compare, utc, no_color) -> None:
    assert snap_compare(PaneApp(), terminal_size=(80, 24), run_before=_pane(_failed_board(), now=T0 + 1))


def test_its_safe_point_before_120x30(snap_compare, utc) -> None:
    assert snap_compare(PaneApp(), terminal_size=(120, 30), run_before=_pane(_failed_board(), moments=-1, now=T0 + 1))


def test_the_tree_the_server_printed_120x30(snap_compare, utc) -> None:
    board = RadixBoard()
    for sample in PrintedTrees().feed("server.log", [*OOM, *LEGACY]):
        board.add(sample)
    assert snap_compare(PaneApp(), terminal_size=(120, 30), run_before=_pane(board, "x"))


def test_an_earlier_moment_with_its_lock_holders_120x30(snap_compare, utc) -> None:
    assert snap_compare(PaneApp(), terminal_size=(120, 30), run_before=_pane(_kept_board(), "x", moments=-1))


def test_two_ranks_side_by_side_at_an_earlier_moment_160x40(snap_compare, utc) -> None:
    assert snap_compare(PaneApp(), terminal_size=(160, 40), run_before=_pane(_kept_board(), "w", "x", moments=-1))


def test_a_nodes_details_80x24_no_color(snap_compare, utc, no_color) -> None:
    board = RadixBoard()
    snap = make_snapshot(nodes=held_tree(), holders=HOLDERS)
    board.add(RadixSample(URL, OK, T0, rank=0, snapshot=snap, index=TreeIndex.build(snap)))
    assert snap_compare(PaneApp(), terminal_size=(80, 24), run_before=_pane(board, "x", "down", "down", "v"))
