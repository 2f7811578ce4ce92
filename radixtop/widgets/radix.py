"""The radix pane: one rank's prefix tree from the debug endpoint, its pool, its page locks.

Top to bottom: a title (rank selector, the source's health, DOWN with its time), a summary (the
pool: capacity, used, evictable, protected, available; evictions per second; lock counters; the
lock_ref histogram, i.e. page-lock occupancy; the latest lock anomalies with their times; "ranks
disagree" when the ranks' tree digests differ), then the tree. The tree is drawn lazily: only
expanded nodes' children are listed (at most CHILD_PAGE per node until asked for more), and only
the rows on screen are rendered, so a 100,000-node snapshot costs what its visible rows cost.

The app hands in a `RadixBoard` (radixtop.session.radix_board) with `show()`; nothing here does I/O.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Sequence
from itertools import islice
from typing import Any, ClassVar, Protocol

from rich.cells import cell_len, set_cell_size
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Horizontal, Vertical
from textual.geometry import Region, Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.widgets import Static

from radixtop.probes.radix_tree import TreeIndex, discard
from radixtop.session.lock_holders import LockHolders
from radixtop.session.radix_board import SAME_FAILURE_S, RadixBoard, RankView
from radixtop.textsafe import printable_escaped
from radixtop.widgets.fmt import age, bar, clock, count, frozen_banner, rate, update_text
from radixtop.widgets.keys import (
    LOCKED_PATHS,
    TREE_BOTTOM,
    TREE_COLLAPSE,
    TREE_DOWN,
    TREE_EXPAND,
    TREE_NODE,
    TREE_PAGE_DOWN,
    TREE_PAGE_UP,
    TREE_RANK_NEXT,
    TREE_RANK_PREVIOUS,
    TREE_SIDE,
    TREE_TEXT,
    TREE_TOP,
    TREE_UP,
    binding,
)
from radixtop.widgets.radix_node import NodeScreen, node_text
from radixtop.widgets.rows import TextRows

CHILD_PAGE = 200  # children listed per expanded node before a "… N more" row
MAX_ROWS = 50_000  # visible rows at most, however much is expanded
_PREFIX_ROOM = 32  # cells a row keeps for its prefix before it names the requests that used it
_LOCK_BUCKETS = (
    ("<0", -(2**63), -1), ("0", 0, 0), ("1", 1, 1), ("2-3", 2, 3), ("4-7", 4, 7), ("8-15", 8, 15), ("16+", 16, 2**63)
)
_SPARK = "▁▂▃▄▅▆▇█"
_LEGEND = "(* locked, + path to a lock, ! negative lock_ref, » path of the failed operation)"
COLUMNS = f"{'tokens':>7} {'lock':>5} {'hits':>6} {'idle':>6}  node   {_LEGEND}"
COMPACT_COLUMNS = f"{'tokens':>7} {'lock':>5}  node   {_LEGEND}"  # two trees side by side: no hits, no idle

NEEDS_SGLANG = (
    "The radix pane reads SGLang's prefix tree through radixtop's debug endpoint; "
    "vLLM has no such endpoint (its prefix-cache gauges are in the vitals pane)."
)
NO_ENDPOINT = (
    "No debug endpoint. Start SGLang with RADIXTOP_INSTRUMENT=1 (radixtop installed in its "
    "environment), or pass --instrument http://127.0.0.1:PORT for each rank; `radixtop demo` shows one."
)


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _fit_middle(text: str, width: int) -> str:
    """`text` cut in its middle to `width` cells: a note's start says what, its end which folder."""
    if cell_len(text) <= width or width < 8:
        return set_cell_size(text, max(0, width)).rstrip()
    start = width // 2
    tail = text[-(width - start - 1):]
    while cell_len(tail) > width - start - 1:
        tail = tail[1:]
    return set_cell_size(text, start).rstrip() + "…" + tail


class TokenDecoder(Protocol):
    """Token ids -> text (radixtop.probes.tokenizer.TokenText); None where the ids are not its."""

    def decode(self, ids: Sequence[int]) -> str | None: ...


def shape_only(snapshot: Any) -> str:
    """Why a tree's rows carry no token ids (its shape alone is known), or "" when they do."""
    tree = getattr(snapshot, "tree", None)
    if tree is None or len(tree.nodes) <= 1 or any(n.head for n in islice(tree.nodes, 1, 2001)):
        return ""
    detail = getattr(snapshot, "lock_detail", "counts")
    if detail == "locked-only":
        return "shape only: the Rust core's walk carries no token ids"
    if detail == "none":
        return "shape only: these kv-events carry no token ids"
    return "shape only: this tree carries no token ids"


def lock_histogram(hist: dict[int, int]) -> list[tuple[str, int]]:
    return [(label, sum(v for k, v in hist.items() if lo <= k <= hi)) for label, lo, hi in _LOCK_BUCKETS]


def _level(n: int, top: int) -> str:
    if n <= 0 or top <= 0:
        return " "
    return _SPARK[min(len(_SPARK) - 1, int(math.log1p(n) / math.log1p(top) * (len(_SPARK) - 1) + 0.5))]


