"""The incident state behind the live log pane, on the UI side. Pure Python: no Textual, no I/O.

`IncidentState` keeps a bounded ring of line texts (stored as they come, by slice assignment) with
a table of the runs they came in (source, generation, line numbers), so that no object is kept per
line; the severity marks of the few lines that matched, the pause buffer, the filter and search
indexes, per-source health and the latest report. It takes what the Ingestor made of each batch
(session/ingest.py `IngestResult`: the lines, their marks, notices, a fresh report). Widgets read
it; the app redraws only when `version` moved.
"""

from __future__ import annotations

import bisect
import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from radixtop.session.access_fold import AccessFolds, second_of
from radixtop.session.ingest import runs_of

if TYPE_CHECKING:
    from radixtop.diagnosis.findings import Report
    from radixtop.probes.logbatch import LogRun
    from radixtop.session.ingest import IngestResult, Mark

DEFAULT_CAPACITY = 100_000
_NOTICE_HISTORY = 200  # notices kept for the status line
_RATE_WINDOW = 2.0  # seconds of history behind the lines/s figure
_RECENT_NOTICE = 15.0  # seconds a rotation/truncation notice colours a source's health
_HEALTH_NOTICES = ("rotated", "truncated", "capped", "lost", "error")  # the notices that do


class LogEntry:
    """One row of the log pane as widgets see it: a file line, a notice, or a message."""

    __slots__ = ("generation", "kind", "lineno", "seq", "severity", "sig_ids", "source", "span", "text")

    def __init__(
        self,
        source: str,
        lineno: int,
        text: str,
        *,
        generation: int = 0,
        severity: str | None = None,
        sig_ids: tuple[str, ...] = (),
        span: tuple[int, int] | None = None,
        kind: str = "line",
    ) -> None:
        self.seq = -1
        self.source = source
        self.lineno = lineno
        self.generation = generation
        self.text = text
        self.severity = severity  # the worst severity among the matched signatures, or None
        self.sig_ids = sig_ids
        self.span = span  # (start, end) in text of the worst signature's match, when known
        # "line", "fold" (counted access lines), "notice" (from the probe or radixtop) or "message" (guidance)
        self.kind = kind

    def __repr__(self) -> str:
        return f"LogEntry(seq={self.seq}, {self.kind}, {self.source}:{self.lineno}, {self.severity}, {self.text!r})"



def smart_case(query: str) -> Callable[[str], bool]:
    """A substring test that ignores case unless the query has an upper-case letter (like less -S/vim)."""
    if query != query.lower():
        return lambda text: query in text
    return lambda text: query in text.lower()


class _SeqIndex:
    """Ascending sequence numbers of the entries with some property, pruned from the front as the
    ring drops old entries. A list with a moving start: O(1) appends, O(log n) lookups."""

    __slots__ = ("_seqs", "_start")

    def __init__(self, seqs: Iterable[int] = ()) -> None:
        self._seqs = list(seqs)
        self._start = 0

    def append(self, seq: int) -> None:
        self._seqs.append(seq)

    def extend(self, seqs: Iterable[int]) -> None:
        self._seqs.extend(seqs)

    def prune(self, first_seq: int) -> list[int]:
        """Drop the seqs below first_seq; returns them."""
        seqs = self._seqs
        if self._start < len(seqs) and seqs[self._start] < first_seq:
            old = self._start
            self._start = bisect.bisect_left(seqs, first_seq, self._start)
            dropped = seqs[old : self._start]
            if self._start > 4096 and self._start * 2 > len(seqs):
                del seqs[: self._start]
                self._start = 0
            return dropped
        return []

    def __len__(self) -> int:
        return len(self._seqs) - self._start

    def __getitem__(self, i: int) -> int:
        return self._seqs[self._start + i]

    def index_at_or_after(self, seq: int) -> int:
        return bisect.bisect_left(self._seqs, seq, self._start) - self._start

    def index_after(self, seq: int) -> int:
        return bisect.bisect_right(self._seqs, seq, self._start) - self._start


def _skip(pieces: list[Any], n: int) -> list[Any]:
    """pieces without their first n entries (a run may be cut)."""
    out = []
    for i, piece in enumerate(pieces):
        size = 1 if isinstance(piece, LogEntry) else len(piece.texts)
        if n >= size:
            n -= size
            continue
        out.append(piece.part(n, size) if n else piece)
        out.extend(pieces[i + 1 :])
        return out
    return out


