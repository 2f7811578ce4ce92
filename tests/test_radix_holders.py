"""Who holds a lock, the failing operation's path, a node's details, and two ranks side by side:
the radix pane's rows and keys on snapshots built from the schema (the instrument and the
simulator that produce them are tested against the real server elsewhere)."""

from __future__ import annotations

from pathlib import Path

from pane_helpers import make_snapshot, node
from textual.app import App, ComposeResult

from radixtop.probes.flight import FlightFile
from radixtop.probes.radix import RadixSample
from radixtop.probes.radix_tree import TreeIndex
from radixtop.probes.status import SourceState
from radixtop.schema import FlightRecord, Holder, Sharer, Trigger
from radixtop.session.flight_views import flight_sample
from radixtop.session.lock_holders import LockHolders
from radixtop.session.radix_board import RadixBoard
from radixtop.widgets.radix import RadixPane
from radixtop.widgets.radix_node import NodeScreen

T0 = 1_700_000_000.0
OK = SourceState("ok", "", T0)
URL = "http://127.0.0.1:39100"


def held_tree(root_lock: int = 1) -> tuple:
    """root -> 1 (lock 2) -> 2 (lock 1, r-a's) ; 1 -> 3 (lock 1, r-b's); root -> 4 (lock 1, nobody's)."""
    return (
        node(-1, 0, root_lock, 0, children=2, subtree=80),
        node(0, 16, 2, 1, children=2, subtree=48),
        node(1, 16, 1, 2),
        node(1, 16, 1, 3),
        node(0, 32, 1, 4),
    )


HOLDERS = (Holder("r-a", 2, 12.5, 300, "running"), Holder("r-b", 3, 1.0, 40, "chunked"))


def used_tree() -> tuple:
    """held_tree()'s, with 4 unlocked and an unlocked 5 under it: the nodes earlier requests used."""
    return (*held_tree()[:4], node(0, 32, 0, 4, children=1, subtree=40), node(4, 8, 0, 5))


# r-old let go of #5, r-older of #4; r-gone's node is no longer among the rows; r-a still holds #2
# and let go of #3 at a checkpoint before (a request holding a lock is named by it, not here).
SHARERS = (Sharer("r-old", 5, 3.0, 64), Sharer("r-older", 4, 40.0, 48), Sharer("r-gone", 99, 1.0, 8))


def _board(snap, *, url: str = URL, rank: int = 0, at: float = T0) -> RadixBoard:
    board = RadixBoard()
    board.add(RadixSample(url, OK, at, rank=rank, snapshot=snap, index=TreeIndex.build(snap)))
    return board


class PaneApp(App):
    def compose(self) -> ComposeResult:
        yield RadixPane(id="pane")


def _text(pane: RadixPane, n: int = 8) -> list[str]:
    return [pane.tree_view.render_line(y).text.rstrip() for y in range(n)]


# ----------------------------------------------------------------------------------------------
# Placing the holders


def test_holders_are_placed_on_their_paths_and_a_lock_nobody_holds_is_found_where_it_was_taken() -> None:
    h = LockHolders.of(make_snapshot(nodes=held_tree(), holders=HOLDERS))
    assert h.known and h.unplaced == 0
    assert [x.rid for x in h.held_by[1]] == ["r-a", "r-b"] and [x.rid for x in h.deepest[2]] == ["r-a"]
    assert h.unheld == (4,) and h.leaks == (4,) and h.overheld == ()
    # a leaked lock below a held node: the count above it is one more than its holders, the tip is where
    leaked = (held_tree()[0], node(0, 16, 3, 1, children=2), node(1, 16, 2, 2, children=1), held_tree()[3],
              node(0, 32, 0, 4), node(2, 8, 1, 5))
    h = LockHolders.of(make_snapshot(nodes=leaked, holders=HOLDERS))
    assert h.leaks == (5,) and set(h.unheld) == {1, 2, 5}
    # a lock released twice: fewer locks than the requests holding them
    twice = (held_tree()[0], node(0, 16, 1, 1, children=2), *held_tree()[2:4])
    assert LockHolders.of(make_snapshot(nodes=twice, holders=HOLDERS)).overheld == (1,)


def test_holders_unknown_or_off_the_rows_claim_no_leak() -> None:
    assert not LockHolders.of(make_snapshot(nodes=held_tree())).known  # an older server: None
    off_rows = (*HOLDERS, Holder("r-c", 99, 0.5, 8, "waiting"))
    h = LockHolders.of(make_snapshot(nodes=held_tree(), holders=off_rows))
    assert h.unplaced == 1 and h.unheld == () and h.leaks == ()
    # the Rust core's walk says locked-or-not: a locked row no request covers is still flagged
    rust = make_snapshot(nodes=held_tree(), holders=HOLDERS, lock_detail="locked-only")
    assert LockHolders.of(rust).leaks == (4,)


