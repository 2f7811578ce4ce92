"""The live log pane, driven with Textual's Pilot over real files that grow (and rotate) meanwhile."""

from __future__ import annotations

import gc
import os
import time
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from rich.color import Color
from textual import events
from textual.filter import Monochrome
from textual.geometry import Region
from textual.scrollbar import ScrollTo, ScrollUp
from textual.strip import Strip

from radixtop.themes import THEMES
from radixtop.tui.app import RadixtopApp
from radixtop.tui.help import HelpScreen
from radixtop.widgets.findings import EvidenceScreen
from radixtop.widgets.statusline import StatusLine

SEED = "[2026-12-02 14:03:14.942 TP1] RadixCacheError: Failed to lock memory page during dynamic prefix eviction"
SIGQUIT = "[2026-12-02 14:03:14.964] Received sigquit from a child process. It usually means the child failed."
RETRACT = "[2026-12-02 14:03:13.007 TP1] KV cache pool is full. Retract requests. #retracted_reqs: 2"


def decode(i: int, rank: str = "TP0") -> str:
    return (
        f"[2026-12-02 14:02:{i % 60:02d}.{i % 1000:03d} {rank}] Decode batch, #running-req: 61, #token: {1000 + i}, "
        f"token usage: 0.9{i % 10}, cuda graph: True, gen throughput (token/s): 1644.05, #queue-req: {i % 13}"
    )


def append(path: Path, *lines: str) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))


@asynccontextmanager
async def log_app(tmp_path: Path, size: tuple[int, int], show_findings: bool, lines: int = 300):
    """radixtop on a log of `lines` lines, at `size`, the findings list shown or not: its pilot."""
    log = tmp_path / "server.log"
    append(log, *(decode(i) for i in range(lines)))
    app = RadixtopApp(log_patterns=[str(log)])
    async with app.run_test(size=size) as pilot:
        await pilot.pause(0.3)
        if show_findings:
            await pilot.press("tab")
            await pilot.pause(0.1)
        yield pilot


