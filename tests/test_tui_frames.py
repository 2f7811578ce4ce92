"""What the app draws per frame while a log is followed: how often, and which widgets render."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from test_tui_logpane import append, decode, log_app

from radixtop.tui.app import RadixtopApp
from radixtop.tui.pacing import FRAME_BUSY, FRAME_MIN


async def test_a_trickle_of_lines_is_drawn_a_few_frames_a_second_with_every_line_on_screen(tmp_path: Path) -> None:
    """A busy server log comes in many small writes; each frame scrolls the whole pane, so it costs
    the same for one line as for twenty. Frames are paced at FRAME_MIN (at 20 Hz the demo
    workload's log alone took 4-7 % of a core), yet each line is on screen in some frame."""
    log = tmp_path / "server.log"
    append(log, *(decode(i) for i in range(20)))
    app = RadixtopApp(log_patterns=[str(log)])
    async with app.run_test(size=(120, 30)) as pilot:
        await pilot.pause(0.3)
        view, state = app.log_view, app.state
        frames: list[float] = []
        shown: set[int] = set()
        real_refresh_view = view.refresh_view

        def refresh_view() -> None:
            real_refresh_view()
            frames.append(time.monotonic())
            top = round(view.scroll_y)
            for row in range(top, top + view.scrollable_content_region.height):
                seq = state.view_seq(row)
                if seq is not None:
                    shown.add(seq)

        view.refresh_view = refresh_view  # type: ignore[method-assign]
        first_new = state.next_seq
        writes, every = 60, 0.025  # 40 writes a second for 1.5 s: one line each
        started = time.monotonic()
        for i in range(writes):
            append(log, decode(100 + i))
            await pilot.pause(every)
        elapsed = time.monotonic() - started
        for _ in range(100):  # bounded: the last lines are drawn within a frame or two
            if state.total_lines == 20 + writes and view.state.view_seq(state.view_len - 1) in shown:
                break
            await pilot.pause(0.05)
        assert state.total_lines == 20 + writes
        assert view.follow
        missing = set(range(first_new, state.next_seq)) - shown
        assert not missing, f"lines never on screen while following: {sorted(missing)[:10]}"
        # At most 5 frames a second (FRAME_MIN), plus the first and the last; a slow machine draws
        # fewer, never more. Pacing at 20 Hz drew ~30 here.
        assert FRAME_MIN >= 0.2
        assert len(frames) <= elapsed * 5 + 4, f"{len(frames)} frames in {elapsed:.1f} s"


def _blank_widgets(app: RadixtopApp) -> list:
    screen = app.screen
    return [w for w in (screen, *screen.walk_children()) if getattr(type(w), "BLANK", False)]


@pytest.mark.parametrize(("size", "show_findings"), [((160, 48), False), ((80, 24), False), ((80, 24), True)])
async def test_containers_drawn_blank_are_filled_by_their_children(
    tmp_path: Path, size: tuple[int, int], show_findings: bool
) -> None:
    """The screen, #body, #main and #bottom render blank rows instead of going through Textual's
    styles cache on every frame of the log pane (a fifth of its compositing): right only while
    nothing of their own shows, i.e. no border or padding and children that fill them."""
    async with log_app(tmp_path, size, show_findings, lines=40) as pilot:
        app = pilot.app
        if show_findings:
            assert app.query_one("#findings-panel").region.height > 0
        blank = _blank_widgets(app)
        assert {w.id for w in blank} >= {"_default", "body", "main", "bottom"}
        for widget in blank:
            styles = widget.styles
            assert not any(styles.padding) and not any(edge for edge, _ in styles.border), widget
            region = widget.region
            children = [c.region for c in widget.children if c.display and c.region.area]
            covered = sum(r.area for r in children)
            assert all(region.contains_region(r) for r in children), widget
            assert covered == region.area, f"{widget!r}: children cover {covered} of {region.area} cells"


async def test_the_status_counters_move_once_a_second_under_bursts_and_end_at_the_final_count(tmp_path: Path) -> None:
    """A busy log comes in bursts; the counters were redrawn on each quiet tick between them (a
    status frame per log frame). Once a second now, and the final count still shows."""
    from radixtop.tui.pacing import STATUS_INTERVAL

    log = tmp_path / "server.log"
    append(log, *(decode(i) for i in range(20)))
    app = RadixtopApp(log_patterns=[str(log)])
    async with app.run_test(size=(120, 30)) as pilot:
        await pilot.pause(0.3)
        shown: list[int] = []
        real_show = app.status_line.show
        app.status_line.show = lambda info: (shown.append(info.total_lines), real_show(info))[1]  # type: ignore[method-assign]
        started = time.monotonic()
        for burst in range(8):  # a burst of 3 lines every 0.3 s
            append(log, *(decode(100 + 3 * burst + i) for i in range(3)))
            await pilot.pause(0.3)
        elapsed = time.monotonic() - started
        during = len(shown)
        # A slow machine updates less often, never more; one update per burst did 8 or more.
        assert during <= elapsed / STATUS_INTERVAL + 2, f"{during} status updates in {elapsed:.1f} s: {shown}"
        for _ in range(100):  # bounded: within a second and a tick of the last lines
            if shown and shown[-1] == 44:
                break
            await pilot.pause(0.05)
        assert app.state.total_lines == 44 and shown[-1] == 44, shown
        assert "44 lines" in app.status_line.render().plain


async def test_new_lines_redraw_the_rows_and_leave_the_scrollbar_under_them_alone(tmp_path: Path) -> None:
    """Each frame of a followed log redraws the pane's rows; the horizontal scrollbar under them
    does not change with new lines, and rendering it afresh was a tenth of a frame."""
    from textual.scrollbar import ScrollBar

    log = tmp_path / "server.log"
    append(log, *(decode(i) + " " + "x" * 200 for i in range(40)))  # wider than the pane
    app = RadixtopApp(log_patterns=[str(log)])
    async with app.run_test(size=(120, 30)) as pilot:
        await pilot.pause(0.3)
        view = app.log_view
        bar = view.horizontal_scrollbar
        assert view.show_horizontal_scrollbar and bar.region.area
        renders: list[int] = []
        real_render_lines = ScrollBar.render_lines

        def counting(self, crop):
            if self is bar:
                renders.append(1)
            return real_render_lines(self, crop)

        ScrollBar.render_lines = counting  # type: ignore[method-assign]
        try:
            frames_before = app.pacer.drawn_version
            for i in range(10):
                append(log, decode(100 + i))
                await pilot.pause(0.25)  # past FRAME_MIN: a frame for each line
            for _ in range(40):  # bounded: the last line is drawn within a frame or two
                if app.state.total_lines == 50 and app.pacer.drawn_version == app.state.version:
                    break
                await pilot.pause(0.05)
        finally:
            ScrollBar.render_lines = real_render_lines  # type: ignore[method-assign]
        assert app.pacer.drawn_version != frames_before and round(view.scroll_y) == view.max_scroll_y
        rows = view.render_lines(view.scrollable_content_region.reset_offset)
        assert "#token: 1109," in "".join(strip.text for strip in rows)  # the last line is on screen
        assert not renders, f"the scrollbar was rendered {len(renders)} times for 10 new lines"


async def test_a_flood_is_drawn_on_the_clock_one_take_per_frame(tmp_path: Path) -> None:
    """Lines coming faster than a screenful a frame: frames every FRAME_BUSY, timed from when the
    last was due (not from when it was drawn, which the reading and matching before it would
    push later each time), each from one wake-up that takes the lines; when the writer stops, the last line
    is on screen and the frames stop."""
    log = tmp_path / "server.log"
    append(log, *(decode(i) for i in range(20)))
    app = RadixtopApp(log_patterns=[str(log)])
    async with app.run_test(size=(120, 30)) as pilot:
        await pilot.pause(0.3)
        pacer, view = app.pacer, app.log_view
        drawn: list[float] = []
        takes = 0
        real_drew, real_take = pacer.drew_frame, app._take_waiting

        def last_row() -> str:
            return view.render_line(view.scrollable_content_region.height - 1).text

        def drew_frame(now: float, version: int, total_lines: int) -> None:
            drawn.append(now)
            real_drew(now, version, total_lines)

        def take_waiting(follower: object) -> None:
            nonlocal takes
            takes += 1
            real_take(follower)

        pacer.drew_frame = drew_frame  # type: ignore[method-assign]
        app._take_waiting = take_waiting  # type: ignore[method-assign]
        stop = threading.Event()

        def write() -> None:  # 20,000 lines a second for a second, in writes of 100
            for chunk in range(200):
                if stop.is_set():
                    return
                append(log, *(decode(1000 + chunk * 100 + i) for i in range(100)))
                time.sleep(0.005)

        writer = threading.Thread(target=write)
        writer.start()
        try:
            while writer.is_alive():
                await pilot.pause(0.05)
        finally:
            stop.set()
            writer.join()
        for _ in range(100):  # bounded: the last line is drawn within a frame or two
            await pilot.pause(0.05)
            if last_row() and "#token: 21999," in last_row():
                break
        assert app.state.total_lines == 20 + 20_000
        assert "#token: 21999," in last_row(), "the last line written is on the last row"
        steps = [b - a for a, b in zip(drawn, drawn[1:], strict=False)]
        on_clock = [step for step in steps if abs(step - FRAME_BUSY) < 1e-9]
        assert len(on_clock) >= len(steps) / 2, f"{len(on_clock)} of {len(steps)} frames on the clock"
        assert takes <= len(drawn) * 1.25 + 5, f"lines taken {takes} times for {len(drawn)} frames"
        frames = len(drawn)
        await pilot.pause(0.5)
        assert len(drawn) == frames, "frames went on after the writer stopped"
