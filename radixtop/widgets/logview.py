"""The live log pane: a Line-API ScrollView over the incident state's ring of entries.

Only the visible rows are ever rendered: each entry's segments once (cached by sequence number),
and each row's finished Strip once per scroll position (cached too, so a frame that moves the
view by a few lines builds only the new rows), so the pane costs the same with 100 lines or
100,000. A row is built as one Strip already cut to the width, with its styles combined once per
style (not a crop, a pad and a restyle per row each frame: those were most of a frame's cost at
50,000 lines/s). The app calls `refresh_view()` when the state changed; nothing here redraws per
line, reads files or blocks.

A row: severity marker (2 cells, readable without colour), the source's short name when several
files are followed, the time of day, the rank, then the message. Lines that matched a signature get
the severity's style on the marker and the matched span and its colour on the whole line.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from itertools import pairwise
from typing import Any, ClassVar, NamedTuple

from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import BindingType
from textual.cache import LRUCache
from textual.geometry import Region, Size
from textual.scroll_view import ScrollView
from textual.scrollbar import ScrollBar, ScrollTo, ScrollUp
from textual.strip import Strip

from radixtop.diagnosis.logline import parse_line
from radixtop.session.incident_state import IncidentState, LogEntry
from radixtop.textsafe import printable
from radixtop.themes import SEVERITY_MARKERS
from radixtop.widgets.keys import LOG_DOWN, LOG_END, LOG_PAGE_DOWN, LOG_PAGE_UP, LOG_TOP, LOG_UP, TO_FINDINGS, binding
from radixtop.widgets.textual_private import draw_now, paint_rows, style_renderer, styles_version, update_scrollbars

_TIME_WIDTH = 12  # "HH:MM:SS.mmm"
_PLAIN_LEAD = "   "  # a plain line's marker column: no severity
_MAX_SOURCE_WIDTH = 16


def time_of_day(written: str | None) -> str:
    """ "2026-12-02 14:00:00.123" -> "14:00:00.123"; other formats as written."""
    if not written:
        return ""
    if len(written) >= 19 and written[4] == "-" and written[10] in " T":
        return written[11:]
    return written


# SGLang's prefix: "[2026-12-02 14:00:00.123 DP0 TP3] ". Checked here first because parse_line
# also parses batch statistics, which display does not need and which cost ten times more.
_SGLANG_PREFIX = re.compile(
    r"\[\d{4}-\d\d-\d\d[ T](\d\d:\d\d:\d\d(?:[.,]\d{1,6})?)((?: [A-Z][A-Z_]*\d+)*)[^\]\[]{0,64}\] ?"
)


def split_prefix(text: str) -> tuple[str, str, int | None]:
    """(time of day, rank, where the message starts) of a log line; offset None without a prefix."""
    m = _SGLANG_PREFIX.match(text)
    if m is not None:
        return m.group(1), m.group(2).strip(), m.end()
    parsed = parse_line(text)  # vLLM, Python logging, process tags ...
    if not parsed.time or not text.endswith(parsed.message):
        return "", parsed.rank or "", None
    return time_of_day(parsed.time), parsed.rank or "", len(text) - len(parsed.message)


class _NoCache:
    """Stands for the caches of a Strip that is drawn once: remembers nothing."""

    __slots__ = ()

    def get(self, key: object, default: None = None) -> None:
        return None

    def __setitem__(self, key: object, value: object) -> None:
        pass

    def clear(self) -> None:
        pass


_NO_CACHE: Any = _NoCache()


class Row(Strip):
    """A row of the pane. Textual's compositor divides each row it draws at the widgets' edges,
    and a Strip divided whole keeps `[self]` in its own divide cache: a reference cycle, so every
    row drawn (a screenful of new ones each frame of a flood) waited, with its seven caches and
    its segments, for the cyclic garbage collector: 14 ms a second of the UI thread at 50,000
    lines/s, in pauses of up to 50 ms. A Row divided whole is returned as it is and kept nowhere:
    refcounting frees it. Nor does it make the seven caches: a row is drawn as it is (already
    cut, styled and filtered), divided whole, and drawn once in a flood, where making them was a
    third of the row's cost."""

    __slots__ = ()

    def __init__(self, segments: Iterable[Segment], cell_length: int | None = None) -> None:
        # Strip.__init__'s attributes, one for one (tests/test_textual_private.py checks them).
        self._segments = list(segments)
        self._cell_length = cell_length
        self._divide_cache = self._crop_cache = self._style_cache = self._filter_cache = _NO_CACHE
        self._line_length_cache = self._crop_extend_cache = self._offsets_cache = _NO_CACHE
        self._render_cache = None
        self._link_ids = None
        self._cell_count = None

    def divide(self, cuts: Iterable[int]) -> Sequence[Strip]:
        cuts = list(cuts)
        if cuts == [self.cell_length]:
            return [self]
        return super().divide(cuts)


