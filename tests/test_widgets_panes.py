"""The live panes rendered in a tiny App (Pilot) from constructed samples; and their screenshots.

Deterministic: fixed times, rendered in UTC. Update the screenshots after an intended change with
`pytest tests/test_widgets_panes.py --snapshot-update` and look at the SVGs before committing.
"""

from __future__ import annotations

import os

import pytest
from pane_helpers import make_snapshot, wide_snapshot
from rich.text import Text
from textual.app import App, ComposeResult
from textual.containers import Horizontal
from textual.geometry import Region
from textual.widgets import Static

from radixtop.probes.gpu import GpuInfo, GpuProcess, GpuSample, XidEvent
from radixtop.probes.procs import ProcInfo, ProcsSample
from radixtop.probes.radix import RadixSample
from radixtop.probes.radix_tree import TreeIndex
from radixtop.probes.sglang import ServerMetrics
from radixtop.probes.status import SourceState
from radixtop.schema import Counters, Event
from radixtop.session.radix_board import RadixBoard
from radixtop.session.vitals import Observation, Vitals
from radixtop.widgets.gpu import GpuPane, render_gpus
from radixtop.widgets.procs import ProcsPane, render_procs
from radixtop.widgets.radix import CHILD_PAGE, COLUMNS, NEEDS_SGLANG, RadixPane, RadixTreeView
from radixtop.widgets.rows import TextRows
from radixtop.widgets.vitals import VitalsPane, render_vitals

T0 = 1_700_000_000.0  # 22:13:20 UTC
GiB = 1024**3


pytestmark = pytest.mark.usefixtures("utc")  # clock strings in UTC


def ok(since: float = T0) -> SourceState:
    return SourceState("ok", "", since)


def sample(url: str, snap, *, events=(), status=None, t=T0) -> RadixSample:
    return RadixSample(url, status or ok(), t, rank=snap.rank if snap else None, snapshot=snap,
                       index=TreeIndex.build(snap) if snap else None, events=tuple(events))


def board_two_ranks() -> RadixBoard:
    board = RadixBoard()
    anomaly = Event(5, T0 - 3, "negative_lock_ref", node_id=4, lock_ref=-1, message="double unlock")
    s0 = make_snapshot(rank=0, when=T0 - 2, counters=Counters(lock_ops=10, unlock_ops=11, negative_lock_ref=1,
                                                              evictions=4, evicted_tokens=64))
    s0b = make_snapshot(rank=0, when=T0, seq=2, counters=Counters(lock_ops=12, unlock_ops=13, negative_lock_ref=1,
                                                                  evictions=8, evicted_tokens=128))
    board.add(sample("http://127.0.0.1:1", s0, t=T0 - 2))
    board.add(sample("http://127.0.0.1:1", s0b, events=[anomaly]))
    board.add(sample("http://127.0.0.1:2", make_snapshot(rank=1, when=T0 - 2, digest="fedcba9876543210")))
    board.add(sample("http://127.0.0.1:2", make_snapshot(rank=1, when=T0, seq=2, digest="fedcba9876543210")))
    return board


def gpu_sample(state: str = "ok") -> GpuSample:
    gpus = (
        GpuInfo(0, "NVIDIA H200", "GPU-0", 100 * GiB, 140 * GiB, 97, 66, 512.0, 700.0,
                (GpuProcess(4242, 80 * GiB), GpuProcess(999, None))),
        GpuInfo(1, "NVIDIA H200", "GPU-1", None, None, state="lost",
                problems=("memory: GPU lost (fallen off the bus; the kernel log has Xid 79)",)),
    )
    return GpuSample(SourceState(state, "" if state == "ok" else "GPU 1: memory: GPU lost", T0), T0, gpus,
                     driver="550.54.15", seconds=0.004)


def procs_sample() -> ProcsSample:
    procs = (
        ProcInfo(100, 1, "server", None, "python -m sglang.launch_server --port 30000", "sleeping", 2 * GiB, 3.0, 40,
                 T0 - 600),
        ProcInfo(101, 100, "scheduler", "TP0", "sglang::scheduler_TP0", "running", 12 * GiB, 99.0, 80, T0 - 590),
        ProcInfo(102, 100, "scheduler", "TP1", "sglang::scheduler_TP1", "zombie", None, None, None, T0 - 590),
        ProcInfo(103, 100, "scheduler", "TP2", "sglang::scheduler_TP2", "gone", 11 * GiB, None, 70, T0 - 590,
                 gone_at=T0 - 30),
    )
    problems = ("scheduler TP1 (pid 102) is a zombie", "scheduler TP2 (pid 103) is gone since 22:12:50")
    return ProcsSample(SourceState("degraded", problems[0], T0 - 30), T0, 100, procs, problems)