class _RunIndex:
    """The runs in the ring by their first sequence number: which file, generation and line a
    seq shows, with one row per run instead of one object per line. Pruned from the front."""

    __slots__ = ("_lo", "_runs", "_starts")

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._runs: list[LogRun] = []
        self._lo = 0

    def add(self, seq: int, run: LogRun) -> None:
        self._starts.append(seq)
        self._runs.append(run)

    def find(self, seq: int) -> tuple[LogRun, int] | None:
        i = bisect.bisect_right(self._starts, seq, self._lo) - 1
        if i < self._lo:
            return None
        k = seq - self._starts[i]
        run = self._runs[i]
        return (run, k) if k < len(run.texts) else None

    def prune(self, first_seq: int) -> None:
        """Forget the runs that lie wholly before first_seq."""
        starts, lo = self._starts, self._lo
        while lo < len(starts) and starts[lo] + len(self._runs[lo].texts) <= first_seq:
            lo += 1
        # Drop the dead prefix once it is half the table (amortised O(1) per run): a pruned run
        # left in the table keeps all its texts alive, and one run can be 50,000 lines (a backlog
        # read), so waiting for 1,024 of them kept a million lines alive after a million were read.
        if lo and lo * 2 > len(starts):
            del starts[:lo], self._runs[:lo]
            lo = 0
        self._lo = lo

    def __len__(self) -> int:
        return len(self._starts) - self._lo


@dataclass(frozen=True)
class SourceView:
    """What the status line shows for one source."""

    source: str
    label: str
    state: str  # ok, waiting, deleted, error, rotated, truncated, capped, lost
    detail: str
    lines: int


@dataclass(frozen=True)
class _Notice:
    source: str
    kind: str
    message: str
    time: float