async def wait_for(pilot, condition, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await pilot.pause(0.05)
    await pilot.pause(0.1)  # let the 15 Hz timer draw it


def seq_of(app: RadixtopApp, text: str) -> int | None:
    state = app.state
    for seq in range(state.first_seq, state.next_seq):
        entry = state.entry(seq)
        if entry is not None and entry.text == text:
            return seq
    return None


def on_screen(app: RadixtopApp, seq: int):
    """The strip drawn for an entry, which must be on screen."""
    view = app.log_view
    row = app.state.row_of(seq)
    assert row is not None, "entry not in the view"
    y = row - round(view.scroll_y)
    assert 0 <= y < view.scrollable_content_region.height, f"row {row} is not on screen (scroll_y={view.scroll_y})"
    return view.render_line(y)


def segment_with(strip, needle: str):
    for seg in strip:
        if needle in seg.text:
            return seg
    raise AssertionError(f"{needle!r} not in {strip.text!r}")


def screen_text(app: RadixtopApp) -> str:
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


def theme_color(theme: str, variable: str) -> Color:
    return Color.parse(THEMES[theme].variables[variable])


@pytest.fixture
def log(tmp_path: Path) -> Path:
    path = tmp_path / "server.log"
    append(path, *(decode(i) for i in range(20)))
    return path


async def test_appended_lines_appear_highlighted_and_become_findings(log: Path) -> None:
    app = RadixtopApp(log_patterns=[str(log)])  # the file's last lines, then what is appended (tail -n N -f)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.2)
        assert app.state.total_lines == 20  # the existing lines show at once
        append(log, decode(100), SEED, decode(101), SIGQUIT, RETRACT)
        await wait_for(pilot, lambda: app.state.total_lines == 25, "the appended lines")
        await wait_for(pilot, lambda: len(app.findings_list.findings) == 3, "the findings")
        assert app.log_view.follow

        seed = on_screen(app, seq_of(app, SEED))
        assert seed.text.startswith("!  14:03:14.942 TP1 ")
        span = segment_with(seed, "RadixCacheError")
        assert span.style.bold and span.style.underline and not span.style.reverse
        assert span.style.color.triplet == theme_color("radixtop-dark", "sev-error").triplet

        critical = segment_with(on_screen(app, seq_of(app, SIGQUIT)), "Received sigquit")
        assert critical.style.bold and critical.style.reverse
        assert critical.style.color.triplet == theme_color("radixtop-dark", "sev-critical").triplet
        warning = segment_with(on_screen(app, seq_of(app, RETRACT)), "KV cache pool is full")
        assert warning.style.underline and not warning.style.bold
        plain = on_screen(app, seq_of(app, decode(100)))
        assert plain.text.startswith("   14:02:40.100 TP0 Decode batch")
        assert not any(seg.style and (seg.style.bold or seg.style.reverse) for seg in plain)

        ids = [f.signature.id for f in app.findings_list.findings]
        assert ids == ["kv-pool-retract", "radix-page-lock-eviction", "child-sigquit"]
        shown = screen_text(app)
        assert "Radix cache page lock failed" in shown and "Findings (3)" in shown
        # The initiating rank and signature: the cause, not the retraction notice before it.
        assert "first: TP1 14:03:14.942 Radix cache page lock failed during prefix eviction" in shown


def long_log(path: Path, before: int = 6000) -> list[str]:
    """A failure an hour ago (line 11), `before` ordinary lines, the same failure again, 30 more."""
    lines = (
        [decode(i) for i in range(10)]
        + [SEED]
        + [decode(i) for i in range(before)]
        + [SEED]
        + [decode(i, "TP1") for i in range(30)]
    )
    append(path, *lines)
    return lines


async def test_a_big_log_opens_at_its_last_lines_and_finds_what_happened_before(tmp_path: Path) -> None:
    from radixtop.tui.app import BACKLOG_LINES

    path = tmp_path / "server.log"
    lines = long_log(path)
    app = RadixtopApp(log_patterns=[str(path)])
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause(0.05)
        # The first frames already hold the file's last lines, without waiting for new ones.
        assert app.state.total_lines == BACKLOG_LINES
        assert app.state.entry(app.state.next_seq - 1).text == lines[-1]
        assert "14:02:29.029 TP1 Decode batch" in screen_text(app)  # the last line, on screen
        # The part before was scanned for findings: the first occurrence is line 11, not the
        # second one in the view, and the lines before it are its evidence.
        await wait_for(
            pilot, lambda: app.state.report is not None and app.state.report.lines == len(lines), "the earlier part"
        )
        (finding,) = app.state.report.findings
        assert (finding.signature.id, finding.first.line, finding.count) == ("radix-page-lock-eviction", 11, 2)
        assert finding.context_before == tuple(lines[:10])
        await wait_for(pilot, lambda: app.findings_list.findings, "the findings list")
        assert "x2" in screen_text(app)
        # Its line is not in the view: Enter shows the evidence kept for it instead.
        await pilot.press("tab", "enter")
        await pilot.pause(0.2)
        assert isinstance(app.screen, EvidenceScreen)
        # The second occurrence is in the view, with its true line number.
        seq = max(app.state.hit_seqs())
        assert app.state.entry(seq).lineno == len(lines) - 30


async def test_a_log_named_after_start_up_is_followed_the_same_way(tmp_path: Path) -> None:
    path = tmp_path / "server.log"
    lines = long_log(path)
    app = RadixtopApp()  # no --log: discovery may name one later
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.1)
        assert "radixtop is not following any log yet" in screen_text(app)
        app.follow_logs([str(path)])
        await pilot.pause(0.1)
        assert app.state.entry(app.state.next_seq - 1).text == lines[-1]
        await wait_for(
            pilot, lambda: app.state.report is not None and app.state.report.lines == len(lines), "the earlier part"
        )
        assert app.state.report.findings[0].first.line == 11
        append(path, SIGQUIT)
        await wait_for(pilot, lambda: seq_of(app, SIGQUIT) is not None, "a new line")


async def test_from_start_fills_the_view_with_the_last_lines_and_finds_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "server.log"
    lines = long_log(path, before=3000)
    app = RadixtopApp(log_patterns=[str(path)], from_start=True, capacity=2000)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.05)
        assert app.state.view_len == 2000 and app.state.entry(app.state.next_seq - 1).text == lines[-1]
        await wait_for(
            pilot, lambda: app.state.report is not None and app.state.report.lines == len(lines), "the earlier part"
        )
        (finding,) = app.state.report.findings
        assert (finding.first.line, finding.count) == (11, 2)


