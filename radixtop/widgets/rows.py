"""A block of Rich text redrawn row by row: only the rows whose text or styles changed.

The live panes' bodies (vital signs, processes) are rebuilt as one Rich Text every redraw, and
most of their rows read the same as before (an idle server: only the clock or a CPU figure
moves). A `Static` re-renders all of it each time, through Textual's Content conversion; this
widget compares row by row, refreshes only the changed rows (a smaller screen update, too) and
makes each row's Strip from the Rich segments directly. Lines longer than the widget wrap, as in
a Static. Nothing here does I/O.
"""

from __future__ import annotations

from typing import Any

from rich.cells import cell_len
from rich.style import Style
from rich.text import Text
from textual.geometry import Region, Size
from textual.strip import Strip
from textual.widget import Widget

from radixtop.textsafe import printable_text


def _key(row: Text) -> tuple:
    return (row.plain, tuple(row.spans), row.style)


class TextRows(Widget):
    DEFAULT_CSS = """
    TextRows { height: auto; }
    """

    def __init__(self, text: Text | str = "", *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._text = Text()
        self._lines: list[Text] = []  # the text's lines
        self._rows: list[Text] = []  # the lines wrapped to the width they were laid out for
        self._keys: list[tuple] = []
        self._where: list[tuple[int, int]] = []
        self._wrapped_for = -1
        self._widest = 0
        self._strips: dict[int, Strip] = {}
        self._pass: tuple[int, Style] | None = None  # (width, base style) while render_lines runs
        if text:
            self._set(Text(text) if isinstance(text, str) else text)

    # -- content ---------------------------------------------------------------------------

    def render(self) -> Text:
        """The whole text (what a Static would hold)."""
        return self._text

    def update(self, text: Text | str) -> None:
        """Show `text`; only rows that changed are redrawn. A change in the number of rows or in
        the widest line re-lays out (the size may depend on them)."""
        old_rows, old_widest = len(self._rows), self._widest
        old_keys = self._keys
        self._set(Text(text) if isinstance(text, str) else text)
        if len(self._rows) != old_rows or self._widest != old_widest or not self.is_mounted:
            self._strips.clear()
            self.refresh(layout=True)
            return
        top = self.styles.gutter.top
        width = self.outer_size.width
        for y, (was, now) in enumerate(zip(old_keys, self._keys, strict=True)):
            if was != now:
                self._strips.pop(y, None)
                self.refresh(Region(0, top + y, width, 1))

    def _set(self, text: Text) -> None:
        # The panes show names from outside (processes' command lines, a server's answers).
        self._text = printable_text(text)
        self._lines = list(text.split("\n", allow_blank=True)) if text.plain else []
        self._widest = max((cell_len(line.plain) for line in self._lines), default=0)
        self._wrap(self._wrapped_for)

    def _wrap(self, width: int) -> None:
        self._wrapped_for = width
        rows: list[Text] = []
        where: list[tuple[int, int]] = []  # (column, line) each row starts at: text selection offsets
        for n, line in enumerate(self._lines):
            if width <= 0 or cell_len(line.plain) <= width:
                rows.append(line)
                where.append((0, n))
                continue
            parts = list(line.wrap(self.app.console, width))
            at = 0
            for i, part in enumerate(parts):
                if i < len(parts) - 1:
                    part.rstrip()  # the space a line breaks at is not drawn (as in a Static)
                at = line.plain.find(part.plain, at) if part.plain else at
                rows.append(part)
                where.append((max(at, 0), n))
                at += len(part.plain)
        self._rows, self._where = rows, where
        self._keys = [(_key(row), w) for row, w in zip(rows, where, strict=True)]

    # -- size --------------------------------------------------------------------------------

    def get_content_width(self, container: Size, viewport: Size) -> int:
        return self._widest

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        if width != self._wrapped_for:
            self._wrap(width)
            self._strips.clear()
        return len(self._rows)

    def on_resize(self) -> None:
        if self.size.width != self._wrapped_for:
            self._wrap(self.size.width)
        self._strips.clear()

    def notify_style_update(self) -> None:
        self._strips.clear()
        super().notify_style_update()

    # -- drawing -----------------------------------------------------------------------------

    def render_lines(self, crop: Region) -> list[Strip]:
        # The size and the base style once per pass, not per row (`rich_style` walks every
        # ancestor's background).
        self._pass = (self.size.width, self.rich_style)
        try:
            return super().render_lines(crop)
        finally:
            self._pass = None

    def render_line(self, y: int) -> Strip:
        width, base = self._pass or (self.size.width, self.rich_style)
        strip = self._strips.get(y)
        if strip is not None and strip.cell_length == width:
            return strip
        if y >= len(self._rows):
            return Strip.blank(width, self.visual_style.rich_style)  # as Textual draws rows past the text
        row: Any = self._rows[y]
        strip = Strip(list(row.render(self.app.console))).apply_offsets(*self._where[y])  # for text selection
        strip = strip.apply_style(base).crop_extend(0, width, Style(bgcolor=base.bgcolor))
        self._strips[y] = strip
        return strip