class IncidentState:
    """UI side. Rows of the ring get increasing sequence numbers; rows of the view map to them."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY, *, clock: Callable[[], float] = time.monotonic) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._clock = clock
        # Every entry's text, by seq % capacity ("" in a slot not filled yet: read only in range).
        self._texts: list[str] = [""] * capacity
        self._runs = _RunIndex()  # where each file line came from, one row per run of lines
        self._special: dict[int, LogEntry] = {}  # notices and messages by seq (ascending)
        self._marks: dict[int, Mark] = {}
        self.first_seq = 0
        self.next_seq = 0
        self.version = 0
        self.total_lines = 0  # file lines received, all sources, paused or not
        self.max_width = 0  # longest text seen (chars), for horizontal scrolling
        self.report: Report | None = None
        # pause
        self.paused = False
        self._pending: deque[tuple[list[Any], dict[int, Mark], int]] = deque()  # (pieces, marks, entries)
        self._pending_count = 0
        self.pending_dropped = 0  # entries that fell out of a pause buffer longer than the ring
        # filter and search
        self.filter_text: str | None = None
        self._filter_test: Callable[[str], bool] | None = None
        self._filter = _SeqIndex()
        self.search_text: str | None = None
        self._search_test: Callable[[str], bool] | None = None
        self._hits = _SeqIndex()  # entries that matched a signature
        # HTTP access lines, folded into a counted row per second unless shown (see access_fold)
        self.folds = AccessFolds()
        self.fold_access = True
        # sources and notices
        self.notices: deque[Any] = deque(maxlen=_NOTICE_HISTORY)
        self._health: dict[str, Any] = {}
        self._recent_notice: dict[str, tuple[float, Any]] = {}
        self._labels: dict[str, str] = {}
        self._rate: deque[tuple[float, int]] = deque()

    # -- the ring ----------------------------------------------------------------------------------

    def __len__(self) -> int:
        return self.next_seq - self.first_seq

    def text(self, seq: int) -> str | None:
        if self.first_seq <= seq < self.next_seq:
            return self._texts[seq % self.capacity]
        return None

    def entry(self, seq: int) -> LogEntry | None:
        """The entry at seq as a LogEntry (built on demand for file lines: only visible rows ask).
        A line whose number is still being counted (see probes/backlog.py) has lineno 0 until then."""
        if not self.first_seq <= seq < self.next_seq:
            return None
        special = self._special.get(seq)
        if special is not None:
            special.seq = seq
            return special
        found = self._runs.find(seq)
        if found is None:
            return None
        run, k = found
        first = run.lineno_or_none
        text = self._texts[seq % self.capacity]
        kind = "line"
        if self._folding:
            summary = self.folds.summary(seq)
            if summary is not None:
                second = second_of(text)
                text = f"[{second}] {summary}" if second else summary
                kind = "fold"
        entry = LogEntry(run.source, 0 if first is None else first + k, text, generation=run.generation, kind=kind)
        mark = self._marks.get(seq)
        if mark is not None:
            entry.severity, entry.sig_ids, entry.span = mark
        entry.seq = seq
        return entry

    def plain_line(self, seq: int) -> tuple[str, str] | None:
        """(source, text) of the file line at seq when it is plain (no signature matched it, not
        folded, not a notice or message), else None: what a row needs of most lines, without
        building a LogEntry."""
        if not self.first_seq <= seq < self.next_seq or seq in self._marks or seq in self._special:
            return None
        if self._folding and self.folds.summary(seq) is not None:
            return None
        found = self._runs.find(seq)
        return None if found is None else (found[0].source, self._texts[seq % self.capacity])

    def severity(self, seq: int) -> str | None:
        mark = self._marks.get(seq)
        return mark.severity if mark is not None else None

    def _append(self, pieces: list[Any], marks: dict[int, Mark], n: int) -> None:
        """pieces: runs of file lines and LogEntry notices/messages, n entries in all."""
        if not n:
            return
        cap = self.capacity
        skip = n - cap
        if skip > 0:
            # Earlier ones would be overwritten at once: only their sequence numbers are used up.
            self.next_seq += skip
            pieces = _skip(pieces, skip)
            marks = {k - skip: m for k, m in marks.items() if k >= skip}
            n = cap
        start = seq = self.next_seq
        texts = self._texts
        folds = self.folds
        fallback_second = str(int(self._clock()))
        for piece in pieces:
            if isinstance(piece, LogEntry):
                texts[seq % cap] = piece.text
                self._special[seq] = piece
                folds.interrupt()
                seq += 1
                continue
            lines = piece.texts
            count = len(lines)
            marked = [k - (seq - start) for k in marks if 0 <= k - (seq - start) < count] if marks else ()
            folds.feed(seq, lines, marked, fallback_second)
            pos = seq % cap
            head = min(count, cap - pos)
            texts[pos : pos + head] = lines[:head] if head < count else lines
            if head < count:
                texts[0 : count - head] = lines[head:]
            self._runs.add(seq, piece)
            seq += count
        self.next_seq = seq
        first = self.first_seq = max(self.first_seq, seq - cap)
        self._runs.prune(first)
        folds.prune(first)
        special = self._special
        while special:
            oldest = next(iter(special))
            if oldest >= first:
                break
            del special[oldest]
        if marks:
            for k in sorted(marks):
                self._marks[start + k] = marks[k]
                self._hits.append(start + k)
        for old in self._hits.prune(first):
            self._marks.pop(old, None)
        if self._filter_test is not None:
            test = self._filter_test
            self._filter.extend(q for q in range(start, seq) if test(texts[q % cap]))
            self._filter.prune(first)
        self.version += 1

    # -- intake ------------------------------------------------------------------------------------

    def apply(self, result: IngestResult) -> None:
        """Take one ingested batch: lines and notices in the ring (or the pause buffer), findings."""
        now = self._clock()
        if result.lines:
            self._rate.append((now, self.total_lines))
            self.total_lines += result.lines
        self.max_width = max(self.max_width, result.max_len)
        pieces: list[Any] = runs_of(result.records) if result.records else []
        n = sum(len(run.texts) for run in pieces)
        extra = [self._notice_entry(notice, now) for notice in result.notices]
        extra += [self._notice_entry(_Notice("radixtop", "error", m, time.time()), now) for m in result.errors]
        if result.report is not None:
            self.report = result.report
        self._admit(pieces + extra, result.marks, n + len(extra))
        self.version += 1

    def _notice_entry(self, notice: Any, now: float) -> LogEntry:
        self.notices.append(notice)
        recent = self._recent_notice.get(notice.source)
        # A rotation is reported with the new file's "created" right after it (when the reader
        # sees the rename and the new file apart): that must not wash out the rotation's colour.
        if not (
            recent is not None
            and recent[1].kind in _HEALTH_NOTICES
            and notice.kind not in _HEALTH_NOTICES
            and now - recent[0] <= _RECENT_NOTICE
        ):
            self._recent_notice[notice.source] = (now, notice)
        return LogEntry(notice.source, 0, f"[{notice.kind}] {notice.message}", kind="notice")

    def add_notice(self, source: str, kind: str, message: str) -> None:
        """A notice raised by radixtop itself (a failed handler, a worker restart)."""
        self._admit([self._notice_entry(_Notice(source, kind, message, time.time()), self._clock())], {}, 1)
        self.version += 1

    def add_message(self, lines: Iterable[str]) -> None:
        """Guidance shown in the pane (e.g. how to point radixtop at a log); not counted as lines."""
        entries = [LogEntry("radixtop", 0, line, kind="message") for line in lines]
        self.max_width = max(self.max_width, *(len(e.text) for e in entries), 0)
        self._admit(entries, {}, len(entries))
        self.version += 1

    def _admit(self, pieces: list[Any], marks: dict[int, Mark], n: int) -> None:
        if not n:
            return
        if not self.paused:
            self._append(pieces, marks, n)
            return
        self._pending.append((pieces, marks, n))
        self._pending_count += n
        # Keep at most a ring's worth: older ones would leave the ring on resume anyway.
        while self._pending_count > self.capacity:
            old, old_marks, old_n = self._pending[0]
            over = self._pending_count - self.capacity
            if over >= old_n:
                self._pending.popleft()
                self._pending_count -= old_n
                self.pending_dropped += old_n
            else:
                self._pending[0] = (
                    _skip(old, over), {k - over: m for k, m in old_marks.items() if k >= over}, old_n - over
                )
                self._pending_count -= over
                self.pending_dropped += over

    # -- pause -------------------------------------------------------------------------------------

    @property
    def pending_count(self) -> int:
        return self._pending_count

    def set_paused(self, paused: bool) -> int:
        """Pause or resume the view. On resume the buffered entries enter the ring; returns how
        many had to be dropped from the view (never from the findings) because the buffer was full."""
        dropped = 0
        if self.paused and not paused:
            pending, self._pending, self._pending_count = self._pending, deque(), 0
            self.paused = False
            for pieces, marks, n in pending:
                self._append(pieces, marks, n)
            dropped, self.pending_dropped = self.pending_dropped, 0
        self.paused = paused
        self.version += 1
        return dropped

    # -- the view (all entries, or the filtered ones) ----------------------------------------------

    @property
    def _folding(self) -> bool:
        """Access lines are folded in the view (a filter shows every line it matches instead)."""
        return self.fold_access and self._filter_test is None

    def set_fold_access(self, fold: bool) -> None:
        self.fold_access = fold
        self.version += 1

    @property
    def view_len(self) -> int:
        if self._filter_test is not None:
            return len(self._filter)
        hidden = self.folds.hidden_count if self.fold_access else 0
        return self.next_seq - self.first_seq - hidden

    def view_seq(self, row: int) -> int | None:
        """The sequence number shown at a row of the view."""
        if row < 0:
            return None
        if self._filter_test is not None:
            return self._filter[row] if row < len(self._filter) else None
        seq = self.folds.seq_at(self.first_seq, row) if self.fold_access else self.first_seq + row
        return seq if seq < self.next_seq else None

    def row_of(self, seq: int) -> int | None:
        """The row showing seq, or None when it is not in the view (dropped, filtered or folded out)."""
        if not self.first_seq <= seq < self.next_seq:
            return None
        if self._filter_test is not None:
            i = self._filter.index_at_or_after(seq)
            return i if i < len(self._filter) and self._filter[i] == seq else None
        if self.fold_access:
            if self.folds.is_hidden(seq):
                return None
            return seq - self.first_seq - self.folds.hidden_before(seq)
        return seq - self.first_seq

    def set_filter(self, text: str | None) -> None:
        """Show only entries whose text contains `text` (smart case); None or "" shows everything."""
        if not text:
            self.filter_text, self._filter_test, self._filter = None, None, _SeqIndex()
        else:
            test = smart_case(text)
            texts, cap = self._texts, self.capacity
            seqs = [s for s in range(self.first_seq, self.next_seq) if test(texts[s % cap])]
            self.filter_text, self._filter_test, self._filter = text, test, _SeqIndex(seqs)
        self.version += 1

    def set_search(self, text: str | None) -> None:
        self.search_text = text or None
        self._search_test = smart_case(text) if text else None
        self.version += 1

    def _scan_rows(self, from_row: int, forward: bool, test: Callable[[int], bool]) -> int | None:
        """The first row after (or before) from_row whose seq passes test, wrapping once."""
        n = self.view_len
        if n == 0:
            return None
        step = 1 if forward else -1
        row = from_row
        for _ in range(n):
            row = (row + step) % n
            seq = self.view_seq(row)
            if seq is not None and test(seq):
                return row
        return None

    def find_search(self, from_row: int, forward: bool = True) -> int | None:
        """Row of the next (or previous) entry containing the search text, wrapping around."""
        test = self._search_test
        if test is None:
            return None
        texts, cap = self._texts, self.capacity
        return self._scan_rows(from_row, forward, lambda seq: test(texts[seq % cap]))

    def find_hit(self, from_row: int, forward: bool = True) -> int | None:
        """Row of the next (or previous) line that matched a signature, wrapping around."""
        if not len(self._hits):
            return None
        if self._filter_test is None:
            # The hit index is sorted by seq, and so are rows here (a hit is never folded).
            seq = self.view_seq(from_row) if 0 <= from_row < self.view_len else None
            base = seq if seq is not None else (self.first_seq - 1 if from_row < 0 else self.next_seq)
            hits = self._hits
            if forward:
                i = hits.index_after(base)
                target = hits[i] if i < len(hits) else hits[0]
            else:
                i = hits.index_at_or_after(base) - 1
                target = hits[i] if i >= 0 else hits[len(hits) - 1]
            return self.row_of(target)
        return self._scan_rows(from_row, forward, lambda seq: seq in self._marks)

    def hit_seqs(self) -> Iterable[int]:
        """Sequence numbers of the entries that matched a signature, oldest first."""
        hits = self._hits
        return (hits[i] for i in range(len(hits)))

    @property
    def hit_count(self) -> int:
        return len(self._hits)

    # -- sources -----------------------------------------------------------------------------------

    def set_health(self, health: Iterable[Any]) -> None:
        """The followed files' health, for the status line (read when it is drawn). The log pane
        is redrawn (version) only when a source appears, for its label column: a line count or a
        state moving is the status line's business, and redrawing the log pane for it cost a
        frame a second while lines came."""
        added = False
        for h in health:
            if h.source not in self._health:
                added = True
            self._health[h.source] = h
        if added:
            self._labels = short_labels(list(self._health))
            self.version += 1

    def label(self, source: str) -> str:
        label = self._labels.get(source)
        if label is None:
            self._labels = short_labels([*self._health, source])
            label = self._labels[source]
        return label

    @property
    def source_count(self) -> int:
        return len(self._health)

    def sources(self) -> list[SourceView]:
        """Each source's health; a recent rotation/truncation/cap shows instead of a plain "ok"."""
        now = self._clock()
        out = []
        for source, h in self._health.items():
            state, detail = h.state, h.detail
            recent = self._recent_notice.get(source)
            if recent is not None and now - recent[0] <= _RECENT_NOTICE:
                notice = recent[1]
                if state == "ok" and notice.kind in _HEALTH_NOTICES:
                    state, detail = notice.kind, notice.message
                elif state != "ok":
                    detail = notice.message
            out.append(SourceView(source, self.label(source), state, detail, h.lines))
        return out

    # -- rate --------------------------------------------------------------------------------------

    def lines_per_second(self) -> float | None:
        """Lines/s over the last couple of seconds; None when the clock has not moved (tests)."""
        now = self._clock()
        samples = self._rate
        while len(samples) > 1 and now - samples[1][0] >= _RATE_WINDOW:
            samples.popleft()
        if not samples:
            return 0.0
        t0, n0 = samples[0]
        if now - t0 <= 0:
            return None
        if now - t0 > _RATE_WINDOW * 4:
            return 0.0
        return (self.total_lines - n0) / max(now - t0, _RATE_WINDOW / 4)


def short_labels(sources: Sequence[str]) -> dict[str, str]:
    """A short, unique name per source: the file name, with as many parent directories as it takes
    to tell two apart (rank0/server.log vs rank1/server.log)."""
    labels: dict[str, str] = {}
    parts = {s: os.path.normpath(s).split(os.sep) for s in sources}
    depth = {s: 1 for s in sources}
    for _ in range(8):
        names = {s: os.sep.join(parts[s][-depth[s] :]) for s in sources}
        seen: dict[str, list[str]] = {}
        for s, name in names.items():
            seen.setdefault(name, []).append(s)
        clash = [s for group in seen.values() if len(group) > 1 for s in group]
        labels = names
        if not clash:
            break
        for s in clash:
            depth[s] += 1
    return labels