def vitals_with_incident() -> Vitals:
    v = Vitals()
    for i in range(120):
        t = T0 - 120 + i
        v.feed_metrics(ServerMetrics("sglang", {"token_usage": min(1.0, i / 100), "running": float(i % 30),
                                                "queued": float(max(0, i - 80)), "cache_hit_rate": 0.5,
                                                "evicted_tokens_total": float(i * i), "retracted": float(i > 100)}), t)
    v.feed_log([Observation(T0 - 5, "retracted", 4.0)])
    v.mark(T0 - 20, "radix page lock failed during eviction")
    return v


class PaneApp(App):
    def __init__(self, which: str) -> None:
        super().__init__()
        self.which = which

    def compose(self) -> ComposeResult:
        yield {"radix": RadixPane, "gpu": GpuPane, "procs": ProcsPane, "vitals": VitalsPane}[self.which](id="pane")


def _plain(app: App, selector: str) -> str:
    return app.query_one(selector).render().plain


async def _radix_summary(board: RadixBoard, size: tuple[int, int]) -> str:
    """The radix pane's summary as it shows `board` at T0."""
    app = PaneApp("radix")
    async with app.run_test(size=size) as pilot:
        app.query_one(RadixPane).show(board, now=T0)
        await pilot.pause()
        return _plain(app, "#radix-summary")


# ----------------------------------------------------------------------------------------------
# Radix pane


async def test_radix_pane_summary_ranks_and_tree() -> None:
    app = PaneApp("radix")
    async with app.run_test(size=(120, 40)) as pilot:
        pane = app.query_one(RadixPane)
        pane.show(board_two_ranks(), now=T0 + 1)
        await pilot.pause()
        title = _plain(app, "#radix-title")
        assert "rank 0" in title and "rank 1" in title
        summary = _plain(app, "#radix-summary")
        assert (
            "pool 4,096" in summary
            and "locked 32" in summary
            and "evictable 2,000" in summary
            and "running 1,064" in summary
        )
        assert "evictions 2.0/s" in summary and "32 tok/s" in summary
        assert "lock anomalies: negative lock_ref 1" in summary and "lock failures" not in summary
        assert "lock_ref " in summary and "<0:" in summary and "1:" in summary
        assert "! 22:13:17 rank 0 negative_lock_ref node 4 lock_ref -1 double unlock" in summary
        assert "ranks disagree" in summary
        tree = app.query_one(RadixTreeView)
        lines = [tree.render_line(y).text for y in range(4)]
        assert "root · 5 nodes" in lines[0]
        assert "#3" in lines[1] and "#1" in lines[2] and "#5" in lines[3], "paths to anomalies and locks first"
        negative = tree.render_line(1)
        assert any(
            seg.style is not None and seg.style.reverse for seg in negative
        ), "a negative lock_ref path stands out"
        tree.focus()
        await pilot.press("down", "enter")
        await pilot.pause()
        assert "#4" in tree.render_line(2).text and "-1" in tree.render_line(2).text
        await pilot.press("x")
        assert any("#2" in tree.render_line(y).text for y in range(8)), "x opens the paths to locked nodes"
        await pilot.press("right_square_bracket")
        await pilot.pause()
        assert pane.selected == "http://127.0.0.1:2"


async def test_locked_nodes_and_their_paths_read_without_colour(monkeypatch) -> None:
    """NO_COLOR: Textual strips every colour, so a path to a locked node (colour only) would read
    like any other row; a glyph in the column before the node says it instead."""
    from pane_helpers import node
    from textual.filter import NoColor

    nodes = (
        node(-1, 0, 1, 0, children=3, subtree=60),
        node(0, 16, 0, 10, children=1, subtree=32),  # the path to a lock (parents are row numbers)
        node(1, 16, 2, 11),  # locked
        node(0, 8, 0, 12, children=1, subtree=12),  # the path to a negative lock_ref
        node(3, 4, -1, 13),
        node(0, 16, 0, 14),  # nothing to say
    )
    board = RadixBoard()
    board.add(sample("u", make_snapshot(nodes=nodes)))
    monkeypatch.setenv("NO_COLOR", "1")
    app = PaneApp("radix")
    assert app.no_color
    async with app.run_test(size=(120, 30)) as pilot:
        app.query_one(RadixPane).show(board, now=T0)
        tree = app.query_one(RadixTreeView)
        tree.focus()
        await pilot.press("x")  # open the paths to locks
        await pilot.pause()
        glyph_at = COLUMNS.index("node") - 1
        seen = {}
        for y in range(1, len(tree.rows)):
            strip = tree.render_line(y)
            plain = "".join(seg.text for seg in NoColor().apply(list(strip), None))
            assert all(seg.style is None or seg.style.color is None or seg.style.color.is_default
                       for seg in NoColor().apply(list(strip), None))
            nid = int(plain.split("#", 1)[1].split()[0])
            seen[nid] = plain[glyph_at]
    assert seen == {10: "+", 11: "*", 12: "!", 13: "!", 14: " "}, seen
    assert "* locked" in COLUMNS and "+ path to a lock" in COLUMNS


