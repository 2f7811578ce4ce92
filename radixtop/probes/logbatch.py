"""What the log follower hands its consumer: batches of lines, notices and each source's health.

Lines travel as runs (`LogRun`: one object per read, holding the list of line texts), not as one
object per line: `LogBatch.records` is a `LogLines` sequence that builds a `LogRecord` only for the
lines a consumer indexes or iterates, so a consumer that takes the runs (the TUI) creates no object
per line. A run read before the lines above it were counted (probes/backlog.py) gives its line
numbers when the count is done (`LogRun.numbered` says whether it is; asking for `first_lineno` or
a `LogRecord` earlier waits for it).
"""

from __future__ import annotations

import gc
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate, repeat
from typing import TYPE_CHECKING, Literal, overload

if TYPE_CHECKING:
    from radixtop.probes.backlog import Numbering, SkippedLines

__all__ = ["HealthState", "LogBatch", "LogLines", "LogNotice", "LogRecord", "LogRun", "NoticeKind", "SourceHealth"]


@dataclass(frozen=True, slots=True)
class LogRecord:
    source: str  # the path this line came from, as given or as matched by the glob
    lineno: int  # 1-based, within the current generation of that file
    text: str  # decoded, newline/CR removed, ANSI stripped, capped at max_line chars + marker
    generation: int  # 0 for the first file seen at that path; +1 per rotation or truncation
    received: float  # time.monotonic() when the reader thread read it


NoticeKind = Literal["waiting", "created", "rotated", "truncated", "lost", "deleted", "error", "capped", "compressed"]
HealthState = Literal["ok", "waiting", "deleted", "error"]


@dataclass(frozen=True, slots=True)
class LogNotice:
    source: str
    kind: NoticeKind
    message: str
    time: float  # time.time()


@dataclass(frozen=True, slots=True)
class LogBatch:
    records: Sequence[LogRecord]  # a LogLines from the follower (its .runs hold the texts)
    notices: tuple[LogNotice, ...]
    skipped: tuple[SkippedLines, ...] = ()  # with history=True: parts before where following began


@dataclass(frozen=True, slots=True)
class SourceHealth:
    source: str
    state: HealthState
    detail: str
    lines: int  # lines read so far, all generations together
    last_line_at: float | None  # time.monotonic() of the last line read


class _RecordBuilder:
    """Same slot layout as LogRecord, but mutable, so that its __init__ is plain fast attribute stores.

    A frozen dataclass's __init__ goes through object.__setattr__ per field: about 1.1 us per
    record here, a fifth of a core at 200k lines/s on its own. Building this twin and then assigning
    __class__ (CPython allows it between classes with identical __slots__) costs about a third of
    that and yields genuine LogRecord instances (equality, hashing, immutability all LogRecord's).
    """

    __slots__ = ("source", "lineno", "text", "generation", "received")

    def __init__(self, source: str, lineno: int, text: str, generation: int, received: float) -> None:
        self.source = source
        self.lineno = lineno
        self.text = text
        self.generation = generation
        self.received = received


def _make_records(
    source: str, first_lineno: int, texts: list[str], generation: int, received: float
) -> list[LogRecord]:
    # The cyclic GC is paused while a chunk's records are built. They hold only str/int/float, so
    # they can never be part of a cycle, yet left alone the GC would run a collection per 700 of
    # them and, once the app keeps many (its ring buffer), a full one every ~70,000, which
    # doubles the cost per line. Textual pauses the GC the same way while it scrolls.
    gc_was_enabled = gc.isenabled()
    if gc_was_enabled:
        gc.disable()
    try:
        linenos = range(first_lineno, first_lineno + len(texts))
        records = list(
            map(_RecordBuilder, repeat(source), linenos, texts, repeat(generation), repeat(received))
        )
        for record in records:
            record.__class__ = LogRecord  # type: ignore[assignment]  # the __slots__ twin swap above
    finally:
        if gc_was_enabled:
            gc.enable()
    return records  # type: ignore[return-value]


