"""One node of the radix tree in a screen of its own: its figures, the requests holding its
lock, and its path from the root with each node's prefix as text (or ids), whole where the rows
carry it, with the gaps where a node holds more tokens than were sent."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from rich.text import Text
from textual.binding import BindingType

from radixtop.textsafe import printable_escaped, printable_text
from radixtop.widgets.fmt import age, count
from radixtop.widgets.keys import NODE_CLOSE, binding
from radixtop.widgets.text_screen import TextScreen

if TYPE_CHECKING:
    from radixtop.widgets.radix import RadixTreeView

PATH_ROWS = 64  # the deepest path shown whole; deeper ones keep their first and last rows
USED_ROWS = 32  # the earlier requests listed for a node; the rest counted


def _head(tree: RadixTreeView, node: object) -> str:
    """A node's sent tokens as the tree shows them: text in quotes, else ids; "" when none."""
    head = getattr(node, "head", ())
    if not head:
        return ""
    text = tree.decoder.decode(head) if tree.show_text and tree.decoder is not None else None
    if text is None:
        return "[" + " ".join(str(t) for t in head) + "]"
    return f'"{printable_escaped(text)}"'


def node_text(tree: RadixTreeView, row: int) -> Text:
    snap = tree.snapshot
    nodes = snap.tree.nodes
    node = nodes[row]
    out = Text()
    name = "root" if row == 0 else f"node #{node.id if node.id is not None else '?'}"
    idle = snap.monotonic - node.last_access if node.last_access is not None else None
    out.append(f"{name}", style="bold")
    out.append(
        f" · {count(node.tokens)} tokens · lock {tree.lock_text(node, snap)} · hits {count(node.hit_count)}"
        f" · idle {age(idle)} · {node.children} children{' · evicted' if node.evicted else ''}\n"
    )
    if tree.failed is not None and node.id == tree.failed[0]:
        out.append(f"the {tree.failed[1].replace('_', ' ')} the flight record caught was on this node\n",
                   style="bold red")
    _holders(out, tree, row)
    path: list[int] = []
    at = row
    while at > 0:
        path.append(at)
        at = nodes[at].parent
    path.reverse()
    if path:
        out.append("\npath from the root", style="bold")
        out.append(" (each node's first tokens; … where it holds more than were sent)\n", style="dim")
        shown = path if len(path) <= PATH_ROWS else [*path[: PATH_ROWS // 2], -1, *path[-PATH_ROWS // 2:]]
        for r in shown:
            if r < 0:
                out.append(f"  … {len(path) - PATH_ROWS} nodes …\n", style="dim")
                continue
            n = nodes[r]
            cut = "…" if n.tokens > len(n.head) and n.head else ""
            style = "bold" if r == row else None
            out.append(f"  #{n.id if n.id is not None else '?':<8} {count(n.tokens):>7} tok  lock "
                       f"{str(tree.lock_text(n, snap)):>3}  {_head(tree, n)}{cut}\n", style=style)
    if tree.note():
        out.append(f"\n{tree.note()}\n", style="italic")
    return printable_text(out)


def _holders(out: Text, tree: RadixTreeView, row: int) -> None:
    node = tree.snapshot.tree.nodes[row]
    holders = tree.holders
    if not holders.known:
        if node.lock_ref > 0 and tree.locks_known:
            out.append("held, holder unknown: this source does not say which requests hold locks\n", style="dim")
        return
    held = holders.held_by.get(row, ())
    if held:
        out.append(f"\nheld by {len(held)} request{'s' if len(held) > 1 else ''}\n", style="bold")
        here = holders.deepest.get(row, ())
        for h in sorted(held, key=lambda h: -h.held_s):
            where = "this node" if h in here else f"#{h.node} below"
            out.append(f"  {printable_escaped(h.rid)}  {h.state}  held {age(h.held_s)}  "
                       f"prompt {count(h.prompt_tokens)} tok  (locked at {where})\n")
    if row in holders.unheld:
        n = holders.unheld_locks(tree.snapshot, row)
        out.append(f"{n} lock{'s' if n > 1 else ''} on this node no request holds: leaked, or the cache's own\n",
                   style="bold red")
    if row in holders.overheld:
        out.append("fewer locks than requests holding them: a lock released twice?\n", style="bold red")
    if holders.unplaced:
        out.append(f"{holders.unplaced} holder(s) on nodes not among the rows sent\n", style="dim")
    used = holders.used_by.get(row, ())
    if used:
        out.append(f"\nused before by {len(used)} request{'s' if len(used) > 1 else ''} "
                   "(let go of their locks; the node stays cached)\n", style="bold")
        for u in used[:USED_ROWS]:
            out.append(f"  {printable_escaped(u.rid)}  let go {age(u.released_s)} ago  "
                       f"prompt {count(u.prompt_tokens)} tok\n")
        if len(used) > USED_ROWS:
            out.append(f"  … {len(used) - USED_ROWS} more\n", style="dim")


class NodeScreen(TextScreen):
    TEXT_ID = "node-details"
    TITLE_TEXT = "Node"
    BINDINGS: ClassVar[list[BindingType]] = [binding(NODE_CLOSE)]