async def test_a_tree_rebuilt_from_the_rust_cores_walk_shows_locked_without_a_count() -> None:
    """The Rust TreeCore's walk tells locked from unlocked, not how many locks: the lock column
    says 1+, never a count it did not read."""
    from pane_helpers import node

    nodes = (node(-1, 0, 0, 0, children=2, subtree=32), node(0, 16, 1, 10), node(0, 16, 0, 11))
    board = RadixBoard()
    board.add(sample("u", make_snapshot(nodes=nodes, lock_detail="locked-only")))
    app = PaneApp("radix")
    async with app.run_test(size=(120, 30)) as pilot:
        app.query_one(RadixPane).show(board, now=T0)
        await pilot.pause()
        tree = app.query_one(RadixTreeView)
        lines = {
            int(t.split("#", 1)[1].split()[0]): t
            for t in ("".join(s.text for s in tree.render_line(y)) for y in range(1, 3))
        }
    assert lines[10].split()[1] == "1+" and lines[11].split()[1] == "0", lines


async def test_radix_pane_freezes_on_a_down_rank() -> None:
    app = PaneApp("radix")
    board = board_two_ranks()
    async with app.run_test(size=(120, 30)) as pilot:
        pane = app.query_one(RadixPane)
        board.add(RadixSample("http://127.0.0.1:1", SourceState("down", "connection refused", T0 + 5), T0 + 5))
        pane.show(board, now=T0 + 6)
        await pilot.pause()
        assert "DOWN since 22:13:25 · last values from 22:13:20" in _plain(app, "#radix-title")
        assert "connection refused" in _plain(app, "#radix-summary")
        assert "root · 5 nodes" in app.query_one(RadixTreeView).render_line(0).text, "never blank"


async def test_a_down_rank_says_its_census_age_from_now_and_its_rates_are_frozen() -> None:
    app = PaneApp("radix")
    board = board_two_ranks()
    async with app.run_test(size=(120, 30)) as pilot:
        pane = app.query_one(RadixPane)
        pane.show(board, now=T0 + 1)
        await pilot.pause()
        summary = _plain(app, "#radix-summary")
        assert "census 1.1s old" in summary and "(last, as of" not in summary
        board.add(RadixSample("http://127.0.0.1:1", SourceState("down", "connection refused", T0 + 5), T0 + 5))
        pane.show(board, now=T0 + 65)
        await pilot.pause()
        summary = _plain(app, "#radix-summary")
        assert "census 65s old" in summary, "relative to now, not to the last snapshot"
        assert "evictions 2.0/s · 32 tok/s (last, as of 22:13:20)" in summary
        rates = app.query_one("#radix-summary", TextRows).render_line(
            next(i for i, line in enumerate(summary.splitlines()) if line.startswith("evictions")))
        assert not any(
            seg.style is not None and seg.style.bold and "2.0/s" in seg.text for seg in rates
        ), "frozen rates are not bold"


async def test_an_endpoint_answering_garbage_after_a_good_snapshot_keeps_the_tree_and_says_why() -> None:
    """A real probe against a real loopback server: one good snapshot, then an HTML page."""
    from pane_helpers import Answer, health_body, stub_server

    from radixtop.probes.radix import HEALTH_PATH, SNAPSHOT_PATH, RadixProbe

    board = RadixBoard()
    app = PaneApp("radix")
    with stub_server() as stub:
        stub.answers[SNAPSHOT_PATH] = Answer(body=make_snapshot().to_json())
        stub.answers[HEALTH_PATH] = Answer(body=health_body())
        probe = RadixProbe(stub.url)
        try:
            board.add(await probe.poll())
            stub.answers[SNAPSHOT_PATH] = Answer(body=b"<html>502 Bad Gateway</html>")
            bad = await probe.poll()
        finally:
            await probe.aclose()
    assert bad.status.state == "error"
    board.add(bad)
    async with app.run_test(size=(120, 30)) as pilot:
        app.query_one(RadixPane).show(board, now=T0 + 5)
        await pilot.pause()
        summary = _plain(app, "#radix-summary")
        assert "snapshot: not valid JSON" in summary.splitlines()[0], summary
        assert "ERROR since" in _plain(app, "#radix-title")
        assert "root · 5 nodes" in app.query_one(RadixTreeView).render_line(0).text, "the last tree is kept"