def test_the_requests_that_let_go_are_placed_on_the_paths_they_used() -> None:
    h = LockHolders.of(make_snapshot(nodes=used_tree(), holders=HOLDERS, sharers=SHARERS))
    assert [u.rid for u in h.used_by[4]] == ["r-old", "r-older"] and [u.rid for u in h.used_by[5]] == ["r-old"]
    assert 1 not in h.used_by and h.unplaced == 0  # sharers hold no lock: no holder went missing
    assert h.leaks == ()  # and they are no holders: #4, unlocked now, is no leak


# ----------------------------------------------------------------------------------------------
# The pane


async def test_rows_name_their_holders_and_flag_the_lock_no_request_holds() -> None:
    app = PaneApp()
    async with app.run_test(size=(120, 30)) as pilot:
        pane = app.query_one(RadixPane)
        pane.show(_board(make_snapshot(nodes=held_tree(), holders=HOLDERS)), now=T0)
        pane.tree_view.focus()
        await pilot.press("x")  # open the locked paths
        await pilot.pause()
        rows = _text(pane)
        by_id = {int(r.split("#")[1].split()[0]): r for r in rows if "#" in r}
        assert "← r-a 12s" in by_id[2] and "← r-b 1.0s chunked" in by_id[3]
        assert "⚠ no request holds it" in by_id[4] and "⇠ shared by 2 requests" in by_id[1] and "←" not in by_id[1]
        summary = pane.query_one("#radix-summary").render().plain  # type: ignore[union-attr]
        assert "locks held by 2 requests: r-a 12s 300 tok, r-b 1.0s 40 tok chunked" in summary
        assert "⚠ locked with no request holding it: #4" in summary
        pane.show(_board(make_snapshot(nodes=held_tree())), now=T0)  # holders unknown
        await pilot.pause()
        rows = _text(pane)
        tips = [r for r in rows if "held, holder unknown" in r]
        assert [int(r.split("#")[1].split()[0]) for r in tips] == [2, 3, 4], rows  # the deepest locks only


def _flight(node_id: int | None, *, rank: int = 1) -> FlightFile:
    at = make_snapshot(rank=rank, seq=0, when=T0, nodes=held_tree())
    before = make_snapshot(rank=rank, seq=6, when=T0 - 1.5, nodes=held_tree())
    triggers = (
        Trigger("unlock_failure", "RuntimeError: lock_ref below zero", T0, node_id),
        Trigger("scheduler_exception", "Scheduler hit an exception", T0 + 0.01),
    )
    return FlightFile(Path(f"/x/flight/rank{rank}-pid42.json"), 0.0,
                      FlightRecord(1, rank, 42, 1, T0, triggers, at, (), 0, before))


async def test_the_failing_operations_path_is_marked_and_opened_with_the_cursor_on_its_node() -> None:
    board = RadixBoard()
    board.add(flight_sample(_flight(3)))
    app = PaneApp()
    async with app.run_test(size=(120, 30)) as pilot:
        pane = app.query_one(RadixPane)
        pane.show(board, now=T0)
        await pilot.pause()
        rows = _text(pane)
        marked = [r for r in rows if "»#" in r]
        assert [int(r.split("»#")[1].split()[0]) for r in marked] == [1, 3], rows
        assert "◀ unlock failure here" in marked[-1]
        view = pane.tree_view
        assert view.snapshot.tree.nodes[view.rows[view.cursor][0]].id == 3, "the cursor is on the failed node"
        summary = pane.query_one("#radix-summary").render().plain  # type: ignore[union-attr]
        assert "the unlock failure was on node #3 (marked »)" in summary
        # a record whose trigger names no node marks nothing and says nothing of a node
        board = RadixBoard()
        board.add(flight_sample(_flight(None)))
        pane.show(board, now=T0)
        await pilot.pause()
        assert not [r for r in _text(pane) if "»" in r]


async def test_rows_no_lock_holds_name_the_requests_that_used_them() -> None:
    app = PaneApp()
    async with app.run_test(size=(120, 30)) as pilot:
        pane = app.query_one(RadixPane)
        pane.show(_board(make_snapshot(nodes=used_tree(), holders=HOLDERS, sharers=SHARERS)), now=T0)
        view = pane.tree_view
        view.focus()
        await pilot.press("x")  # open the locked paths
        await pilot.pause()
        view.cursor = next(i for i, (row, *_) in enumerate(view.rows) if view.snapshot.tree.nodes[row].id == 4)
        await pilot.press("right")  # and #4
        await pilot.pause()
        rows = _text(pane, 10)
        by_id = {int(r.split("#")[1].split()[0]): r for r in rows if "#" in r}
        assert "⇠ r-old 3.0s ago +1" in by_id[4] and "⇠ r-old 3.0s ago" in by_id[5], rows
        assert "← r-a 12s" in by_id[2] and "ago" not in by_id[1]  # a held row names its holders
        summary = pane.query_one("#radix-summary").render().plain  # type: ignore[union-attr]
        assert "⇠ names the nodes 2 earlier requests used" in summary
        await pilot.press("v")
        await pilot.pause()
        text = app.screen.text.plain
        assert "used before by 2 requests" in text
        assert "  r-old  let go 3.0s ago  prompt 64 tok\n  r-older  let go 40s ago  prompt 48 tok" in text


