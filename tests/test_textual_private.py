"""What radixtop takes from Textual's private API (radixtop/widgets/textual_private.py) still
exists and still does what it is used for; a Textual upgrade that changes it fails here."""

from __future__ import annotations

import inspect

from textual.app import App, ComposeResult
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.widget import Widget

from radixtop.widgets.textual_private import update_scrollbars


def test_widget_scroll_update_takes_a_virtual_size():
    params = list(inspect.signature(Widget._scroll_update).parameters)
    assert params == ["self", "virtual_size"]


class Tall(ScrollView):
    DEFAULT_CSS = "Tall { scrollbar-size-horizontal: 1; overflow-x: auto; }"


async def test_update_scrollbars_sizes_the_horizontal_scrollbar_to_the_virtual_width():
    class Demo(App):
        def compose(self) -> ComposeResult:
            yield Tall()

    async with Demo().run_test(size=(40, 10)) as pilot:
        view = pilot.app.query_one(Tall)
        size = Size(400, 100)
        view.set_reactive(ScrollView.virtual_size, size)  # as the log pane does: no layout pass
        assert view.horizontal_scrollbar.window_virtual_size != 400  # not by itself
        update_scrollbars(view, size)
        assert view.show_horizontal_scrollbar  # at once, not at some later layout
        assert view.horizontal_scrollbar.window_virtual_size == 400


def test_normalize_keys_names_keys_as_a_keymap_binds_them():
    from radixtop.widgets.textual_private import normalize_keys

    assert normalize_keys("?,q,ctrl+c") == ["question_mark", "q", "ctrl+c"]
    assert normalize_keys("&") == ["ampersand"]
