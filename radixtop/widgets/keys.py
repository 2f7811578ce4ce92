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
HELP_CLOSE = WidgetKey("help-close", "escape,q,question_mark", "close", "Close",
                       "on the help screen: close it")
RUN_CLOSE = WidgetKey("run-close", "enter", "close_done", "Close",
                      "the confirmation run's screen, once it is done: close it", show=False)
RUN_QUIT = WidgetKey("run-quit", "q", "quit_or_close", "Quit",
                     "the confirmation run's screen: close it when done, else quit (cancelling the run)", show=False)
TO_LOG = WidgetKey("to-log", "tab", "app.toggle_findings", "Log",
                   "in the findings list: back to the log")
EVIDENCE_CLOSE = WidgetKey("evidence-close", "escape,q,d", "dismiss", "Close",
                           "on a finding's evidence: close it")
TO_FINDINGS = WidgetKey("to-findings", "tab", "app.toggle_findings", "Findings",
                        "in the log: to the findings list")
LOG_UP = WidgetKey("log-up", "k", "scroll_up", "Up",
                   "in the log: up a line", show=False)
LOG_DOWN = WidgetKey("log-down", "j", "scroll_down", "Down",
                     "in the log: down a line", show=False)
LOG_TOP = WidgetKey("log-top", "g", "scroll_home", "Top",
                    "in the log: to the first line kept", show=False)
LOG_END = WidgetKey("log-end", "G", "scroll_end", "End (follow)",
                    "in the log: to the newest line, following again", show=False)
LOG_PAGE_UP = WidgetKey("log-page-up", "b", "page_up", "Page up",
                        "in the log: a page up", show=False)
LOG_PAGE_DOWN = WidgetKey("log-page-down", "space", "page_down", "Page down",
                          "in the log: a page down", show=False)
PICKER_CANCEL = WidgetKey("picker-cancel", "escape,q", "cancel", "Cancel",
                          "in the servers list: keep watching the one watched")
QUESTION_YES = WidgetKey("question-yes", "y", "answer(True)", "Yes",
                         "in a yes/no question (following a terminal's output): yes")
QUESTION_NO = WidgetKey("question-no", "n,escape", "answer(False)", "No",
                        "in a yes/no question: no")
TREE_UP = WidgetKey("tree-up", "up,k", "move(-1)", "Up",
                    "in the radix tree: up a row", show=False)
TREE_DOWN = WidgetKey("tree-down", "down,j", "move(1)", "Down",
                      "in the radix tree: down a row", show=False)
TREE_PAGE_UP = WidgetKey("tree-page-up", "pageup", "page(-1)", "Page up",
                         "in the radix tree: a page up", show=False)
TREE_PAGE_DOWN = WidgetKey("tree-page-down", "pagedown", "page(1)", "Page down",
                           "in the radix tree: a page down", show=False)
TREE_TOP = WidgetKey("tree-top", "home", "jump(0)", "Top",
                     "in the radix tree: to the root", show=False)
TREE_BOTTOM = WidgetKey("tree-bottom", "end", "jump(-1)", "Bottom",
                        "in the radix tree: to the last row", show=False)
TREE_EXPAND = WidgetKey("tree-expand", "enter,right,l,space", "expand", "Expand",
                        "in the radix tree: open the node", show=False)
TREE_COLLAPSE = WidgetKey("tree-collapse", "left,h", "collapse", "Collapse",
                          "in the radix tree: close the node, or go to its parent", show=False)
TREE_RANK_PREVIOUS = WidgetKey("tree-rank-previous", "left_square_bracket", "rank(-1)", "Prev rank",
                               "in the radix tree: the previous rank")
TREE_RANK_NEXT = WidgetKey("tree-rank-next", "right_square_bracket", "rank(1)", "Next rank",
                           "in the radix tree: the next rank")
TREE_TEXT = WidgetKey("tree-text", "i", "toggle_text", "Ids/text",
                      "in the radix tree: each node's prefix as text (the served model's tokenizer.json, read from "
                      "this node's disk) or as token ids")
TREE_NODE = WidgetKey("tree-node", "v", "node", "Node",
                      "in the radix tree: the node under the cursor: its path's prefix, its locks and who holds them",
                      show=False)
TREE_SIDE = WidgetKey("tree-side", "w", "side", "Side by side",
                      "in the radix tree: this rank and the next side by side, at the same moment", show=False)
NODE_CLOSE = WidgetKey("node-close", "escape,q,v", "dismiss", "Close", "on a node's details: close them")
FLEET_CLOSE = WidgetKey("fleet-close", "escape,q,F", "dismiss", "Close", "on the fleet view: close it")
WIDGET_KEYS = (APPROVE, REFUSE, CANCEL_RUN, HIDE_RUN, EVIDENCE, LOCKED_PATHS,
               HELP_CLOSE, RUN_CLOSE, RUN_QUIT, TO_LOG,
               EVIDENCE_CLOSE, TO_FINDINGS, LOG_UP, LOG_DOWN,
               LOG_TOP, LOG_END, LOG_PAGE_UP, LOG_PAGE_DOWN,
               PICKER_CANCEL, QUESTION_YES, QUESTION_NO, TREE_UP,
               TREE_DOWN, TREE_PAGE_UP, TREE_PAGE_DOWN, TREE_TOP,
               TREE_BOTTOM, TREE_EXPAND, TREE_COLLAPSE, TREE_RANK_PREVIOUS,
               TREE_RANK_NEXT, TREE_TEXT, TREE_NODE, TREE_SIDE, NODE_CLOSE, FLEET_CLOSE)


def binding(key: WidgetKey) -> Binding:
    return Binding(key.keys, key.action, key.label, show=key.show, id=key.id)