async def test_enter_on_a_finding_jumps_to_its_first_line_with_context(tmp_path: Path) -> None:
    path = tmp_path / "server.log"
    append(path, *(decode(i) for i in range(300)), SEED, *(decode(i) for i in range(300, 600)), SEED)
    app = RadixtopApp(log_patterns=[str(path)], from_start=True)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.state.total_lines == 602, "the whole file")
        assert app.log_view.follow and round(app.log_view.scroll_y) == app.log_view.max_scroll_y
        await pilot.press("tab")
        assert app.focused is app.findings_list
        assert app.findings_list.highlighted == 0
        await pilot.press("enter")
        await pilot.pause(0.1)
        view = app.log_view
        assert app.focused is view and not view.follow
        entry = app.state.entry(view.cursor_seq)
        assert entry.text == SEED and entry.lineno == 301  # the first occurrence, not the second
        row = app.state.row_of(view.cursor_seq)
        top = round(view.scroll_y)
        height = view.scrollable_content_region.height
        assert top < row < top + height
        assert row - top >= height // 2  # the lines before it (its context) are on screen too
        cursor_strip = on_screen(app, view.cursor_seq)
        cursor_bg = Color.parse(THEMES["radixtop-dark"].variables["cursor-line"]).triplet
        assert any(seg.style.bgcolor and seg.style.bgcolor.triplet == cursor_bg for seg in cursor_strip)
        await pilot.press("tab", "d")
        assert isinstance(app.screen, EvidenceScreen)
        evidence = app.screen.query_one("#evidence").render().plain
        assert decode(299) in evidence and ">> " + SEED in evidence and "First checks" in evidence
        await pilot.press("escape")
        assert not isinstance(app.screen, EvidenceScreen)


async def test_follow_key_and_scrolling_up_stop_following_end_resumes(log: Path) -> None:
    app = RadixtopApp(log_patterns=[str(log)], from_start=True)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.state.total_lines == 20, "the file")
        append(log, *(decode(i) for i in range(100, 160)))
        await wait_for(pilot, lambda: app.state.total_lines == 80, "appended lines")
        view = app.log_view
        assert round(view.scroll_y) == view.max_scroll_y > 0

        await pilot.press("f")
        assert not view.follow and "SCROLL" in screen_text(app)
        top = round(view.scroll_y)
        append(log, *(decode(i) for i in range(200, 230)))
        await wait_for(pilot, lambda: app.state.total_lines == 110, "more lines")
        assert round(view.scroll_y) == top < view.max_scroll_y  # not following: the view stays put
        await pilot.press("f")
        await pilot.pause(0.1)
        assert view.follow and round(view.scroll_y) == view.max_scroll_y and "FOLLOW" in screen_text(app)

        await pilot.press("up")
        assert not view.follow
        await pilot.press("G")
        assert view.follow and round(view.scroll_y) == view.max_scroll_y

        view.post_message(events.MouseScrollUp(view, 5, 5, 0, -1, 0, False, False, False))
        await pilot.pause(0.1)
        assert not view.follow and round(view.scroll_y) < view.max_scroll_y  # the wheel scrolled and unfollowed
        await pilot.press("end")
        assert view.follow
        # What the horizontal and vertical scrollbars post: a click above the thumb, a drag upwards.
        view.post_message(ScrollUp())
        await pilot.pause(0.1)
        assert not view.follow
        await pilot.press("end")
        view.post_message(ScrollTo(y=0, animate=False))
        await pilot.pause(0.1)
        assert not view.follow and round(view.scroll_y) == 0


async def test_pause_keeps_reading_and_counts_waiting_lines(log: Path) -> None:
    app = RadixtopApp(log_patterns=[str(log)], from_start=True)
    async with app.run_test(size=(120, 30)) as pilot:
        await wait_for(pilot, lambda: app.state.total_lines == 20, "the file")
        await pilot.press("p")
        append(log, *(decode(i) for i in range(100, 150)), SEED)
        await wait_for(pilot, lambda: app.state.total_lines == 71, "lines read while paused")
        await wait_for(pilot, lambda: app.findings_list.findings, "the finding")
        assert app.state.view_len == 20  # the view did not move
        assert "PAUSED +51 waiting" in screen_text(app)
        assert [f.signature.id for f in app.findings_list.findings] == ["radix-page-lock-eviction"]
        await pilot.press("p")
        await pilot.pause(0.1)
        assert app.state.view_len == 71 and app.state.pending_count == 0
        assert app.state.entry(app.state.view_seq(70)).text == SEED
        assert "PAUSED" not in screen_text(app)


