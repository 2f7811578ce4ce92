"""The incident state behind the live log pane. Pure Python: no Textual, no I/O.

Two halves, because matching lines against the catalog is the expensive part and must not run on
the UI's event loop:

- `Ingestor` matches a whole batch of lines in one `Matcher.scan` call (C speed) and hands only
  the hits to the FindingsBuilder (`add_hit`/`add_lines`, the builder's fast path), with the
  context, opener and batch stats the builder would have kept on its live path. Per line it does
  no Python work beyond joining the batch: at 50,000 lines/s, `FindingsBuilder.feed` (parse, match
  and ring per line) costs more than a core here. The builder keeps each finding's evidence on its
  own, so dropping old lines from the ring never loses it. It is thread-safe (one lock): the app
  runs it on the event loop (a batch costs about 1 us a line; a thread hop per batch cost more lag
  than that), and a background scan of the part of a file before where following began
  (`hold`/`add_history_hit`/`release`) feeds the same builder from another thread. While a file
  is held, or its line numbers are still being counted (see probes/logs.py), its hits wait in
  order: the builder takes a file's first occurrence as the first hit it is given.
- `IncidentState` lives on the UI side: a bounded ring of line texts (stored as they come, by
  slice assignment) with a table of the runs they came in (source, generation, line numbers), so
  that no object is kept per line; the severity marks of the few lines that matched, the pause
  buffer, the filter and search indexes, per-source health and the latest report. Widgets read
  it; the app redraws only when `version` moved.
"""

from __future__ import annotations

import bisect
import os
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import TYPE_CHECKING, Any, NamedTuple

from radixtop.diagnosis.evidence_policy import BATCH_LOOKBACK, OPENER_LOOKBACK, batch_stats_before, find_opener
from radixtop.diagnosis.logline import opens_record
from radixtop.diagnosis.severity import Severity, rank
from radixtop.probes.logs import LogRun
from radixtop.session.access_fold import AccessFolds, second_of

if TYPE_CHECKING:
    from radixtop.diagnosis.catalog import Catalog
    from radixtop.diagnosis.findings import FindingsBuilder, Report
    from radixtop.diagnosis.logline import BatchStats
    from radixtop.probes.logs import LogBatch

DEFAULT_CAPACITY = 100_000
_NOTICE_HISTORY = 200  # notices kept for the status line
_RATE_WINDOW = 2.0  # seconds of history behind the lines/s figure
_RECENT_NOTICE = 15.0  # seconds a rotation/truncation notice colours a source's health
_HEALTH_NOTICES = ("rotated", "truncated", "capped", "lost", "error")  # the notices that do
_MAX_INGEST_ERRORS = 5  # per Ingestor: after this many failures, count them silently
AFTER_WAIT = 0.5  # seconds a first occurrence waits for its context_after before it is reported
HELD_HITS_MAX = 50_000  # hits kept waiting for earlier parts of files to be scanned, at most


class Mark(NamedTuple):
    """What a matched line gets: its worst severity, the signatures and the first one's span."""

    severity: str
    sig_ids: tuple[str, ...]
    span: tuple[int, int] | None


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
        self.kind = kind  # "line", "fold" (counted access lines), "notice" (from the probe or radixtop) or "message" (guidance)

    def __repr__(self) -> str:
        return f"LogEntry(seq={self.seq}, {self.kind}, {self.source}:{self.lineno}, {self.severity}, {self.text!r})"


@dataclass(frozen=True)
class IngestResult:
    records: Sequence[Any]  # a LogLines (its .runs are used), or LogRecord-likes, in order
    marks: dict[int, Mark] = field(default_factory=dict)  # index in records -> its mark
    notices: tuple[Any, ...] = ()  # LogNotice-likes: .source .kind .message .time
    report: Report | None = None  # a fresh diagnosis Report when the findings changed, else None
    lines: int = 0  # file lines in this result (for the totals)
    errors: tuple[str, ...] = ()  # one-line descriptions of what the diagnosis failed on
    max_len: int = 0  # longest text in records
    skipped: tuple[Any, ...] = ()  # SkippedLines the batch carried: parts of files to scan


def runs_of(records: Sequence[Any]) -> list[LogRun]:
    """The records as runs: a LogLines' own runs, or consecutive LogRecord-likes of one file
    generation with consecutive line numbers grouped (tests and other callers pass those)."""
    runs = getattr(records, "runs", None)
    if runs is not None:
        return list(runs)
    out: list[LogRun] = []
    last: Any = None
    for r in records:
        if (
            last is not None
            and r.source == last.source
            and r.generation == last.generation
            and r.lineno == last.lineno_or_none + len(last.texts)
        ):
            last.texts.append(r.text)
        else:
            last = LogRun(r.source, r.generation, r.lineno, [r.text], getattr(r, "received", 0.0))
            out.append(last)
    return out


