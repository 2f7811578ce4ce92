"""The radix tree SGLang prints itself when it fails, read back from its log.

On an allocation failure (`Prefill out of memory`, `Decode out of memory`, `Out of memory`) and on
a failed sanity check of the unified tree, SGLang logs the error and then `print`s its whole tree
to stdout: on a server without radixtop's instrument, the only picture of the cache at the failure.
Two forms (sglang 0.5.23, read from its wheel):

- legacy `RadixCache._print_helper`: ``print(" " * indent, len(key), key.token_ids[:10],
  f"r={lock_ref}")``, children two spaces deeper, then ``#tokens: N``; the ids print as a list,
  a list of tuples (bigram keys) or ``array('q', [...])``.
- `UnifiedTreeCore.pretty_print` (the Python core and the Rust core alike): ``print(" " * indent,
  f"[{id}]", len(key), f"full_lock={lock}", "full=yes swa=no ...")``, with no total line.

`print` puts a space after the leading "", so a row at depth d starts with 2d + 1 spaces. The rows
carry no time and no rank, and stdout is often block-buffered into the file the log lines go to:
they may come long after the error line, between other lines, or split by another rank's rows.
`PrintedTreeReader` takes the lines of one file in order and keeps the rows whose depth fits the
tree so far (the others are counted, never guessed at); the last error line before the rows gives
the tree its rank, time and pool figures.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cache
from typing import Literal

from radixtop.diagnosis.logline import parse_line, strip_ansi
from radixtop.diagnosis.matcher import Matcher
from radixtop.diagnosis.needles import (
    PRINTED_TREE_NEEDLES,
    TREE_POOL_NEEDLES,
    TREE_ROW_NEEDLES,
    TREE_TOTAL_NEEDLE,
    TREE_TRIGGER_NEEDLES,
)
from radixtop.schema import MAX_HEAD_TOKENS, Branch, Snapshot, heaviest_first, rebuilt_snapshot

TreeForm = Literal["radix-cache", "unified"]

# Cheap tests a whole batch passes before any line is looked at (a flood has none of them).
NEEDLES = PRINTED_TREE_NEEDLES
_ROWS = frozenset(TREE_ROW_NEEDLES)
_TRIGGERS = frozenset(TREE_TRIGGER_NEEDLES)
_POOL = frozenset(TREE_POOL_NEEDLES)

_LEGACY = re.compile(r"( +)(\d+) (?:array\('\w'(?:, \[(.*)\])?\)|\[(.*)\]) r=(-?\d+)")
_UNIFIED = re.compile(r"( +)\[(\d+)\] (\d+) full_lock=(-?\d+)((?: \w+=(?:yes|no))*)")
_TOTAL_LINE = re.compile(r"#tokens: (\d+)")
_TRIGGER = re.compile(
    r"(?:Prefill|Decode) out of memory|Out of memory\. Try to lower|Sanity check FAILED \(\d+ violations"
)
_REQUESTED = re.compile(r"Try to allocate (\d+) tokens")
_AVAILABLE = re.compile(r"\((?:full_)?available_size=(\d+) \+ (?:full_)?evictable_size_?=(\d+)\)")
_RANK_NUMBER = re.compile(r"TP ?(\d+)|rank ?(\d+)", re.IGNORECASE)
_INT = re.compile(r"-?\d+")
_TUPLE_HEAD = re.compile(r"\((-?\d+)")

QUIET_LINES = 200  # this many lines without a row after the last one: the tree is over
MAX_ROWS = 200_000  # rows kept per tree; a print of a bigger tree is cut, and says so
TRIGGER_TEXT_MAX = 200


@dataclass(frozen=True, slots=True)
class PrintedNode:
    depth: int  # 0: the root
    tokens: int  # len(key)
    lock_ref: int
    node_id: int | None  # the unified tree's node id; the legacy print has none
    head: tuple[int, ...]  # the first token ids (legacy: at most 10)
    components: tuple[tuple[str, bool], ...]  # unified: each component and whether it holds a value


@dataclass(frozen=True, slots=True)
class PrintTrigger:
    """The error line SGLang logged before printing its tree."""

    text: str  # its message, cut to TRIGGER_TEXT_MAX
    rank: str | None
    epoch: float | None
    line: int  # its line number among the lines read
    requested: int | None = None  # "Try to allocate N tokens"
    available: int | None = None  # available_size=
    evictable: int | None = None  # evictable_size=


@dataclass(frozen=True, slots=True)
class PrintedTree:
    form: TreeForm
    nodes: tuple[PrintedNode, ...]  # the root first, then as printed (depth-first)
    first_line: int  # line numbers among the lines read, 1-based
    last_line: int
    total_tokens: int | None = None  # the legacy print's "#tokens: N"
    skipped_rows: int = 0  # rows whose depth did not fit the tree (interleaved or split lines)
    cut_rows: int = 0  # rows past MAX_ROWS
    complete: bool = False  # ended by its total line, by a next tree, or by QUIET_LINES other lines
    trigger: PrintTrigger | None = None

    @property
    def rank_number(self) -> int:
        """The printing rank's number, from its error line's rank ("TP3", "DP0 TP3", "rank3"); 0 unknown."""
        m = _RANK_NUMBER.search(self.trigger.rank or "") if self.trigger is not None else None
        return int(m.group(1) or m.group(2)) if m is not None else 0

    @property
    def tokens(self) -> int:
        return sum(n.tokens for n in self.nodes)

    @property
    def locked_tokens(self) -> int:
        return sum(n.tokens for n in self.nodes[1:] if n.lock_ref > 0)

    @property
    def inverted_locks(self) -> int:
        """Nodes locked less than one of their children: a lock walks from its node to the root,
        so a parent holds every lock its children hold, unless a lock was released twice (the root
        is never counted: its lock_ref stays 1)."""
        inverted = 0
        stack: list[PrintedNode] = []
        flagged: set[int] = set()
        for node in self.nodes:
            del stack[node.depth:]
            parent = stack[-1] if len(stack) > 1 else None
            if parent is not None and parent.lock_ref < node.lock_ref and id(parent) not in flagged:
                flagged.add(id(parent))
                inverted += 1
            stack.append(node)
        return inverted

    def describe(self) -> str:
        """One line: what was printed, on what, and how much of it was read."""
        form = "RadixCache print" if self.form == "radix-cache" else "unified tree print"
        why = f" after {self.trigger.text!r}" if self.trigger is not None else ""
        parts = [f"{form}{why}", f"{len(self.nodes) - 1:,} nodes", f"{self.tokens:,} tokens",
                 f"{self.locked_tokens:,} locked"]
        inverted = self.inverted_locks
        if inverted:  # first: the finding the print itself holds
            parts.insert(0, f"{inverted:,} node(s) locked less than a child (a lock released twice)")
        if self.total_tokens is not None and self.total_tokens != self.tokens:
            parts.append(f"#tokens says {self.total_tokens:,}")
        if self.skipped_rows:
            parts.append(f"{self.skipped_rows:,} rows out of place (skipped)")
        if self.cut_rows:
            parts.append(f"{self.cut_rows:,} rows past {MAX_ROWS:,} not kept")
        if self.form == "radix-cache":
            if not self.complete:
                parts.append("no #tokens line yet")
            parts.append("first 10 token ids per node")
        return " · ".join(parts)


def parse_row(text: str) -> tuple[TreeForm, PrintedNode] | None:
    """One printed row, or None when the line is not one."""
    line = strip_ansi(text).rstrip("\r\n") if "\x1b" in text else text.rstrip("\r\n")
    depth = _depth(len(line) - len(line.lstrip(" ")))
    if depth is None:
        return None
    m = _LEGACY.fullmatch(line)
    if m is not None:
        _, tokens, array_ids, list_ids, lock = m.groups()
        return "radix-cache", PrintedNode(depth, int(tokens), int(lock), None, _head(array_ids or list_ids or ""), ())
    m = _UNIFIED.fullmatch(line)
    if m is not None:
        _, node_id, tokens, lock, comps = m.groups()
        pairs = tuple((name, value == "yes") for name, value in (c.split("=") for c in comps.split()))
        return "unified", PrintedNode(depth, int(tokens), int(lock), int(node_id), (), pairs)
    return None


@cache
def _needles() -> Matcher:
    return Matcher.of_literals(NEEDLES)


def _depth(spaces: int) -> int | None:
    return (spaces - 1) // 2 if spaces % 2 == 1 else None


def _head(ids: str) -> tuple[int, ...]:
    found = _TUPLE_HEAD.findall(ids) if "(" in ids else _INT.findall(ids[:400])
    return tuple(int(t) for t in found[:MAX_HEAD_TOKENS])


class _Building:
    def __init__(self, form: TreeForm, root: PrintedNode, line: int, trigger: PrintTrigger | None) -> None:
        self.form = form
        self.nodes: list[PrintedNode] = [root]
        self.first = self.last = line
        self.skipped = 0
        self.cut = 0
        self.quiet = 0
        self.trigger = trigger

    def add(self, form: TreeForm, node: PrintedNode, line: int) -> None:
        depth_now = self.nodes[-1].depth
        if form != self.form or node.depth < 1 or node.depth > depth_now + 1:
            self.skipped += 1
        elif len(self.nodes) >= MAX_ROWS:
            self.cut += 1
        else:
            self.nodes.append(node)
        self.last = line
        self.quiet = 0

    def tree(self, *, complete: bool, total: int | None = None) -> PrintedTree:
        return PrintedTree(self.form, tuple(self.nodes), self.first, self.last, total, self.skipped, self.cut,
                           complete, self.trigger)


class PrintedTreeReader:
    """Reads the lines of one log file in order; `feed` returns the trees begun or grown in them
    (a tree still being printed comes back again, grown, with complete=False until it ends)."""

    def __init__(self) -> None:
        self.lines = 0
        self._building: _Building | None = None
        self._trigger: PrintTrigger | None = None

    def feed(self, texts: Sequence[str], found: frozenset[str] | None = None) -> list[PrintedTree]:
        """`found`: the NEEDLES the lines hold, when the caller's own pass over them found them
        (the log pane's ingest does); otherwise one pass here. Most batches hold none."""
        if found is None:
            found = frozenset(NEEDLES[index] for _, index in _needles().line_hits(texts))
        rows = bool(found & _ROWS) or (self._building is not None and TREE_TOTAL_NEEDLE in found)
        triggers = bool(found & _TRIGGERS) or (self._trigger is not None and bool(found & _POOL))
        base = self.lines
        self.lines += len(texts)
        if not rows and not triggers:
            return self._quiet(len(texts))
        out: list[PrintedTree] = []
        for i, text in enumerate(texts):
            line = base + i + 1
            if triggers and self._read_trigger(text, line):
                continue
            row = parse_row(text) if rows else None
            if row is None:
                if self._building is not None:
                    total = _TOTAL_LINE.fullmatch(text.rstrip("\r\n")) if rows else None
                    if total is not None:
                        out.append(self._end(int(total.group(1))))
                        continue
                    self._building.quiet += 1
                    if self._building.quiet >= QUIET_LINES:
                        out.append(self._end())
                continue
            form, node = row
            if node.depth == 0:
                if self._building is not None:
                    out.append(self._end())
                self._building = _Building(form, node, line, self._trigger)
                self._trigger = None
            elif self._building is not None:
                self._building.add(form, node, line)
        if self._building is not None:
            out.append(self._building.tree(complete=False))
        return _newest_of_each(out)

    def finish(self) -> PrintedTree | None:
        """The lines are all read: a tree still open ends with them."""
        return self._end() if self._building is not None else None

    def _quiet(self, n: int) -> list[PrintedTree]:
        b = self._building
        if b is None:
            return []
        b.quiet += n
        return [self._end()] if b.quiet >= QUIET_LINES else []

    def _end(self, total: int | None = None) -> PrintedTree:
        assert self._building is not None
        tree = self._building.tree(complete=True, total=total)
        self._building = None
        return tree

    def _read_trigger(self, text: str, line: int) -> bool:
        """An error line that comes before a print, or a pool line of its message."""
        if _TRIGGER.search(text) is not None:
            parsed = parse_line(text)
            message = parsed.message.strip()[:TRIGGER_TEXT_MAX]
            self._trigger = PrintTrigger(message, parsed.rank, parsed.epoch, line)
            return True
        t = self._trigger
        if t is None or line - t.line > 5:
            return False
        m = _REQUESTED.search(text)
        if m is not None:
            self._trigger = replace(t, requested=int(m.group(1)))
            return True
        m = _AVAILABLE.search(text)
        if m is not None:
            self._trigger = replace(t, available=int(m.group(1)), evictable=int(m.group(2)))
            return True
        return False


def _newest_of_each(trees: list[PrintedTree]) -> list[PrintedTree]:
    """A tree that ended in this batch also came back as still open: keep its ended form."""
    out: dict[int, PrintedTree] = {}
    for tree in trees:
        kept = out.get(tree.first_line)
        if kept is None or (tree.complete and not kept.complete):
            out[tree.first_line] = tree
    return list(out.values())


def read_printed_trees(lines: Sequence[str]) -> list[PrintedTree]:
    """Every tree printed in these lines (a whole file's, or a window of it), in order."""
    reader = PrintedTreeReader()
    trees = {t.first_line: t for t in reader.feed(lines)}
    last = reader.finish()
    if last is not None:
        trees[last.first_line] = last
    return [trees[k] for k in sorted(trees)]


def printed_snapshot(tree: PrintedTree, *, rank: int, seq: int, budget: int, page_size: int | None = None) -> Snapshot:
    """The printed tree in the debug endpoint's shape (what a print does not carry is None), so
    the radix pane and the bundle take it as they take a snapshot."""
    started = time.process_time()
    nodes = tree.nodes
    children: list[list[int]] = [[] for _ in nodes]
    stack: list[int] = [0]
    for i in range(1, len(nodes)):
        depth = nodes[i].depth
        del stack[depth:]
        children[stack[-1]].append(i)
        stack.append(i)
    subtree = [n.tokens for n in nodes]
    for i in range(len(nodes) - 1, 0, -1):  # children come after their parent
        for c in children[i]:
            subtree[i] += subtree[c]
    # heaviest_first takes the nodes below the root: index i here is row i + 1
    branches = [Branch(n.node_id, n.tokens, n.lock_ref, subtree[i], tuple(c - 1 for c in children[i]))
                for i, n in enumerate(nodes) if i]
    view = heaviest_first(branches, [c - 1 for c in children[0]], budget, lambda i: nodes[i + 1].head)
    t = tree.trigger
    locked = tree.locked_tokens
    when = t.epoch if t is not None and t.epoch is not None else time.time()
    return rebuilt_snapshot(
        view, rank=rank, instance=f"printed-{tree.first_line}", seq=seq, when=when,
        cache_class="RadixCache" if tree.form == "radix-cache" else "UnifiedRadixCache", page_size=page_size,
        lock_detail="counts", seconds=time.process_time() - started,
        available=t.available if t is not None else None, evictable=t.evictable if t is not None else None,
        protected=locked,
    )
