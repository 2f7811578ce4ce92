"""The one place radixtop reaches into Textual's private API, each use with the reason.

tests/test_textual_private.py fails when a Textual release changes what is used here, so an
upgrade breaks a test rather than the screen.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from textual._compositor import ChopsUpdate, Compositor
from textual.geometry import Region
from textual.strip import Strip

__all__ = ["CroppedCompositor", "draw_now", "normalize_keys", "update_scrollbars"]


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
    app, screen = widget.app, widget.screen
    if (
        not widget._repaint_required
        or widget._layout_required
        or widget._scroll_required
        or app._batch_count
        or app.is_inline
        or not screen.is_current
        or screen._layout_required
        or screen._scroll_required
        or screen._repaint_required
        or screen._recompose_required
        or widget not in screen._compositor.visible_widgets
    ):
        return False
    widget._repaint_required = False
    screen._dirty_widgets.add(widget)
    screen._compositor.update_widgets(screen._dirty_widgets)
    screen._compositor_refresh()  # clears _dirty_widgets: the others dirty now are drawn too
    return True


def normalize_keys(keys: str) -> list[str]:
    """A binding's keys as Textual compares them ("?,q" -> ["question_mark", "q"]): how it reads a
    keymap (textual.keys._normalize_key_list, which App.set_keymap applies), so a user's keymap is
    checked with the names it will be bound by."""
    from textual.keys import _normalize_key_list

    return _normalize_key_list(keys).split(",")