class RadixTreeView(ScrollView, can_focus=True):
    """The tree, one row per visible node; Enter/→ expands, ← collapses (or goes to the parent)."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "radixtree--locked",
        "radixtree--lockpath",
        "radixtree--negative",
        "radixtree--evicted",
        "radixtree--cursor",
        "radixtree--dim",
        "radixtree--more",
        "radixtree--failed",
    }
    DEFAULT_CSS = """
    RadixTreeView { background: $surface; scrollbar-size-vertical: 1; overflow-x: hidden; }
    RadixTreeView > .radixtree--locked { color: $warning; text-style: bold; }
    RadixTreeView > .radixtree--lockpath { color: $warning; }
    RadixTreeView > .radixtree--negative { color: $error; text-style: bold reverse; }
    RadixTreeView > .radixtree--evicted { color: $text-muted; text-style: italic; }
    RadixTreeView > .radixtree--cursor { background: $primary 30%; }
    RadixTreeView > .radixtree--dim { color: $text-muted; }
    RadixTreeView > .radixtree--more { color: $text-muted; text-style: italic; }
    RadixTreeView > .radixtree--failed { color: $error; text-style: bold underline; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        binding(TREE_UP),
        binding(TREE_DOWN),
        binding(TREE_PAGE_UP),
        binding(TREE_PAGE_DOWN),
        binding(TREE_TOP),
        binding(TREE_BOTTOM),
        binding(TREE_EXPAND),
        binding(TREE_COLLAPSE),
        binding(LOCKED_PATHS),
        binding(TREE_RANK_PREVIOUS),
        binding(TREE_RANK_NEXT),
        binding(TREE_TEXT),
        binding(TREE_NODE),
        binding(TREE_SIDE),
    ]

    class RankRequested(Message):
        def __init__(self, step: int) -> None:
            super().__init__()
            self.step = step

    class SideRequested(Message):
        """The key for two ranks side by side."""

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.compact = False  # no hits or idle columns (two trees side by side)
        self.snapshot: Any = None
        self.index: TreeIndex | None = None
        self.expanded: set[int] = set()  # node keys (ids, or -(row + 1) for id-less rows)
        self.shown: dict[int, int] = {}  # node key -> children listed
        self.rows: list[tuple[int, int, int]] = []  # (row, depth, more): more > 0 is a "… N more" row
        self.cursor = 0
        self.locks_known = True  # False (kv-events): the lock column says "?", never 0
        self._styles: dict[str, Style] = {}
        self._pass: tuple[int, Style] | None = None  # (width, base style) while render_lines runs
        # Prefixes as text (the served model's tokenizer) or as token ids; the key TREE_TEXT flips it.
        self.show_text = True
        self.decoder: TokenDecoder | None = None
        self.text_note = ""  # why there is no decoder ("no tokenizer.json in ..."), from the live sources
        self._shape_note = ""  # why the shown tree has no token ids at all (shape_only)
        self._holders: LockHolders | None = None  # who holds the shown tree's locks, placed once asked
        self.failed: tuple[int, str] | None = None  # (node id, kind) of the operation that failed
        self._failed_rows: dict[int, int] = {}  # the rows from the root to that node -> their depth

    # -- data -------------------------------------------------------------------------------

    def set_tree(self, snapshot: Any, index: TreeIndex | None, *, failed: tuple[int, str] | None = None) -> None:
        """Show `snapshot`; `failed`: (node id, what failed) of the operation a flight record caught,
        whose path is marked and opened, the cursor on it."""
        if snapshot is self.snapshot and index is self.index and failed == self.failed:
            return
        cursor_key = self._cursor_key()
        if self.snapshot is not snapshot:
            discard(self.snapshot)  # a big tree is freed on a worker thread, not here
            discard(self.index)
        self.snapshot, self.index = snapshot, index
        self._holders = None
        self._shape_note = shape_only(snapshot)
        newly_failed = failed is not None and failed != self.failed
        self.failed = failed
        self._failed_rows = self._path_to(failed[0]) if failed is not None else {}
        if newly_failed and self._failed_rows:
            self.expanded.update(self._key(row) for row in self._failed_rows)
            cursor_key = self._key(max(self._failed_rows, key=lambda r: self._failed_rows[r]))
        self._flatten()
        if cursor_key is not None:
            for i, (row, _, more) in enumerate(self.rows):
                if not more and self._key(row) == cursor_key:
                    self.cursor = i
                    break
        self.cursor = min(self.cursor, max(0, len(self.rows) - 1))
        self.refresh()

    @property
    def holders(self) -> LockHolders:
        if self._holders is None:
            self._holders = LockHolders.of(self.snapshot)
        return self._holders

    def _path_to(self, node_id: int) -> dict[int, int]:
        """The rows from the root to the node with `node_id`, each with its depth; {} if not sent."""
        nodes = self._tree_nodes()
        row = next((i for i, n in enumerate(nodes) if n.id == node_id), None)
        path: list[int] = []
        while row is not None and row > 0:
            path.append(row)
            row = nodes[row].parent
        return {r: depth for depth, r in enumerate(reversed(path), 1)}

    def _tree_nodes(self) -> tuple:
        tree = getattr(self.snapshot, "tree", None)
        return tree.nodes if tree is not None else ()

    def _key(self, row: int) -> int:
        nodes = self._tree_nodes()
        nid = nodes[row].id if row < len(nodes) else None
        return nid if nid is not None else -(row + 1)

    def _cursor_key(self) -> int | None:
        if not self.rows or self.cursor >= len(self.rows):
            return None
        row, _, more = self.rows[self.cursor]
        return None if more else self._key(row)

    def _flatten(self) -> None:
        rows: list[tuple[int, int, int]] = []
        index = self.index
        if index is not None and self._tree_nodes():
            kids = index.children
            stack: list[tuple[int, int, int]] = [(0, 0, 0)]
            while stack and len(rows) < MAX_ROWS:
                row, depth, more = stack.pop()
                rows.append((row, depth, more))
                if more:
                    continue
                key = self._key(row)
                if row != 0 and key not in self.expanded:
                    continue
                children = kids[row]
                limit = self.shown.get(key, CHILD_PAGE)
                listed = children[:limit]
                if len(children) > limit:
                    stack.append((row, depth + 1, len(children) - limit))
                for child in reversed(listed):
                    stack.append((child, depth + 1, 0))
        self.rows = rows
        self.virtual_size = Size(self.size.width, len(rows) + self._top())

    def set_text_source(self, decoder: TokenDecoder | None, note: str = "") -> None:
        """The tokenizer rows are decoded with (None: ids), and why there is none (said once,
        above the rows)."""
        if decoder is self.decoder and note == self.text_note:
            return
        self.decoder, self.text_note = decoder, note
        self._flatten()
        self.refresh()

    def note(self) -> str:
        """The line above the rows: why they are not text, when they cannot be; else ""."""
        if self.snapshot is None or not self._tree_nodes():
            return ""
        if self._shape_note:
            return self._shape_note
        if self.show_text and self.decoder is None and self.text_note:
            return f"token ids only: {self.text_note}"
        return ""

    def _top(self) -> int:
        return 1 if self.note() else 0

    # -- actions ----------------------------------------------------------------------------

    def action_move(self, step: int) -> None:
        self._set_cursor(self.cursor + step)

    def action_page(self, step: int) -> None:
        self._set_cursor(self.cursor + step * max(1, self.scrollable_content_region.height - self._top() - 1))

    def action_jump(self, where: int) -> None:
        self._set_cursor(0 if where == 0 else len(self.rows) - 1)

    def _set_cursor(self, cursor: int) -> None:
        self.cursor = max(0, min(cursor, len(self.rows) - 1))
        height = max(1, self.scrollable_content_region.height - self._top())
        top = round(self.scroll_y)
        if self.cursor < top:
            self.scroll_to(y=self.cursor, animate=False, immediate=True)
        elif self.cursor >= top + height:
            self.scroll_to(y=self.cursor - height + 1, animate=False, immediate=True)
        self.refresh()

    def action_expand(self) -> None:
        if not self.rows:
            return
        row, _, more = self.rows[self.cursor]
        key = self._key(row)
        if more:
            self.shown[key] = self.shown.get(key, CHILD_PAGE) + CHILD_PAGE
        elif self.index is not None and self.index.children[row]:
            if key in self.expanded and row != 0:
                self.expanded.discard(key)
            else:
                self.expanded.add(key)
        self._flatten()
        self._set_cursor(self.cursor)

    def action_collapse(self) -> None:
        if not self.rows:
            return
        row, depth, more = self.rows[self.cursor]
        key = self._key(row)
        if not more and key in self.expanded:
            self.expanded.discard(key)
            self._flatten()
            self._set_cursor(self.cursor)
            return
        for i in range(self.cursor - 1, -1, -1):  # to the parent
            if self.rows[i][1] < depth:
                self._set_cursor(i)
                return

    def action_expand_locked(self) -> None:
        """Open every path that leads to a locked (or negative) node."""
        index = self.index
        if index is None:
            return
        nodes = self._tree_nodes()
        for row in range(1, len(nodes)):
            if index.marks[row] and index.children[row] and any(index.marks[c] for c in index.children[row]):
                self.expanded.add(self._key(row))
        self._flatten()
        self._set_cursor(self.cursor)

    def action_rank(self, step: int) -> None:
        self.post_message(self.RankRequested(step))

    def action_side(self) -> None:
        self.post_message(self.SideRequested())

    def action_node(self) -> None:
        """The node under the cursor in a screen of its own (radix_node.py)."""
        if not self.rows or self.snapshot is None:
            return
        row, _, more = self.rows[self.cursor]
        if more:
            return
        self.app.push_screen(NodeScreen(node_text(self, row)))

    def action_toggle_text(self) -> None:
        self.show_text = not self.show_text
        self._flatten()
        self._set_cursor(self.cursor)

    # -- rendering --------------------------------------------------------------------------

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._styles = {}

    def _style(self, name: str) -> Style:
        style = self._styles.get(name)
        if style is None:
            style = self._styles[name] = self.get_component_rich_style(f"radixtree--{name}", partial=True)
        return style

    def on_resize(self) -> None:
        self.virtual_size = Size(self.size.width, len(self.rows) + self._top())

    def render_lines(self, crop: Region) -> list[Strip]:
        # The size and the base style once per pass, not per row: `rich_style` walks every
        # ancestor's background (most of a row's cost).
        self._pass = (self.size.width, self.rich_style)
        try:
            return super().render_lines(crop)
        finally:
            self._pass = None

    def render_line(self, y: int) -> Strip:
        width, base = self._pass or (self.size.width, self.rich_style)
        note = self.note()
        if note:  # said once, above the rows, and kept there while they scroll
            if y == 0:
                line = _fit_middle(note, width - 1)
                # Padded in the pane's style: NO_COLOR's filter needs a style on every segment.
                return Strip([Segment(line, base + self._style("more"))]).crop_extend(0, width, base)
            y -= 1
        i = round(self.scroll_y) + y
        if i >= len(self.rows):
            if i == 0:
                return Strip([Segment("(no tree yet)".ljust(width), base + self._style("dim"))]).crop(0, width)
            return Strip.blank(width, base)
        try:
            strip = self._render_row(i, width)
        except Exception as exc:  # one bad row must not blank the pane
            strip = Strip([Segment(f"(row {i} could not be drawn: {type(exc).__name__})", self._style("dim"))])
        strip = strip.crop_extend(0, width, None).apply_style(base)
        if i == self.cursor and self.has_focus:
            strip = strip.apply_style(self._style("cursor"))
        elif i == self.cursor:
            strip = strip.apply_style(self._style("cursor") + Style(dim=True))
        return strip

    def _render_row(self, i: int, width: int) -> Strip:
        row, depth, more = self.rows[i]
        snap = self.snapshot
        nodes = snap.tree.nodes
        indent = "  " * min(depth, 30)
        gap = "" if self.compact else f" {'':>6} {'':>6}"
        if more:
            text = f"{'':>7} {'':>5}{gap}  {indent}… {more:,} more children (Enter lists {CHILD_PAGE} more)"
            return Strip([Segment(text, self._style("more"))])
        node = nodes[row]
        index = self.index
        mark = index.marks[row] if index is not None else 0
        has_kids = index is not None and bool(index.children[row])
        if row == 0:
            tree = snap.tree
            cut = ""
            if tree.cut_nodes:
                cut = f", {tree.cut_nodes:,}{'' if tree.cut_exact else '~'} more not sent (budget {tree.budget:,})"
            lock = self.lock_text(node, snap)
            text = f"{tree.walked_tokens:>7,} {lock:>5}{gap}  root · {tree.walked_nodes:,} nodes{cut}"
            return Strip([Segment(text, self._style("locked") if node.lock_ref > 0 else None)])
        idle = None
        if node.last_access is not None:
            idle = snap.monotonic - node.last_access
        twisty = ("▾ " if self._key(row) in self.expanded else "▸ ") if has_kids else "  "
        more_kids = ""
        if node.children > len(index.children[row] if index is not None else ()):
            more_kids = f" (+{node.children - len(index.children[row]) if index else node.children} not sent)"
        # A glyph as well as the colour (COLUMNS' legend), so locks read in monochrome (NO_COLOR) too.
        if node.lock_ref < 0:
            glyph = "!"  # negative
        elif node.lock_ref > 0:
            glyph = "*"  # locked
        elif mark & TreeIndex.NEGATIVE:
            glyph = "!"  # on the path to a negative node
        elif mark & TreeIndex.LOCKED:
            glyph = "+"  # on the path to a locked node
        else:
            glyph = " "
        lock = self.lock_text(node, snap)
        stats = "" if self.compact else f" {count(node.hit_count):>6} {age(idle):>6}"
        nums = f"{node.tokens:>7,} {lock:>5}{stats} {glyph}"
        on_failed = row in self._failed_rows
        label = f"{indent}{twisty}{'»' if on_failed else ''}#{node.id if node.id is not None else '?'}"
        held, leaked = self._held(row, node)
        failed_here = ""
        if on_failed and self.failed is not None and node.id == self.failed[0]:
            failed_here = f" ◀ {self.failed[1].replace('_', ' ')} here"
        tail = f"{more_kids}{' evicted' if node.evicted else ''}{held}{failed_here}"
        if not held and (used := self._used(row)):  # where the prefix keeps room to be read
            room = width - cell_len(nums) - cell_len(label) - cell_len(tail) - cell_len(used)
            if room >= _PREFIX_ROOM or not node.head:
                tail += used
        label += self._prefix(node, width - cell_len(nums) - cell_len(label) - cell_len(tail)) + tail
        if on_failed:
            style = self._style("failed")
        elif node.lock_ref < 0 or leaked:
            style = self._style("negative")
        elif node.lock_ref > 0:
            style = self._style("locked")
        elif mark & TreeIndex.NEGATIVE:
            style = self._style("negative")
        elif mark & TreeIndex.LOCKED:
            style = self._style("lockpath")
        elif node.evicted:
            style = self._style("evicted")
        else:
            style = None
        return Strip([Segment(nums, style), Segment(label, style)])

    def _held(self, row: int, node: Any) -> tuple[str, bool]:
        """Who holds the row's lock, where it is a request's deepest locked node: its rid and how
        long (+N more), or that no request holds it (True: flagged), or that the holder is unknown."""
        if node.lock_ref <= 0 or not self.locks_known:
            return "", False
        holders = self.holders
        if not holders.known:
            index = self.index
            tip = index is not None and not any(index.marks[c] & TreeIndex.LOCKED for c in index.children[row])
            return (" held, holder unknown", False) if tip else ("", False)
        if row in holders.leaks:
            n = holders.unheld_locks(self.snapshot, row)
            what = "no request holds it" if n <= 1 or node.lock_ref <= 1 else f"{n} locks no request holds"
            return f" ⚠ {what}", True
        at = holders.deepest.get(row)
        if not at:
            shared = len(holders.held_by.get(row, ()))
            return (f" ⇠ shared by {shared} requests", False) if shared > 1 else ("", False)
        first = at[0]
        more = f" +{len(at) - 1}" if len(at) > 1 else ""
        state = "" if first.state == "running" else f" {first.state}"
        return f" ← {_fit(printable_escaped(first.rid), 24)} {age(first.held_s)}{state}{more}", False

    def _used(self, row: int) -> str:
        """The requests that used the row and let go (the newest first, +N more), where the source
        remembers them: how a node no lock holds says whose prefix it is."""
        used = self.holders.used_by.get(row)
        if not used:
            return ""
        newest = used[0]
        more = f" +{len(used) - 1}" if len(used) > 1 else ""
        return f" ⇠ {_fit(printable_escaped(newest.rid), 12)} {age(newest.released_s)} ago{more}"

    def _prefix(self, node: Any, room: int) -> str:
        """The node's first tokens as text in quotes (its head decoded, escaped, cut to `room`
        cells), else as ids in brackets; "" when the tree has none."""
        head = node.head
        if not head:
            return ""
        goes_on = node.tokens > len(head)
        text = self.decoder.decode(head) if self.show_text and self.decoder is not None else None
        if text is None:  # the first 4 ids; "…" when the node holds more than those
            ids = " ".join(str(t) for t in head[:4])
            return f" [{ids}{' …' if node.tokens > min(4, len(head)) else ''}]"
        text = printable_escaped(text)
        room = max(8, room - 3)  # the space and the quotes
        if cell_len(text) > room or (goes_on and cell_len(text) >= room):
            text, goes_on = set_cell_size(text, room - 1).rstrip(), True
        return f' "{text}{"…" if goes_on else ""}"'

    def lock_text(self, node: Any, snap: Any) -> Any:
        """The lock column: the count, "1+" where only locked-or-not is known (the Rust TreeCore's
        walk), "?" where nothing is (kv-events): never a 0 that was not read."""
        detail = getattr(snap, "lock_detail", "counts")
        if not self.locks_known or detail == "none":
            return "?"
        if detail == "locked-only":
            return "1+" if node.lock_ref > 0 else 0
        return node.lock_ref

    def on_focus(self) -> None:
        self.refresh()

    def on_blur(self) -> None:
        self.refresh()


