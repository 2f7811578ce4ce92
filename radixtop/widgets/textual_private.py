"""The one place radixtop reaches into Textual's private API, each use with the reason.

tests/test_textual_private.py fails when a Textual release changes what is used here, so an
upgrade breaks a test rather than the screen.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

from rich.color import ColorSystem
from rich.style import Style
from textual._ansi_sequences import SYNC_END, SYNC_START
from textual._compositor import ChopsUpdate, Compositor
from textual.geometry import Region
from textual.strip import Strip

__all__ = [
    "CroppedCompositor",
    "draw_now",
    "normalize_keys",
    "paint_rows",
    "rows_area",
    "rows_text",
    "style_renderer",
    "styles_version",
    "update_scrollbars",
]


class CroppedCompositor(Compositor):
    """A compositor that renders, for a partial update, only what the update can show.

    Textual's `_get_renders` renders every widget whose *clip* (its container's region) meets the
    box around every changed area, and the whole of each, front to back, the first strip at each
    cut winning: while the log pane scrolls under a flood, every frame also rendered the containers
    behind it and the row of panes below it, for strips the update threw away (a third of a
    frame); on an idle server, a changed row in one pane and one in another rendered every pane
    between them. Here a widget is rendered only on the rows its changed parts span, at its full
    visible width (a chop starts at a cut, and every cut is a widget's edge), and not at all when
    none of the changed areas meets its visible part, or each part it meets lies inside one widget
    in front of it (which then wins every chop there). What is written is Textual's own: the update
    writes only the changed spans."""

    _changed: list[Region] | None = None  # the partial update's changed areas, while it renders
    # (visible_widgets it was made for, each widget's region and visible part in render order):
    # Textual remakes that mapping when the layout changes, not each frame.
    _visible: tuple[object, list[tuple[Any, Region, Region]]] | None = None

    def render_partial_update(self) -> ChopsUpdate | None:
        self._changed = list(self._dirty_regions)
        try:
            return super().render_partial_update()
        finally:
            self._changed = None

    def _visible_parts(self) -> list[tuple[Any, Region, Region]]:
        widgets = self.visible_widgets
        cached = self._visible
        if cached is None or cached[0] is not widgets:
            parts = [(widget, region, region.intersection(clip)) for widget, (region, clip) in widgets.items()]
            cached = self._visible = (widgets, parts)
        return cached[1]

    def _get_renders(self, crop: Region | None = None) -> Iterable[tuple[Region, Region, list[Strip]]]:
        if crop is None:
            yield from super()._get_renders(crop)
            return
        changed = [area.intersection(crop) for area in (self._changed or [crop])]
        box = Region.from_union(changed)
        in_front: list[Region] = []  # visible parts of the widgets rendered so far
        # A frame of the log pane meets one widget of the forty in front of it: most are passed
        # over with one comparison against the box around the changed areas.
        for widget, region, visible in self._visible_parts():
            if not visible.overlaps(box):
                continue
            if in_front and all(any(front.contains_region(area) for front in in_front) for area in changed):
                return  # every changed area lies in front of all the widgets left (the log pane's frame)
            parts = [visible.intersection(area) for area in changed if visible.overlaps(area)]
            parts = [part for part in parts if not any(front.contains_region(part) for front in in_front)]
            if not parts:
                continue
            in_front.append(visible)
            y1, y2 = min(part.y for part in parts), max(part.bottom for part in parts)
            rows = Region(visible.x, y1, visible.width, y2 - y1)
            yield region, rows, widget.render_lines(Region(rows.x - region.x, y1 - region.y, rows.width, rows.height))


def update_scrollbars(widget: Any, virtual_size: Any) -> None:
    """Recompute a scroll view's scrollbars for a new virtual size, without a layout pass.

    The public way, assigning `virtual_size`, re-lays out and redraws the whole screen; the log
    pane grows its virtual size on every new line, so it sets the reactive quietly and asks for
    the scrollbars alone (Widget._scroll_update: visibility, window sizes and a refresh of each)."""
    widget._scroll_update(virtual_size)


def draw_now(widget: Any) -> bool:
    """Put a widget's refreshed rows on screen now, as the screen's update timer does at its next
    tick; False, doing nothing, where that tick would do more than repaint widgets (a layout, a
    scroll, a recompose, the whole screen, a batch, an inline app, another screen on top).

    A refresh reaches the screen through three message-pump passes (the widget's idle, the
    screen's Update, the screen's idle) and a wake-up of the timer's task: while a flood scrolls
    the log pane, a tenth of each frame's CPU and most of a millisecond before it is drawn."""
    if not widget._repaint_required:
        return False
    screen = widget.screen
    if not _can_draw_now(widget, widget.app, screen):
        return False
    widget._repaint_required = False
    screen._dirty_widgets.add(widget)
    screen._compositor.update_widgets(screen._dirty_widgets)
    screen._compositor_refresh()  # clears _dirty_widgets: the others dirty now are drawn too
    return True


def _can_draw_now(widget: Any, app: Any, screen: Any) -> bool:
    """Whether the screen's next update would only repaint widgets: no layout, scroll, recompose
    or full repaint pending, no batch, not inline, the widget's screen on top and the widget on it.
    (`app` and `screen` are the widget's: each is a walk up the DOM to look up.)"""
    return not (
        widget._layout_required
        or widget._scroll_required
        or app._batch_count
        or app.is_inline
        or not screen.is_current
        or screen._layout_required
        or screen._scroll_required
        or screen._repaint_required
        or screen._recompose_required
        or widget not in screen._compositor.visible_widgets
    )


def _in_front(compositor: Any, widget: Any, area: Region) -> bool:
    """Whether no visible widget in front of `widget` covers any of `area` (screen cells). Kept
    on the compositor for the layout it was asked of (Textual remakes the mapping on a change):
    the log pane has forty widgets in front of it, and a flood asks forty times a second."""
    widgets = compositor.visible_widgets
    cached = getattr(compositor, "_radixtop_in_front", None)
    if cached is not None and cached[0] is widgets and cached[1] is widget and cached[2] == area:
        return bool(cached[3])
    found = False
    for other, (region, clip) in widgets.items():  # front first
        if other is widget:
            found = True
            break
        if region.intersection(clip).overlaps(area):
            break
    compositor._radixtop_in_front = (widgets, widget, area, found)
    return found


def rows_area(widget: Any, height: int, screen: Any = None) -> Region | None:
    """The screen cells of a widget's first `height` rows, where they are all on screen and no
    widget in front of it covers one; else None. `screen`: the widget's, when looked up already."""
    compositor = (widget.screen if screen is None else screen)._compositor
    region, clip = compositor.visible_widgets[widget]
    area = Region(region.x, region.y, region.width, height)
    if height <= 0 or region.intersection(clip).intersection(area) != area or not _in_front(compositor, widget, area):
        return None
    return area


def rows_text(area: Region, rows: list[str]) -> str:
    """The terminal text that puts `rows` (each a row's styled text, as Strip.render writes it)
    on `area`'s rows, as Textual's update writes them for a repaint of those rows: a cursor move
    and the row's text each."""
    x = area.x + 1
    return "".join(f"\x1b[{area.y + i + 1};{x}H" + row for i, row in enumerate(rows))


def styles_version(widget: Any) -> int:
    """A number that changes whenever one of the widget's styles does, CSS or inline (Textual's
    own key for its caches of a widget's rendering): what was read of the styles is read again
    only then."""
    return int(widget.styles._cache_key)


def style_renderer(console: Any) -> Callable[[Style, str], str]:
    """`styled(style, text)`: the text of a Segment(text, style) as Strip.render writes it for the
    console (its colour system is private to rich)."""
    return partial(Strip.render_style, color_system=console._color_system or ColorSystem.TRUECOLOR)


def paint_rows(widget: Any, height: int, render: Callable[[], list[str]]) -> bool:
    """Write a widget's first `height` rows, `render()` (each row's styled text, exactly the
    widget's width, as Strip.render writes it), to the terminal now, in one write, as Textual's
    screen update would; False, rendering and writing nothing, where that update would do more
    than repaint widgets (draw_now's cases), the app draws to no terminal, or the rows are not all
    on screen in front of everything else.

    Following a flood, each frame of the log pane is a screenful of new rows and nothing else:
    the compositor's general pass (its dirty regions, each screen row's cuts, the rows divided
    and written through three queued writes) was half of such a frame. Textual keeps no copy of
    the screen, so a write of what it would write leaves nothing behind for it to know."""
    app, screen = widget.app, widget.screen
    if (app._driver is None or app.is_headless or not app._running or app._closed
            or not _can_draw_now(widget, app, screen)):
        return False
    area = rows_area(widget, height, screen)
    if area is None:
        return False
    text = rows_text(area, render())
    x, y = screen.outer_size.clamp_offset(app.cursor_position)
    text += f"\x1b[{y + 1};{x + 1}H"  # where Textual leaves the cursor after each update
    app._driver.write(f"{SYNC_START}{text}{SYNC_END}" if app._sync_available else text)
    return True


def normalize_keys(keys: str) -> list[str]:
    """A binding's keys as Textual compares them ("?,q" -> ["question_mark", "q"]): how it reads a
    keymap (textual.keys._normalize_key_list, which App.set_keymap applies), so a user's keymap is
    checked with the names it will be bound by."""
    from textual.keys import _normalize_key_list

    return _normalize_key_list(keys).split(",")