async def test_search_filter_and_signature_navigation_keys(log: Path) -> None:
    append(log, decode(50, "TP3"), SEED, decode(51), decode(52, "TP3"), SIGQUIT, decode(53))
    app = RadixtopApp(log_patterns=[str(log)], from_start=True)
    async with app.run_test(size=(120, 30)) as pilot:
        await wait_for(pilot, lambda: app.state.total_lines == 26, "the file")
        state, view = app.state, app.log_view
        tp3 = [seq_of(app, decode(50, "TP3")), seq_of(app, decode(52, "TP3"))]

        await pilot.press("slash", *"TP3", "enter")
        assert state.search_text == "TP3" and view.cursor_seq == tp3[1]  # the newest match first
        highlighted = segment_with(on_screen(app, tp3[1]), "TP3")
        assert highlighted.style.bgcolor.triplet == theme_color("radixtop-dark", "search-match").triplet
        await pilot.press("N")
        assert view.cursor_seq == tp3[0]
        await pilot.press("n")
        assert view.cursor_seq == tp3[1]
        await pilot.press("escape")
        assert state.search_text is None

        await pilot.press("e")
        assert state.entry(view.cursor_seq).text in (SEED, SIGQUIT)
        first_hit = view.cursor_seq
        await pilot.press("e")
        assert view.cursor_seq != first_hit and state.entry(view.cursor_seq).severity is not None
        await pilot.press("E")
        assert view.cursor_seq == first_hit

        await pilot.press("ampersand", *"tp3", "enter")  # smart case: lower case matches TP3
        assert state.filter_text == "tp3" and state.view_len == 2
        assert "filter 'tp3' 2 rows" in screen_text(app)
        append(log, decode(60, "TP3"), decode(61))
        await wait_for(pilot, lambda: state.total_lines == 28, "lines under the filter")
        assert state.view_len == 3  # the filter applies to new lines too
        await pilot.press("escape")
        assert state.filter_text is None and state.view_len == 28

        await pilot.press("backslash", *"sigquit", "enter")
        assert state.view_len == 1
        await pilot.press("escape")
        await pilot.press("slash", "x", "escape")  # Esc in the prompt cancels without searching
        assert state.search_text is None and app.focused is view


async def test_rotation_while_running_shows_a_notice_and_follows_the_new_file(log: Path) -> None:
    app = RadixtopApp(log_patterns=[str(log)], from_start=True)
    async with app.run_test(size=(120, 30)) as pilot:
        await wait_for(pilot, lambda: app.state.total_lines == 20, "the file")
        append(log, "last line of the old file")
        os.rename(log, str(log) + ".1")
        append(log, "first line of the new file", SEED)
        await wait_for(pilot, lambda: seq_of(app, SEED) is not None, "the new file's lines", timeout=15)
        await wait_for(pilot, lambda: app.findings_list.findings, "the finding")
        texts = [app.state.entry(s).text for s in range(app.state.first_seq, app.state.next_seq)]
        assert texts.index("last line of the old file") < texts.index("first line of the new file")
        notices = [t for t in texts if t.startswith("[rotated]")]
        assert notices, texts[-6:]
        notice_seq = seq_of(app, notices[0])
        assert on_screen(app, notice_seq).text.startswith("»  [rotated]")
        app._poll_health()
        await pilot.pause(0.1)
        assert "server.log ROTATED (" in screen_text(app)
        occurrence = app.findings_list.findings[0].first
        assert occurrence.line == 2 and occurrence.file.endswith("(generation 1)")


async def test_80x24_hides_findings_until_tab(log: Path) -> None:
    append(log, SEED)
    app = RadixtopApp(log_patterns=[str(log)], from_start=True)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.state.total_lines == 21, "the file")
        await wait_for(pilot, lambda: app.findings_list.findings, "the finding")
        panel = app.query_one("#findings-panel")
        assert not panel.display or panel.region.width == 0 or panel.region.height == 0
        text = screen_text(app)
        assert "!  14:03:14.942 TP1 RadixCacheError" in text
        assert "q Quit" in text and "FOLLOW" in text
        await pilot.press("tab")
        await pilot.pause(0.1)
        assert app.focused is app.findings_list and panel.region.height > 0 and panel.region.width == 80
        assert "Radix cache page lock failed" in screen_text(app)
        await pilot.press("tab")
        await pilot.pause(0.1)
        assert app.focused is app.log_view and panel.region.height == 0


