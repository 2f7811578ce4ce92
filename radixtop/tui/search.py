"""Search and filter in the log pane: the prompt line they share, n/N, e/E and Esc.

RadixtopApp inherits SearchKeys. The searching itself is session/incident_state.py's (`IncidentState`'s
search and filter indexes); this module takes the text from the prompt, moves the log pane to what
it found and says when nothing was.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.widgets import Input, Label

from radixtop.tui.guard import guarded

if TYPE_CHECKING:
    from textual.app import App

    from radixtop.session.incident_state import IncidentState
    from radixtop.widgets.findings import FindingsList
    from radixtop.widgets.logview import LogView

    _AppBase = App[int]
else:
    _AppBase = object


class SearchKeys(_AppBase):
    """Mixin for RadixtopApp: the prompt's keys and what Enter and Esc do with it."""

    _prompt_mode: str | None = None  # "search" or "filter" while the prompt is open

    if TYPE_CHECKING:  # the app's
        state: IncidentState

        @property
        def log_view(self) -> LogView: ...

        @property
        def findings_list(self) -> FindingsList: ...

        def _tick(self, force: bool = False) -> None: ...

    @guarded("prompt")
    async def action_prompt(self, mode: str) -> None:
        self._prompt_mode = mode
        bar = self.query_one("#prompt-bar")
        label = self.query_one("#prompt-label", Label)
        found = bar.query("#prompt")
        if found:
            prompt = found.first(Input)
        else:
            prompt = Input(id="prompt", compact=True)
            await bar.mount(prompt)
        label.update("Search /" if mode == "search" else "Filter &")
        prompt.placeholder = (
            "text to find (Enter; Esc cancels; n/N next/previous)"
            if mode == "search"
            else "show only lines containing (Enter; Esc cancels)"
        )
        prompt.value = (self.state.search_text if mode == "search" else self.state.filter_text) or ""
        bar.add_class("-visible")
        prompt.focus()

    def _close_prompt(self) -> None:
        self._prompt_mode = None
        self.query_one("#prompt-bar").remove_class("-visible")
        self.log_view.focus()

    @guarded("search/filter input")
    def on_input_submitted(self, event: Input.Submitted) -> None:
        mode, text = self._prompt_mode, event.value
        self._close_prompt()
        if mode == "search":
            self.apply_search(text)
        elif mode == "filter":
            self.apply_filter(text)

    def apply_search(self, text: str) -> None:
        state, view = self.state, self.log_view
        state.set_search(text or None)
        view.invalidate()
        if not text:
            return
        # The nearest match at or above the bottom of the screen: in a live tail, the latest one.
        row = state.find_search(view.reference_row(forward=False), forward=False)
        if row is None:
            self.notify(f"no line in view contains {text!r}", severity="warning")
        else:
            view.jump_to_row(row)
        self._tick(force=True)

    def apply_filter(self, text: str) -> None:
        state, view = self.state, self.log_view
        anchor = view.cursor_seq
        state.set_filter(text or None)
        view.refresh_view()
        row = state.row_of(anchor) if anchor is not None else None
        if row is not None:
            view.jump_to_row(row)
        elif not view.follow:
            view.set_follow(True)
        if text and state.view_len == 0:
            self.notify(f"no line in view contains {text!r} (yet); Esc clears the filter", severity="warning")
        self._tick(force=True)

    @guarded("search")
    def action_search(self, forward: bool) -> None:
        state, view = self.state, self.log_view
        if not state.search_text:
            self.run_worker(self.action_prompt("search"), group="prompt")
            return
        row = state.find_search(view.reference_row(forward), forward)
        if row is None:
            self.notify(f"no line in view contains {state.search_text!r}", severity="warning")
            return
        view.jump_to_row(row)
        self._tick(force=True)

    @guarded("next/previous hit")
    def action_hit(self, forward: bool) -> None:
        view = self.log_view
        row = self.state.find_hit(view.reference_row(forward), forward)
        if row is None:
            self.notify("no line in view matched a failure signature", severity="information")
            return
        view.jump_to_row(row)
        view.focus()
        self._tick(force=True)

    @guarded("clear")
    def action_clear(self) -> None:
        state, view = self.state, self.log_view
        if self._prompt_mode is not None:
            self._close_prompt()
        elif self.focused is self.findings_list:
            self.screen.remove_class("-show-findings")
            view.focus()
        elif state.search_text:
            state.set_search(None)
            view.invalidate()
        elif state.filter_text:
            self.apply_filter("")
        elif view.cursor_seq is not None:
            view.cursor_seq = None
            view.refresh()
        self._tick(force=True)
