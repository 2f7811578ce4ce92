"""The keys of the dialogs and panes, written once: each widget binds from here, and the app's
keymap file (radixtop/tui/keys.py) moves them by these ids, as it moves the app's own keys.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual.binding import Binding

__all__ = ["WIDGET_KEYS", "WidgetKey", "binding"]


@dataclass(frozen=True)
class WidgetKey:
    id: str  # the keymap file's name for it
    keys: str  # Textual key names, comma separated
    action: str
    label: str  # in the footer
    help: str  # on the help screen
    show: bool = True


APPROVE = WidgetKey("approve", "y,enter", "answer(True)", "Approve",
                    "in a plan or a question: approve (the confirmation run, arming the crash dump)")
REFUSE = WidgetKey("refuse", "n,escape", "answer(False)", "Cancel", "in a plan or a question: refuse; nothing starts")
CANCEL_RUN = WidgetKey("cancel-run", "x", "cancel_run", "Cancel run",
                       "while a confirmation run runs: cancel it and stop the servers it started")
HIDE_RUN = WidgetKey("hide-run", "escape", "close", "Hide / close",
                     "the confirmation run's screen: hide it while it runs (c shows it again), close it after")
EVIDENCE = WidgetKey("evidence", "d", "details", "Evidence", "in the findings list: the evidence of the finding")
LOCKED_PATHS = WidgetKey("locked-paths", "x", "expand_locked", "Locked paths",
                         "in the radix tree: open every path to a locked node")
WIDGET_KEYS = (APPROVE, REFUSE, CANCEL_RUN, HIDE_RUN, EVIDENCE, LOCKED_PATHS)


def binding(key: WidgetKey) -> Binding:
    return Binding(key.keys, key.action, key.label, show=key.show, id=key.id)
