"""The incident actions on screen: the approval modal, the confirmation run's progress and verdict,
and the one-line action bar. They render what they are given and post what the user chose; the
app (radixtop/tui/actions.py) does the work."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Log, Static

from radixtop.textsafe import printable
from radixtop.widgets.keys import APPROVE, CANCEL_RUN, HIDE_RUN, REFUSE, RUN_CLOSE, RUN_QUIT, binding

MAX_EVENT_LINES = 2_000  # the run's progress lines kept on screen (a long run polls every 5 s)

VERDICT_STYLES = {
    "pressure-dependent": "bold green",
    "persists-under-control": "bold red",
    "not-reproduced": "bold yellow",
    "inconclusive": "bold magenta",
}


class PlanScreen(ModalScreen[bool]):
    """The confirmation run's plan, shown before anything is launched: True when approved.

    A plan that cannot start (``blockers``) offers only Close. A plan that stops the live server
    first (``requires_stop``) is approved only by typing ``stop``: y is not enough for that."""

    DEFAULT_CSS = """
    PlanScreen { align: center middle; }
    PlanScreen > Vertical {
        width: 96%; max-width: 150; height: auto; max-height: 92%;
        border: thick $warning; background: $surface; padding: 0 1;
    }
    PlanScreen #plan-question { text-style: bold; padding: 1 0 0 0; }
    PlanScreen.-blocked #plan-question { color: $error; }
    PlanScreen #plan-body { height: auto; max-height: 30; }
    PlanScreen #plan-buttons { height: 3; align-horizontal: right; }
    PlanScreen Button { margin: 0 0 0 2; }
    PlanScreen #plan-stop { width: 40; margin: 1 0 0 0; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        binding(APPROVE),
        binding(REFUSE),
    ]

    def __init__(self, lines: Sequence[str], *, blockers: Sequence[str] = (), requires_stop: bool = False,
                 question: str | None = None) -> None:
        super().__init__()
        self.lines = list(lines)
        self.blockers = list(blockers)
        self.requires_stop = requires_stop and not self.blockers
        self.question = question  # instead of the confirmation run's

    def _question(self) -> str:
        if self.question is not None and not self.blockers:
            return self.question
        if self.blockers:
            return f"This plan cannot start: {self.blockers[0]}.  n / Esc close"
        if self.requires_stop:
            return "This plan STOPS the live server first. Type stop and Enter to approve · Esc cancel"
        return "Start the servers and replay the workload as planned?  y / Enter approve · n / Esc cancel"

    def compose(self) -> ComposeResult:
        with Vertical(id="plan-box"):
            with VerticalScroll(id="plan-body"):
                yield Static(Text(printable("\n".join(self.lines), block=True), no_wrap=False), id="plan-text")
            yield Static(self._question(), id="plan-question")
            if self.requires_stop:
                yield Input(placeholder="type stop", id="plan-stop")
            with Horizontal(id="plan-buttons"):
                if not self.blockers and not self.requires_stop:
                    yield Button("Approve (y)", id="approve", variant="warning")
                yield Button("Close (n)" if self.blockers else "Cancel (n)", id="cancel", variant="primary")

    def on_mount(self) -> None:
        box = self.query_one("#plan-box")
        box.border_title = "Confirmation run: the plan"
        box.border_subtitle = "nothing is launched until you approve"
        self.set_class(bool(self.blockers), "-blocked")
        if self.requires_stop:
            self.query_one("#plan-stop", Input).focus()
        else:
            self.query_one("#plan-body").focus()  # Enter then approves; Tab reaches the buttons

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.id == "approve")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        if event.value.strip().lower() == "stop":
            self.dismiss(True)
        else:
            self.query_one("#plan-question", Static).update(
                "Type exactly stop to approve stopping the live server · Esc cancel"
            )

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "answer" and parameters and parameters[0] is True and (self.blockers or self.requires_stop):
            return False  # y cannot approve what cannot start, nor stopping the live server
        return True

    def action_answer(self, approved: bool) -> None:
        if approved and (self.blockers or self.requires_stop):
            return
        self.dismiss(approved)


