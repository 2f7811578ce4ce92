"""The status line's layout: what stays when the line is too narrow, and how each part reads."""

from __future__ import annotations

from textual.app import App, ComposeResult

from radixtop.themes import variable_defaults
from radixtop.widgets.statusline import SourceStatus, StatusInfo, StatusLine

DOWN = "since 07:18:56"
CRASH_SOURCES = (
    SourceStatus("server.log", "ok", ""),
    SourceStatus("server", "down", DOWN),
    SourceStatus("r0", "down", DOWN),
    SourceStatus("r1", "down", DOWN),
    SourceStatus("procs", "down", DOWN),
    SourceStatus("gpu", "unavailable", "no NVML"),
)
FIRST = "TP0 07:18:55 radix page lock failed during eviction (server.log:1234)"


class LineApp(App):
    def get_theme_variable_defaults(self) -> dict[str, str]:
        return variable_defaults()

    def compose(self) -> ComposeResult:
        yield StatusLine()


async def _line(info: StatusInfo, width: int) -> str:
    app = LineApp()
    async with app.run_test(size=(width, 3)) as pilot:
        line = app.query_one(StatusLine)
        line.show(info)
        await pilot.pause()
        return line.render_line(0).text


async def test_sources_down_after_a_crash_show_at_80_columns_before_the_first_finding() -> None:
    text = await _line(StatusInfo(total_lines=5000, rate=3.0, sources=CRASH_SOURCES, initiating=FIRST, findings=2), 80)
    assert "server r0 r1 procs DOWN since 07:18:56" in text, text
    assert text.index("DOWN") < text.index("first:"), "the sources in trouble come before the first finding"
    assert len(text.rstrip()) <= 80


async def test_sources_down_at_different_moments_are_said_apart_and_all_fit_at_160() -> None:
    sources = CRASH_SOURCES[:3] + (
        SourceStatus("r1", "down", "since 07:18:58"),
        SourceStatus("procs", "error", "no such pid"),
    )
    text = await _line(StatusInfo(total_lines=5000, rate=3.0, sources=sources, initiating=FIRST, findings=2), 160)
    assert "server r0 DOWN since 07:18:56, r1 DOWN since 07:18:58, procs ERROR (no such pid)" in text, text
    assert "first: TP0 07:18:55" in text


async def test_the_line_count_has_the_right_plural() -> None:
    one = await _line(StatusInfo(total_lines=1, rate=0.0, sources=CRASH_SOURCES[:1]), 80)
    assert "1 line 0/s" in one, one
    many = await _line(StatusInfo(total_lines=1234, rate=0.0, sources=CRASH_SOURCES[:1]), 80)
    assert "1,234 lines 0/s" in many, many


async def test_the_findings_count_is_said_once_with_the_right_plural() -> None:
    hidden = await _line(StatusInfo(findings=1, findings_hidden=True, sources=CRASH_SOURCES[:1]), 80)
    assert "1 finding: Tab" in hidden and hidden.count("finding") == 1, hidden
    shown = await _line(StatusInfo(findings=3, sources=CRASH_SOURCES[:1]), 80)
    assert "3 findings" in shown and shown.count("finding") == 1 and "(s)" not in shown, shown
    with_first = await _line(StatusInfo(findings=3, initiating=FIRST, sources=CRASH_SOURCES[:1]), 120)
    assert "finding" not in with_first.replace("first:", ""), "the first finding is named instead of counted"


async def test_healthy_sources_come_after_the_first_finding_and_go_first_when_narrow() -> None:
    sources = (SourceStatus("server.log", "ok", ""), SourceStatus("server", "ok", ""))
    wide = await _line(StatusInfo(total_lines=10, sources=sources, initiating=FIRST), 160)
    assert wide.index("first:") < wide.index("server ok")
    narrow = await _line(StatusInfo(total_lines=10, sources=sources, initiating=FIRST), 80)
    assert "first: TP0" in narrow and "server ok" not in narrow


async def test_what_the_user_armed_stays_beside_the_first_finding_over_the_counts() -> None:
    sources = (SourceStatus("server.log", "ok", ""), SourceStatus("server", "ok", ""), SourceStatus("r0", "ok", ""),
               SourceStatus("procs", "ok", ""))
    info = StatusInfo(total_lines=1234, rate=2.0, sources=sources, initiating=FIRST, engine="matcher: hyperscan",
                      extra=("crash dump armed",))
    for width in (160, 120):
        text = await _line(info, width)
        assert "first: TP0 07:18:55" in text and "crash dump armed" in text, (width, text)
    narrow = await _line(info, 120)
    assert "server ok" not in narrow and "1,234 lines" not in narrow, narrow  # they gave way to it


async def test_a_long_list_of_sources_in_trouble_leaves_the_first_rank_and_its_time_readable() -> None:
    """Mid-crash every source can be in a different state with its reason: the sources give way
    (cut with …) before the rank that spoke first does."""
    sources = (
        SourceStatus("server", "error", "HTTP 503 Service Unavailable from /health"),
        SourceStatus("r0", "down", "since 07:18:56"),
        SourceStatus("r1", "error", "connection reset by peer while reading the snapshot"),
        SourceStatus("procs", "degraded", "scheduler pid 4242 is a zombie"),
    )
    text = await _line(StatusInfo(total_lines=5000, rate=3.0, sources=sources, initiating=FIRST, findings=2), 120)
    assert "first: TP0 07:18:55" in text, text
    assert "server ERROR" in text and "…" in text.split("first:")[0], "the sources are said, then cut"
    assert len(text.rstrip()) <= 120
