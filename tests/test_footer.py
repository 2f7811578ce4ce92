"""The footer shows the keys of what has focus, and is rebuilt only when those keys change."""

from __future__ import annotations

import time
from pathlib import Path

from textual.widgets import Footer
from textual.widgets._footer import FooterKey

from radixtop.tui.app import RadixtopApp
from radixtop.widgets.findings import FindingsList
from radixtop.widgets.footer import KeysFooter


def shown_labels(app: RadixtopApp) -> list[str]:
    return [key.description for key in app.query_one(KeysFooter).query(FooterKey)]


def bound_labels(app: RadixtopApp) -> list[str]:
    """The shown bindings' labels, one per action (the footer shows an action's keys as one)."""
    by_action = {b.binding.action: b.binding.description for b in app.screen.active_bindings.values() if b.binding.show}
    return list(by_action.values())


async def until(pilot, condition, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        await pilot.pause(0.05)


async def test_the_footer_is_rebuilt_when_its_keys_change_and_only_then(tmp_path: Path, monkeypatch) -> None:
    log = tmp_path / "server.log"
    log.write_text("[2026-12-02 14:03:13.281] The server is fired up and ready to roll!\n", encoding="utf-8")
    rebuilt = []
    textual_recompose = Footer.recompose

    async def counted(self: Footer) -> None:
        rebuilt.append(time.monotonic())
        await textual_recompose(self)

    monkeypatch.setattr(Footer, "recompose", counted)
    app = RadixtopApp(log_patterns=[str(log)])
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: shown_labels(app) == bound_labels(app) != [], "the footer's keys")
        assert "Evidence" not in shown_labels(app)  # the log pane has focus
        await pilot.pause(0.3)
        before, widgets = len(rebuilt), list(app.query_one(KeysFooter).query(FooterKey))

        # A bindings signal that changes nothing shown (what a focus move between two panes with
        # the same keys, or the app gaining focus, sends) leaves the key widgets as they are.
        app.screen.refresh_bindings()
        app.log_view.focus()
        await pilot.pause(0.3)
        assert len(rebuilt) == before
        assert list(app.query_one(KeysFooter).query(FooterKey)) == widgets

        # The findings list's keys are others: the footer shows them.
        app.query_one(FindingsList).focus()
        await until(pilot, lambda: "Evidence" in shown_labels(app), "the findings list's Evidence key")
        assert shown_labels(app) == bound_labels(app)
        assert len(rebuilt) == before + 1

        app.log_view.focus()
        await until(pilot, lambda: "Evidence" not in shown_labels(app), "the log pane's keys again")
        assert shown_labels(app) == bound_labels(app)
