"""What radixtop takes from Textual's private API (radixtop/widgets/textual_private.py) still
exists and still does what it is used for; a Textual upgrade that changes it fails here."""

from __future__ import annotations

import inspect
import random
import re
from pathlib import Path

import pytest
from textual.app import App, ComposeResult
from textual.geometry import Region, Size
from textual.scroll_view import ScrollView
from textual.widget import Widget

from radixtop.widgets.textual_private import update_scrollbars


def test_widget_scroll_update_takes_a_virtual_size():
    params = list(inspect.signature(Widget._scroll_update).parameters)
    assert params == ["self", "virtual_size"]


class Tall(ScrollView):
    DEFAULT_CSS = "Tall { scrollbar-size-horizontal: 1; overflow-x: auto; }"


async def test_update_scrollbars_sizes_the_horizontal_scrollbar_to_the_virtual_width():
    class Demo(App):
        def compose(self) -> ComposeResult:
            yield Tall()

    async with Demo().run_test(size=(40, 10)) as pilot:
        view = pilot.app.query_one(Tall)
        size = Size(400, 100)
        view.set_reactive(ScrollView.virtual_size, size)  # as the log pane does: no layout pass
        assert view.horizontal_scrollbar.window_virtual_size != 400  # not by itself
        update_scrollbars(view, size)
        assert view.show_horizontal_scrollbar  # at once, not at some later layout
        assert view.horizontal_scrollbar.window_virtual_size == 400


def test_normalize_keys_names_keys_as_a_keymap_binds_them():
    from radixtop.widgets.textual_private import normalize_keys

    assert normalize_keys("?,q,ctrl+c") == ["question_mark", "q", "ctrl+c"]
    assert normalize_keys("&") == ["ampersand"]


# A cursor move that writes nothing before the next move, line end or the end: Textual's own
# compositor moves to a chop that starts at a changed span's right edge and writes it empty.
_EMPTY_MOVE = re.compile(r"\x1b\[\d+;\d+H(?=\x1b\[\d+;\d+H|\n|$)")


def _partial_update(compositor, cls, dirty, console) -> str:
    """What a partial update writes to the terminal, less its cursor moves that write nothing."""
    compositor.__class__ = cls
    compositor._dirty_regions = set(dirty)
    update = compositor.render_update()
    return _EMPTY_MOVE.sub("", update.render_segments(console)) if update is not None else ""


@pytest.mark.parametrize(("size", "show_findings"), [((160, 48), False), ((80, 24), True)])
async def test_the_cropped_compositor_writes_what_textuals_own_writes(
    tmp_path: Path, size: tuple[int, int], show_findings: bool
) -> None:
    """For any changed area (each widget's region, the log pane's rows, random rectangles across
    several widgets), the main screen's compositor writes to the terminal exactly what Textual's
    own compositor writes, having rendered less."""
    from test_tui_logpane import log_app
    from textual._compositor import Compositor

    from radixtop.widgets.textual_private import CroppedCompositor

    async with log_app(tmp_path, size, show_findings) as pilot:
        app = pilot.app
        screen = app.screen
        compositor = screen._compositor
        assert type(compositor) is CroppedCompositor
        width, height = size
        view = app.log_view
        areas = [region for region, _ in compositor.visible_widgets.values()]
        areas.append(view.scrollable_content_region)  # the rows a log frame changes
        rng = random.Random(5)
        for _ in range(150):
            x, y = rng.randrange(width), rng.randrange(height)
            areas.append(Region(x, y, rng.randint(1, width - x), rng.randint(1, height - y)))
        rendered = {"stock": 0, "cropped": 0}
        for area in areas:
            # One changed area, or two or three anywhere (an idle screen: a row here, a row there).
            dirty = [area, *(areas[rng.randrange(len(areas))] for _ in range(rng.choice((0, 0, 1, 2))))]
            counts = {}
            for name, cls in (("stock", Compositor), ("cropped", CroppedCompositor)):
                calls = 0
                real_get_renders = cls._get_renders
                drawn: list[Region] = []

                def counting(self, crop=None, _real=real_get_renders, _drawn=drawn):
                    nonlocal calls
                    for item in _real(self, crop):
                        calls += 1
                        _drawn.append(item[1])
                        yield item

                cls._get_renders = counting  # type: ignore[method-assign]
                try:
                    counts[name] = _partial_update(compositor, cls, dirty, app.console)
                finally:
                    cls._get_renders = real_get_renders  # type: ignore[method-assign]
                rendered[name] += calls
                if name == "cropped":  # nothing rendered between the changed areas
                    assert all(any(rows.overlaps(changed) for changed in dirty) for rows in drawn), dirty
            assert counts["cropped"] == counts["stock"], f"the screen differs for the changed area {dirty}"
        compositor.__class__ = CroppedCompositor
        # Less rendered in all: the point of it (a rendering that only matched would not need it).
        assert rendered["cropped"] < rendered["stock"] * 0.8, rendered