class LogRun:
    """Consecutive lines of one file generation, read together: one object per read, not per line.

    `texts` must not be changed. `first_lineno` is the first line's 1-based number; for a run read
    before the lines above it were counted it waits for that count (`numbered` says whether it
    would wait); `lineno_or_none` never waits. `raw`, where the reader had it: the texts joined
    by newlines, as UTF-8 (the bytes it read, which decoded to them unchanged), for a matcher to
    scan without joining and encoding them again; `take_raw` hands it over once.
    """

    __slots__ = ("_first", "_numbering", "_raw", "_widest", "generation", "received", "source", "texts")

    def __init__(
        self,
        source: str,
        generation: int,
        first_lineno: int,
        texts: list[str],
        received: float,
        numbering: Numbering | None = None,
        widest: int | None = None,
        raw: bytes | None = None,
    ) -> None:
        self.source = source
        self.generation = generation
        self._first = first_lineno  # relative to numbering.base while a count is pending
        self.texts = texts
        self.received = received
        self._numbering = numbering
        self._widest = widest  # the reader's split measured it already; else measured when asked
        self._raw = raw

    def __len__(self) -> int:
        return len(self.texts)

    def __repr__(self) -> str:
        return (
            f"LogRun({self.source!r}, gen {self.generation}, from line {self.lineno_or_none}, {len(self.texts)} lines)"
        )

    @property
    def widest(self) -> int:
        """The longest line's length in characters (0 for no lines)."""
        widest = self._widest
        if widest is None:
            widest = self._widest = max(map(len, self.texts), default=0)
        return widest

    def take_raw(self) -> bytes | None:
        """`raw` (see the class), then None: its one reader takes it, and the ring that keeps the
        run keeps the texts alone."""
        raw, self._raw = self._raw, None
        return raw

    @property
    def numbered(self) -> bool:
        numbering = self._numbering
        return numbering is None or numbering.done.is_set()

    @property
    def first_lineno(self) -> int:
        numbering = self._numbering
        if numbering is None:
            return self._first
        numbering.done.wait()
        return numbering.base + self._first

    @property
    def lineno_or_none(self) -> int | None:
        numbering = self._numbering
        if numbering is None:
            return self._first
        return numbering.base + self._first if numbering.done.is_set() else None

    def part(self, start: int, stop: int) -> LogRun:
        """Lines start..stop-1 of this run, as a run of their own."""
        return LogRun(
            self.source, self.generation, self._first + start, self.texts[start:stop], self.received, self._numbering
        )

    def records(self) -> list[LogRecord]:
        return _make_records(self.source, self.first_lineno, self.texts, self.generation, self.received)


class LogLines(Sequence[LogRecord]):
    """The lines of a batch as runs. Indexing and iterating build genuine LogRecords on demand;
    a consumer that reads `runs` (source, generation, first_lineno, texts) builds none."""

    __slots__ = ("_ends", "runs")

    def __init__(self, runs: Sequence[LogRun] = ()) -> None:
        self.runs: tuple[LogRun, ...] = tuple(runs)
        self._ends = list(accumulate(len(run.texts) for run in self.runs))

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    def __iter__(self) -> Iterator[LogRecord]:
        for run in self.runs:
            yield from run.records()

    @overload
    def __getitem__(self, index: int) -> LogRecord: ...
    @overload
    def __getitem__(self, index: slice) -> LogLines: ...
    def __getitem__(self, index: int | slice) -> LogRecord | LogLines:
        n = len(self)
        if isinstance(index, slice):
            start, stop, step = index.indices(n)
            if step != 1:
                raise ValueError("LogLines slices take a step of 1")
            return LogLines(self._cut(start, stop))
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError("LogLines index out of range")
        k = bisect_right(self._ends, index)
        run = self.runs[k]
        i = index - (self._ends[k - 1] if k else 0)
        return _make_records(run.source, run.first_lineno + i, [run.texts[i]], run.generation, run.received)[0]

    def _cut(self, start: int, stop: int) -> list[LogRun]:
        out = []
        begin = 0
        for run, end in zip(self.runs, self._ends):
            if end > start and begin < stop:
                a, b = max(start, begin) - begin, min(stop, end) - begin
                out.append(run if (a, b) == (0, len(run.texts)) else run.part(a, b))
            begin = end
        return out

    def __repr__(self) -> str:
        return f"LogLines({len(self)} lines in {len(self.runs)} runs)"
