"""The footer: Textual's, rebuilt only when the keys it shows change.

Textual's Footer removes and mounts every key widget again at each bindings signal (a focus move,
the app gaining focus, the panes' mount), 12 to 17 ms a time here, three times in the second after
the first screen, though the keys shown were the same.
"""

from __future__ import annotations

from typing import Any

from textual.widgets import Footer

__all__ = ["KeysFooter"]


class KeysFooter(Footer):
    _composed: Any = None  # what the last compose showed (None: nothing yet)

    def _shown(self) -> tuple[Any, ...]:
        """What compose() would show: the shown bindings, each with its state and key display."""
        app = self.app
        keys = tuple(
            (binding, enabled, tooltip, app.get_key_display(binding))
            for (_, binding, enabled, tooltip) in self.screen.active_bindings.values()
            if binding.show
        )
        return keys, self.show_command_palette and app.ENABLE_COMMAND_PALETTE

    async def recompose(self) -> None:
        if not self._bindings_ready or not self.is_attached:
            await super().recompose()
            return
        shown = self._shown()
        if shown == self._composed:
            return
        self._composed = shown
        await super().recompose()
