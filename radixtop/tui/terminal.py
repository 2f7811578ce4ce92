"""The terminal radixtop runs in: drawing on one that cannot take Unicode, and leaving it on a signal.

`fit_terminal` makes Textual's output encodable where the terminal's encoding is ASCII;
`run_until_quit` runs the app with SIGTERM and SIGHUP taking its own quit path, so the terminal is
given back as it was. Both wrap the app from outside, through Textual's public API only (its
private API has one choke point: radixtop/widgets/textual_private.py).
"""

from __future__ import annotations

import asyncio
import codecs
import os
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from textual.app import App

# -- a terminal that cannot take Unicode ----------------------------------------------------------

_ASCII_ERRORS = "radixtop-ascii-cells"
_ASCII_GLYPHS = {"…": ".", "·": ".", "•": "*", "→": ">", "←": "<", "↑": "^", "↓": "v", "▲": "^", "▼": "v",
                 "▶": ">", "◀": "<", "✓": "v", "✗": "x", "×": "x", "—": "-", "–": "-"}


def _ascii_glyph(ch: str) -> str:
    """An ASCII stand-in for a character, as many cells wide as the character itself (Textual
    has placed everything after it by that width)."""
    import unicodedata

    from rich.cells import cell_len

    if ch in _ASCII_GLYPHS:
        return _ASCII_GLYPHS[ch]
    width = cell_len(ch)
    name = unicodedata.name(ch, "")
    if "BOX DRAWINGS" in name or name.endswith(("ONE EIGHTH BLOCK", "ONE QUARTER BLOCK")):
        vertical = "VERTICAL" in name or "LEFT" in name or "RIGHT" in name
        horizontal = "HORIZONTAL" in name or "UPPER" in name or "LOWER" in name
        return "+" if vertical and horizontal else "|" if vertical else "-" if horizontal else "+"
    if "BLOCK" in name or "SHADE" in name:
        return "#" * width
    return "?" * width


def _ascii_cells(exc: UnicodeError) -> tuple[str, int]:
    if not isinstance(exc, UnicodeEncodeError):
        raise exc
    return "".join(_ascii_glyph(ch) for ch in exc.object[exc.start : exc.end]), exc.end


def fit_terminal() -> bool:
    """Textual writes to sys.__stderr__. Where that cannot encode Unicode (an ASCII locale
    without Python's UTF-8 mode, PYTHONIOENCODING=ascii) its default error handler would print
    `\\u2502` for every border cell; instead each character it cannot encode is drawn in ASCII,
    cell for cell (box drawing as + - |, blocks as #, the rest ?). Returns whether it did."""
    stream = sys.__stderr__
    try:
        "\u2502".encode(getattr(stream, "encoding", None) or "ascii")
        return False
    except (UnicodeEncodeError, LookupError):
        pass
    try:
        codecs.lookup_error(_ASCII_ERRORS)
    except LookupError:
        codecs.register_error(_ASCII_ERRORS, _ascii_cells)
    reconfigure = getattr(stream, "reconfigure", None)
    if reconfigure is None:
        return False
    reconfigure(errors=_ASCII_ERRORS)
    return True


# -- SIGTERM and SIGHUP ----------------------------------------------------------------------------

QUIT_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


QUIT_GRACE_S = 5.0  # after SIGTERM or SIGHUP, the quit path's time before the process just ends


def _exit_after(seconds: float, code: int) -> None:
    time.sleep(seconds)
    os._exit(code)


def run_until_quit(app: App[Any]) -> int | None:
    """``app.run()``, except that SIGTERM and SIGHUP take the app's own quit path (what q does:
    bundles cancelled, a confirmation run's control server stopped, the terminal given back with
    the alternate screen, mouse reporting and the cursor as they were) instead of killing the
    process in the middle of the screen. Returns the signal's number when one ended the app."""
    received: list[int] = []

    def handle(signum: int, _frame: Any) -> None:
        received.append(signum)
        try:
            loop = asyncio.get_running_loop()  # the app's: the handler runs on its thread
        except RuntimeError:  # before or after the app: as if no handler were there
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        if len(received) == 1:
            # A hang-up means the terminal is gone, and restoring it can block for ever (Textual's
            # writer waits on a terminal no one reads): the quit path gets QUIT_GRACE_S, then the
            # process ends anyway (the servers it started die with it: PR_SET_PDEATHSIG).
            threading.Thread(target=_exit_after, args=(QUIT_GRACE_S, 128 + signum), name="radixtop-quit-deadline",
                             daemon=True).start()
            loop.call_soon_threadsafe(lambda: loop.create_task(app.run_action("quit")))
        else:  # asked twice: the quit path itself is stuck
            os._exit(128 + signum)

    previous = {sig: signal.signal(sig, handle) for sig in QUIT_SIGNALS}
    try:
        app.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return received[0] if received else None
