"""One rule for outside text on its way to the terminal (radixtop/textsafe.py), and the
confirmation progress, which shows a starting server's own lines, held to it."""

from __future__ import annotations

import pytest
from textual.app import App
from textual.widgets import Log, Static

from radixtop.textsafe import printable
from radixtop.widgets.confirm import RunScreen

HOSTILE = "a\x1bcb\x1b]2;T\x1b\\c\x9d0;X\x9cd\u202ee\u2066f\x7fg\th"


def test_every_control_and_bidi_character_becomes_one_replacement() -> None:
    out = printable(HOSTILE)
    assert out == "a\ufffdcb\ufffd]2;T\ufffd\\c\ufffd0;X\ufffdd\ufffde\ufffdf\ufffdg h"
    assert len(out) == len(HOSTILE) and out.isprintable()


@pytest.mark.parametrize("text", ["plain line", "日本語のログ", "émigré — ok"])
def test_printable_text_is_returned_as_it_is(text: str) -> None:
    assert printable(text) is text


def test_a_block_keeps_its_newlines_and_nothing_else() -> None:
    assert printable("one\x1b\ntwo\r\n", block=True) == "one\ufffd\ntwo\ufffd\n"
    assert printable("one\ntwo") == "one\ufffdtwo"


async def test_the_run_screen_shows_a_servers_lines_as_text_never_markup_or_escapes() -> None:
    """A starting server's own line with markup, a lone [/] and escapes: shown as written,
    without raising, and the progress goes on."""
    screen = RunScreen(lambda: None)

    class Host(App[None]):
        def on_mount(self) -> None:
            self.push_screen(screen)

    async with Host().run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        hostile = "[@click=app.quit]CLICKQUIT[/] [/] [bold]x \x1bc\x1b]52;c;eA==\x1b\\"
        screen.add_event("control", hostile)
        screen.add_event("control", "healthy")
        await pilot.pause()
        log = screen.query_one("#run-log", Log)
        assert log.lines[-2].startswith(
            "[control] [@click=app.quit]CLICKQUIT[/] [/] [bold]x \ufffdc\ufffd]52"
        ), log.lines
        assert log.lines[-1] == "[control] healthy"
        screen.finish("VERDICT: inconclusive", f"the control said: {hostile}\nsecond line")
        await pilot.pause()
        shown = str(screen.query_one("#run-verdict", Static).render())
        assert "[@click=app.quit]CLICKQUIT[/]" in shown and "\x1b" not in shown and "second line" in shown


def test_a_styled_text_is_made_printable_in_place_with_its_styles_where_they_were() -> None:
    from rich.text import Text

    from radixtop.textsafe import printable_text

    text = Text("log ")
    text.append("a\x1b]2;T\x1b\\b", style="bold")
    text.append("\nnext", style="dim")
    assert printable_text(text) is text
    assert text.plain == "log a\ufffd]2;T\ufffd\\b\nnext"
    assert [(s.start, s.end, s.style) for s in text.spans] == [(4, 13, "bold"), (13, 18, "dim")]