async def test_radix_pane_lazy_over_100k_nodes() -> None:
    snap = wide_snapshot(100_000)
    board = RadixBoard()
    board.add(sample("u", snap))
    app = PaneApp("radix")
    async with app.run_test(size=(100, 30)) as pilot:
        pane = app.query_one(RadixPane)
        pane.show(board, now=T0)
        await pilot.pause()
        tree = app.query_one(RadixTreeView)
        assert len(tree.rows) == 1 + CHILD_PAGE + 1, "only one page of the root's children is listed"
        assert tree.rows[-1][2] == 100_000 - CHILD_PAGE, "the last row is the '… more' row"
        tree.focus()
        await pilot.press("end")
        await pilot.pause()
        on_screen = tree.render_line(tree.cursor - round(tree.scroll_y)).text
        assert "… 99,800 more children (Enter lists 200 more)" in on_screen, on_screen
        await pilot.press("enter")
        await pilot.pause()
        assert len(tree.rows) == 1 + 2 * CHILD_PAGE + 1
        assert all(snap.tree.nodes[r].lock_ref == 1 for r, _, more in tree.rows[1:CHILD_PAGE] if not more)


async def test_radix_pane_notes() -> None:
    app = PaneApp("radix")
    async with app.run_test(size=(100, 20)) as pilot:
        app.query_one(RadixPane).show(RadixBoard(), note=NEEDS_SGLANG)
        await pilot.pause()
        assert "vLLM has no such endpoint" in _plain(app, "#radix-summary")
        assert "(no tree yet)" in app.query_one(RadixTreeView).render_line(0).text


# ----------------------------------------------------------------------------------------------
# GPU, processes, vitals


def test_a_rank_whose_snapshots_carry_no_tree_keeps_them_for_the_bundle() -> None:
    board = RadixBoard()
    url = "http://127.0.0.1:1"
    for seq in (1, 2):
        snap = make_snapshot(seq=seq, when=T0 + seq, tree=None, walkable=False, reason="not walkable")
        board.add(RadixSample(url, ok(), T0 + seq, rank=0, snapshot=snap))
    view = board.ranks[url]
    assert view.snapshot is not None and view.snapshot.seq == 2
    assert [s.seq for _, s in view.earlier.newest(5)] == [1]


def test_gpu_text() -> None:
    text = render_gpus(gpu_sample("degraded"), server_pids={4242: "scheduler TP0"},
                       xids=[XidEvent(T0 - 60, 1, 79)], width=120).plain
    assert "GPU 0 H200" in text and "100 GiB/140 GiB" in text
    assert "util 97%" in text and "66°C" in text and "512/700 W" in text
    assert "pid 4242" in text and "scheduler TP0" in text and "80.0 GiB" in text
    assert "pid 999" in text and "not the server" in text and "n/a" in text
    assert "LOST: memory: GPU lost" in text
    assert "Xid 79 22:12:20 GPU 1: GPU has fallen off the bus" in text
    unavailable = GpuSample(SourceState("unavailable", "no NVIDIA driver (libnvidia-ml.so not found)", T0), T0)
    text = render_gpus(unavailable).plain
    assert "unavailable: no NVIDIA driver (libnvidia-ml.so not found)" in text
    frozen = render_gpus(unavailable, last_good=gpu_sample()).plain
    assert "UNAVAILABLE since 22:13:20 · last values from 22:13:20" in frozen and "GPU 0 H200" in frozen


def test_procs_text() -> None:
    text = render_procs(procs_sample(), now=T0).plain
    assert "DEGRADED since 22:12:50: scheduler TP1 (pid 102) is a zombie" in text
    assert "scheduler TP0" in text and "99%" in text and "12.0 GiB" in text
    assert "zombie" in text and "gone 22:12:50" in text
    assert "! scheduler TP2 (pid 103) is gone since 22:12:50" in text


async def test_procs_title_counts_a_zombie_apart_and_the_down_reason_wraps_whole() -> None:
    app = PaneApp("procs")
    async with app.run_test(size=(60, 20)) as pilot:
        pane = app.query_one(ProcsPane)
        pane.show(procs_sample(), now=T0)
        await pilot.pause()
        title = _plain(app, "#procs-title")
        assert "2 alive · 1 zombie/dead" in title, title  # server + TP0; TP1 is a zombie, TP2 gone
        reason = ("the server process (pid 100) exited with status 137, killed by SIGKILL (the kernel's "
                  "out-of-memory killer, see dmesg); its schedulers went with it")
        down = ProcsSample(SourceState("down", reason, T0 - 5), T0, 100, (), ())
        pane.show(down, now=T0, last_good=procs_sample())
        await pilot.pause()
        body = app.query_one("#procs-body", TextRows)
        width = pane.size.width - 2
        rows = [body.render_line(y).text.rstrip() for y in range(6)]
        assert rows[0].startswith("DOWN since 22:13:15: the server process"), rows
        message = rows[: next(i for i, r in enumerate(rows) if "pid" in r and "role" in r)]
        assert (
            len(message) > 1 and " ".join(row.strip() for row in message).endswith("its schedulers went with it")
        ), rows
        assert all(len(row) <= width for row in message), "wrapped to the pane, not cut at its edge"


