"""Which earlier prompt each prompt shares most with, and how much: a compressed prefix tree.

A trace keeps a workload's sharing as ``prefix_of``/``prefix_len`` (``radixtop.incident.replay.trace``):
for every prompt, the earlier prompt with the longest common prefix and its length. Comparing each
prompt with every earlier one is quadratic; a crash dump holds thousands of prompts of thousands
of tokens. Here the prompts go into a radix tree in order (edges are slices of the prompts, so a
comparison is a C-speed slice equality), and each one's longest match is read on its way in: the
cost is the prompts' total length. Works for any sliceable sequence: token ids, or text.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["longest_earlier_prefixes"]


class _Node:
    __slots__ = ("children", "edge", "owner")

    def __init__(self, edge: Sequence[Any], owner: int) -> None:
        self.edge = edge
        self.owner = owner  # the first prompt whose path runs through this node
        self.children: dict[Any, _Node] = {}


def _common(a: Sequence[Any], b: Sequence[Any]) -> int:
    """The length of a's and b's common prefix, by halving over slice comparisons."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def longest_earlier_prefixes(prompts: Iterable[Sequence[Any]]) -> list[tuple[int, int]]:
    """For each prompt in order: (the index of the earlier prompt it shares the longest prefix
    with, that length), or (-1, 0) when it shares not even a first element with any."""
    root = _Node((), -1)
    out: list[tuple[int, int]] = []
    for index, prompt in enumerate(prompts):
        node, depth, owner = root, 0, -1
        while depth < len(prompt):
            child = node.children.get(prompt[depth])
            if child is None:
                node.children[prompt[depth]] = _Node(prompt[depth:], index)
                break
            k = _common(child.edge, prompt[depth : depth + len(child.edge)])
            depth += k
            owner = child.owner
            if k < len(child.edge):  # they part inside this edge: split it there
                rest = _Node(child.edge[k:], child.owner)
                rest.children = child.children
                child.edge, child.children = child.edge[:k], {rest.edge[0]: rest}
                if depth < len(prompt):
                    child.children[prompt[depth]] = _Node(prompt[depth:], index)
                break
            node = child
        out.append((owner, depth) if depth else (-1, 0))
    return out
