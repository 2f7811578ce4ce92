"""The confirmation run's progress keeps its newest event in view, as a starting server's long
lines come too, and leaves the view where the reader scrolled it."""

from __future__ import annotations

from textual.app import App
from textual.widgets import Log

from radixtop.widgets.confirm import PlanScreen, RunScreen


class Host(App[None]):
    def __init__(self, screen: RunScreen) -> None:
        super().__init__()
        self.run_screen = screen

    def on_mount(self) -> None:
        self.push_screen(self.run_screen)


def _bottom_line(log: Log) -> str:
    return log.lines[min(len(log.lines), round(log.scroll_y) + log.scrollable_content_region.height) - 1]


async def test_the_newest_event_stays_in_view_through_a_servers_long_lines() -> None:
    """As in a run: the plan covers the progress while the evidence fills it, then a starting
    server's line wider than the screen brings a horizontal scrollbar, which takes a row."""
    screen = RunScreen(lambda: None)
    async with Host(screen).run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        for i in range(5):
            screen.add_event("evidence", f"collected {i}")
        screen.app.push_screen(PlanScreen(["the plan"] * 10, question="Start?"))
        await pilot.pause()
        for i in range(30):
            screen.add_event("evidence", f"collected under the plan {i}")
        await pilot.pause()
        screen.app.pop_screen()
        await pilot.pause()
        log = screen.query_one("#run-log", Log)
        for i in range(20):
            long = f" /usr/lib/python3/site-packages/{'x' * 150}" if i in (1, 2) else ""
            screen.add_event("reproduction-start", f"({i} s) waiting for its health{long}")
            await pilot.pause(0.01)
        await pilot.pause()
        newest = "[reproduction-start] (19 s) waiting for its health"
        assert _bottom_line(log) == newest, (log.scroll_y, log.max_scroll_y)


async def test_a_reader_who_scrolled_up_is_left_where_they_read() -> None:
    screen = RunScreen(lambda: None)
    async with Host(screen).run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        log = screen.query_one("#run-log", Log)
        for i in range(60):
            screen.add_event("reproduction", f"run {i}/60: 32 calls")
        await pilot.pause()
        log.scroll_to(y=5, animate=False, immediate=True)
        await pilot.pause()
        screen.add_event("reproduction", "one more")
        await pilot.pause()
        assert round(log.scroll_y) == 5
        log.scroll_end(animate=False, immediate=True)  # back at the end: following again
        await pilot.pause()
        screen.add_event("reproduction", "and the last")
        await pilot.pause()
        assert _bottom_line(log) == "[reproduction] and the last"
