"""Match the log pane's lines against the catalog and feed the hits to the findings. Pure Python:
no Textual, no I/O.

Matching is the expensive part of the log pane, so it is done per batch, not per line:
`Ingestor` matches a whole batch of lines in one `Matcher.scan` call (C speed) and hands only the
hits to the FindingsBuilder (`add_hit`/`add_lines`, the builder's fast path), with the context,
opener and batch stats the builder would have kept on its live path. Per line it does no Python
work beyond joining the batch: at 50,000 lines/s, `FindingsBuilder.feed` (parse, match and ring per
line) costs more than a core here. The builder keeps each finding's evidence on its own, so
dropping old lines from the ring (session/incident_state.py) never loses it.

It is thread-safe (one lock): the app runs it on the event loop (a batch costs about 1 us a line;
a thread hop per batch cost more lag than that), and a background scan of the part of a file
before where following began (`hold`/`add_history_hit`/`release`, session/history.py) feeds the
same builder from another thread. While a file is held, or its line numbers are still being
counted (see probes/backlog.py), its hits wait in order: the builder takes a file's first occurrence
as the first hit it is given. What it returns, an `IngestResult`, is what `IncidentState.apply`
takes.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import TYPE_CHECKING, Any, NamedTuple

from radixtop.diagnosis.evidence_policy import BATCH_LOOKBACK, OPENER_LOOKBACK, batch_stats_before, find_opener
from radixtop.diagnosis.logline import opens_record
from radixtop.diagnosis.matcher import Matcher, literal_signatures, span_search
from radixtop.diagnosis.severity import Severity, rank
from radixtop.probes.logbatch import LogRun
from radixtop.session.needles import NEEDLES, NeedleLines

if TYPE_CHECKING:
    from radixtop.diagnosis.catalog import Catalog
    from radixtop.diagnosis.findings import FindingsBuilder, Report
    from radixtop.diagnosis.logline import BatchStats
    from radixtop.probes.logbatch import LogBatch

_MAX_INGEST_ERRORS = 5  # per Ingestor: after this many failures, count them silently
AFTER_WAIT = 0.5  # seconds a first occurrence waits for its context_after before it is reported
HELD_HITS_MAX = 50_000  # hits kept waiting for earlier parts of files to be scanned, at most


class Mark(NamedTuple):
    """What a matched line gets: its worst severity, the signatures and the first one's span."""

    severity: str
    sig_ids: tuple[str, ...]
    span: tuple[int, int] | None


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
    needles: NeedleLines | None = None  # the lines holding session.needles.NEEDLES (None: not looked for)


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


def _raw_of(runs: Sequence[LogRun]) -> bytes | None:
    """The runs' lines joined by newlines as UTF-8, from the bytes the reader kept (LogRun.raw);
    None unless every run has them."""
    raws = [run.take_raw() for run in runs]
    if any(raw is None for raw in raws):
        return None
    return raws[0] if len(raws) == 1 else b"\n".join(raws)  # type: ignore[arg-type]


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

    def __init__(
        self, builder: FindingsBuilder, catalog: Catalog, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._builder = builder
        self._context = builder.context
        self._after = builder.after
        self._clock = clock
        sigs = list(builder.matcher.signatures)
        # The signatures and the needles in one pass over each batch (session/needles.py).
        self._matcher = Matcher([*sigs, *literal_signatures(NEEDLES)], engine=builder.matcher.engine)
        self._signatures = len(sigs)
        self._ids = tuple(sig.id for sig in sigs)
        self._severity = tuple(sig.severity for sig in sigs)
        self._rank = tuple(rank(sig.severity) for sig in sigs)
        self._raw = tuple(sig.pattern for sig in sigs)
        self._spans: dict[int, Callable[[str], tuple[int, int] | None] | None] = {}
        self._files: dict[str, _FileTrack] = {}
        self._generation: dict[str, int] = {}  # newest generation seen per source
        self._keep = max(self._context, BATCH_LOOKBACK, OPENER_LOOKBACK)
        self._lock = threading.Lock()
        self._send_errors: list[str] = []  # failures while handing hits over, for the next result
        self._errors = 0
        self.failed = 0

    # -- helpers -------------------------------------------------------------------------------

    def _span(self, index: int, text: str) -> tuple[int, int] | None:
        if index in self._spans:
            span = self._spans[index]
        else:
            span = self._spans[index] = span_search(self._raw[index])  # never `re` on a nested repeat
        return span(text) if span is not None else None

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
        needles: dict[str, list[int]] = {}
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
                    max_len = max(max_len, *(run.widest for run in group))
                    if generation > self._generation.get(source, 0):
                        self._retire_generations(source, generation)
                    try:
                        delivered |= self._run(finding_file(source, generation), group, n, texts, marks, needles)
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
        return IngestResult(
            records, marks, tuple(batch.notices), report, n, tuple(errors), max_len, skipped, NeedleLines(needles)
        )

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

    def _run(
        self, file: str, runs: Sequence[LogRun], base: int, texts: list[str], marks: dict[int, Mark],
        needles: dict[str, list[int]],
    ) -> bool:
        """Consecutive lines of one file (one or more runs): match them all at once, queue the hits;
        the lines holding a needle go to `needles`, numbered from the batch's first line."""
        track = self._track(file)
        for hit in track.queue:  # earlier hits still collecting their context_after
            if hit.need:
                take = texts[: hit.need]
                hit.after.extend(take)
                hit.need -= len(take)
        hits = self._matcher.line_hits(texts, _raw_of(runs))
        signatures = self._signatures
        found = [hit for hit in hits if hit[1] >= signatures]
        if found:
            for line, index in found:
                needles.setdefault(NEEDLES[index - signatures], []).append(base + line)
            hits = [hit for hit in hits if hit[1] < signatures]
        if hits:
            now = self._clock()
            by_line: dict[int, list[int]] = {}
            for line, index in hits:
                by_line.setdefault(line, []).append(index)
            starts = [0]
            for run in runs[:-1]:
                starts.append(starts[-1] + len(run.texts))
            for k, indices in by_line.items():
                text = texts[k]
                worst = max(indices, key=lambda i: self._rank[i])
                marks[base + k] = Mark(
                    self._severity[worst], tuple(self._ids[i] for i in indices), self._span(worst, text)
                )
                r = bisect.bisect_right(starts, k) - 1
                for index in indices:
                    track.queue.append(self._hit(track, file, runs[r], k - starts[r], text, index, texts, k, now))
        track.recent.extend(texts[-self._keep :])  # the deque keeps no more: copy no more
        return self._deliver(track)

    def _hit(
        self, track: _FileTrack, file: str, run: LogRun, offset: int, text: str, index: int, texts: list[str], k: int,
        now: float,
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
