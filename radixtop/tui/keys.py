"""The app's keys, written once: the bindings, the help screen and the README's key list all come
from KEYS (tests/test_keys.py holds the README to it), and a user keymap file can move any of them.

A keymap is a TOML file, ``$RADIXTOP_KEYMAP``, else ``$XDG_CONFIG_HOME/radixtop/keymap.toml``
(``~/.config/radixtop/keymap.toml``), mapping a key's id to the keys that run it:

    [keys]
    quit = "ctrl+q"
    bundle = "B"
    confirm = "C"

Textual's own keymap does the rest (``App.set_keymap``: the binding with that id moves). A file
that cannot be used is one notice in the log pane, and the default keys stay; so is one with a
binding that could never run (a key the screen takes first, such as ctrl+c, or one key for two
of the app's bindings).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from textual.binding import Binding
from textual.keys import format_key

from radixtop.bounded import load_toml, read_user_file
from radixtop.widgets.keys import WIDGET_KEYS, WidgetKey
from radixtop.widgets.textual_private import normalize_keys

__all__ = ["EXTRA_HELP", "KEYS", "Key", "bindings", "display", "help_rows", "keymap_path", "load_keymap"]

ENV_KEYMAP = "RADIXTOP_KEYMAP"
MAX_KEYMAP_BYTES = 1 << 20  # a keymap is a few lines


@dataclass(frozen=True)
class Key(WidgetKey):
    """One of the app's own keys (a widget's is a WidgetKey)."""

    priority: bool = False
    key_display: str | None = None  # the footer's way of writing several keys ("1-5")


KEYS: tuple[Key, ...] = (
    Key("quit", "q", "quit", "Quit",
        "quit (a confirmation run in progress is cancelled and its servers stopped first)"),
    Key("help", "question_mark", "help", "Help", "this help (Esc closes)"),
    Key("follow", "f", "toggle_follow", "Follow",
        "follow the newest line on/off (scrolling up also stops following; End or G resumes)"),
    Key("pause", "p", "toggle_pause", "Pause",
        "pause the view: lines are still read, matched and buffered; the status line counts them"),
    Key("search", "slash", "prompt('search')", "Search", "search (smart case: ignores case unless you type a capital)"),
    Key("next-match", "n", "search(True)", "Next match", "next search match", show=False),
    Key("previous-match", "N", "search(False)", "Previous match", "previous search match", show=False),
    Key("filter", "ampersand,backslash", "prompt('filter')", "Filter",
        "filter: show only lines containing the text; Esc clears search, then filter"),
    Key("next-hit", "e", "hit(True)", "Next hit", "next line that matched a failure signature"),
    Key("previous-hit", "E", "hit(False)", "Previous hit",
        "previous line that matched a failure signature", show=False),
    Key("theme", "t", "cycle_theme", "Theme", "next theme: dark, light, high contrast"),
    Key("access-lines", "a", "toggle_access", "Access lines",
        "HTTP access lines (POST /generate ... 503) shown or folded; folded by default into one counted row per "
        "second, so a crash's traceback stays on screen (a line that matched a signature is never folded)",
        show=False),
    # priority: over the log pane's own b (page up)
    Key("bundle", "b", "bundle", "Bundle",
        "evidence bundle now: first occurrences with context, findings, server info, metrics, processes, stacks, "
        "GPU; written (redacted, with a SHA-256 manifest) into the current directory; the first error-or-worse "
        "signature takes one by itself", priority=True),
    Key("confirm", "c", "confirm", "Confirm",
        "confirmation run: evidence first, then the plan (how the server was launched, the arms, their GPUs, the "
        "workload) to approve with y / Enter or refuse with n / Esc; then live progress (x cancels and stops the "
        "servers it started, Esc hides it, c shows it again) and the verdict with the arms side by side"),
    Key("arm-dump", "D", "arm_dump", "Arm crash dump",
        "arm SGLang's crash dump on a live server that has none: after your approval, POST /configure_logging "
        "with only crash_dump_folder (radixtop's private folder), until the server restarts; a crash then keeps "
        "its own requests and c replays them", show=False),
    Key("pane-log", "1", "pane('log')", "Panes",
        "log pane (on a small screen one pane at a time; on a big one, 140x40 and more, all at once and a number "
        "zooms one; the same number again shows all)", key_display="1-5"),
    Key("pane-radix", "2", "pane('radix')", "Radix", "radix tree pane", show=False),
    Key("pane-gpu", "3", "pane('gpu')", "GPU", "GPU pane", show=False),
    Key("pane-procs", "4", "pane('procs')", "Processes", "processes pane", show=False),
    Key("pane-vitals", "5", "pane('vitals')", "Vitals", "vital signs pane", show=False),
    Key("pane-all", "0", "pane('all')", "All panes", "all panes", show=False),
    Key("rank-previous", "left_square_bracket", "rank(-1)", "Previous rank", "previous rank in the radix pane",
        show=False),
    Key("rank-next", "right_square_bracket", "rank(1)", "Next rank", "next rank in the radix pane", show=False),
    Key("moment-earlier", "comma", "moment(-1)", "Earlier",
        "the radix pane one moment earlier: a flight record's last safe point before the failure, or an earlier "
        "snapshot kept", show=False),
    Key("moment-later", "full_stop", "moment(1)", "Later", "the radix pane one moment later (past the last: live)",
        show=False),
    Key("servers", "s", "server", "Servers",
        "the servers on this node (port, model, pid, uptime, log): Enter watches another one", show=False),
    Key("clear", "escape", "clear", "Clear", "clear the search, then the filter", show=False),
    Key("fleet", "F", "fleet", "Fleet",
        "the fleet view (radixtop --prometheus URL): every rank the fleet's Prometheus scrapes, those that stand "
        "out with why, and the command that opens one", show=False),
)

# What the help screen also says: keys of a focused widget, and a flag.
EXTRA_HELP: tuple[tuple[str, str], ...] = (
    ("Tab", "to the findings list and back; Enter jumps to a finding's first line"),
    ("radix tree", "↑ ↓ move, Enter or → expands, ← collapses (or goes to the parent); 2 focuses it"),
    ("↑ ↓ PgUp PgDn Home End", "scroll (also j k Space g G); ← → scroll long lines; mouse wheel works"),
    ("--readonly", "b, c and the automatic bundle are off: radixtop only watches"),
)


def bindings() -> list[Binding]:
    return [
        Binding(k.keys, k.action, k.label, show=k.show, priority=k.priority, key_display=k.key_display, id=k.id)
        for k in KEYS
    ]


def display(keys: str) -> str:
    """ "ampersand,backslash" -> "& or \\"": keys as a person types them."""
    return " or ".join(format_key(name) for name in keys.split(","))