async def test_no_color_keeps_severity_distinguishable(log: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    append(log, SEED, SIGQUIT, RETRACT)
    app = RadixtopApp(log_patterns=[str(log)], from_start=True)
    async with app.run_test(size=(120, 30)) as pilot:
        await wait_for(pilot, lambda: app.state.total_lines == 23, "the file")
        assert app.no_color and any(isinstance(f, Monochrome) for f in app._filters)
        seen = {}
        for text, word in ((SEED, "RadixCacheError"), (SIGQUIT, "Received"), (RETRACT, "KV cache")):
            strip = on_screen(app, seq_of(app, text))
            # What reaches the terminal: the app's own NO_COLOR filter applied.
            segments = Monochrome().apply(list(strip), None)
            seg = next(s for s in segments if word in s.text)
            seen[text] = (strip.text[:2], bool(seg.style.bold), bool(seg.style.underline), bool(seg.style.reverse))
        assert seen[SIGQUIT] == ("!!", True, False, True)
        assert seen[SEED] == ("! ", True, True, False)
        assert seen[RETRACT] == ("~ ", False, True, False)


async def test_t_cycles_themes_and_restyles_the_log(log: Path) -> None:
    append(log, SEED)
    app = RadixtopApp(log_patterns=[str(log)], from_start=True)
    async with app.run_test(size=(120, 30)) as pilot:
        await wait_for(pilot, lambda: app.state.total_lines == 21, "the file")
        seq = seq_of(app, SEED)
        for theme in ("radixtop-light", "radixtop-high-contrast", "radixtop-dark"):
            await pilot.press("t")
            await pilot.pause(0.1)
            assert app.theme == theme
            span = segment_with(on_screen(app, seq), "RadixCacheError")
            assert span.style.color.triplet == theme_color(theme, "sev-error").triplet


async def test_light_theme_from_the_command_line(log: Path) -> None:
    app = RadixtopApp(log_patterns=[str(log)], theme="light")
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause(0.1)
        assert app.theme == "radixtop-light" and not app.current_theme.dark


async def test_without_a_log_the_pane_says_how_to_point_it_at_one() -> None:
    app = RadixtopApp()
    async with app.run_test(size=(120, 30)) as pilot:
        await pilot.pause(0.2)
        text = screen_text(app)
        assert "radixtop is not following any log yet" in text
        assert "radixtop --log /path/to/server.log" in text
        assert "no log followed (--log PATH)" in text
        assert "radixtop demo" in text


async def test_a_banner_is_the_first_line(log: Path) -> None:
    app = RadixtopApp(log_patterns=[str(log)], from_start=True, banner="demo: simulated SGLang at http://127.0.0.1:1")
    async with app.run_test(size=(120, 30)) as pilot:
        await wait_for(pilot, lambda: app.state.total_lines == 20, "the file")
        assert app.state.entry(app.state.first_seq).text.startswith("demo: simulated SGLang")
        assert app.state.entry(app.state.first_seq + 1).text == decode(0)


async def test_a_failing_ingest_becomes_a_notice_and_reading_goes_on(log: Path) -> None:
    app = RadixtopApp(log_patterns=[str(log)])
    real = app.ingestor.process
    calls = []

    def flaky(batch):
        calls.append(len(batch.records))
        if len(calls) == 1:
            raise RuntimeError("simulated bug in the ingest path")
        return real(batch)

    app.ingestor.process = flaky
    async with app.run_test(size=(120, 30)) as pilot:
        await pilot.pause(0.2)
        append(log, "lost with the failing batch")
        await wait_for(pilot, lambda: calls, "the first batch")
        await pilot.pause(0.8)  # the worker restarts after 0.5 s
        append(log, SEED)
        await wait_for(pilot, lambda: seq_of(app, SEED) is not None, "lines after the failure")
        assert app.is_running
        notices = [
            e.text
            for e in (app.state.entry(s) for s in range(app.state.first_seq, app.state.next_seq))
            if e.kind == "notice"
        ]
        assert any("reading the logs failed" in n and "simulated bug" in n for n in notices)


async def test_help_opens_and_closes(log: Path) -> None:
    app = RadixtopApp(log_patterns=[str(log)])
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        assert "follow the newest line" in screen_text(app)
        await pilot.press("f")  # main-screen keys do nothing under the help
        assert app.log_view.follow
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)


async def test_status_line_lists_each_source(tmp_path: Path) -> None:
    a, b = tmp_path / "rank0" / "server.log", tmp_path / "rank1" / "server.log"
    a.parent.mkdir()
    b.parent.mkdir()
    append(a, decode(1))
    app = RadixtopApp(log_patterns=[str(a), str(b)], from_start=True)
    async with app.run_test(size=(160, 30)) as pilot:
        await wait_for(pilot, lambda: app.state.total_lines == 1, "rank0's line")
        app._poll_health()
        await pilot.pause(0.1)
        status = app.query_one(StatusLine).render().plain
        assert "rank0/server.log ok" in status
        assert "rank1/server.log WAITING (does not exist yet" in status
        append(b, SEED)
        await wait_for(pilot, lambda: seq_of(app, SEED) is not None, "rank1's line")
        # Several files: each line says where it came from.
        assert on_screen(app, seq_of(app, SEED)).text.startswith("!  rank1/server.log 14:03:14.942")