async def test_v_shows_the_node_its_path_and_its_holders() -> None:
    app = PaneApp()
    async with app.run_test(size=(120, 30)) as pilot:
        pane = app.query_one(RadixPane)
        pane.show(_board(make_snapshot(nodes=held_tree(), holders=HOLDERS)), now=T0)
        pane.tree_view.focus()
        await pilot.press("x", "down", "down")  # root, #1, then #2 (r-a's)
        await pilot.press("v")
        await pilot.pause()
        assert isinstance(app.screen, NodeScreen)
        text = app.screen.text.plain
        assert text.startswith("node #2 · 16 tokens · lock 1")
        assert "held by 1 request\n  r-a  running  held 12s  prompt 300 tok  (locked at this node)" in text
        assert "path from the root" in text and "#1 " in text and "[1 2 3 4]" in text
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, NodeScreen)


async def test_w_puts_the_next_rank_beside_this_one_at_the_same_moment() -> None:
    board = RadixBoard()
    url0, url1 = URL, "http://127.0.0.1:39101"
    for i in range(3):  # rank 0 at T0, +2, +4; rank 1 a second later each time
        board.add(RadixSample(url0, OK, T0 + 2 * i, rank=0, snapshot=make_snapshot(rank=0, seq=i, when=T0 + 2 * i)))
        nodes = held_tree() if i == 1 else None
        snap1 = make_snapshot(rank=1, seq=10 + i, when=T0 + 2 * i + 1, nodes=nodes)
        board.add(RadixSample(url1, OK, T0 + 2 * i + 1, rank=1, snapshot=snap1))
    app = PaneApp()
    async with app.run_test(size=(160, 40)) as pilot:
        pane = app.query_one(RadixPane)
        pane.show(board, now=T0 + 5)
        pane.tree_view.focus()
        await pilot.press("w")
        await pilot.pause()
        title = pane.query_one("#radix-side-title").render().plain  # type: ignore[union-attr]
        assert title.startswith("rank 1 at ") and "snapshot #12" in title, title
        pane.step_moment(-1)  # rank 0 at T0+2: rank 1's newest at or before it is T0+1
        await pilot.pause()
        title = pane.query_one("#radix-side-title").render().plain  # type: ignore[union-attr]
        assert "snapshot #10" in title and "1.0s before" in title, title
        pane.step_moment(1)
        pane.step_moment(-1)
        pane.step_moment(1)
        await pilot.pause()
        side = pane.side_view
        assert side.snapshot.seq == 12 and side.compact and pane.tree_view.compact
        assert "hits" not in pane.query_one("#radix-columns").render().plain  # type: ignore[union-attr]
        await pilot.press("w")
        await pilot.pause()
        assert not pane.side_by_side and not pane.tree_view.compact
        assert not pane.query_one("#radix-side").display


def test_the_time_scale_places_the_moments_kept_and_the_one_shown() -> None:
    from radixtop.widgets.radix import time_scale

    assert time_scale([0.0, 5.0, 10.0], 1, 11) == "▕·    ◆    ·▏"
    assert time_scale([0.0, 1.0, 2.0, 10.0], 3, 6) == "▕··   ◆▏"  # crowded moments share a cell


async def test_at_a_failure_the_holders_are_unknown_and_the_safe_point_before_names_them() -> None:
    """Mid-step the scheduler's requests are not read: the failure's tree claims no holder and no
    leak (a lock taken since the safe point would read as leaked); the safe point lists them."""
    from dataclasses import replace

    found = _flight(3)
    record = replace(found.record, before=replace(found.record.before, holders=HOLDERS))
    board = RadixBoard()
    board.add(flight_sample(FlightFile(found.path, 0.0, record)))
    app = PaneApp()
    async with app.run_test(size=(120, 30)) as pilot:
        pane = app.query_one(RadixPane)
        pane.show(board, now=T0 + 1)
        await pilot.pause()
        summary = pane.query_one("#radix-summary").render().plain  # type: ignore[union-attr]
        assert "lock holders unknown at the failure: 2 requests held locks at the safe point before (,)" in summary
        assert "⚠" not in summary and not [r for r in _text(pane) if "⚠" in r]
        pane.step_moment(-1)
        await pilot.pause()
        summary = pane.query_one("#radix-summary").render().plain  # type: ignore[union-attr]
        assert "locks held by 2 requests: r-a 12s" in summary and "⚠ locked with no request holding it: #4" in summary