def help_rows(keymap: Mapping[str, str] | None = None) -> list[tuple[str, str, str]]:
    """(keys, what they do, the id a keymap file names it by) for the help screen, with the
    user's keymap applied; "" for the rows that are no binding of the app's."""
    keymap = keymap or {}
    rows = [(display(keymap.get(k.id, k.keys)), k.help, k.id) for k in (*KEYS, *WIDGET_KEYS)]
    return rows + [(keys, what, "") for keys, what in EXTRA_HELP]


def keymap_path() -> Path:
    given = os.environ.get(ENV_KEYMAP)
    if given:
        return Path(given)
    config = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(config) / "radixtop" / "keymap.toml"


def load_keymap(path: Path | None = None) -> tuple[dict[str, str], str | None]:
    """(keymap, a one-line problem or None); a missing file is no keymap and no problem."""
    path = path or keymap_path()
    try:
        data = read_user_file(str(path), MAX_KEYMAP_BYTES)  # a FIFO or a device is refused, never waited on
        doc = load_toml(data, str(path), max_bytes=MAX_KEYMAP_BYTES)
    except FileNotFoundError:
        return {}, None
    except (OSError, ValueError) as exc:  # ValueError: TOML that is malformed, too big or nested too deeply
        return {}, f"{path}: not read ({str(exc).removeprefix(f'{path}: ')}); the default keys are in use"
    table = doc.get("keys")
    if not isinstance(table, dict):
        return {}, f"{path}: no [keys] table; write e.g. [keys] quit = \"ctrl+q\""
    ids = {k.id for k in (*KEYS, *WIDGET_KEYS)}
    unknown = sorted(str(name) for name in table if name not in ids)
    if unknown:
        return {}, f"{path}: unknown key ids {', '.join(unknown)}; use ids from: {', '.join(sorted(ids))}"
    bad = sorted(str(name) for name, value in table.items() if not isinstance(value, str) or not value.strip())
    if bad:
        return {}, f"{path}: {', '.join(bad)} must be keys as text, e.g. \"ctrl+q\" or \"B\""
    keymap = {str(name): value.replace(" ", "") for name, value in table.items()}
    problem = _never_fires(keymap)
    if problem is not None:
        return {}, f"{path}: {problem}; the default keys are in use"
    return keymap, None


def _never_fires(keymap: Mapping[str, str]) -> str | None:
    """Why a binding of `keymap` could never run (one line), or None. A key the screen binds
    itself (ctrl+c copies, tab moves the focus) reaches no app binding, and a key two of the app's
    bindings share runs only one: moving quit to one of those would leave no key that quits."""
    from textual.screen import Screen

    taken = {name: b.description or b.action for b in Screen.BINDINGS if isinstance(b, Binding)
             for name in normalize_keys(b.key)}
    owners: dict[str, list[str]] = {}
    for key in KEYS:
        given = keymap.get(key.id)
        for name in normalize_keys(given if given is not None else key.keys):
            if given is not None and name in taken:
                return (f'{key.id} = "{given}" never runs: the screen takes {name} first ({taken[name]}); '
                        "choose another key")
            owners.setdefault(name, []).append(key.id)
    shared = next(((name, ids) for name, ids in owners.items() if len(ids) > 1), None)
    if shared is not None:
        name, ids = shared
        return f"{name} is bound to {', '.join(ids)}, but only one of them can run; give each its own key"
    return None