def test_a_process_gone_before_and_after_the_last_live_sample_is_listed_once() -> None:
    from dataclasses import replace

    last_good = procs_sample()  # TP2 (103) already gone in it
    gone = tuple(replace(p, status="gone", gone_at=T0) for p in last_good.procs if p.pid != 103)
    down = ProcsSample(SourceState("down", "server process 100 is gone", T0), T0, 100, gone + last_good.procs[3:], ())
    rows = [line for line in render_procs(down, now=T0, last_good=last_good).plain.splitlines() if "sglang" in line]
    assert [int(r.split()[0]) for r in rows] == [100, 101, 102, 103], rows
    assert all(" gone " in r for r in rows), rows


def test_vitals_text_marks_the_first_signature() -> None:
    text = render_vitals(vitals_with_incident(), width=100, now=T0).plain
    lines = text.splitlines()
    assert "▼" in lines[0] and "first signature 22:13:00: radix page lock failed" in lines[0]
    for title in (
        "token usage", "running reqs", "queued reqs", "cache hit rate", "evicted tok/s", "retractions", "GPU memory"
    ):
        assert any(line.startswith(title) for line in lines), title
    usage = next(line for line in lines if line.startswith("token usage"))
    assert "█" in usage and "100% /metrics" in usage
    assert "2 s per column" in lines[-1]
    # 65 columns of 2 s ending at T0 (even): the window starts at T0 - 128, so the mark at T0 - 20
    # is column 54, drawn after the 15-cell title and a space.
    col = 15 + 1 + 54
    assert lines[0][col] == "▼", lines[0]
    for line in _styled_lines(render_vitals(vitals_with_incident(), width=100, now=T0))[1:8]:
        assert _style_at(line, col) is not None and "reverse" in str(_style_at(line, col)), line.plain
        assert not any("reverse" in str(_style_at(line, c)) for c in range(16, col)), "only the mark's column"


def test_vitals_mark_the_radix_panes_moment_with_the_values_then() -> None:
    # token usage is i / 100 at T0 - 120 + i: 60 s before T0 it was 0.60, at T0 1.00
    cursor = T0 - 60
    text = render_vitals(vitals_with_incident(), width=100, now=T0, cursor=cursor)
    lines = text.plain.splitlines()
    usage = next(line for line in lines if line.startswith("token usage"))
    assert "◆ 61%" in usage and "100%" not in usage, usage  # its 2 s column's last value
    assert lines[-1].endswith("· ◆ 22:12:20"), lines[-1]
    col = 15 + 1 + (int(cursor) - (int(T0) - 128)) // 2  # 2 s per column, as above
    styled = _styled_lines(text)[1:8]
    assert all("yellow" in str(_style_at(line, col)) for line in styled), "the moment's column on every plot"
    assert "off the plot" in render_vitals(vitals_with_incident(), width=100, now=T0, cursor=T0 - 9_999).plain
    # a moment in a column with no value of its own (a server that died between two polls): the last one before it
    at_end = render_vitals(vitals_with_incident(), width=100, now=T0, cursor=T0).plain.splitlines()
    assert "◆ 100%" in next(line for line in at_end if line.startswith("token usage"))


def _styled_lines(text: Text) -> list[Text]:
    return list(text.split("\n"))


def _style_at(line: Text, col: int):
    styles = [span.style for span in line.spans if span.start <= col < span.end]
    return styles[-1] if styles else None


def test_vitals_keep_a_signature_that_came_after_the_last_value_of_a_silent_server() -> None:
    v = Vitals()
    v.feed_log([Observation(T0 - 60 + 2 * i, "token_usage", 0.5) for i in range(31)])  # 2 s apart, last at T0
    v.mark(T0 + 1.6, "radix page lock failed")
    text = render_vitals(v, width=100, now=T0 + 100)
    lines = text.plain.splitlines()
    assert "▼" in lines[0] and "first signature 22:13:21: radix page lock failed" in lines[0], lines[0]
    assert "this window" not in lines[0]
    assert "ends at the last value, 22:13:22" in lines[-1], "the window ends just after the signature"
    col = lines[0].index("▼")
    usage = _styled_lines(text)[1]
    assert "reverse" in str(_style_at(usage, col)) and "▅" in usage.plain[:col]