class _Frame(NamedTuple):
    scroll_x: int
    scroll_y: int
    width: int
    height: int
    filters: tuple
    background: Any
    base: Style
    plain_box: bool


class LogView(ScrollView, can_focus=True):
    """Scrollable view of the incident state's log entries."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "logview--critical",
        "logview--critical-line",
        "logview--error",
        "logview--error-line",
        "logview--warning",
        "logview--warning-line",
        "logview--info",
        "logview--info-line",
        "logview--notice",
        "logview--message",
        "logview--search",
        "logview--cursor",
        "logview--dim",
    }

    DEFAULT_CSS = """
    LogView {
        background: $surface;
        color: $foreground;
        overflow-x: auto;
        overflow-y: scroll;
        /* No vertical scrollbar drawn: redrawing it took two thirds of each frame while lines
           stream in (Textual renders it line by line). Wheel and keys still scroll; the status
           line says where the view is. */
        scrollbar-size-vertical: 0;
        scrollbar-size-horizontal: 1;
    }
    LogView > .logview--critical { color: $sev-critical; text-style: bold reverse; }
    LogView > .logview--critical-line { color: $sev-critical; text-style: bold; }
    LogView > .logview--error { color: $sev-error; text-style: bold underline; }
    LogView > .logview--error-line { color: $sev-error; }
    LogView > .logview--warning { color: $sev-warning; text-style: underline; }
    LogView > .logview--warning-line { color: $sev-warning; }
    LogView > .logview--info { color: $sev-info; text-style: italic; }
    LogView > .logview--info-line { }
    LogView > .logview--notice { color: $sev-notice; text-style: italic; }
    LogView > .logview--message { color: $foreground; text-style: bold; }
    LogView > .logview--search { color: $background; background: $search-match; text-style: bold; }
    LogView > .logview--cursor { background: $cursor-line; }
    LogView > .logview--dim { color: $log-dim; }
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        binding(TO_FINDINGS),
        binding(LOG_UP),
        binding(LOG_DOWN),
        binding(LOG_TOP),
        binding(LOG_END),
        binding(LOG_PAGE_UP),
        binding(LOG_PAGE_DOWN),
    ]

    def __init__(self, state: IncidentState, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.state = state
        self.follow = True  # keep the newest line in view
        self.cursor_seq: int | None = None  # the line a jump landed on (highlighted)
        # Segments by seq: a few screens of them, for scrolling back and forth (a flood renders
        # each row once; a big cache there would only give the GC more to walk).
        self._cache: LRUCache[int, list[tuple[str, Style | None]]] = LRUCache(512)
        self._rows: dict[int, Strip] = {}  # finished rows by seq, for _rows_key
        self._rows_key: tuple = ()  # (scroll_x, width, base style) the finished rows are for
        self._combined: dict[Style | None, Style] = {}  # segment style -> base + it
        self._layout_key: tuple = ()
        self._rank_width = 0
        self._styles: dict[str, Style] | None = None
        # (base style, background, _plain_styles(), the styles' version they were read at)
        self._look: tuple[Style, Any, bool, int] | None = None
        self._src_width = 0  # width of the source column (0: one source, no column)
        self._anchor: int | None = None  # seq at the top row: keeps the view still as old lines drop
        self._render_failures = 0
        self._frame: _Frame | None = None  # while a frame renders
        self._painting = False  # while a following frame scrolls, before it writes its rows

    # -- styles and cache --------------------------------------------------------------------------

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._styles = None
        self._look = None
        self._cache.clear()
        self._rows.clear()

    def _style(self, name: str) -> Style:
        styles = self._styles
        if styles is None:
            styles = self._styles = {
                cls.removeprefix("logview--"): self.get_component_rich_style(cls, partial=True)
                for cls in self.COMPONENT_CLASSES
            }
        return styles[name]

    def invalidate(self) -> None:
        """Forget every rendered row (search text, theme or layout changed)."""
        self._cache.clear()
        self._rows.clear()
        self._set_virtual_size(Size(self._prefix_width() + min(self.state.max_width, 4096), self.state.view_len))
        self.refresh()

    def _set_virtual_size(self, size: Size) -> None:
        """Grow the scrollable area without a layout pass of the whole screen.

        Assigning `virtual_size` re-lays out every widget, and redraws them, on each new line;
        only this widget's scrollbars depend on it (their appearing still re-lays out).
        """
        old = self.virtual_size
        if size != old:
            self.set_reactive(ScrollView.virtual_size, size)
            if size.width != old.width or not old.height:
                # Only the width decides the horizontal scrollbar (the vertical one has no size):
                # redrawing it for each new line would be wasted.
                update_scrollbars(self, size)

    def _prefix_width(self) -> int:
        source = self._src_width
        return 3 + (source + 1 if source else 0) + _TIME_WIDTH + 1 + (self._rank_width + 1 if self._rank_width else 0)

    def _source_width(self) -> int:
        if self.state.source_count <= 1:
            return 0
        widths = [len(view.label) for view in self.state.sources()]
        return min(max(widths, default=0), _MAX_SOURCE_WIDTH)

    # -- following the state -----------------------------------------------------------------------

    def refresh_view(self) -> None:
        """Bring the view up to date with the state (called on the app's timer, not per line)."""
        state = self.state
        changed = state.folds.changed
        if changed:  # a counted access row grew: its cached text is stale
            for seq in changed:
                self._cache.discard(seq)
                self._rows.pop(seq, None)
            changed.clear()
        self._src_width = self._source_width()
        layout_key = (self._src_width, state.search_text)
        if layout_key != self._layout_key:
            self._layout_key = layout_key
            self._cache.clear()
            self._rows.clear()
        if self.cursor_seq is not None and state.entry(self.cursor_seq) is None:
            self.cursor_seq = None
        self._set_virtual_size(Size(self._prefix_width() + min(state.max_width, 4096), state.view_len))
        if self.follow and self._paint_at_end():
            return
        top = round(self.scroll_y)
        if self.follow:
            self._scroll_to_end()
        elif self._anchor is not None:
            # Old lines left the ring: move up by as many rows so the same lines stay on screen.
            row = state.row_of(self._anchor)
            if row is None:
                row = 0 if self._anchor < state.first_seq else None
            if row is not None and row != round(self.scroll_y):
                self.scroll_to(y=row, animate=False, immediate=True)
        self._anchor = state.view_seq(round(self.scroll_y))
        if round(self.scroll_y) == top:  # a view that moved was redrawn by watch_scroll_y
            self.refresh_rows()
        draw_now(self)  # the new lines are on screen when this returns, not a few loop passes later

    def _paint_at_end(self) -> bool:
        """Following: scroll to the end and draw the rows at once, written past the compositor
        (paint_rows) where it can, else through it (draw_now). False, having done nothing, while
        a whole repaint of the widget waits: that is Textual's to draw."""
        if self._repaint_required:
            return False  # (a scrollbar, a style, a size)
        self._painting = True  # the scroll's watcher leaves the rows to this frame
        try:
            self._scroll_to_end()
        finally:
            self._painting = False
        self._anchor = self.state.view_seq(round(self.scroll_y))
        height = self.scrollable_content_region.height
        if paint_rows(self, height, lambda: self.row_texts(height)):
            return True
        self.refresh_rows()
        draw_now(self)
        return True

    def _scroll_to_end(self) -> None:
        """Following: the last line on the view's last row. Textual's scroll_end stops two
        animations and sets four reactives, each validated and watched (0.4 ms, each frame of a
        flood); following moves scroll_y alone, and its watcher here does what a move needs. An
        animated scroll (a key's) is left to Textual's way."""
        old, end = self.scroll_y, self.max_scroll_y
        if old == end and self.scroll_target_y == end:
            return
        if self.app.animator.is_being_animated(self, "scroll_y"):
            self.scroll_end(animate=False, immediate=True, x_axis=False)
            return
        self.set_reactive(ScrollView.scroll_target_y, end)
        self.set_reactive(ScrollView.scroll_y, end)
        self.watch_scroll_y(old, end)

    def refresh_rows(self) -> None:
        """Redraw the rows, not the horizontal scrollbar under them: new lines leave it as it is,
        and a scrollbar is rendered afresh on each refresh (a tenth of a log frame)."""
        if self._painting:
            return
        self.refresh(Region(0, 0, self.size.width, self.scrollable_content_region.height))

    def keep_following(self) -> None:
        """Back to the last line if a layout change (a scrollbar appearing, a resize) moved it away."""
        if self.follow and round(self.scroll_y) != self.max_scroll_y:
            self.scroll_end(animate=False, immediate=True, x_axis=False)

    def on_resize(self) -> None:
        self._cache.clear()
        self._rows.clear()
        self.call_after_refresh(self.keep_following)

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        # ScrollView's own watcher, but only the rows are redrawn (refresh_rows). The vertical
        # scrollbar has no size (CSS above), so the compositor does not place it; a refresh of a
        # widget it has not placed makes it re-arrange the whole screen at the next frame (2-3 ms
        # a frame, on each new line): its position is then set quietly.
        if self.show_vertical_scrollbar:
            if self.styles.scrollbar_size_vertical:
                self.vertical_scrollbar.position = new_value
            else:
                self.vertical_scrollbar.set_reactive(ScrollBar.position, new_value)
        if round(old_value) != round(new_value):
            self.refresh_rows()
        self._anchor = self.state.view_seq(round(new_value))

    def set_follow(self, follow: bool) -> None:
        self.follow = follow
        if follow:
            self.cursor_seq = None
            self.scroll_end(animate=False, immediate=True, x_axis=False)
            self.refresh()

    def _stop_following(self) -> None:
        self.follow = False

    # -- user scrolling (up stops following; End/G resumes) ----------------------------------------

    def action_scroll_up(self) -> None:
        self._stop_following()
        super().action_scroll_up()

    def action_page_up(self) -> None:
        self._stop_following()
        super().action_page_up()

    def action_scroll_home(self) -> None:
        self._stop_following()
        self.scroll_to(y=0, animate=False, immediate=True)

    def action_scroll_end(self) -> None:
        self.set_follow(True)

    # Public handlers: Textual runs them after its own (which scroll); following stops before the
    # next frame, which is when it would scroll back to the end.

    def on_mouse_scroll_up(self, event: events.MouseScrollUp) -> None:
        if not (event.ctrl or event.shift):
            self._stop_following()

    def on_scroll_up(self, event: ScrollUp) -> None:  # scrollbar click above the thumb
        self._stop_following()

    def on_scroll_to(self, message: ScrollTo) -> None:  # scrollbar drag
        if message.y is not None and message.y < self.max_scroll_y:
            self._stop_following()

    # -- jumping -----------------------------------------------------------------------------------

    def jump_to_row(self, row: int, *, context: int | None = None) -> None:
        """Highlight the entry at `row` and scroll so that lines before it (its context) show too."""
        seq = self.state.view_seq(row)
        if seq is None:
            return
        self.follow = False
        self.cursor_seq = seq
        height = max(1, self.scrollable_content_region.height)
        above = height // 3 if context is None else min(context, height - 1)
        self.scroll_to(y=max(0, row - above), animate=False, immediate=True)
        self._anchor = self.state.view_seq(round(self.scroll_y))
        self.refresh()

    @property
    def position(self) -> tuple[int, int]:
        """(last row on screen, rows in the view), 1-based, for the status line."""
        rows = self.state.view_len
        bottom = min(rows, round(self.scroll_y) + self.scrollable_content_region.height)
        return bottom, rows

    @property
    def cursor_row(self) -> int | None:
        if self.cursor_seq is None:
            return None
        return self.state.row_of(self.cursor_seq)

    def reference_row(self, forward: bool) -> int:
        """Where n/N/e/E start from: the highlighted line, else the screen's edge in that direction."""
        row = self.cursor_row
        if row is not None:
            return row
        top = round(self.scroll_y)
        if forward:
            return top - 1
        return min(self.state.view_len, top + self.scrollable_content_region.height)

    # -- rendering ---------------------------------------------------------------------------------

    def render_lines(self, crop: Region) -> list[Strip]:
        # The scroll offset, size, colours and box, once per frame: looking them up costs more
        # than a row.
        self._frame = frame = self._frame_now()
        try:
            if not frame.plain_box:
                return super().render_lines(crop)  # (its filters again: they are idempotent)
            # Textual's per-line pass (borders, padding, tint, opacity, line filters) has nothing
            # left to do for this widget, yet it copied every row twice per frame: our rows are
            # final (exactly `width` cells, the widget's colours, the filters applied per style).
            strips = [self.render_line(y) for y in crop.line_range]
            x1, x2 = crop.column_span
            if (x1, x2) != (0, frame.width):
                strips = [strip.crop(x1, x2) for strip in strips]
            return strips
        finally:
            self._frame = None

    def row_texts(self, height: int) -> list[str]:
        """The terminal text of the first `height` rows, each the whole width, as Strip.render
        writes each row's Strip: for a frame written past the compositor (paint_rows). A plain
        line's row is written from its pieces and its two styles' codes, with no Strip made
        between (a flood's frame is a screenful of new rows: their Strips were a third of it);
        any other row is its Strip, rendered."""
        console = self.app.console
        self._frame = frame = self._frame_now()
        try:
            if not frame.plain_box or frame.scroll_x or self.state.search_text:
                return [strip.render(console) for strip in self.render_lines(Region(0, 0, frame.width, height))]
            styled = style_renderer(console)
            combined = self._combined
            plain = self._styled(None, frame.base, combined)
            dim = self._styled(self._style("dim"), frame.base, combined)
            lead = styled(plain, _PLAIN_LEAD)
            state, cursor, width = self.state, self.cursor_seq, frame.width
            texts = []
            for y in range(height):
                seq = state.view_seq(frame.scroll_y + y)
                line = state.plain_line(seq) if seq is not None and seq != cursor else None
                pieces = self._plain_pieces(line[0], line[1], width) if line is not None else None
                if pieces is None:
                    texts.append(self.render_line(y).render(console))
                else:
                    texts.append(lead + styled(dim, pieces[0]) + styled(plain, pieces[1]))
            return texts
        finally:
            self._frame = None

    def _frame_now(self) -> _Frame:
        """What every row of a frame needs; the finished rows are dropped when they were made for
        another scroll column, width, style, line filters or background."""
        look = self._look
        styles_key = styles_version(self)
        if look is None or look[3] != styles_key:
            # Walking the ancestors for the style and the background, and reading the box's rules,
            # cost more than a row: once per style change is enough.
            look = self._look = (self.rich_style, self.background_colors[1], self._plain_styles(), styles_key)
        base, background, plain_styles, _ = look
        size = self.size
        scroll_x, scroll_y = self.scroll_offset
        filters = tuple(self.get_line_filters())
        key = (scroll_x, size.width, base, filters, background)
        if key != self._rows_key:
            self._rows_key = key
            self._rows.clear()
            self._combined.clear()
        plain_box = plain_styles and not self.border_title and not self.border_subtitle
        return _Frame(scroll_x, scroll_y, size.width, size.height, filters, background, base, plain_box)

    def _plain_styles(self) -> bool:
        """No border, padding, outline, tint, hatch or opacity: nothing for Textual to add to a row
        (but a border title, which is no style)."""
        styles = self.styles
        return (
            not any(styles.padding)
            and not any(edge for edge, _ in styles.border)
            and not any(edge for edge, _ in styles.outline)
            and not styles.tint.a
            and self.opacity == 1.0
            and styles.text_opacity == 1.0
            and not (styles.has_rule("hatch") and styles.hatch != "none")
        )

    def render_line(self, y: int) -> Strip:
        frame = self._frame or self._frame_now()
        scroll_x, scroll_y, width, height = frame.scroll_x, frame.scroll_y, frame.width, frame.height
        base = frame.base
        seq = self.state.view_seq(scroll_y + y)
        if seq is None:
            return Row.blank(width, self._styled(None, base, self._combined))
        cursor = seq == self.cursor_seq
        if not cursor:
            strip = self._rows.get(seq)
            if strip is None and not scroll_x and not self.state.search_text:
                plain = self.state.plain_line(seq)
                if plain is not None:
                    strip = self._plain_row(plain[0], plain[1], width, base)
                    if strip is not None:
                        self._keep_row(seq, strip, height)
            if strip is not None:
                return strip
        segments = self._cache.get(seq)
        if segments is None:
            entry = self.state.entry(seq)
            if entry is None:
                return Row.blank(width, self._styled(None, base, self._combined))
            try:
                segments = self._render_entry(entry)
            except Exception as exc:  # a line we cannot style is still shown, plainly
                segments = [(printable(entry.text), None)]
                self._render_failures += 1
                if self._render_failures == 1:
                    self.log.error(f"rendering {entry!r} failed: {exc!r}")
            self._cache[seq] = segments
        if cursor:
            return self._row(segments, scroll_x, width, base + self._style("cursor"), {})
        strip = self._row(segments, scroll_x, width, base, self._combined)
        self._keep_row(seq, strip, height)
        return strip

    def _keep_row(self, seq: int, strip: Strip, height: int) -> None:
        rows = self._rows
        if len(rows) >= 4 * max(height, 16):
            rows.clear()  # bounded: rows scrolled away are not asked for again
        rows[seq] = strip

    def _plain_row(self, source: str, text: str, width: int, base: Style) -> Strip | None:
        """The row `_row(_render_entry(...))` makes of a plain line (no signature, no search, not
        scrolled sideways) with SGLang's prefix, in ASCII, made in one pass, cell for cell and
        style for style; None for any other line. Most rows of a busy log are these, and each
        frame of a flood is a screenful of new ones: the general path's pieces, overlays and
        merging were most of such a frame."""
        pieces = self._plain_pieces(source, text, width)
        if pieces is None:
            return None
        plain = self._styled(None, base, self._combined)
        dim = self._styled(self._style("dim"), base, self._combined)
        return Row([Segment(_PLAIN_LEAD, plain), Segment(pieces[0], dim), Segment(pieces[1], plain)], width)

    def _plain_pieces(self, source: str, text: str, width: int) -> tuple[str, str] | None:
        """A plain row's dim part (source, time, rank) and its message cut or padded to the
        width, after the blank marker; None where the line needs the general path."""
        if not (text.isascii() and text.isprintable()):
            return None
        m = _SGLANG_PREFIX.match(text)
        if m is None:
            return None
        rank, rank_width = m.group(2).strip(), self._rank_width
        if len(rank) > rank_width:
            return None  # the general path widens the rank column first
        dim_text = m.group(1)[:_TIME_WIDTH].ljust(_TIME_WIDTH) + " "
        if rank_width:
            dim_text += rank.ljust(rank_width) + " "
        source_width = self._src_width
        if source_width:
            label = self._source_label(source, source_width)
            if not label.isprintable():
                return None
            dim_text = label.ljust(source_width) + " " + dim_text
        room = width - len(_PLAIN_LEAD) - len(dim_text)
        if room <= 0:
            return None
        return dim_text, text[m.end() : m.end() + room].ljust(room)

    def _styled(self, style: Style | None, base: Style, combined: dict) -> Style:
        """base + style, through the app's line filters (NO_COLOR's monochrome, ANSI colours to
        true colour): they map each segment's style on its own, so once per style is enough
        instead of a filtered copy of every row."""
        out = combined.get(style)
        if out is None:
            out = base if style is None else base + style
            frame = self._frame or self._frame_now()
            filters, background = frame.filters, frame.background
            for line_filter in filters:
                out = line_filter.apply([Segment(" ", out)], background)[0].style or out
            combined[style] = out
        return out

    def _row(
        self, segments: list[tuple[str, Style | None]], scroll_x: int, width: int, base: Style, combined: dict
    ) -> Strip:
        """One row as one Strip of exactly `width` cells, its styles on top of `base`."""

        def styled(style: Style | None) -> Style:
            out = combined.get(style)
            return out if out is not None else self._styled(style, base, combined)

        if scroll_x == 0 and all(text.isascii() for text, _ in segments):
            # The usual case, done directly: ASCII (control characters are already replaced) is
            # one cell per character, so cutting and padding are plain slicing.
            # Neighbours of the same style become one segment (the marker and the blank after
            # it, the time and the rank, the message and the padding): fewer segments for Textual
            # to divide, filter and turn into escape codes every frame.
            texts: list[str] = []
            styles: list[Style] = []
            room = width
            for text, style in segments:
                if room <= 0:
                    break
                if len(text) > room:
                    text = text[:room]
                room -= len(text)
                final = styled(style)
                if styles and styles[-1] is final:
                    texts[-1] += text
                else:
                    texts.append(text)
                    styles.append(final)
            if room > 0:
                pad = styled(None)
                if styles and styles[-1] is pad:
                    texts[-1] += " " * room
                else:
                    texts.append(" " * room)
                    styles.append(pad)
            return Row(list(map(Segment, texts, styles)), width)
        strip = Strip([Segment(text, styled(style)) for text, style in segments])
        return strip.crop_extend(scroll_x, scroll_x + width, styled(None))

    def _render_entry(self, entry: LogEntry) -> list[tuple[str, Style | None]]:
        style = self._style
        pieces: list[tuple[str, Style | None]] = []
        overlays: list[tuple[int, int, Style]] = []
        if entry.kind == "message":
            pieces += [("   ", None), (printable(entry.text), style("message"))]
            return self._finish(pieces, overlays)
        if entry.kind == "notice":
            pieces.append((SEVERITY_MARKERS["notice"] + " ", style("notice")))
            self._append_source(pieces, entry.source)
            pieces.append((printable(entry.text), style("notice")))
            return self._finish(pieces, overlays)

        text = printable(entry.text)
        clock, rank, offset = split_prefix(text)
        if len(rank) > self._rank_width:
            self._rank_width = min(len(rank), 24)  # grows, never shrinks: columns stay put
            self.call_later(self.invalidate)  # rows already drawn get the wider column too

        severity = entry.severity
        dim = style("dim")
        pieces += [(SEVERITY_MARKERS.get(severity, "  "), style(severity) if severity else None), (" ", None)]
        self._append_source(pieces, entry.source)
        if offset is None:
            # No prefix we understand (a traceback line, a continuation): indent under messages.
            pieces.append((" " * (_TIME_WIDTH + 1 + (self._rank_width + 1 if self._rank_width else 0)), None))
            message, offset = text, 0
        else:
            message = text[offset:]
            pieces.append((clock[:_TIME_WIDTH].ljust(_TIME_WIDTH) + " ", dim))
            if self._rank_width:
                pieces.append((rank.ljust(self._rank_width) + " ", dim))
        body_start = sum(len(t) for t, _ in pieces)
        pieces.append((message, style(f"{severity}-line") if severity else (dim if entry.kind == "fold" else None)))
        if severity:
            start, end = (entry.span[0] - offset, entry.span[1] - offset) if entry.span else (0, len(message))
            if end > 0 and start < len(message):
                overlays.append((body_start + max(0, start), body_start + min(end, len(message)), style(severity)))
        return self._finish(pieces, overlays)

    def _append_source(self, pieces: list[tuple[str, Style | None]], source: str) -> None:
        source_width = self._src_width
        if source_width:
            pieces.append((self._source_label(source, source_width).ljust(source_width) + " ", self._style("dim")))

    def _source_label(self, source: str, width: int) -> str:
        """The source column's text: the file's label, cut from the left to `width` cells."""
        label = self.state.label(source)
        return label if len(label) <= width else "…" + label[-(width - 1) :]

    def _finish(
        self, pieces: list[tuple[str, Style | None]], overlays: list[tuple[int, int, Style]]
    ) -> list[tuple[str, Style | None]]:
        """(text, style) segments for the pieces, with the overlays (matched span, search hits)
        laid on top. Built by hand: rich's Text costs several times more, and this runs for
        every new line."""
        query = self.state.search_text
        if query:
            plain = "".join(t for t, _ in pieces)
            overlays = overlays + self._matches(plain, query, self._style("search"))
        if not overlays:
            return [(t, s) for t, s in pieces if t]
        cuts = sorted({0, *(a for a, _, _ in overlays), *(b for _, b, _ in overlays)})
        segments = []
        pos = 0
        for text, base in pieces:
            end = pos + len(text)
            points = [pos, *(c for c in cuts if pos < c < end), end]
            for a, b in pairwise(points):
                if a == b:
                    continue
                piece_style = base
                for o_start, o_end, o_style in overlays:
                    if o_start <= a and b <= o_end:
                        piece_style = o_style if piece_style is None else piece_style + o_style
                segments.append((text[a - pos : b - pos], piece_style))
            pos = end
        return segments

    @staticmethod
    def _matches(plain: str, query: str, search_style: Style) -> list[tuple[int, int, Style]]:
        haystack = plain if query != query.lower() else plain.lower()
        out: list[tuple[int, int, Style]] = []
        start = haystack.find(query)
        while start >= 0 and len(out) < 64:
            out.append((start, start + len(query), search_style))
            start = haystack.find(query, start + max(1, len(query)))
        return out