def finding_file(source: str, generation: int) -> str:
    """The file name a finding's occurrence carries: after a rotation, line numbers restart."""
    return source if generation == 0 else f"{source} (generation {generation})"


class _Hit:
    """A hit on its way to the builder; a file's first hit of a signature first waits for the
    lines after it (its context_after), and the hits behind it wait too, to keep their order."""

    __slots__ = ("after", "batch", "before", "file", "index", "need", "offset", "opener", "run", "since", "text")

    def __init__(self, file: str, run: LogRun, offset: int, text: str, index: int, since: float) -> None:
        # The line number comes from the run when the hit is sent: it may still be being counted.
        self.file, self.run, self.offset, self.text, self.index, self.since = file, run, offset, text, index, since
        self.before: tuple[str, ...] = ()
        self.batch: dict[str, BatchStats] = {}
        self.opener: str | None = None
        self.after: list[str] = []
        self.need = 0


class _FileTrack:
    __slots__ = ("failure_seen", "first_seen", "held", "queue", "recent")

    def __init__(self, keep: int) -> None:
        self.held = False  # the part of the file before where following began is being scanned
        self.recent: deque[str] = deque(maxlen=keep)  # the file's last lines, before the current run
        self.first_seen: set[int] = set()  # signature indices already hit in this file
        self.failure_seen = False
        self.queue: deque[_Hit] = deque()