def test_vitals_say_a_signature_is_after_the_window_when_it_is() -> None:
    v = Vitals()
    v.feed_log([Observation(T0 - 10 + i, "token_usage", 0.5) for i in range(11)])
    v.mark(T0 + 50, "later")  # reported by a clock ahead of this one
    first = render_vitals(v, width=100, now=T0 + 1).plain.splitlines()[0]
    assert "(after this window)" in first and "▼" not in first
    v = vitals_with_incident()
    v.marks[:] = [(T0 - 100_000, "long ago")]
    v.feed_metrics(ServerMetrics("sglang", {"token_usage": 0.3}), T0 + 1)
    assert "(before this window)" in render_vitals(v, width=100, now=T0 + 1).plain.splitlines()[0]


def test_vitals_zoom_out_keeps_the_incident() -> None:
    v = vitals_with_incident()
    v.feed_metrics(ServerMetrics("sglang", {"token_usage": 0.3}), T0 + 3000)
    text = render_vitals(v, width=100, now=T0 + 3000).plain
    assert "▼" in text.splitlines()[0], "the window widens to keep the first signature on screen"
    assert "49 s per column" in text


async def test_panes_survive_a_tiny_terminal() -> None:
    """Shrunk to 40x10, each pane still says its most important thing on screen."""
    for which, show, said in (
        ("radix", lambda p: p.show(board_two_ranks(), now=T0), ("Radix cache", "rank 0", "pool 4,096")),
        ("gpu", lambda p: p.show(gpu_sample(), server_pids={4242: "scheduler TP0"}, now=T0), ("GPU 0 H200",)),
        ("procs", lambda p: p.show(procs_sample(), now=T0), ("DEGRADED since 22:12:50", "is a zombie")),
        ("vitals", lambda p: p.show(vitals_with_incident(), now=T0), ("first signature", "token usage")),
    ):
        app = PaneApp(which)
        async with app.run_test(size=(60, 20)) as pilot:
            show(app.query_one("#pane"))
            await pilot.pause()
            await pilot.resize_terminal(40, 10)
            await pilot.pause()
            show(app.query_one("#pane"))
            await pilot.pause()
            assert app.is_running
            screen = "\n".join(strip.text for strip in app.screen._compositor.render_strips())
            for text in said:
                assert text in screen, f"{which}: {text!r} not on a 40x10 screen:\n{screen}"


# ----------------------------------------------------------------------------------------------
# Screenshots


def _shot(which: str, show):
    async def before(pilot) -> None:
        show(pilot.app.query_one("#pane"))
        await pilot.pause()

    return PaneApp(which), before


@pytest.mark.skipif(os.environ.get("RADIXTOP_NO_SNAPSHOTS") == "1", reason="snapshots disabled")
@pytest.mark.parametrize(
    "which, show",
    [
        ("radix", lambda p: p.show(board_two_ranks(), now=T0 + 1)),
        ("gpu", lambda p: p.show(gpu_sample("degraded"), server_pids={4242: "scheduler TP0"},
                                 xids=[XidEvent(T0 - 60, 1, 79)], now=T0)),
        ("procs", lambda p: p.show(procs_sample(), now=T0)),
        ("vitals", lambda p: p.show(vitals_with_incident(), now=T0)),
    ],
)
def test_pane_screenshots(snap_compare, which, show) -> None:
    app, before = _shot(which, show)
    assert snap_compare(app, terminal_size=(100, 24), run_before=before)


async def test_short_evictions_are_summarised_not_listed() -> None:
    board = RadixBoard()
    events = [
        Event(i, T0 - 10 + i, "evict_short", tokens=0, requested=16, message=f"freed 0 of 16 ({i})")
        for i in range(1, 6)
    ]
    board.add(sample("u", make_snapshot(events_seq=5), events=events))
    summary = await _radix_summary(board, (100, 30))
    assert "~ 22:13:15 eviction came up short while pages were locked (5 seen): freed 0 of 16 (5)" in summary
    assert "! " not in summary


def test_vitals_of_an_old_log_end_at_its_last_value() -> None:
    v = Vitals()
    v.feed_log([Observation(T0 - 30 + i, "token_usage", i / 30) for i in range(30)])
    text = render_vitals(v, width=100, now=T0 + 86_400).plain
    usage = next(line for line in text.splitlines() if line.startswith("token usage"))
    assert "█" in usage, "the values are drawn, not pushed a day off the left edge"
    assert "ends at the last value, 22:13:20" in text