def test_a_log_row_sets_every_attribute_a_strip_has_and_draws_as_one():
    """The log pane's Row builds itself without Strip.__init__ (whose seven caches cost a third
    of a row drawn once): a Textual release that adds an attribute to Strip fails here."""
    from rich.console import Console
    from rich.segment import Segment
    from rich.style import Style
    from textual.strip import Strip

    from radixtop.widgets.logview import Row

    segments = [Segment("ab", Style(bold=True)), Segment("cdef", Style(color="red")), Segment("  ")]
    row, strip = Row(segments, 8), Strip(segments, 8)
    assert all(hasattr(row, name) for name in Strip.__slots__)
    for _ in range(2):  # the second time from a Strip's caches, never from a Row's
        assert row.crop(1, 5).text == strip.crop(1, 5).text
        assert [s.text for s in row.divide([3, 8])] == [s.text for s in strip.divide([3, 8])]
        assert list(row.apply_style(Style(italic=True))) == list(strip.apply_style(Style(italic=True)))
        assert list(row.crop_extend(2, 12, None)) == list(strip.crop_extend(2, 12, None))
        assert list(row.extend_cell_length(12)) == list(strip.extend_cell_length(12))
    console = Console()
    assert row.render(console) == strip.render(console)


async def test_draw_now_writes_a_refreshed_widget_before_the_loop_runs_again(tmp_path: Path):
    """The log pane draws a frame of new lines at once: the screen writes it before the event
    loop runs again (no message-pump passes, no timer); not when a layout is pending."""
    from textual.widgets import Static

    from radixtop.widgets.textual_private import draw_now

    class Demo(App):
        def compose(self) -> ComposeResult:
            yield Static("one", id="a")
            yield Static("two", id="b")

    async with Demo().run_test(size=(40, 10)) as pilot:
        await pilot.pause(0.1)
        app = pilot.app
        written: list[str] = []
        real_display = app._display
        app._display = lambda screen, update: (written.append(update), real_display(screen, update))[1]
        widget = app.query_one("#a", Static)
        assert not draw_now(widget), "nothing to draw"
        widget.refresh()
        assert draw_now(widget) and len(written) == 1
        assert not widget._repaint_required and not app.screen._dirty_widgets
        widget.refresh(layout=True)
        assert not draw_now(widget), "a layout is the screen's own to do"
        await pilot.pause(0.1)
        assert len(written) >= 2, "Textual drew it its own way"


@pytest.mark.parametrize(("size", "show_findings", "no_color"),
                         [((160, 48), False, False), ((80, 24), True, False), ((80, 24), False, True)])
async def test_painted_log_rows_are_what_textuals_update_writes_for_them(
    tmp_path: Path, size: tuple[int, int], show_findings: bool, no_color: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A following frame written past the compositor (paint_rows) puts on the terminal what
    Textual's own update of the log pane's rows writes, move for move and byte for byte, with
    NO_COLOR's filter too."""
    if no_color:
        monkeypatch.setenv("NO_COLOR", "1")
    from test_tui_logpane import log_app
    from textual._compositor import Compositor

    from radixtop.widgets.textual_private import CroppedCompositor, rows_area, rows_text

    async with log_app(tmp_path, size, show_findings) as pilot:
        app = pilot.app
        view = app.log_view
        height = view.scrollable_content_region.height
        area = rows_area(view, height)
        assert area is not None and area.height == height > 0
        painted = rows_text(area, view.row_texts(height))
        compositor = app.screen._compositor
        stock = _partial_update(compositor, Compositor, [area], app.console)
        compositor.__class__ = CroppedCompositor
        assert "decode batch" in painted.lower() or "seq" in painted  # rows, not blanks
        assert painted == stock.replace("\n", ""), "the painted rows differ from Textual's update"


async def test_rows_are_not_painted_under_a_widget_in_front_or_off_screen():
    """paint_rows declines (and renders nothing) where a widget in front covers a row, where the
    rows run past what is on screen, and on an app without a terminal (Textual draws those)."""
    from textual.containers import Container
    from textual.widgets import Static

    from radixtop.widgets.textual_private import paint_rows, rows_area

    class Demo(App):
        CSS = "#over { layer: above; offset: 2 1; width: 5; height: 1; } Screen { layers: below above; }"

        def compose(self) -> ComposeResult:
            with Container():
                yield Static("\n".join(f"row {i}" for i in range(6)), id="rows")
            yield Static("over", id="over")

    async with Demo().run_test(size=(30, 8)) as pilot:
        await pilot.pause(0.1)
        rows = pilot.app.query_one("#rows", Static)
        assert rows_area(rows, 1) == Region(0, 0, 30, 1), "nothing in front of its first row"
        assert rows_area(rows, 2) is None, "the second row is under #over"
        assert rows_area(rows, 9) is None, "more rows than the screen holds"
        rendered: list[int] = []
        assert not paint_rows(rows, 1, lambda: rendered.append(1) or []), "headless: no terminal"
        assert not rendered


async def test_paint_rows_writes_the_rows_in_one_synchronized_write(monkeypatch: pytest.MonkeyPatch):
    from rich.segment import Segment
    from textual.strip import Strip
    from textual.widgets import Static

    from radixtop.widgets.textual_private import paint_rows

    class Demo(App):
        def compose(self) -> ComposeResult:
            yield Static("top", id="top")
            yield Static("under", id="under")

    async with Demo().run_test(size=(10, 4)) as pilot:
        await pilot.pause(0.1)
        app = pilot.app
        monkeypatch.setattr(type(app), "is_headless", property(lambda self: False))
        written: list[str] = []
        monkeypatch.setattr(app._driver, "write", written.append)
        app._sync_available = True
        widget = app.query_one("#under", Static)
        rows = [Strip([Segment("x" * 10)], 10).render(app.console)]
        assert paint_rows(widget, 1, lambda: rows)
        assert written == ["\x1b[?2026h\x1b[2;1Hxxxxxxxxxx\x1b[1;1H\x1b[?2026l"]
        widget.refresh(layout=True)
        assert not paint_rows(widget, 1, lambda: rows), "a layout is the screen's own to do"
        assert len(written) == 1
