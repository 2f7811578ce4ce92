"""HTTP access lines folded into one counted row per second, so a crash stays readable.

When SGLang (or the simulator) dies, its uvicorn front end keeps logging every refused call
(`POST /generate HTTP/1.1" 503`, `GET /health ... 503`) at the default log level: hundreds of
lines a second that push the traceback off the screen. The log pane shows, by default, the first
access line of each second and run (a run ends at any other line) as a counted row, and hides the
rest; a key shows them all again. A line that matched a signature is never folded.

Pure Python, no Textual: the incident state calls `feed` as entries enter its ring and asks the
row <-> sequence-number mapping of the folded view. The hidden lines are kept as one sorted list
(plus a second list that turns a row into a sequence number by bisection), so the view costs
nothing per visible line and O(log n) per lookup.
"""

from __future__ import annotations

import bisect
import heapq
from collections import deque
from collections.abc import Sequence
from itertools import compress, repeat
from operator import contains, itemgetter

from radixtop.diagnosis.logline import access_key

_SUMMARY_KINDS = 3  # the commonest (method, path, status) kinds named in a folded row


def second_of(text: str) -> str | None:
    """The line's own second ("2026-12-03 11:54:35" of an SGLang prefix), when it has one."""
    if len(text) >= 20 and text[0] == "[" and text[5] == "-" and text[8] == "-":
        return text[1:20]
    return None


class _Group:
    __slots__ = ("count", "head", "kinds", "second")

    def __init__(self, head: int, second: str, key: tuple[str, str, str]) -> None:
        self.head = head  # the seq of its first line, which stays visible
        self.second = second
        self.count = 1
        # A dict, not a Counter: one group is made per counted row, and a Counter costs several
        # times more to make.
        self.kinds: dict[tuple[str, str, str], int] = {key: 1}


class AccessFolds:
    """Which entries of the ring are folded away, and the counted rows that stand for them."""

    def __init__(self) -> None:
        self._hidden: list[int] = []  # ascending seqs of folded lines
        self._shifted: list[int] = []  # hidden[i] - (i + pruned): non-decreasing, for row -> seq
        self._lo = 0  # entries of both lists before _lo are pruned
        self._pruned = 0  # hidden entries ever pruned: the index base of _shifted
        self._groups: dict[int, _Group] = {}  # head seq -> its group, once it has two lines
        # The groups' heads, ascending, pruned from the left: a dict's first key is slow to reach
        # once many keys were deleted from its front.
        self._heads: deque[int] = deque()
        # What a next access line of the same second joins: a counted row's group, or a line alone
        # as (seq, text, fallback second), read only once a second line would join it (most
        # access lines of a busy log stay alone: reading each cost a fifth of its ingest).
        self._open: _Group | tuple[int, str, str] | None = None
        self.changed: set[int] = set()  # heads whose row text changed since the view last asked

    # -- intake ------------------------------------------------------------------------------------

    def feed(self, start: int, texts: Sequence[str], marked: Sequence[int] = (), fallback_second: str = "") -> None:
        """Entries start.. start+len(texts)-1 entered the ring; `marked` are indexes that matched
        a signature (never folded). fallback_second buckets lines without a time of their own."""
        if not texts:
            return
        # An access line quotes its request (access_key's pattern), and a quote is one byte for a
        # memchr to find: the few quoted lines are then asked for HTTP/, instead of every line.
        quoted = compress(range(len(texts)), map(contains, texts, repeat('"')))
        candidates = [i for i in quoted if "HTTP/" in texts[i]]
        if not candidates:
            self._open = None
            return
        last = len(texts) - 1
        # Only a candidate next to another one, or at an edge of the batch (a run may go on from
        # the batch before or into the next), can join or open a row that counts; a lone access
        # line mid-batch stays a line of its own whatever it holds.
        taken = set(candidates)
        linked = [i for i in candidates if i - 1 in taken or i + 1 in taken or i == 0 or i == last]
        marked_set = set(marked)
        # The loop keeps its state in locals (written back at the end): the run is a frame's
        # work, and each attribute read of a cold object is a cache miss there.
        opened = self._open
        hidden, shifted = self._hidden, self._shifted
        shift = self._pruned - self._lo  # _shifted's rule (see __init__), for the lines appended here
        previous = -1
        for i in linked:
            if i != previous + 1:
                opened = None
            previous = i
            if i in marked_set:
                opened = None
                continue
            seq, text = start + i, texts[i]
            if opened is None:
                opened = (seq, text, fallback_second)
                continue
            key = access_key(text)
            if key is None:
                opened = None
                continue
            second = second_of(text) or fallback_second
            if isinstance(opened, tuple):
                head, head_text, head_fallback = opened
                head_key = access_key(head_text)
                if head_key is None or (second_of(head_text) or head_fallback) != second:
                    opened = (seq, text, fallback_second)
                    continue
                group = opened = _Group(head, second, head_key)  # the head becomes a counted row
                self._groups[head] = group
                self._heads.append(head)
            else:
                group = opened
                if group.second != second:
                    opened = (seq, text, fallback_second)
                    continue
            group.count += 1
            group.kinds[key] = group.kinds.get(key, 0) + 1
            self.changed.add(group.head)
            shifted.append(seq - (shift + len(hidden)))
            hidden.append(seq)
        self._open = opened if previous == last else None

    def interrupt(self) -> None:
        """A notice or message entered the ring: the next access line starts a new row."""
        self._open = None

    def prune(self, first_seq: int) -> None:
        hidden, lo = self._hidden, self._lo
        if lo < len(hidden) and hidden[lo] < first_seq:
            new_lo = bisect.bisect_left(hidden, first_seq, lo)
            self._pruned += new_lo - lo
            lo = new_lo
            if lo > 4096 and lo * 2 > len(hidden):
                del hidden[:lo], self._shifted[:lo]
                lo = 0
            self._lo = lo
        heads = self._heads
        while heads and heads[0] < first_seq:
            head = heads.popleft()
            del self._groups[head]
            self.changed.discard(head)
        opened = self._open
        if opened is not None and (opened[0] if isinstance(opened, tuple) else opened.head) < first_seq:
            self._open = None

    # -- the folded view ---------------------------------------------------------------------------

    @property
    def hidden_count(self) -> int:
        return len(self._hidden) - self._lo

    def hidden_before(self, seq: int) -> int:
        return bisect.bisect_left(self._hidden, seq, self._lo) - self._lo

    def is_hidden(self, seq: int) -> bool:
        i = bisect.bisect_left(self._hidden, seq, self._lo)
        return i < len(self._hidden) and self._hidden[i] == seq

    def seq_at(self, first_seq: int, row: int) -> int:
        """The sequence number shown at `row` of the folded view (row >= 0, unchecked above)."""
        # hidden[i] lies before the entry at `row` exactly when shifted[i] <= first_seq + row.
        k = bisect.bisect_right(self._shifted, first_seq + row - self._pruned, self._lo) - self._lo
        return first_seq + row + k

    def summary(self, seq: int) -> str | None:
        """The counted row's text for a head that stands for several lines, else None."""
        group = self._groups.get(seq)
        if group is None or group.count < 2:
            return None
        kinds = ", ".join(
            f"{method} {path} {status} ×{n}"
            for (method, path, status), n in heapq.nlargest(_SUMMARY_KINDS, group.kinds.items(), key=itemgetter(1))
        )
        more = len(group.kinds) - _SUMMARY_KINDS
        return f"{group.count} HTTP access lines: {kinds}{f', {more} more kinds' if more > 0 else ''} (a shows them)"
