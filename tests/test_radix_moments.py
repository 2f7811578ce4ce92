"""The radix pane at the moment that matters: a rank's flight record as a view of its own (the
tree as the rank failed, its last safe point one key away), the pane turned to the rank the log
names first, and stepping back through the snapshots kept. Records are written by the
instrument's own flight recorder into a real directory; the demo in a real terminal at the end."""

from __future__ import annotations

import json
import re
import shutil
import sys
import time
from pathlib import Path

import pytest
from pane_helpers import make_snapshot

from radixtop.probes.flight import FlightFile, FlightProbe, read_flight_records
from radixtop.probes.radix import RadixSample
from radixtop.probes.status import SourceState
from radixtop.schema import FlightRecord, Trigger
from radixtop.session.flight_views import flight_sample
from radixtop.session.radix_board import RadixBoard

OK = SourceState("ok")


def record(rank: int, pid: int, when: float) -> FlightRecord:
    before = make_snapshot(rank=rank, seq=6, when=when - 1.5, protected_tokens=0)
    at = make_snapshot(rank=rank, seq=0, when=when, protected_tokens=3168)
    message = "RadixCacheError: Failed to lock memory page during dynamic prefix eviction"
    trigger = Trigger("evict_failure", message, when)
    return FlightRecord(1, rank, pid, 1, when, (trigger,), at, (), 0, before)


def test_a_flight_record_is_a_view_with_its_safe_point_one_step_back() -> None:
    board = RadixBoard()
    found = FlightFile(Path("/x/flight/rank1-pid42.json"), 0.0, record(1, 42, 1_700_000_000.0))
    board.add(flight_sample(found))
    (view,) = board.ranks.values()
    assert view.label == "failed r1" and board.focus == view.url and view.rank == 1
    assert "evict_failure: RadixCacheError: Failed to lock" in view.source_note
    at, _ = view.shown()
    assert at is found.record.snapshot and at.protected_tokens == 3168
    view.step(-1)
    before, index = view.shown()
    assert before is found.record.before and view.cursor == 0 and index is not None
    view.step(-1)  # nothing earlier: it stays
    assert view.cursor == 0
    view.step(1)
    assert view.cursor is None and view.shown()[0] is at


def test_stepping_back_through_kept_snapshots_stays_on_the_moment_while_new_ones_come() -> None:
    board = RadixBoard()
    url = "http://127.0.0.1:39100"
    snaps = [make_snapshot(seq=i, when=1_700_000_000.0 + i, instance="aa11") for i in range(3)]
    for i, snap in enumerate(snaps):
        board.add(RadixSample(url, OK, 1_700_000_000.0 + i, rank=0, snapshot=snap))
    view = board.ranks[url]
    assert view.moment_times() == [1_700_000_000.0, 1_700_000_001.0, 1_700_000_002.0]
    view.step(-1)
    assert view.shown()[0] == snaps[1]
    board.add(RadixSample(url, OK, 1_700_000_010.0, rank=0, snapshot=make_snapshot(seq=3, when=1_700_000_010.0)))
    assert view.shown()[0] == snaps[1]  # the newer snapshot does not move what is being looked at
    view.step(5)
    assert view.cursor is None and view.shown()[0].seq == 3  # past the newest: live again


def test_flight_records_and_prints_take_no_part_in_ranks_disagree() -> None:
    board = RadixBoard()
    for rank, digest in ((0, "aaaa000000000000"), (1, "aaaa000000000000")):
        snap = make_snapshot(rank=rank, digest=digest)
        board.add(RadixSample(f"http://127.0.0.1:{39100 + rank}", OK, 1.0, rank=rank, snapshot=snap))
        board.add(RadixSample(f"http://127.0.0.1:{39100 + rank}", OK, 2.0, rank=rank, snapshot=snap))
    odd = FlightRecord(1, 1, 42, 1, 3.0, (), make_snapshot(rank=1, digest="bbbb000000000000"), (), 0, None)
    board.add(flight_sample(FlightFile(Path("/x/rank1-pid42.json"), 0.0, odd)))
    assert board.disagreement() is None


def test_the_probe_reads_the_servers_records_as_they_are_written_and_each_change_once(tmp_path: Path) -> None:
    import asyncio

    from radixtop.rundir import write_file

    flight = tmp_path / "flight"
    flight.mkdir(mode=0o700)
    probe = FlightProbe(lambda: [flight], lambda: 42)
    assert asyncio.run(probe.poll()).records == ()
    mine, other = record(1, 42, time.time()), record(0, 77, time.time())
    write_file(flight / "rank1-pid42.json", json.dumps(mine.to_dict()).encode())
    write_file(flight / "rank0-pid77.json", json.dumps(other.to_dict()).encode())
    (found,) = asyncio.run(probe.poll()).records  # another server's record is not this one's
    assert found.record.rank == 1 and found.record.pid == 42
    assert asyncio.run(probe.poll()).records == ()  # unchanged: not read again
    (flight / "junk").symlink_to("/etc/passwd")
    (flight / "rank2-pid42.json").symlink_to(flight / "rank1-pid42.json")  # never read through a link
    assert read_flight_records([flight], 42).records[0].path.name == "rank1-pid42.json"
    assert len(read_flight_records([flight], 42).records) == 1


@pytest.mark.tmux
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_the_demos_lock_race_shows_rank_1_as_it_failed_then_its_safe_point(tmp_path: Path) -> None:
    from tmux_helpers import Tmux

    tmux = Tmux(160, 48)
    try:
        tmux.start([sys.executable, "-m", "radixtop", "demo"], tmp_path)
        screen = tmux.wait_for(lambda s: re.search(r"as rank 1 failed, \d\d:\d\d:\d\d · , the safe point before", s),
                               "rank 1 as it failed in the radix pane", timeout=90)
        assert "failed r1" in screen and "flight record of pid " in screen, screen
        # the failing operation's node and the path to it, marked and opened
        failed = re.search(r"the scheduler exception was on node #(\d+) \(marked »\)", screen)
        assert failed is not None and f"»#{failed.group(1)} " in screen, screen
        assert "ranks disagree" not in screen, screen
        tmux.send(",")
        screen = tmux.wait_for(lambda s: "rank 1's last safe point before it failed" in s, "the safe point", 10)
        assert re.search(r"snapshot #\d+ ", screen), screen
        # the vital signs at that moment, beside the tree
        screen = tmux.wait_for(lambda s: re.search(r"token usage .*◆ \d+%", s), "the vitals' cursor", 10)
        tmux.send(".")
        tmux.wait_for(lambda s: "as rank 1 failed" in s, "back at the failure", 10)
    finally:
        tmux.kill()
