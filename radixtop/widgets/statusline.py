"""One line under the log pane: mode, the initiating failure, each source's health, throughput.

The app builds a `StatusInfo` from the state on its timer; the widget only lays it out. When the
line is too narrow, the least important parts go first (see `_PRIORITY`), never the mode or a
source in trouble.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import ClassVar

from rich.cells import cell_len
from rich.style import Style
from rich.text import Text
from textual.strip import Strip
from textual.widget import Widget

from radixtop.textsafe import printable_text


@dataclass(frozen=True)
class SourceStatus:
    label: str
    state: str  # ok, waiting, deleted, error, rotated, truncated, capped, lost
    detail: str


@dataclass(frozen=True)
class StatusInfo:
    mode: str = "FOLLOW"  # FOLLOW | SCROLL | PAUSED
    position: tuple[int, int] | None = None  # (last row on screen, rows) when not following
    pending: int = 0  # lines waiting while paused
    total_lines: int = 0
    rate: float | None = None  # lines/s, None when unknown
    sources: tuple[SourceStatus, ...] = ()
    initiating: str | None = None  # e.g. "TP3 radix page lock failed 14:00:01.234"
    findings: int = 0
    findings_hidden: bool = False  # the findings panel is not on screen (narrow terminal)
    filter_text: str | None = None
    filter_rows: int = 0
    search_text: str | None = None
    engine: str = ""
    extra: tuple[str, ...] = field(default_factory=tuple)  # what the user set ("crash dump armed")


_OK_STATES = ("ok",)
_QUIET_STATES = ("unavailable",)  # a source that cannot exist here (no GPU): said, not alarmed
_BAD_STATES = ("error", "deleted", "down")


def _count(n: int) -> str:
    return f"{n:,}"


def _counted(n: int, noun: str) -> str:
    return f"{_count(n)} {noun}{'' if n == 1 else 's'}"


def rate_text(rate: float | None) -> str:
    return "—" if rate is None else f"{rate:,.0f}/s"


def _as_shown(info: StatusInfo) -> StatusInfo:
    """`info` with its figures as the line writes them."""
    return replace(info, rate=None if info.rate is None else round(info.rate))


FIRST_MIN = 24  # cells kept for "first: TP1 07:44:46.704" (rank and time) before sources in trouble are cut


class StatusLine(Widget):
    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "statusline--mode",
        "statusline--paused",
        "statusline--ok",
        "statusline--bad",
        "statusline--warn",
        "statusline--initiating",
        "statusline--dim",
    }
    DEFAULT_CSS = """
    StatusLine { height: 1; background: $panel; color: $foreground; text-wrap: nowrap; text-overflow: ellipsis; }
    StatusLine > .statusline--mode { color: $background; background: $primary; text-style: bold; }
    StatusLine > .statusline--paused { color: $background; background: $sev-warning; text-style: bold reverse; }
    StatusLine > .statusline--ok { color: $success; }
    StatusLine > .statusline--bad { color: $sev-error; text-style: bold; }
    StatusLine > .statusline--warn { color: $sev-warning; text-style: bold; }
    StatusLine > .statusline--initiating { color: $sev-critical; text-style: bold; }
    StatusLine > .statusline--dim { color: $log-dim; }
    """

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.info = StatusInfo()
        self._styles: dict[str, Style] = {}

    def show(self, info: StatusInfo) -> None:
        """Redraw only when what the line says changed: a lines/s figure drifting from 1.43 to
        1.33 reads "1/s" both times (redrawing it cost a screen update several times a second)."""
        if info != self.info:
            shown = _as_shown(info) != _as_shown(self.info)
            self.info = info
            if shown:
                self.refresh()

    def _s(self, name: str) -> Style:
        # Looked up once per theme or style change (each lookup walks the CSS: most of a redraw).
        style = self._styles.get(name)
        if style is None:
            style = self._styles[name] = self.get_component_rich_style(f"statusline--{name}", partial=True)
        return style

    def notify_style_update(self) -> None:
        self._styles.clear()
        super().notify_style_update()

    def parts(self) -> list[tuple[int, Text]]:
        """(priority, text) in display order; lower priority numbers are dropped last."""
        info = self.info
        out: list[tuple[int, Text]] = []
        if info.mode == "PAUSED":
            out.append((0, Text(f" PAUSED +{_count(info.pending)} waiting ", self._s("paused"))))
        else:
            where = ""
            if info.position is not None and info.mode != "FOLLOW":
                bottom, rows = info.position
                where = f" {bottom * 100 // max(rows, 1)}%"
            out.append((0, Text(f" {info.mode}{where} ", self._s("mode"))))
        if info.filter_text:
            out.append((2, Text(f"filter '{info.filter_text}' {_count(info.filter_rows)} rows", self._s("warn"))))
        if info.search_text:
            out.append((3, Text(f"search '{info.search_text}'", self._s("warn"))))
        trouble, calm = self._source_parts(info.sources)
        if trouble is not None:  # before the first finding: a dead server is what to read first
            out.append(trouble)
        # The findings count is said once: with "Tab" when the findings panel is off screen (a
        # narrow terminal), else only when there is no first finding to name.
        said = _counted(info.findings, "finding")
        if info.findings and info.findings_hidden:
            out.append((2, Text(f"{said}: Tab", self._s("warn"))))
        if info.initiating:
            out.append((2, Text(f"first: {info.initiating}", self._s("initiating"))))
        elif info.findings and not info.findings_hidden:
            out.append((3, Text(said, self._s("warn"))))
        if calm is not None:
            out.append(calm)
        # What the user set stays over the counts and the healthy sources: it changes the server.
        for extra in info.extra:
            out.append((3, Text(extra, self._s("warn"))))
        rate = rate_text(info.rate)
        out.append((4, Text(f"{_counted(info.total_lines, 'line')} {rate}", self._s("dim"))))
        if info.engine:
            out.append((6, Text(info.engine, self._s("dim"))))
        return out

    def _source_parts(self, sources: Sequence[SourceStatus]) -> tuple[tuple[int, Text] | None, tuple[int, Text] | None]:
        """(sources in trouble, the others): each None when there are none. Sources in the same
        trouble since the same moment are said together ("server r0 r1 procs DOWN since 07:18:56")
        so that all of them fit in the room of one."""
        if not sources:
            return (1, Text("no log followed (--log PATH)", self._s("warn"))), None
        bad = [s for s in sources if s.state not in _OK_STATES and s.state not in _QUIET_STATES]
        ok = [s for s in sources if s.state in _OK_STATES]
        quiet = [s for s in sources if s.state in _QUIET_STATES]
        trouble = None
        if bad:
            groups: dict[tuple[str, str], list[str]] = {}
            for s in bad:
                groups.setdefault((s.state, s.detail), []).append(s.label)
            text = Text()
            for i, ((state, detail), labels) in enumerate(groups.items()):
                style = self._s("bad") if state in _BAD_STATES else self._s("warn")
                if i:
                    text.append(", ")
                said = f"{' '.join(labels)} {state.upper()}"
                if detail:
                    said += f" {detail}" if detail.startswith("since ") else f" ({detail})"
                text.append(said, style)
            trouble = (1, text)
        text = Text()
        if len(ok) > 3 and bad:
            text.append(f"{len(ok)} sources ok", self._s("ok"))
        else:
            for i, s in enumerate(ok):
                text.append((", " if i else "") + f"{s.label} ok", self._s("ok"))
        for s in quiet:
            if text:
                text.append(", ")
            text.append(f"{s.label} n/a", self._s("dim"))
        # The healthy ones beside sources in trouble say the outage's extent: kept over the line count.
        return trouble, (((4 if bad else 5), text) if text else None)

    def _make_room_for_the_first(self, parts: list[tuple[int, Text]], width: int, sep: int) -> None:
        """Sources in trouble and the first failure both stay, and the line is cut at its end. A
        crash's sources can say a lot (several states, each with why): when they would leave the
        first failure less than FIRST_MIN cells (its rank and time), they give way, down to a
        third of the line."""
        first = next((i for i, (_, t) in enumerate(parts) if t.plain.startswith("first: ")), None)
        trouble = next((i for i, (p, _) in enumerate(parts) if p == 1), None)
        if first is None or trouble is None or trouble > first:
            return
        start = sum(cell_len(t.plain) for _, t in parts[:first]) + sep * first
        wanted = min(cell_len(parts[first][1].plain), FIRST_MIN)
        short = wanted - (width - start)
        if short <= 0:
            return
        text = parts[trouble][1]
        keep = max(width // 3, cell_len(text.plain) - short)
        if keep < cell_len(text.plain):
            cut = text.copy()
            cut.truncate(keep, overflow="ellipsis")
            parts[trouble] = (1, cut)

    def render_line(self, y: int) -> Strip:
        """The line as Rich segments, straight: Textual's way (the Text turned into its Content,
        styles converted span by span, then laid out) cost ten times more, 1 ms and up on every
        change of the line counter, i.e. on each log line while the log is quiet."""
        width = self.size.width
        base = self.rich_style
        if y or width <= 0:
            return Strip.blank(width, base)
        line = self.render()
        line.truncate(width, overflow="ellipsis")
        strip = Strip(list(line.render(self.app.console))).apply_offsets(0, 0)  # offsets: text selection
        return strip.apply_style(base).extend_cell_length(width, Style(bgcolor=base.bgcolor))

    def render(self) -> Text:
        width = self.size.width
        parts = self.parts()
        sep = " │ "
        # Drop the least important parts until the line fits; the mode always stays.
        while len(parts) > 1:
            total = sum(cell_len(t.plain) for _, t in parts) + cell_len(sep) * (len(parts) - 1)
            if total <= width:
                break
            worst = max(range(1, len(parts)), key=lambda i: (parts[i][0], i))
            if parts[worst][0] <= 2:
                break  # the initiating failure and sources in trouble stay; the line is cut instead
            del parts[worst]
        self._make_room_for_the_first(parts, width, cell_len(sep))
        line = Text(no_wrap=True, overflow="ellipsis")
        for i, (_, text) in enumerate(parts):
            if i:
                line.append(sep, self._s("dim"))
            line.append_text(text)
        # Source names come from outside (a process's --log-file, its stdout's target): the whole
        # line through the one rule, character for character, so the spans' styles still fit.
        return printable_text(line)