def test_the_radix_pane_redraws_when_its_shown_rank_moves_not_for_another_ranks_snapshot():
    from radixtop.probes.radix import RadixSample
    from radixtop.probes.status import SourceState
    from radixtop.tui.panes import LiveOptions, Panes


    class ShownPane:
        selected = "u0"

    class App:
        def query_one(self, what):
            return ShownPane

    panes = Panes(App(), LiveOptions(), follow_log=lambda patterns: None, add_lines=lambda lines: None)
    board = panes.state.board
    ok = SourceState("ok", "", 100.0)
    for seq in (1, 2):  # two snapshots each: the trees are at rest (their digests steady)
        for url, rank in (("u0", 0), ("u1", 1)):
            board.add(RadixSample(url, ok, 98.0 + seq, rank=rank, snapshot=make_snapshot(rank=rank, seq=seq)))
    key = panes._radix_key()
    board.add(RadixSample("u1", ok, 102.0, rank=1, snapshot=make_snapshot(rank=1, seq=3)))
    assert panes._radix_key() == key, "rank 1's new snapshot redrew rank 0's pane"
    board.add(RadixSample("u0", ok, 102.0, rank=0, snapshot=make_snapshot(rank=0, seq=3)))
    assert panes._radix_key() != key
    key = panes._radix_key()
    board.add(RadixSample("u1", SourceState("down", "connection refused", 103.0), 103.0, rank=1))
    assert panes._radix_key() != key, "another rank going down changes the title's marks"


def test_panes_redrawn_after_the_log_frame_once_however_often_asked():
    from radixtop.tui.panes import LiveOptions, Panes

    class App:
        def __init__(self):
            self.after: list = []

        def call_after_refresh(self, callback):
            self.after.append(callback)

    app = App()
    panes = Panes(app, LiveOptions(), follow_log=lambda patterns: None, add_lines=lambda lines: None)
    panes.redraw_after_frame()
    assert app.after == [], "nothing is drawn before the panes are mounted"
    panes.mounted = True
    drawn = []
    panes.redraw = lambda force=False: drawn.append(force)  # type: ignore[method-assign]
    for _ in range(5):  # the log pane draws up to 20 frames a second
        panes.redraw_after_frame()
    assert len(app.after) == 1
    app.after.pop()()
    assert drawn == [False]
    panes.redraw_after_frame()
    assert len(app.after) == 1, "asked again once the last one ran"