class Ingestor:
    """Thread side: LogBatch -> IngestResult. Thread-safe (one lock), so `flush` may run beside
    `process` from another thread."""

    def __init__(self, builder: FindingsBuilder, catalog: Catalog, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._builder = builder
        self._matcher = builder.matcher
        self._context = builder.context
        self._after = builder.after
        self._clock = clock
        sigs = list(self._matcher.signatures)
        self._ids = tuple(sig.id for sig in sigs)
        self._severity = tuple(sig.severity for sig in sigs)
        self._rank = tuple(rank(sig.severity) for sig in sigs)
        self._raw = tuple(sig.pattern for sig in sigs)
        self._patterns: dict[int, re.Pattern[str] | None] = {}
        self._files: dict[str, _FileTrack] = {}
        self._generation: dict[str, int] = {}  # newest generation seen per source
        self._keep = max(self._context, BATCH_LOOKBACK, OPENER_LOOKBACK)
        self._lock = threading.Lock()
        self._send_errors: list[str] = []  # failures while handing hits over, for the next result
        self._errors = 0
        self.failed = 0

    # -- helpers -------------------------------------------------------------------------------

    def _span(self, index: int, text: str) -> tuple[int, int] | None:
        if index in self._patterns:
            pattern = self._patterns[index]
        else:
            try:
                pattern = re.compile(self._raw[index])
            except re.error:
                pattern = None
            self._patterns[index] = pattern
        if pattern is None:
            return None
        m = pattern.search(text)
        return m.span() if m else None

    def _error(self, errors: list[str], message: str) -> None:
        self.failed += 1
        self._errors += 1
        if self._errors <= _MAX_INGEST_ERRORS:
            errors.append(message)

    # -- the batch path ------------------------------------------------------------------------

    def process(self, batch: LogBatch) -> IngestResult:
        records = batch.records
        runs = runs_of(records)
        skipped = tuple(getattr(batch, "skipped", ()))
        marks: dict[int, Mark] = {}
        errors: list[str] = []
        max_len = 0
        n = 0
        with self._lock:
            for part in skipped:  # their lines arrive in this batch or later: hold them first
                self._track(finding_file(part.source, part.generation)).held = True
            delivered = False
            i = 0
            while i < len(runs):
                first = runs[i]
                source, generation = first.source, first.generation
                j = i + 1
                while j < len(runs) and runs[j].source == source and runs[j].generation == generation:
                    j += 1
                group = runs[i:j]
                texts = group[0].texts if j == i + 1 else list(chain.from_iterable(r.texts for r in group))
                if texts:
                    max_len = max(max_len, max(map(len, texts)))
                    if generation > self._generation.get(source, 0):
                        self._retire_generations(source, generation)
                    try:
                        delivered |= self._run(finding_file(source, generation), group, n, texts, marks)
                    except Exception as exc:  # the lines are still shown, unmatched
                        self._error(errors, f"diagnosis failed on {source} ({len(texts)} lines): {exc!r}")
                    n += len(texts)
                i = j
            try:
                self._builder.add_lines(n)
                delivered |= self._release_if_too_many(errors)
                delivered |= self._deliver_due(self._clock(), AFTER_WAIT)
                report = self._builder.report() if delivered else None
            except Exception as exc:
                report = None
                self._error(errors, f"building the findings report failed: {exc!r}")
            errors += self._send_errors
            self._send_errors = []
        return IngestResult(records, marks, tuple(batch.notices), report, n, tuple(errors), max_len, skipped)

    def _track(self, file: str) -> _FileTrack:
        track = self._files.get(file)
        if track is None:
            track = self._files[file] = _FileTrack(self._keep)
        return track

    # -- the part of a file before where following began (scanned on another thread) -------------

    def hold(self, file: str) -> None:
        """Keep the file's hits waiting until release(): an earlier part of it is being scanned."""
        with self._lock:
            self._track(file).held = True

    def add_history_hit(
        self,
        file: str,
        lineno: int,
        text: str,
        index: int,
        context_before: Sequence[str],
        batch_before: Mapping[str, BatchStats],
        *,
        context_after: Sequence[str] = (),
        opener: str | None = None,
    ) -> None:
        """A hit the background scan found before where following began (in line order)."""
        with self._lock:
            track = self._track(file)
            track.first_seen.add(index)
            if self._rank[index] >= Severity.ERROR:
                track.failure_seen = True
            try:
                self._builder.add_hit(
                    file, lineno, text, index, context_before, batch_before, context_after=context_after, opener=opener
                )
            except Exception as exc:
                self._error(self._send_errors, f"diagnosis failed on {file}:{lineno}: {exc!r}")

    def release(self, file: str, lines: int, note: str | None = None) -> IngestResult:
        """The earlier part of `file` (its first `lines` lines) is scanned: count them, and let the
        hits that waited go to the builder after the scan's."""
        errors: list[str] = [note] if note else []
        with self._lock:
            try:
                self._builder.add_lines(lines)
                track = self._track(file)
                track.held = False
                self._deliver(track)
                report = self._builder.report()
            except Exception as exc:
                report = None
                self._error(errors, f"building the findings report failed: {exc!r}")
            errors += self._send_errors
            self._send_errors = []
        return IngestResult((), report=report, lines=0, errors=tuple(errors))

    def _release_if_too_many(self, errors: list[str]) -> bool:
        """Memory stays bounded: past HELD_HITS_MAX waiting hits, the held files let theirs go
        (their first occurrences may then be later lines than the scan will find)."""
        held = [t for t in self._files.values() if t.held]
        if not held or sum(len(t.queue) for t in held) <= HELD_HITS_MAX:
            return False
        sent = False
        for track in held:
            track.held = False
            sent |= self._deliver(track)
        self._error(
            errors,
            f"more than {HELD_HITS_MAX:,} signature hits came in while the earlier part of the logs was "
            "still being scanned; they were reported first, so a finding may show a later first occurrence",
        )
        return sent

    def _retire_generations(self, source: str, generation: int) -> None:
        """A rotated-away file is read to its end before the new one starts, so two generations
        back is done: send its waiting hits and forget its lines (memory stays bounded however
        often the file rotates)."""
        self._generation[source] = generation
        for old in range(max(0, generation - 8), generation - 1):
            file = finding_file(source, old)
            track = self._files.get(file)
            if track is None or track.held or not all(hit.run.numbered for hit in track.queue):
                continue  # still waiting for its earlier part or its line count: not yet
            del self._files[file]
            while track.queue:
                self._send(track.queue.popleft())

    def _run(self, file: str, runs: Sequence[LogRun], base: int, texts: list[str], marks: dict[int, Mark]) -> bool:
        """Consecutive lines of one file (one or more runs): match them all at once, queue the hits."""
        track = self._track(file)
        for hit in track.queue:  # earlier hits still collecting their context_after
            if hit.need:
                take = texts[: hit.need]
                hit.after.extend(take)
                hit.need -= len(take)
        data = ("\n".join(texts) + "\n").encode("utf-8", "replace")
        hits = self._matcher.scan(data)
        if hits:
            now = self._clock()
            by_line: dict[int, list[int]] = {}
            line, pos = 0, 0
            for end, index in hits:  # sorted by offset: count the newlines in between
                line += data.count(b"\n", pos, end)
                pos = end
                by_line.setdefault(line, []).append(index)
            starts = [0]
            for run in runs[:-1]:
                starts.append(starts[-1] + len(run.texts))
            for k, indices in by_line.items():
                text = texts[k]
                worst = max(indices, key=lambda i: self._rank[i])
                marks[base + k] = Mark(self._severity[worst], tuple(self._ids[i] for i in indices), self._span(worst, text))
                r = bisect.bisect_right(starts, k) - 1
                for index in indices:
                    track.queue.append(self._hit(track, file, runs[r], k - starts[r], text, index, texts, k, now))
        track.recent.extend(texts)
        return self._deliver(track)

    def _hit(
        self, track: _FileTrack, file: str, run: LogRun, offset: int, text: str, index: int, texts: list[str], k: int, now: float
    ) -> _Hit:
        hit = _Hit(file, run, offset, text, index, now)
        recent = track.recent
        if index not in track.first_seen:
            # Only a file's first hit of a signature can become a finding's first occurrence:
            # only it needs the lines around it.
            track.first_seen.add(index)
            if self._context:
                before = texts[max(0, k - self._context) : k]
                if len(before) < self._context:
                    missing = self._context - len(before)
                    before = list(recent)[-missing:] + before
                hit.before = tuple(before)
            hit.after = texts[k + 1 : k + 1 + self._after]
            hit.need = self._after - len(hit.after)
        if self._rank[index] >= Severity.ERROR and not track.failure_seen:
            track.failure_seen = True
            hit.batch = self._batch_before(recent, texts[:k])
        if not opens_record(text):
            hit.opener = self._opener(recent, texts, k)
        return hit

    @staticmethod
    def _opener(recent: deque[str], texts: list[str], k: int) -> str | None:
        """The line that opened the record a continuation line (a traceback's body) belongs to."""
        found = find_opener(chain(reversed(texts[:k]), reversed(recent)))
        return found[1] if found else None

    @staticmethod
    def _batch_before(recent: deque[str], texts: list[str]) -> dict[str, BatchStats]:
        window = "\n".join([*recent, *texts]).encode("utf-8", "replace")
        return batch_stats_before(window)

    def _deliver(self, track: _FileTrack) -> bool:
        """Hand the queue's ready hits to the builder, in order; True when any went."""
        queue = track.queue
        sent = False
        if track.held:
            return False
        while queue and queue[0].need <= 0 and queue[0].run.numbered:
            self._send(queue.popleft())
            sent = True
        return sent

    def _deliver_due(self, now: float, max_age: float) -> bool:
        """Hits that waited max_age for lines after them go with the lines they have (never
        before their line numbers are known, nor while their file is held)."""
        sent = False
        for track in self._files.values():
            queue = track.queue
            if track.held:
                continue
            while queue and (queue[0].need <= 0 or now - queue[0].since >= max_age) and queue[0].run.numbered:
                self._send(queue.popleft())
                sent = True
        return sent

    def _send(self, hit: _Hit) -> None:
        try:
            self._builder.add_hit(
                hit.file,
                hit.run.first_lineno + hit.offset,
                hit.text,
                hit.index,
                hit.before,
                hit.batch,
                context_after=tuple(hit.after[: self._after]),
                opener=hit.opener,
            )
        except Exception as exc:  # this hit is lost to the findings, the others still go
            first = hit.run.lineno_or_none  # known: a hit is sent once its run is numbered
            where = hit.file if first is None else f"{hit.file}:{first + hit.offset}"
            self._error(self._send_errors, f"diagnosis failed on {where}: {exc!r}")

    def flush(self, max_age: float = AFTER_WAIT) -> IngestResult | None:
        """Report first occurrences whose lines-after did not all come within max_age (the server
        died on that line, say). Called on a timer; None when nothing was waiting that long."""
        errors: list[str] = []
        with self._lock:
            try:
                if not self._deliver_due(self._clock(), max_age):
                    return None
                report = self._builder.report()
            except Exception as exc:
                self._error(errors, f"building the findings report failed: {exc!r}")
                report = None
            errors += self._send_errors
            self._send_errors = []
        return IngestResult((), report=report, errors=tuple(errors))

    @property
    def files_tracked(self) -> int:
        """Files (generations) whose recent lines are kept for context."""
        with self._lock:
            return len(self._files)

    @property
    def waiting(self) -> int:
        """Hits still waiting for their context_after."""
        return sum(len(t.queue) for t in self._files.values())

    def has_waiting(self) -> bool:
        """Whether a hit waits for its context_after: only then has flush() anything to do (the
        app's timer asks several times a second; the history scan's thread may add files meanwhile,
        so the values are copied in one C call rather than iterated)."""
        return any(t.queue for t in list(self._files.values()))


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
        A line whose number is still being counted (see probes/logs.py) has lineno 0 until then."""
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
                self._pending[0] = (_skip(old, over), {k - over: m for k, m in old_marks.items() if k >= over}, old_n - over)
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

    def row_near(self, seq: int) -> int:
        """The row of seq, or of the first entry after it in the view (the last row if none)."""
        if self._filter_test is not None:
            return min(self._filter.index_at_or_after(seq), max(0, len(self._filter) - 1))
        hidden = self.folds.hidden_before(seq) if self.fold_access else 0
        return min(max(0, seq - self.first_seq - hidden), max(0, self.view_len - 1))

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
