"""The incident state behind the live log pane. Pure Python: no Textual, no I/O.

Two halves, because matching lines against the catalog is the expensive part and must not run on
the UI's event loop:

- `Ingestor` runs in a worker thread: it feeds each record to the FindingsBuilder (which keeps the
  findings and their evidence on its own, so dropping old lines from the ring never loses a
  finding's context) and turns a LogBatch into an `IngestResult` (entries with their severity and
  matched span, the probe's notices, a fresh findings report when something matched).
- `IncidentState` lives on the UI side: a bounded ring of entries with stable sequence numbers, the
  pause buffer, the filter and search indexes, per-source health and the latest report. Widgets
  read it; the app refreshes the screen only when `version` moved.
"""

from __future__ import annotations

import bisect
import os
import re
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

SEVERITY_RANK: dict[str | None, int] = {None: 0, "info": 1, "warning": 2, "error": 3, "critical": 4}

DEFAULT_CAPACITY = 100_000
_NOTICE_HISTORY = 200  # notices kept for the status line and the help screen
_RATE_WINDOW = 2.0  # seconds of history behind the lines/s figure
_RECENT_NOTICE = 15.0  # seconds a rotation/truncation notice colours a source's health
_MAX_INGEST_ERRORS = 5  # per Ingestor: after this many failing lines, count them silently


class LogEntry:
    """One row of the log pane: a line read from a file, a notice, or a message from radixtop."""

    __slots__ = ("seq", "source", "lineno", "generation", "text", "severity", "sig_ids", "span", "kind")

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
        self.seq = -1  # assigned by IncidentState when the entry enters the ring
        self.source = source
        self.lineno = lineno
        self.generation = generation
        self.text = text
        self.severity = severity  # the worst severity among the matched signatures, or None
        self.sig_ids = sig_ids
        self.span = span  # (start, end) in text of the first matched signature, when known
        self.kind = kind  # "line", "notice" (from the probe or radixtop) or "message" (guidance)

    def __repr__(self) -> str:
        return f"LogEntry(seq={self.seq}, {self.kind}, {self.source}:{self.lineno}, {self.severity}, {self.text!r})"


@dataclass(frozen=True)
class IngestResult:
    entries: list[LogEntry]
    notices: tuple[Any, ...]  # LogNotice-like: .source .kind .message .time
    report: Any | None  # diagnosis Report when something matched in this batch, else None
    lines: int  # file lines in this batch
    errors: tuple[str, ...]  # one-line descriptions of lines the diagnosis failed on


def finding_file(source: str, generation: int) -> str:
    """The file name a finding's occurrence carries: after a rotation, line numbers restart."""
    return source if generation == 0 else f"{source} (generation {generation})"


class Ingestor:
    """Thread side: LogBatch -> IngestResult. Only one thread may call process() at a time."""

    def __init__(self, builder: Any, catalog: Any) -> None:
        self._builder = builder
        self._severity: dict[str, str] = {sig.id: sig.severity for sig in catalog.signatures}
        self._patterns: dict[str, re.Pattern[str] | None] = {}
        self._raw = {sig.id: sig.pattern for sig in catalog.signatures}
        self._errors = 0
        self.failed_lines = 0

    def _span(self, sig_id: str, text: str) -> tuple[int, int] | None:
        # Only matched lines get here, so compiling and searching with `re` is cheap enough.
        pattern = self._patterns.get(sig_id, False)
        if pattern is False:
            try:
                pattern = re.compile(self._raw[sig_id])
            except (re.error, KeyError):
                pattern = None
            self._patterns[sig_id] = pattern
        if pattern is None:
            return None
        m = pattern.search(text)
        return m.span() if m else None

    def process(self, batch: Any) -> IngestResult:
        feed = self._builder.feed
        severity_of = self._severity
        entries: list[LogEntry] = []
        append = entries.append
        matched = False
        errors: list[str] = []
        for record in batch.records:
            source, lineno, text, generation = record.source, record.lineno, record.text, record.generation
            try:
                ids = feed(finding_file(source, generation), lineno, text)
            except Exception as exc:  # one bad line must not stop the pane
                ids = ()
                self.failed_lines += 1
                self._errors += 1
                if self._errors <= _MAX_INGEST_ERRORS:
                    errors.append(f"diagnosis failed on {source}:{lineno}: {exc!r}; the line is shown unmatched")
            if ids:
                matched = True
                worst = max(ids, key=lambda i: SEVERITY_RANK.get(severity_of.get(i), 0))
                append(
                    LogEntry(
                        source,
                        lineno,
                        text,
                        generation=generation,
                        severity=severity_of.get(worst),
                        sig_ids=tuple(ids),
                        span=self._span(worst, text),
                    )
                )
            else:
                append(LogEntry(source, lineno, text, generation=generation))
        report = None
        if matched:
            try:
                report = self._builder.report()
            except Exception as exc:
                errors.append(f"building the findings report failed: {exc!r}")
        return IngestResult(entries, tuple(batch.notices), report, len(batch.records), tuple(errors))


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

    def prune(self, first_seq: int) -> None:
        seqs = self._seqs
        if self._start < len(seqs) and seqs[self._start] < first_seq:
            self._start = bisect.bisect_left(seqs, first_seq, self._start)
            if self._start > 4096 and self._start * 2 > len(seqs):
                del seqs[: self._start]
                self._start = 0

    def __len__(self) -> int:
        return len(self._seqs) - self._start

    def __getitem__(self, i: int) -> int:
        return self._seqs[self._start + i]

    def index_at_or_after(self, seq: int) -> int:
        return bisect.bisect_left(self._seqs, seq, self._start) - self._start

    def index_after(self, seq: int) -> int:
        return bisect.bisect_right(self._seqs, seq, self._start) - self._start


