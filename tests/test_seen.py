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
from radixtop.session.radix_board import KEPT_EVENTS, KEPT_NODES, KEPT_SNAPSHOTS, RadixBoard

OK = SourceState("ok")
URL = "http://127.0.0.1:39100"


def test_the_board_keeps_a_bounded_history_of_small_snapshots_and_events():
    board = RadixBoard()
    last = KEPT_SNAPSHOTS + 7
    for seq in range(1, last + 1):
        events = tuple(Event(seq * 10 + i, 1.0 + seq, "evict", tokens=16) for i in range(300))
        board.add(RadixSample(URL, OK, 1_000.0 + seq, rank=0, snapshot=make_snapshot(seq=seq), events=events))
    view = board.ranks[URL]
    assert view.snapshot.seq == last
    assert [s.seq for _, s in view.earlier] == list(range(last - KEPT_SNAPSHOTS, last))  # the ones before it
    assert len(view.events) == KEPT_EVENTS and view.events[-1].seq == last * 10 + 299
    # A big tree is kept as the last snapshot only (a 100k-node tree is MBs of objects).
    board.add(RadixSample(URL, OK, 2_000.0, rank=0, snapshot=wide_snapshot(6_000, seq=last + 1)))
    board.add(RadixSample(URL, OK, 2_001.0, rank=0, snapshot=make_snapshot(seq=last + 2)))
    assert [s.seq for _, s in view.earlier][-1] == last  # the wide one was not kept as an earlier one
    # Trees up to KEPT_SNAPSHOT_NODES are kept, within KEPT_NODES rows in all.
    for i in range(40):
        board.add(RadixSample(URL, OK, 3_000.0 + i, rank=0, snapshot=wide_snapshot(4_000, seq=last + 3 + i)))
    rows = sum(len(s.tree.nodes) for _, s in view.earlier)
    assert KEPT_NODES - 4_001 <= rows <= KEPT_NODES and view.earlier[-1][1].seq == last + 41


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