def test_the_app_imports_no_probe_before_its_first_frame():
    """Discovery (psutil), the HTTP probes and the schema are imported when the panes start, after
    the log's first frame (70-100 ms of start-up here); so are the printed-tree reader and the
    vitals, whose needles the log's ingest looks for (diagnosis/needles.py)."""
    import subprocess
    import sys

    code = (
        "import sys, radixtop.tui.app; "
        "print(sorted(m for m in sys.modules if m.startswith(('radixtop.probes.discovery', 'radixtop.probes.sglang', "
        "'radixtop.probes.radix', 'radixtop.probes.gpu', 'radixtop.session.live', 'psutil', "
        "'radixtop.widgets.radix', 'radixtop.schema', 'radixtop.diagnosis.printed_tree', 'radixtop.session.vitals', "
        "'radixtop.session.printed'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_log_lines_read_before_the_panes_run_feed_the_vitals_once_they_do():
    import asyncio
    import contextlib
    from types import SimpleNamespace

    from radixtop.tui.panes import LiveOptions, Panes

    panes = Panes(SimpleNamespace(), LiveOptions(discover=False), follow_log=lambda p: None, add_lines=lambda l: None,
                  clock_fn=lambda: 1_764_684_000.0)
    line = (
        "[2026-12-02 14:00:01 TP0] Decode batch, #running-req: 7, #token: 900, token usage: 0.55, cuda graph: True, "
        "#queue-req: 1"
    )
    panes.feed_log(SimpleNamespace(records=[SimpleNamespace(text=line)]))
    assert panes._state is None, "the live state (and its imports) waited for the panes to run"

    async def start_then_stop() -> None:
        task = asyncio.ensure_future(panes.run())
        for _ in range(100):  # bounded
            if panes.sources is not None:
                break
            await asyncio.sleep(0.01)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(start_then_stop())
    assert panes.state.vitals.series["token_usage"].last == 0.55


def test_a_live_source_changing_state_redraws_the_status_line_at_once():
    from types import SimpleNamespace

    from radixtop.probes.radix import RadixSample
    from radixtop.probes.status import SourceState
    from radixtop.tui.panes import LiveOptions, Panes

    told = []
    panes = Panes(SimpleNamespace(), LiveOptions(), follow_log=lambda p: None, add_lines=lambda l: None,
                  on_status_change=lambda: told.append(1))
    ok = SourceState("ok", "", 100.0)
    panes.state.apply(RadixSample("u0", ok, 100.0, rank=0, snapshot=make_snapshot(seq=1)))
    panes._sources_changed()
    assert told == [1], "attached"
    panes.state.apply(RadixSample("u0", ok, 102.0, rank=0, snapshot=make_snapshot(seq=2)))
    panes._sources_changed()
    assert told == [1], "a new sample of a source in the same state is not news for the status line"
    panes.state.apply(RadixSample("u0", SourceState("down", "connection refused", 103.0), 103.0, rank=0))
    panes._sources_changed()
    assert told == [1, 1]


# ----------------------------------------------------------------------------------------------
# TextRows: the vitals and processes bodies, redrawn row by row


def _rows_text(clock: str = "14:03:20") -> Text:
    text = Text()
    text.append("token usage ", style="bold")
    text.append("▁▂▃▄▅▆▇█", style="cyan")
    text.append(" 42% /metrics\n", style="dim")
    text.append("! a problem\n", style="bold red reverse")
    text.append("\n")
    text.append("a long line that the narrow widget has to wrap onto more rows, " * 2 + "\n", style="yellow")
    text.append(f"now {clock}", style="dim")
    return text


def _cells(strip) -> list[tuple[str, object]]:
    return [(ch, seg.style) for seg in strip for ch in seg.text]


class _RowsApp(App):
    CSS = "Horizontal > * { width: 1fr; height: 1fr; padding: 0 1; }"

    def compose(self) -> ComposeResult:
        with Horizontal():
            yield TextRows(id="rows")
            yield Static(id="static")


@pytest.mark.parametrize("size", [(160, 12), (60, 12)])
async def test_text_rows_draw_what_a_static_draws(size: tuple[int, int]) -> None:
    """Cell for cell what a Static makes of the same Rich Text, wrapped the same way when narrow,
    in each theme (their strips are made from the Rich segments directly)."""
    app = _RowsApp()
    async with app.run_test(size=size) as pilot:
        rows, static = app.query_one(TextRows), app.query_one(Static)
        for theme in ("textual-light", "textual-dark"):
            app.theme = theme
            rows.update(_rows_text())
            static.update(_rows_text())
            await pilot.pause()
            region = Region(0, 0, rows.outer_size.width, rows.outer_size.height)
            ours, textuals = rows.render_lines(region), static.render_lines(region)
            assert [s.text for s in ours] == [s.text for s in textuals]
            assert [_cells(s) for s in ours] == [_cells(s) for s in textuals]
            assert rows.render().plain == _rows_text().plain


async def test_text_rows_redraw_only_the_rows_that_changed() -> None:
    app = _RowsApp()
    async with app.run_test(size=(160, 12)) as pilot:
        rows = app.query_one(TextRows)
        rows.update(_rows_text("14:03:20"))
        await pilot.pause()
        calls: list[tuple] = []
        real = rows.refresh
        rows.refresh = lambda *regions, **kw: (calls.append((regions, kw)), real(*regions, **kw))[1]  # type: ignore[method-assign]
        rows.update(_rows_text("14:03:20"))
        assert calls == [], "the same text: nothing to redraw"
        rows.update(_rows_text("14:03:22"))
        last = rows.get_content_height(rows.size, rows.size, rows.size.width) - 1  # the long line wraps
        assert calls == [((Region(0, last, rows.outer_size.width, 1),), {})], "only the clock's row"
        await pilot.pause()
        assert "now 14:03:22" in rows.render_lines(Region(0, last, rows.outer_size.width, 1))[0].text
        calls.clear()
        rows.update(_rows_text("14:03:24").append("\none more row"))
        assert calls and calls[0][1].get("layout"), "a row more: laid out again"


async def test_radix_tree_rows_take_the_current_theme_and_width() -> None:
    """The tree's rows take their width and base style once per drawing pass (not per row): after
    a theme change or a resize, the rows drawn next use the new ones."""
    app = PaneApp("radix")
    async with app.run_test(size=(120, 40)) as pilot:
        app.query_one(RadixPane).show(board_two_ranks(), now=T0 + 1)
        tree = app.query_one(RadixTreeView)
        for theme, size in (("textual-light", (120, 40)), ("textual-dark", (90, 40))):
            app.theme = theme
            await pilot.resize_terminal(*size)
            await pilot.pause()
            strips = tree.render_lines(Region(0, 0, tree.outer_size.width, 3))
            assert "root" in strips[0].text
            row = strips[1]  # a node row, not under the cursor
            assert row.cell_length == tree.outer_size.width
            assert list(row)[-1].style.bgcolor == tree.rich_style.bgcolor


async def test_an_evict_failure_is_a_lock_anomaly_with_its_line() -> None:
    board = RadixBoard()
    failure = Event(
        1, T0 - 3, "evict_failure", message="RadixCacheError: Failed to lock memory page during dynamic prefix eviction"
    )
    board.add(sample("u", make_snapshot(events_seq=1, counters=Counters(lock_ops=10, unlock_ops=9, evict_failures=1)),
                     events=[failure]))
    summary = await _radix_summary(board, (120, 30))
    assert "lock anomalies: evict failures 1" in summary
    assert "! 22:13:17 rank 0 evict_failure RadixCacheError: Failed to lock memory page" in summary, summary
