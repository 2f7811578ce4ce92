"""The one place radixtop reaches into Textual's private API, each use with the reason.

tests/test_textual_private.py fails when a Textual release changes what is used here, so an
upgrade breaks a test rather than the screen.
"""

from __future__ import annotations

from typing import Any

__all__ = ["normalize_keys", "update_scrollbars"]


def update_scrollbars(widget: Any, virtual_size: Any) -> None:
    """Recompute a scroll view's scrollbars for a new virtual size, without a layout pass.

    The public way, assigning `virtual_size`, re-lays out and redraws the whole screen; the log
    pane grows its virtual size on every new line, so it sets the reactive quietly and asks for
    the scrollbars alone (Widget._scroll_update: visibility, window sizes and a refresh of each)."""
    widget._scroll_update(virtual_size)


def normalize_keys(keys: str) -> list[str]:
    """A binding's keys as Textual compares them ("?,q" -> ["question_mark", "q"]): how it reads a
    keymap (textual.keys._normalize_key_list, which App.set_keymap applies), so a user's keymap is
    checked with the names it will be bound by."""
    from textual.keys import _normalize_key_list

    return _normalize_key_list(keys).split(",")