class RadixPane(Vertical):
    """Title, summary and tree for the selected rank."""

    DEFAULT_CSS = """
    RadixPane { height: 1fr; }
    RadixPane > #radix-title { height: 1; background: $panel; text-style: bold; padding: 0 1; }
    RadixPane > #radix-summary { height: auto; max-height: 9; padding: 0 1; }
    RadixPane > #radix-columns { height: 1; color: $text-muted; padding: 0 1; }
    RadixPane > #radix-trees { height: 1fr; }
    RadixPane RadixTreeView { height: 1fr; padding: 0 1; }
    RadixPane #radix-side { display: none; width: 1fr; border-left: vkey $panel; }
    RadixPane.side-by-side #radix-side { display: block; }
    RadixPane #radix-side-title { height: 1; text-style: bold; padding: 0 1; }
    """

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.selected: str | None = None  # the endpoint URL shown
        self._focus_seen = 0  # the board's focus_seq last turned to
        self._auto: str | None = None  # the view the pane turned to by itself
        self._board: RadixBoard | None = None
        self._note = ""
        self._groups: Any = None
        self._now: float | None = None
        self._from_log: tuple[Any, ...] = ()

    def compose(self) -> ComposeResult:
        yield Static("Radix cache", id="radix-title")
        yield TextRows(id="radix-summary")  # row by row: each snapshot moves a row or two
        yield Static(COLUMNS, id="radix-columns")
        with Horizontal(id="radix-trees"):
            yield RadixTreeView(id="radix-tree")
            with Vertical(id="radix-side"):
                yield Static("", id="radix-side-title")
                yield RadixTreeView(id="radix-side-tree")

    @property
    def tree_view(self) -> RadixTreeView:
        return self.query_one("#radix-tree", RadixTreeView)

    @property
    def side_view(self) -> RadixTreeView:
        return self.query_one("#radix-side-tree", RadixTreeView)

    @property
    def side_by_side(self) -> bool:
        return self.has_class("side-by-side")

    def toggle_side_by_side(self) -> None:
        """This rank and the next beside it, at the moment this one shows (or back to one tree)."""
        self.toggle_class("side-by-side")
        compact = self.side_by_side
        for tree in (self.tree_view, self.side_view):
            tree.compact = compact
            tree.refresh()
        self.query_one("#radix-columns", Static).update(COMPACT_COLUMNS if compact else COLUMNS)
        if self._board is not None:
            self.show(self._board, now=self._now, note=self._note, groups=self._groups)

    def _show_side(self, board: RadixBoard, view: RankView | None) -> None:
        """The next rank (of the same kind of view: a flight record beside a flight record) at
        the shown moment: its newest tree at or before it."""
        title = self.query_one("#radix-side-title", Static)
        side = self.side_view
        others = [v for v in board.ordered() if view is not None and v is not view and v.kind == view.kind]
        times = view.moment_times() if view is not None else []
        if view is None or not others or not times:
            update_text(title, Text("no other rank to show beside this one", style="italic"))
            side.set_tree(None, None)
            return
        after = [v for v in others if (v.rank or 0) > (view.rank or 0)]
        other = (after or others)[0]
        t = times[-1 if view.cursor is None else view.cursor]
        if view.cursor is None:  # live beside live, a failure beside a failure
            other_times = other.moment_times()
            snap, index, when = other.snapshot, other.index, other_times[-1] if other_times else None
        else:
            snap, index, when = other.at_moment(t)
        main = self.tree_view
        side.set_text_source(main.decoder, main.text_note)
        side.show_text = main.show_text
        side.locks_known = other.locks_known
        failed = (other.failed_node, other.failed_op) if other.failed_node is not None else None
        side.set_tree(snap, index, failed=failed)
        if snap is None or when is None:
            update_text(title, Text(f"{other.label}: nothing yet at {clock(t)}", style="italic"))
            return
        gap = f", {age(abs(t - when))} {'before' if when < t else 'after'}" if abs(t - when) >= 0.05 else ""
        update_text(title, Text(f"{other.label} at {clock(when)}{gap} · snapshot #{snap.seq}"))

    def on_resize(self) -> None:
        if self._board is not None:  # the pool bar's width is the pane's
            self.show(self._board, now=self._now, note=self._note, groups=self._groups)

    def show(
        self, board: RadixBoard, *, now: float | None = None, note: str = "", groups: Any = None,
        from_log: Sequence[Any] | None = None,
    ) -> None:
        """Redraw from the board (`note` replaces the summary when there is nothing to show).
        `from_log`: the radix-cache signatures the log reported (tui.panes.LogFinding), listed
        after what the endpoint says: the failure kills its rank before the endpoint is read;
        None keeps the last ones (a resize, a rank key)."""
        self._board, self._note, self._groups, self._now = board, note, groups, now
        if from_log is not None:
            self._from_log = tuple(from_log)
        now = time.time() if now is None else now
        views = board.ordered()
        if board.focus in board.ranks and (board.focus_seq != self._focus_seen or self.selected == self._auto):
            # turned to the failure until the user picks a view: the log may name the first rank later
            self._focus_seen = board.focus_seq
            self.selected = self._auto = self._first_to_fail(board, board.focus)
        if views and (self.selected is None or self.selected not in board.ranks):
            self.selected = views[0].url
        view = board.ranks.get(self.selected) if self.selected else None
        update_text(self.query_one("#radix-title", Static), self._title(views, view, now))
        snap, index = view.shown() if view is not None else (None, None)
        locks_known = view.locks_known if view is not None else True
        if self.tree_view.locks_known != locks_known:
            self.tree_view.locks_known = locks_known
            self.tree_view.refresh()
        failed = None
        if view is not None and view.failed_node is not None:
            failed = (view.failed_node, view.failed_op)
        self.tree_view.set_tree(snap, index, failed=failed)
        if self.side_by_side:
            self._show_side(board, view)
        summary = self._summary(board, view, now, note)
        self._log_lines(summary)
        self.query_one("#radix-summary", TextRows).update(summary)

    def on_radix_tree_view_side_requested(self, event: RadixTreeView.SideRequested) -> None:
        event.stop()
        self.toggle_side_by_side()

    def on_radix_tree_view_rank_requested(self, event: RadixTreeView.RankRequested) -> None:
        event.stop()
        self.select_step(event.step)

    def select_step(self, step: int) -> None:
        board = self._board
        if board is None or not board.ranks:
            return
        urls = [v.url for v in board.ordered()]
        i = urls.index(self.selected) if self.selected in urls else 0
        self.selected = urls[(i + step) % len(urls)]
        self.show(board, now=self._now, note=self._note, groups=self._groups)

    def _first_to_fail(self, board: RadixBoard, focus: str) -> str:
        """Of the views of one failure (each rank's flight record or print), the rank the log
        names first, when it names one: the rank that spoke first, not the first file read."""
        first = min((f for f in self._from_log if f.rank and f.epoch is not None), key=lambda f: f.epoch, default=None)
        m = re.search(r"TP ?(\d+)|rank ?(\d+)", first.rank or "") if first is not None else None
        focused = board.ranks[focus]
        if m is None or focused.snapshot is None:
            return focus
        rank = int(m.group(1) or m.group(2))
        for url, v in board.ranks.items():
            if v.rank == rank and v.kind == focused.kind and v.snapshot is not None and \
                    abs(v.snapshot.time - focused.snapshot.time) <= SAME_FAILURE_S:
                return url
        return focus

    def step_moment(self, step: int) -> None:
        board = self._board
        view = board.ranks.get(self.selected) if board is not None and self.selected else None
        if board is None or view is None:
            return
        view.step(step)
        self.show(board, now=self._now, note=self._note, groups=self._groups)

    def _log_lines(self, out: Text) -> None:
        """One line per radix-cache signature in the log: when it first came, which rank, how often."""
        width = max(40, (self.size.width or 80) - 2)
        for f in sorted(self._from_log, key=lambda f: f.epoch or 0.0):
            when = clock(f.epoch) if f.epoch is not None else "--:--:--"
            times = f" ×{f.count}" if f.count > 1 else ""
            line = f"log {when} {f.rank or ''} {f.title}{times}".replace("  ", " ")
            style = {"warning": "yellow", "info": "dim"}.get(f.severity, "bold red")
            if out.plain and not out.plain.endswith("\n"):
                out.append("\n")
            out.append(_fit(line, width), style=style)

    def _title(self, views: list[RankView], view: RankView | None, now: float) -> Text:
        text = Text("Radix cache ", style="bold")
        for v in views:
            state = v.status.state
            mark = "●" if state == "ok" else ("◐" if state in ("starting", "degraded") else "✕")
            style = "reverse bold" if v is view else ""
            colour = {"ok": "green", "starting": "yellow", "degraded": "yellow"}.get(state, "red")
            text.append(f" {v.label} ", style=style)
            text.append(mark, style=colour)
        if len(views) > 1:
            text.append("  [ ] rank", style="dim")
        if view is not None and not view.status.ok:
            text.append("  ")
            text.append(frozen_banner(view.status.state, view.status.since, view.snapshot_at), style="bold red")
        return text

    def _summary(self, board: RadixBoard, view: RankView | None, now: float, note: str) -> Text:
        out = Text()
        if view is None:
            out.append(note or NO_ENDPOINT, style="italic")
            self._server_alarms(out, board)
            return out
        snap = view.shown()[0]
        if not view.status.ok and view.status.message:
            out.append(view.status.message + "\n", style="red")
        self._moment(out, view)
        if snap is None:
            out.append(note or "waiting for the first snapshot…", style="italic")
            return out
        if view.source:
            self._mirrored(out, view, snap)
            self._server_alarms(out, board)
            return out
        head = (
            f"{_plugin_source(snap)} · {snap.cache_class} · page {snap.page_size or '?'}"
            f" · snapshot #{snap.seq} {age(now - snap.time)} old"
        )
        if snap.hooks_state != "active":
            head += f" · hooks {snap.hooks_state}"
        if not snap.walkable:
            head += f": {snap.reason}"
        elif snap.lock_detail == "locked-only":
            head += " · lock counts, hits and token ids not in the walk (locked: 1+)"
        out.append(head + "\n", style="dim")
        if view.name and view.source_note:  # a flight record: what made the rank write it
            out.append(_fit(view.source_note, max(40, (self.size.width or 80) - 2)) + "\n", style="bold red")
        if view.before is not None and view.cursor is None and snap.holders is None and view.before.holders:
            # Mid-step the scheduler's requests are not read: who held locks is known a step before.
            n = len(view.before.holders)
            out.append(f"lock holders unknown at the failure: {n} request{'s' if n > 1 else ''} held locks at "
                       "the safe point before (,)\n", style="dim")
        if view.failed_node is not None:
            where = "marked »" if self.tree_view._failed_rows else "not among the rows sent"
            what = view.failed_op.replace("_", " ")
            out.append(f"the {what} was on node #{view.failed_node} ({where})\n", style="bold")
        self._pool(out, snap)
        c = snap.counters
        # A rank that is not answering: its last rates are not current, and say so.
        frozen = not view.status.ok
        figure = "dim" if frozen else "bold"
        out.append("evictions ")
        out.append(rate(view.evictions_per_s), style=figure)
        out.append(" · ")
        out.append(f"{rate(view.evicted_tokens_per_s).removesuffix('/s')} tok/s", style=figure)
        if frozen:
            out.append(f" (last, as of {clock(snap.time)})", style="dim")
        out.append(
            f" · total {count(c.evictions)} ({count(c.evicted_tokens)} tok)"
            f" · locks {count(c.lock_ops)}/{count(c.unlock_ops)}\n"
        )
        anomalies = [
            (name, n)
            for name, n in (
                ("lock failures", c.lock_failures),
                ("unlock failures", c.unlock_failures),
                ("evict failures", c.evict_failures),
                ("negative lock_ref", c.negative_lock_ref),
                ("short evicts while locked", c.evict_short_locked),
            )
            if n
        ]
        if anomalies:
            serious = any(name != "short evicts while locked" for name, _ in anomalies)
            text = "lock anomalies: " + " · ".join(f"{name} {count(n)}" for name, n in anomalies)
            out.append(text + "\n", style="bold red" if serious else "yellow")
        census = snap.census
        if census is not None:
            buckets = lock_histogram(census.lock_ref_histogram)
            top = max((n for _, n in buckets), default=0)
            out.append("lock_ref ")
            for label, n in buckets:
                if label == "<0" and not n:
                    continue
                style = "bold red" if label == "<0" else ("yellow" if label not in ("0",) and n else "")
                out.append(f" {label}:", style="dim")
                out.append(_level(n, top), style=style or None)
                out.append(count(n), style=style or None)
            done = "" if census.complete else " (partial census)"
            # The census's age is given relative to its snapshot: the time since then is added.
            out.append(f"  nodes, census {age(census.age_s + max(0.0, now - snap.time))} old{done}\n", style="dim")
        width = max(40, (self.size.width or 80) - 2)
        mine = [a for a in board.anomalies if a.rank is None or a.rank == view.rank or view.rank is None]
        alarms = [a for a in mine if a.kind != "evict_short"][-3:]
        for a in reversed(alarms):
            where = f" node {a.node_id}" if a.node_id is not None else ""
            lr = f" lock_ref {a.lock_ref}" if a.lock_ref is not None else ""
            line = f"! {clock(a.time)} rank {a.rank} {a.kind}{where}{lr} {a.message}".rstrip()
            out.append(_fit(line, width) + "\n", style="bold red")
        short = [a for a in mine if a.kind == "evict_short"]
        if short:
            last = short[-1]
            line = (
                f"~ {clock(last.time)} eviction came up short while pages were locked ({len(short)} seen): "
                f"{last.message}"
            )
            out.append(_fit(line, width) + "\n", style="yellow")
        self._holder_lines(out, snap, width)
        disagree = board.disagreement(self._groups)
        if disagree:
            out.append(disagree + "\n", style="bold yellow")
        if view.events_dropped:
            out.append(
                f"{view.events_dropped:,} events were dropped by the server before radixtop read them\n", style="yellow"
            )
        out.rstrip()
        return out

    def _holder_lines(self, out: Text, snap: Any, width: int) -> None:
        """The requests holding locks, and the locks no request accounts for."""
        holders = self.tree_view.holders
        if not holders.known or not snap.holders and not holders.unheld and not snap.sharers:
            return
        nodes = snap.tree.nodes
        placed = {u.rid for used in holders.used_by.values() for u in used}
        if placed:
            out.append(_fit(f"⇠ names the nodes {len(placed)} earlier request{'s' if len(placed) > 1 else ''} used "
                            "(their locks let go, the nodes still cached; v: a node's)", width) + "\n", style="dim")
        if snap.holders:
            listed = sorted(snap.holders, key=lambda h: -h.held_s)
            text = ", ".join(
                f"{_fit(printable_escaped(h.rid), 24)} {age(h.held_s)} {count(h.prompt_tokens)} tok"
                + ("" if h.state == "running" else f" {h.state}")
                for h in listed[:4]
            )
            more = f" (+{len(listed) - 4})" if len(listed) > 4 else ""
            out.append(_fit(f"locks held by {len(listed)} request{'s' if len(listed) > 1 else ''}: {text}{more}",
                            width) + "\n")
        if holders.leaks:
            where = ", ".join(f"#{nodes[row].id}" for row in holders.leaks[:3])
            out.append(_fit(f"⚠ locked with no request holding it: {where} (leaked, or the cache's own lock)",
                            width) + "\n", style="bold red")
        if holders.overheld:
            where = ", ".join(f"#{nodes[row].id}" for row in holders.overheld[:3])
            out.append(_fit(f"⚠ fewer locks than requests holding them: {where} (a lock released twice?)",
                            width) + "\n", style="bold red")

    def _moment(self, out: Text, view: RankView) -> None:
        """Which moment is shown, when it is not simply the latest snapshot."""
        times = view.moment_times()
        if view.before is not None:
            at_failure = view.cursor is None
            rank = view.rank
            what = f"as rank {rank} failed" if at_failure else f"rank {rank}'s last safe point before it failed"
            other = ", the safe point before" if at_failure else ". the failure"
            when = clock(times[-1 if at_failure else 0])
            out.append(f"{what}, {when} · {other}\n", style="bold" if at_failure else "bold yellow")
        elif view.cursor is not None and len(times) > 1:
            when = clock(times[view.cursor])
            out.append(f"as of {when}, {view.cursor + 1} of {len(times)} kept · , earlier · . later (to live)\n",
                       style="bold yellow")
            width = max(10, min(60, (self.size.width or 80) - 24))
            out.append(f"{clock(times[0])} {time_scale(times, view.cursor, width)} {clock(times[-1])} live\n",
                       style="dim")

    def _server_alarms(self, out: Text, board: RadixBoard) -> None:
        """The alarms no rank's view carries (/metrics' figures while idle), below any view."""
        width = max(40, (self.size.width or 80) - 2)
        for a in [a for a in board.anomalies if a.rank is None][-3:]:
            out.append("\n" + _fit(f"! {clock(a.time)} {a.kind} {a.message}", width), style="bold red")

    def _mirrored(self, out: Text, view: RankView, snap: Any) -> None:
        """A tree rebuilt from another source (kv-events): its name, what it holds and missed, and
        what it cannot see."""
        width = max(40, (self.size.width or 80) - 2)
        out.append(f"source {view.source} · page {snap.page_size or '?'}\n", style="bold")
        out.append(_fit(view.source_note, width) + "\n", style="dim")
        if view.locks_known:  # a print: its lock counts are the server's, its pool figures its error line's
            if snap.available_tokens is not None:
                out.append(
                    f"pool at the failure: available {count(snap.available_tokens)} · evictable "
                    f"{count(snap.evictable_tokens or 0)} · locked {count(snap.protected_tokens or 0)}\n"
                )
            out.append("as printed: no hits, evictions or access times", style="italic")
            return
        out.append(
            "lock counts unknown (shown ?) · pool, evictions and hits unknown: the radixtop instrument shows them",
            style="italic",
        )

    def _pool(self, out: Text, snap: Any) -> None:
        cap = snap.capacity_tokens
        avail, evict, prot = snap.available_tokens, snap.evictable_tokens, snap.protected_tokens
        if not cap:
            out.append("pool size unknown\n", style="dim")
            return
        evict_n = max(0, evict or 0)
        prot_n = max(0, prot or 0)
        busy = max(0, cap - (avail or 0) - evict_n - prot_n)  # held by running requests, not (yet) in the tree
        parts = [
            ("locked", prot, "yellow"), ("running", busy, "cyan"), ("evictable", evict, "blue"), ("free", avail, "bold")
        ]
        legend = " ".join(f"{name} {count(n)}" for name, n, _ in parts)
        head = f"pool {cap:,} "
        width = max(6, min(40, (self.size.width or 80) - 4 - len(head) - len(legend) - 2))
        runs = bar([prot_n / cap, busy / cap, evict_n / cap], width)
        styles = {"█": "yellow", "▓": "cyan", "▒": "blue", "░": "dim"}
        out.append(head)
        for ch, n in runs:
            out.append(ch * n, style=styles.get(ch))
        for name, n, style in parts:
            out.append(f" {name} ", style="dim")
            out.append(count(n), style=style)
        out.append("\n")


def time_scale(times: Sequence[float], cursor: int, width: int) -> str:
    """The moments kept along a line of `width` cells, oldest left: · where one was, ◆ the shown."""
    first, span = times[0], max(1e-9, times[-1] - times[0])
    cells = [" "] * width
    for t in times:
        cells[min(width - 1, int((t - first) / span * (width - 1) + 0.5))] = "·"
    cells[min(width - 1, int((times[cursor] - first) / span * (width - 1) + 0.5))] = "◆"
    return "▕" + "".join(cells) + "▏"


def _plugin_source(snap: Any) -> str:
    """Where a snapshot from radixtop's instrument got its tree."""
    if not snap.walkable:
        return "plugin: sizes only"
    return "plugin: Rust core walk" if snap.lock_detail == "locked-only" else "plugin: tree walk"
