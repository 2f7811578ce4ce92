"""What radixtop saw, for a bundle taken after the ranks died: the board keeps a bounded history
per rank, and SeenState writes it (and the vitals and the screen) into the bundle's seen/."""

from __future__ import annotations

import json
from pathlib import Path

from pane_helpers import make_snapshot, wide_snapshot

from radixtop.incident.bundle.bundle import BundleWriter
from radixtop.incident.bundle.seen import RankSeen, SeenState
from radixtop.incident.common.redact import Redactor
from radixtop.probes.radix import RadixSample
from radixtop.probes.status import SourceState
from radixtop.schema import Event
from radixtop.session.radix_board import KEPT_EVENTS, RadixBoard

OK = SourceState("ok")
URL = "http://127.0.0.1:39100"


def test_the_board_keeps_a_bounded_history_of_snapshots_and_events():
    board = RadixBoard()
    last = 12
    for seq in range(1, last + 1):
        events = tuple(Event(seq * 10 + i, 1.0 + seq, "evict", tokens=16) for i in range(300))
        board.add(RadixSample(URL, OK, 1_000.0 + seq, rank=0, snapshot=make_snapshot(seq=seq), events=events))
    view = board.ranks[URL]
    assert view.snapshot.seq == last
    kept = view.earlier.newest(100)
    assert [s.seq for _, s in kept] == list(range(1, last))  # the ones before it, whole again
    assert kept[0][1] == make_snapshot(seq=1)
    assert len(view.events) == KEPT_EVENTS and view.events[-1].seq == last * 10 + 299


def test_kept_snapshots_share_their_unchanged_rows_and_stay_within_count_and_bytes():
    from radixtop.session.snapshot_store import ROW_BYTES, SnapshotStore

    store = SnapshotStore(max_count=40, max_bytes=4_000_000)
    base = wide_snapshot(2_000)
    rows = list(base.tree.nodes)
    snaps = []
    for seq in range(60):
        rows[1 + seq] = rows[1 + seq]._replace(hit_count=(rows[1 + seq].hit_count or 0) + 1)  # one row moves a poll
        if seq % 7 == 0:  # and now and then the order shifts: rows 1 and 2 swap places
            a, b = rows[1], rows[2]
            rows[1], rows[2] = b, a
        snap = make_snapshot(seq=seq, nodes=tuple(rows))
        snaps.append(snap)
        store.add(1_000.0 + seq, snap)
    assert len(store) == 40 and store.bytes <= 4_000_000
    # 2,001 rows a snapshot, 40 snapshots: shared, about one new row each (and the swapped pairs)
    assert store.distinct_rows < 2_001 + 3 * 40, store.distinct_rows
    assert store.bytes < 40 * (2_000 + 2_001 * 4) + (2_001 + 3 * 40) * ROW_BYTES
    assert [store.load(k) for k in store] == snaps[-40:]  # every one whole again, parents where they were
    small = SnapshotStore(max_count=1_000, max_bytes=1_000_000)
    for seq, snap in enumerate(snaps):
        small.add(seq, snap)
    assert small.bytes <= 1_000_000 and len(small) < 60 and small.load(small[-1]) == snaps[-1]


def test_stepping_back_decodes_a_kept_snapshot_and_keeps_it_while_new_ones_come():
    board = RadixBoard()
    for seq in range(5):
        board.add(RadixSample(URL, OK, 1_000.0 + seq, rank=0, snapshot=wide_snapshot(300, seq=seq, when=1_000.0 + seq)))
    view = board.ranks[URL]
    view.step(-2)
    shown, index = view.shown()
    assert shown.seq == 2 and index is not None and shown == wide_snapshot(300, seq=2, when=1_002.0)
    assert view.shown()[0] is shown  # made whole once
    board.add(RadixSample(URL, OK, 1_010.0, rank=0, snapshot=wide_snapshot(300, seq=5, when=1_010.0)))
    assert view.shown()[0].seq == 2


def test_seen_state_writes_the_ranks_the_vitals_and_the_screen(tmp_path: Path):
    snap = make_snapshot(seq=5, protected_tokens=96)
    seen = SeenState(
        ranks=(RankSeen("rank0", URL, "down (connection refused)", ((1_000.0, snap),),
                        (Event(1, 999.0, "lock_failure", node_id=7, message="page lock"),)),),
        vitals={"token_usage": {"source": "metrics", "points": [[999.0, 0.93], [1_000.0, 0.97]]}},
        marks=((1_000.2, "TP1 Radix cache page lock failed"),),
        screen_svg="<svg><text>radixtop</text></svg>",
    )
    written = seen.write(BundleWriter(tmp_path, Redactor()))
    assert written == ["seen/radix/rank0-snapshots.json", "seen/radix/rank0-events.json", "seen/vitals.json",
                       "seen/screen.svg"]
    doc = json.loads((tmp_path / "seen/radix/rank0-snapshots.json").read_text())
    assert doc["status"].startswith("down") and doc["snapshots"][0]["snapshot"]["protected_tokens"] == 96
    assert json.loads((tmp_path / "seen/radix/rank0-events.json").read_text())["events"][0]["kind"] == "lock_failure"
    assert json.loads((tmp_path / "seen/vitals.json").read_text())["first_signatures"][0][1].startswith("TP1")


def test_a_screen_that_could_not_be_exported_leaves_a_note_saying_why(tmp_path: Path):
    seen = SeenState(screen_error="NoMatches: no widget #log")
    assert seen.write(BundleWriter(tmp_path, Redactor())) == []
    assert not (tmp_path / "seen/screen.svg").exists()
    note = next(tmp_path.glob("seen/screen.svg*"))
    assert "could not be exported: NoMatches: no widget #log" in note.read_text()


def test_a_rank_mirrored_from_kv_events_says_its_locks_are_unknown(tmp_path: Path):
    seen = SeenState(ranks=(RankSeen("rank0", URL, "ok", ((1_000.0, make_snapshot(seq=1)),), (),
                                     "kv-events: blocks, no locks", False),))
    seen.write(BundleWriter(tmp_path, Redactor()))
    doc = json.loads((tmp_path / "seen/radix/rank0-snapshots.json").read_text())
    assert doc["source"] == "kv-events: blocks, no locks" and doc["locks_known"] is False