class RunScreen(ModalScreen[None]):
    """The confirmation run as it goes: the phase, each event as a line, then the verdict.

    ``x`` asks the app to cancel (``on_cancel``); Esc hides the screen while the run goes on (the
    app's action bar keeps its phase, and ``c`` shows this again); once done, Esc / q / Enter close.
    """

    DEFAULT_CSS = """
    RunScreen { align: center middle; }
    RunScreen > Vertical {
        width: 96%; max-width: 150; height: 92%;
        border: thick $primary; background: $surface; padding: 0 1;
    }
    RunScreen #run-phase { height: auto; text-style: bold; }
    RunScreen #run-log { height: 1fr; border: none; }
    RunScreen #run-verdict-box { display: none; height: 1fr; border-top: hkey $panel; }
    RunScreen.-done #run-log { height: 6; }
    RunScreen.-done #run-phase { display: none; }  /* the verdict's own first line says it once */
    RunScreen.-done #run-verdict-box { display: block; }
    RunScreen #run-keys { height: 1; color: $text-muted; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        binding(CANCEL_RUN),
        binding(HIDE_RUN),
        binding(RUN_CLOSE),
        binding(RUN_QUIT),
    ]

    def __init__(self, on_cancel: Callable[[], None]) -> None:
        super().__init__()
        self.on_cancel = on_cancel
        self.done = False
        self.cancelling = False
        self.phase = "evidence"
        self._pending: list[str] = []  # lines given before the screen was composed
        self._verdict: Text | None = None
        self._last_line = ""
        self._following = True  # the progress keeps its newest line in view (_log_scrolled)

    def compose(self) -> ComposeResult:
        with Vertical(id="run-box"):
            yield Static("starting…", id="run-phase")
            yield Log(id="run-log", max_lines=MAX_EVENT_LINES, auto_scroll=False)  # _log_scrolled follows
            with VerticalScroll(id="run-verdict-box"):
                yield Static("", id="run-verdict")
            yield Static(self._keys_text(), id="run-keys")

    def on_mount(self) -> None:
        box = self.query_one("#run-box")
        box.border_title = "Confirmation run"
        log = self.query_one("#run-log", Log)
        self.watch(log, "scroll_y", self._log_scrolled, init=False)
        if self._pending:
            log.write_lines(self._pending)
            self._pending = []
        if self._verdict is not None:
            self._show_verdict()

    def _log_scrolled(self, old: float, new: float) -> None:
        # The progress follows its newest line until the reader scrolls away from the end, and
        # again once they are back. Not Log's own rule (at the very end before each line): a
        # horizontal scrollbar that a server's long line brings shrinks the view under it, and
        # the progress stayed where that left it for the rest of the run.
        self._following = round(new) >= self.query_one("#run-log", Log).max_scroll_y

    def _keys_text(self) -> str:
        if self.done:
            return "Esc / q / Enter close · ↑ ↓ scroll the verdict"
        if self.cancelling:
            return "cancelling: stopping the servers it started…"
        return (
            "x cancel the run (the servers it started are stopped) · Esc hide (the run goes on; c shows it again)"
            " · q quit"
        )

    def _refresh_keys(self) -> None:
        if self.is_mounted:
            self.query_one("#run-keys", Static).update(self._keys_text())

    # -- what the app tells it ---------------------------------------------------------------------

    def add_event(self, phase: str, message: str) -> None:
        # A starting server's own lines come through here: text, never markup or escapes.
        phase, message = printable(phase), printable(message)
        line = f"[{phase}] {message}"
        if line == self._last_line:
            return  # the same news twice in a row (a step's end and its phase's) is said once
        self._last_line = line
        self.phase = phase
        if not self.is_mounted:
            self._pending.append(line)
            return
        self.query_one("#run-phase", Static).update(Text(f"phase: {phase} · {message}"[:300]))
        log = self.query_one("#run-log", Log)
        log.write_line(line, scroll_end=False)
        if self._following:
            log.scroll_end(animate=False, x_axis=False)  # after the layout: the end it makes

    def set_cancelling(self) -> None:
        self.cancelling = True
        self._refresh_keys()

    def finish(self, headline: str, body: str, verdict: str | None = None) -> None:
        """The end: a verdict (Verdict.format()'s text), a cancellation or an error."""
        self.done = True
        text = Text(printable(headline) + "\n", style=VERDICT_STYLES.get(verdict or "", "bold"))
        text.append(printable(body, block=True))
        self._verdict = text
        if self.is_mounted:
            self._show_verdict()

    def _show_verdict(self) -> None:
        self.add_class("-done")
        self.query_one("#run-verdict", Static).update(self._verdict or "")
        self._refresh_keys()
        self.query_one("#run-verdict-box").focus()
        log = self.query_one("#run-log", Log)
        self.call_after_refresh(log.scroll_end, animate=False)  # the last events above the verdict

    # -- keys --------------------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return self.done if action == "close_done" else True

    async def action_quit_or_close(self) -> None:
        """q closes the verdict; during the run it is the app's quit, which cancels the run first."""
        if self.done:
            self.dismiss(None)
        else:
            await self.app.run_action("quit")

    def action_cancel_run(self) -> None:
        if not self.done and not self.cancelling:
            self.set_cancelling()
            self.on_cancel()

    def action_close(self) -> None:
        self.dismiss(None)

    def action_close_done(self) -> None:
        if self.done:
            self.dismiss(None)


class ActionBar(Static):
    """One line above the status line: what an incident action is doing, or what it left."""

    # Absolute, one row above the status line (over the log pane's last row): showing it moves no
    # other widget, so it costs no relayout and no full-screen redraw.
    DEFAULT_CSS = """
    ActionBar { position: absolute; offset-y: -1; overlay: screen; height: 1; width: 1fr; background: $panel;
                padding: 0 1; }
    ActionBar.-error { color: $error; text-style: bold; }
    """

    def say(self, text: str, error: bool = False) -> None:
        self.set_class(error, "-error")
        self.update(Text(text, no_wrap=True, overflow="ellipsis"))
        self.display = True

    def clear(self) -> None:
        self.display = False