@dataclass(frozen=True)
class SourceView:
    """What the status line shows for one source."""

    source: str
    label: str
    state: str  # ok, waiting, deleted, error, rotated, truncated, capped
    detail: str
    lines: int


class IncidentState:
    """UI side. Entries get increasing sequence numbers; rows of the view map to them."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY, *, clock: Callable[[], float] = time.monotonic) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._clock = clock
        self._buf: list[LogEntry | None] = [None] * capacity
        self.first_seq = 0
        self.next_seq = 0
        self.version = 0
        self.total_lines = 0  # file lines received, all sources, paused or not
        self.max_width = 0  # longest text seen (chars), for horizontal scrolling
        self.report: Any | None = None
        self.engine_note = ""
        self.failed_lines = 0
        # pause
        self.paused = False
        self._pending: deque[LogEntry] = deque()
        self.pending_dropped = 0  # entries that fell out of a pause buffer longer than the ring
        # filter and search
        self.filter_text: str | None = None
        self._filter_test: Callable[[str], bool] | None = None
        self._filter = _SeqIndex()
        self.search_text: str | None = None
        self._search_test: Callable[[str], bool] | None = None
        self._hits = _SeqIndex()  # entries that matched a signature
        # sources and notices
        self.notices: deque[Any] = deque(maxlen=_NOTICE_HISTORY)
        self._health: dict[str, Any] = {}
        self._recent_notice: dict[str, tuple[float, Any]] = {}
        self._labels: dict[str, str] = {}
        self._rate: deque[tuple[float, int]] = deque()

    # -- the ring ----------------------------------------------------------------------------------

    def __len__(self) -> int:
        return self.next_seq - self.first_seq

    def entry(self, seq: int) -> LogEntry | None:
        if self.first_seq <= seq < self.next_seq:
            return self._buf[seq % self.capacity]
        return None

    def _append(self, entry: LogEntry) -> None:
        seq = self.next_seq
        entry.seq = seq
        self._buf[seq % self.capacity] = entry
        self.next_seq = seq + 1
        if self.next_seq - self.first_seq > self.capacity:
            self.first_seq = self.next_seq - self.capacity
        n = len(entry.text)
        if n > self.max_width:
            self.max_width = n
        if entry.severity is not None:
            self._hits.append(seq)
        if self._filter_test is not None and self._filter_test(entry.text):
            self._filter.append(seq)

    def _append_all(self, entries: Sequence[LogEntry]) -> None:
        if not entries:
            return
        skip = len(entries) - self.capacity
        if skip > 0:
            # Earlier ones would be overwritten at once: only their sequence numbers are used up.
            self.next_seq += skip
            self.first_seq = max(self.first_seq, self.next_seq - self.capacity)
            entries = entries[skip:]
        for entry in entries:
            self._append(entry)
        self._hits.prune(self.first_seq)
        self._filter.prune(self.first_seq)
        self.version += 1

    # -- intake ------------------------------------------------------------------------------------

    def apply(self, result: IngestResult) -> None:
        """Take one ingested batch: lines and notices in the ring (or the pause buffer), findings."""
        now = self._clock()
        self._rate.append((now, self.total_lines))
        self.total_lines += result.lines
        entries = list(result.entries)
        for notice in result.notices:
            entries.append(self._notice_entry(notice, now))
        for message in result.errors:
            entries.append(self._notice_entry(_Notice("radixtop", "error", message, time.time()), now))
        if result.report is not None:
            self.report = result.report
        self._admit(entries)
        self.version += 1

    def _notice_entry(self, notice: Any, now: float) -> LogEntry:
        self.notices.append(notice)
        if notice.kind in ("rotated", "truncated", "capped", "error", "deleted", "waiting", "created"):
            self._recent_notice[notice.source] = (now, notice)
        return LogEntry(notice.source, 0, f"[{notice.kind}] {notice.message}", kind="notice")

    def add_notice(self, source: str, kind: str, message: str) -> None:
        """A notice raised by radixtop itself (a failed handler, a worker restart)."""
        self._admit([self._notice_entry(_Notice(source, kind, message, time.time()), self._clock())])
        self.version += 1

    def add_message(self, lines: Iterable[str]) -> None:
        """Guidance shown in the pane (e.g. how to point radixtop at a log); not counted as lines."""
        self._admit([LogEntry("radixtop", 0, line, kind="message") for line in lines])
        self.version += 1

    def _admit(self, entries: list[LogEntry]) -> None:
        if not entries:
            return
        if not self.paused:
            self._append_all(entries)
            return
        pending = self._pending
        pending.extend(entries)
        over = len(pending) - self.capacity
        for _ in range(max(0, over)):
            pending.popleft()
            self.pending_dropped += 1

    # -- pause -------------------------------------------------------------------------------------

    @property
    def pending_count(self) -> int:
        return len(self._pending)

    def set_paused(self, paused: bool) -> int:
        """Pause or resume the view. On resume the buffered entries enter the ring; returns how
        many had to be dropped from the view (never from the findings) because the buffer was full."""
        dropped = 0
        if self.paused and not paused:
            pending, self._pending = list(self._pending), deque()
            self.paused = False
            self._append_all(pending)
            dropped, self.pending_dropped = self.pending_dropped, 0
        self.paused = paused
        self.version += 1
        return dropped

    # -- the view (all entries, or the filtered ones) ----------------------------------------------

    @property
    def view_len(self) -> int:
        if self._filter_test is not None:
            return len(self._filter)
        return self.next_seq - self.first_seq

    def view_seq(self, row: int) -> int | None:
        """The sequence number shown at a row of the view."""
        if row < 0:
            return None
        if self._filter_test is not None:
            return self._filter[row] if row < len(self._filter) else None
        seq = self.first_seq + row
        return seq if seq < self.next_seq else None

    def row_of(self, seq: int) -> int | None:
        """The row showing seq, or None when it is not in the view (dropped, or filtered out)."""
        if not self.first_seq <= seq < self.next_seq:
            return None
        if self._filter_test is not None:
            i = self._filter.index_at_or_after(seq)
            return i if i < len(self._filter) and self._filter[i] == seq else None
        return seq - self.first_seq

    def set_filter(self, text: str | None) -> None:
        """Show only entries whose text contains `text` (smart case); None or "" shows everything."""
        if not text:
            self.filter_text, self._filter_test, self._filter = None, None, _SeqIndex()
        else:
            test = smart_case(text)
            buf, cap = self._buf, self.capacity
            seqs = [s for s in range(self.first_seq, self.next_seq) if test(buf[s % cap].text)]  # type: ignore[union-attr]
            self.filter_text, self._filter_test, self._filter = text, test, _SeqIndex(seqs)
        self.version += 1

    def set_search(self, text: str | None) -> None:
        self.search_text = text or None
        self._search_test = smart_case(text) if text else None
        self.version += 1

    def _scan_rows(self, from_row: int, forward: bool, test: Callable[[LogEntry], bool]) -> int | None:
        """The first row after (or before) from_row whose entry passes test, wrapping once."""
        n = self.view_len
        if n == 0:
            return None
        step = 1 if forward else -1
        row = from_row
        for _ in range(n):
            row = (row + step) % n
            seq = self.view_seq(row)
            entry = self.entry(seq) if seq is not None else None
            if entry is not None and test(entry):
                return row
        return None

    def find_search(self, from_row: int, forward: bool = True) -> int | None:
        """Row of the next (or previous) entry containing the search text, wrapping around."""
        test = self._search_test
        if test is None:
            return None
        return self._scan_rows(from_row, forward, lambda e: test(e.text))

    def find_hit(self, from_row: int, forward: bool = True) -> int | None:
        """Row of the next (or previous) line that matched a signature, wrapping around."""
        if not len(self._hits):
            return None
        if self._filter_test is None:
            # Fast path: the hit index is sorted by seq, and rows are seqs here.
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
        return self._scan_rows(from_row, forward, lambda e: e.severity is not None)

    def hit_seqs(self) -> Iterable[int]:
        """Sequence numbers of the entries that matched a signature, oldest first."""
        hits = self._hits
        return (hits[i] for i in range(len(hits)))

    @property
    def hit_count(self) -> int:
        return len(self._hits)

    # -- sources -----------------------------------------------------------------------------------

    def set_health(self, health: Iterable[Any]) -> None:
        changed = False
        for h in health:
            if self._health.get(h.source) != h:
                self._health[h.source] = h
                changed = True
        if changed:
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
                if state == "ok" and notice.kind in ("rotated", "truncated", "capped", "error"):
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


@dataclass(frozen=True)
class _Notice:
    source: str
    kind: str
    message: str
    time: float


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