def test_a_bad_signature_file_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from radixtop.cli import main

    bad = tmp_path / "ours.toml"
    bad.write_text('[[signature]]\nid = "x"\npattern = "(?<=a)b"\n', encoding="utf-8")
    assert main(["--signatures", str(bad), "--log", str(tmp_path / "x.log")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("radixtop: ") and str(bad) in err and "\n" not in err


def cells(strip) -> list[tuple[str, object]]:
    return [(ch, seg.style) for seg in strip for ch in seg.text]


@pytest.mark.parametrize("no_color", [False, True])
async def test_rows_drawn_directly_match_textuals_own_line_rendering(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_color: bool
) -> None:
    """The log pane builds its rows itself (one Strip per row, filters applied per style); cell for
    cell they must be what Textual's generic per-line pass makes of the same rows."""
    from textual.geometry import Region
    from textual.widget import Widget

    if no_color:
        monkeypatch.setenv("NO_COLOR", "1")
    a, b = tmp_path / "rank0" / "server.log", tmp_path / "rank1" / "server.log"
    a.parent.mkdir()
    b.parent.mkdir()
    append(
        a,
        *(decode(i) for i in range(30)),
        SEED,
        "\tTraceback (most recent call last): \x07 bell",
        "unicode 日本語 line",
    )
    append(b, SIGQUIT, RETRACT, "x" * 300)
    app = RadixtopApp(log_patterns=[str(a), str(b)], from_start=True)
    async with app.run_test(size=(120, 30)) as pilot:
        await wait_for(pilot, lambda: app.state.total_lines == 36, "both files")
        await pilot.press("slash", *"TP0", "enter")  # search highlights too
        await pilot.pause(0.1)
        view = app.log_view
        for scroll in (0, 40):  # and scrolled right, past the start of the long lines
            view.scroll_to(x=scroll, animate=False, immediate=True)
            await pilot.pause(0.05)
            region = Region(0, 0, view.size.width, view.size.height)
            ours = view.render_lines(region)
            view._styles_cache.clear()
            textuals = Widget.render_lines(view, region)
            assert [s.text for s in ours] == [s.text for s in textuals]
            assert [cells(s) for s in ours] == [cells(s) for s in textuals]


@pytest.mark.parametrize(
    ("no_color", "two_files", "width"), [(False, False, 120), (True, True, 120), (False, True, 44)]
)
async def test_plain_rows_made_in_one_pass_are_the_general_paths_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_color: bool, two_files: bool, width: int
) -> None:
    """Most rows of a busy log are plain SGLang lines, made in one pass (LogView._plain_row):
    segment for segment and style for style they must be the rows the general path makes, beside
    the lines it leaves to that path (matches, no prefix, non-ASCII, a wider rank)."""
    from radixtop.widgets.logview import LogView

    if no_color:
        monkeypatch.setenv("NO_COLOR", "1")
    a = tmp_path / "rank0-with-a-long-directory-name" / "server.log"
    a.parent.mkdir()
    lines = [decode(i) for i in range(12)] + [
        SEED,
        "[2026-12-02 14:03:15,5 TP1] comma and one digit",
        "[2026-12-02 14:03:15.500 TP1]",  # a prefix and nothing after it
        "[2026-12-02T14:03:16.000000 TP1 pid=77] iso time, microseconds, more in the brackets",
        "\tTraceback (most recent call last): \x07 bell",
        "unicode 日本語 line",
        "x" * 300,
        decode(99, rank="DP0 TP3"),  # widens the rank column: every row is made again
        *(decode(i, rank="DP1 TP2") for i in range(12)),
    ]
    append(a, *lines)
    patterns = [str(a)]
    if two_files:
        b = tmp_path / "r1" / "server.log"
        b.parent.mkdir()
        append(b, SIGQUIT, RETRACT, decode(5, rank="TP1"))
        patterns.append(str(b))
    app = RadixtopApp(log_patterns=patterns, from_start=True)
    async with app.run_test(size=(width, 40)) as pilot:
        await wait_for(pilot, lambda: app.state.total_lines >= len(lines), "the lines")
        view = app.log_view
        view.refresh_view()
        await pilot.pause(0.1)
        one_pass = []
        plain_row = LogView._plain_row

        def counted(self, *args):
            strip = plain_row(self, *args)
            one_pass.append(strip is not None)
            return strip

        region = Region(0, 0, view.size.width, view.size.height)
        monkeypatch.setattr(LogView, "_plain_row", counted)
        view.invalidate()
        ours = view.render_lines(region)
        monkeypatch.setattr(LogView, "_plain_row", lambda self, *args: None)
        view.invalidate()
        general = view.render_lines(region)
        assert sum(one_pass) >= 20 and not all(one_pass)  # both paths drew rows here
        assert [s.text for s in ours] == [s.text for s in general]
        assert [cells(s) for s in ours] == [cells(s) for s in general]
        assert all(s.cell_length == view.size.width for s in ours)


async def test_the_status_line_redraws_only_when_what_it_says_changes() -> None:
    from radixtop.widgets.statusline import StatusInfo

    app = RadixtopApp()
    async with app.run_test(size=(120, 30)) as pilot:
        await pilot.pause()
        line = app.query_one(StatusLine)
        refreshes = []
        original = line.refresh
        line.refresh = lambda *a, **k: (refreshes.append(1), original(*a, **k))[1]  # type: ignore[method-assign]
        line.show(StatusInfo(total_lines=10, rate=1.43))
        assert len(refreshes) == 1 and "10 lines 1/s" in line.render().plain
        line.show(StatusInfo(total_lines=10, rate=1.33))  # still "1/s": nothing to redraw
        assert len(refreshes) == 1 and line.info.rate == 1.33
        line.show(StatusInfo(total_lines=10, rate=0.2))
        assert len(refreshes) == 2 and "10 lines 0/s" in line.render().plain
        line.show(StatusInfo(total_lines=11, rate=0.2))
        assert len(refreshes) == 3


async def test_the_timer_runs_slowly_while_nothing_moves_and_fast_while_something_waits(tmp_path: Path) -> None:
    """The app hands the pacer (tests/test_pacing.py) what it has drawn and what waits."""
    from radixtop.tui.pacing import IDLE_TICK_S, REFRESH_HZ

    log = tmp_path / "server.log"
    log.write_text("")
    app = RadixtopApp(log_patterns=[str(log)])

    def timer_delay() -> float:  # what the app's timer asks the pacer after each run
        return app.pacer.timer_delay(time.monotonic(), app.state.version, app.ingestor.has_waiting())

    async with app.run_test(size=(120, 30)) as pilot:
        await pilot.pause()
        app._tick(force=True)
        assert timer_delay() == IDLE_TICK_S, "an idle app woke 4+ times a second"
        app.state.add_message(["something to draw"])
        assert timer_delay() == 1 / REFRESH_HZ
        app._tick(force=True)
        assert timer_delay() == IDLE_TICK_S
        app.ingestor.has_waiting = lambda: True  # a finding waits AFTER_WAIT for its lines-after
        assert timer_delay() == 1 / REFRESH_HZ
        app.ingestor.has_waiting = lambda: False
        assert timer_delay() == IDLE_TICK_S
        with open(log, "a") as f:
            f.write("[2026-12-02 14:00:00 TP0] Decode batch, #running-req: 1, token usage: 0.10\n")
        for _ in range(200):  # bounded: the follower hands the line over within a few polls
            if app.state.total_lines:
                break
            await pilot.pause(0.02)
        app._tick(force=True)
        assert timer_delay() == 1 / REFRESH_HZ, "lines just came: the counters' final figures follow"
        health_at = app.pacer.health_at
        for _ in range(200):  # bounded: the timer runs again and reads the files' health
            if app.pacer.health_at != health_at:
                break
            await pilot.pause(0.02)
        assert app.pacer.health_at != health_at, "the timer did not run again"


async def test_the_findings_title_is_redrawn_only_when_its_text_changes(tmp_path: Path) -> None:
    from textual.widgets import Static

    log = tmp_path / "server.log"
    log.write_text("")
    app = RadixtopApp(log_patterns=[str(log)])
    async with app.run_test(size=(120, 30)) as pilot:
        await pilot.pause()
        title = app.query_one("#findings-title", Static)
        assert "Findings (0)" in str(title.render())
        updates = []
        original = title.update
        title.update = lambda *a, **k: (updates.append(a), original(*a, **k))[1]  # type: ignore[method-assign]
        for _ in range(3):
            app._show_findings(time.monotonic(), force=True)  # what each frame of new lines did
        assert updates == [], "the title was redrawn with the same text"


async def test_following_new_lines_leaves_the_sizeless_vertical_scrollbar_alone(log: Path) -> None:
    """The log pane's vertical scrollbar has no size, so the compositor never places it; refreshing
    it (Textual set its position on every scroll) made the compositor re-arrange the whole screen
    at the next frame, 2-3 ms on each new line. Its position still follows, quietly."""
    app = RadixtopApp(log_patterns=[str(log)])
    async with app.run_test(size=(120, 30)) as pilot:
        await pilot.pause(0.2)
        view = app.log_view
        bar = view.vertical_scrollbar
        refreshed: list[object] = []
        real_refresh = bar.refresh
        bar.refresh = lambda *a, **kw: (refreshed.append(a), real_refresh(*a, **kw))[1]
        before = view.scroll_y
        for n in range(3):
            append(log, *(decode(i) for i in range(100 + 20 * n, 120 + 20 * n)))
            await wait_for(pilot, lambda n=n: app.state.total_lines == 40 + 20 * n, "appended lines")
        assert view.follow and view.scroll_y > before, "it scrolled with the new lines"
        assert bar.position == view.scroll_y
        assert refreshed == []


@pytest.mark.parametrize("width", [160, 64])
async def test_the_status_line_drawn_directly_matches_textuals_rendering_in_every_theme(width: int) -> None:
    """The status line makes its Strip from its Rich Text itself (Textual's Content conversion cost
    1 ms and more per redraw, on each quiet log line), with its styles looked up once per theme:
    cell for cell it must be what Textual makes of the same Text, in every theme, cut with … when
    too long."""
    from textual.geometry import Region
    from textual.widget import Widget

    from radixtop.widgets.statusline import SourceStatus, StatusInfo

    info = StatusInfo(
        total_lines=12_345, rate=3.0, findings=2, initiating="TP1 14:03:14 radix page lock failed " + "x" * 40,
        sources=(SourceStatus("server.log", "ok", ""), SourceStatus("server", "down", "since 14:03:15"),
                 SourceStatus("gpu", "unavailable", "no NVML")),
        engine="matcher: hyperscan",
    )
    app = RadixtopApp()
    async with app.run_test(size=(width, 30)) as pilot:
        line = app.status_line
        for theme in ("radixtop-light", "radixtop-high-contrast", "radixtop-dark"):
            await pilot.press("t")
            await pilot.pause(0.1)
            assert app.theme == theme
            line.show(info)  # the app's own timer shows its own; no await from here on
            region = Region(0, 0, line.size.width, 1)
            ours = line.render_lines(region)
            line._styles_cache.clear()
            line.refresh()
            line.render_line = lambda y: Widget.render_line(line, y)  # type: ignore[method-assign]
            textuals = line.render_lines(region)
            del line.render_line
            line._styles_cache.clear()
            assert ours[0].text == textuals[0].text
            assert "server DOWN" in ours[0].text if width == 160 else ours[0].text.endswith("…")
            assert cells(ours[0]) == cells(textuals[0])


async def test_rows_the_compositor_divides_whole_are_freed_without_the_cyclic_collector(log: Path) -> None:
    """Textual's Strip keeps `[self]` in its own cache when divided whole, as the compositor does
    with each row of the pane each frame: a cycle per row, a screenful of them each frame of a
    flood, left to the cyclic collector. The pane's rows must be freed as soon as dropped."""
    app = RadixtopApp(log_patterns=[str(log)], from_start=True)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.state.total_lines == 20, "the file")
        view = app.log_view
        width = view.size.width
        gc.collect()
        gc.disable()
        try:
            view.invalidate()
            rows = view.render_lines(Region(0, 0, width, view.size.height))
            assert sum(1 for row in rows if "Decode batch" in row.text) >= 10
            for row in rows:
                assert [part.text for part in row.divide([width])] == [row.text]  # the compositor's cut
            view.invalidate()
            del rows
            gc.set_debug(gc.DEBUG_SAVEALL)
            gc.collect()
            cyclic = [o for o in gc.garbage if isinstance(o, Strip)]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
        assert cyclic == []


async def test_a_border_given_to_the_log_pane_later_is_drawn_around_its_rows(tmp_path: Path) -> None:
    """The rows skip Textual's per-line pass only while the pane's box adds nothing to them: a
    border given later (an inline style, which no stylesheet update announces) is drawn, with its
    title, and taken away again."""
    async with log_app(tmp_path, (100, 30), False) as pilot:
        view = pilot.app.log_view
        height = view.size.height

        def first_row() -> str:
            return "".join(text for text, *_ in view.render_lines(Region(0, 0, view.size.width, height))[0])

        assert "Decode" in first_row()
        view.styles.border = ("round", "red")
        view.border_title = "log"
        await pilot.pause(0.1)
        assert first_row().startswith("╭─") and "log" in first_row()[:12]
        view.styles.border = ("none", "red")
        await pilot.pause(0.1)
        assert "Decode" in first_row() and not first_row().startswith("╭")
