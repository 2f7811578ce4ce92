"""Findings: what matched, where it first happened, which rank started it, and the fingerprint.

Two ways in, one report out:
- ``feed(file, lineno, text)``: the live path, one line at a time (tens of thousands a second).
  Each line costs one prefix check, one ``Matcher.match`` and a ring append; the time/rank prefix
  is parsed only for a hit or a batch-stats line.
- ``add_hit(...)`` + ``add_lines(n)``: the fast-scan path, where the scanner found the hits and
  hands over their context.

Ordering rules (documented because clock skew between files is a fact of life):
- An occurrence's time is its line's own timestamp; a line without one (a traceback body, the
  second line of a multi-line message) takes the time and rank of the line that opened its record.
  A file's first occurrence of a signature on a line that opens no record, left without a rank by
  both (a bare "CUDA error: ..." line), takes the rank the lines after it hand back
  (logline.rank_ahead: PyTorch's tags within a few lines, before any other record starts). The
  live path waits for those lines; the fast-scan path reads them from context_after.
- Occurrences are ordered by (epoch, file order, line): the epoch as written, shifted by the
  file's entry in ``clock_offsets`` when one is given (seconds added to that file's times); file
  order is the order in which files were first seen. A line with no time of its own or of its
  record takes the place of its file's last timed occurrence (or sorts first if none). No skew
  is guessed: hosts whose clocks disagree by more than the gap between two ranks' first warnings
  can make the wrong rank look first. ``first_by_rank`` (each rank's first warning-or-worse) shows
  that gap so a reader can judge it, and ``clock_offsets`` corrects a known skew. A file another
  node wrote (``node_of(file)`` names the node and its clock's correction) takes that correction,
  and the ranks its lines name are tagged with the node ("node2 TP3"), so ranks of different nodes
  never merge and the initiating rank says where it ran.
- Within one file, the first occurrence of a signature is the first in line order.
- Initiating = the earliest warning-or-worse occurrence of a cause (a signature's role, see
  catalog.py); with no cause logged, the earliest consequence, then the earliest notice, where one
  that names a rank goes before any that names none: a rankless consequence is the parent's
  ("SIGQUIT received ... one child failed", which can be written before the child's own line) and
  says which process reacted, not which one failed. A cause
  inside a traceback names the record it belongs to: of the causes in that record (a frame line
  such as "in cache_finished_req", then the exception line), the last one, which says what failed.
  Fingerprint = for the first error or critical occurrence, the last info-level occurrence before
  it and the first warning after that info (or, with none there, the first warning before the
  error); complete when info < warn < error.
- batch_at_failure = per rank, the last batch stats line before the first error or critical
  occurrence. A file stops recording batch stats at its own first error.

Memory is bounded: a ring of ``context`` lines per file, ``after`` lines per pending finding, a
few dozen batch stats per rank and info occurrences per file. The whole log is never kept.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from radixtop.diagnosis.catalog import ROLES, Catalog, Signature
from radixtop.diagnosis.evidence_policy import CONTEXT_BEFORE, OPENER_LOOKBACK, find_opener
from radixtop.diagnosis.logline import (
    RANK_LOOKAHEAD,
    BatchStats,
    LogLine,
    opens_record,
    parse_line,
    rank_ahead,
    rank_handed_back,
    strip_ansi,
)
from radixtop.diagnosis.severity import Severity

if TYPE_CHECKING:
    from radixtop.diagnosis.matcher import Matcher

__all__ = ["Occurrence", "Finding", "Fingerprint", "Report", "FindingsBuilder", "NodeClock"]

_INFO = Severity.INFO
_WARNING = Severity.WARNING
_ERROR = Severity.ERROR
_BATCH_HISTORY = 64  # batch lines kept per (file, rank) to answer "last before the failure"
_INFO_HISTORY = 32  # info occurrences kept per file for the fingerprint
_ACTIVE_FILES = 64  # files that keep a context ring; the least recently fed beyond this drop theirs

# Where an occurrence stands in time across files: (epoch, file order, line number).
_Key = tuple[float, int, int]


# A NamedTuple, not a dataclass: `radixtop scan` starts without importing dataclasses (and inspect).
class Occurrence(NamedTuple):
    file: str
    line: int  # 1-based
    time: str | None  # as written
    epoch: float | None  # for ordering (includes any clock offset given for the file)
    rank: str | None
    text: str

    def to_json(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "line": self.line,
            "time": self.time,
            "epoch": self.epoch,  # the time on this node's clock: scans across nodes line up by it
            "rank": self.rank,
            "text": self.text,
        }


class Finding(NamedTuple):
    signature: Signature
    count: int  # type: ignore[assignment]  # shadows tuple.count, which nothing here calls
    first: Occurrence
    context_before: tuple[str, ...]
    context_after: tuple[str, ...]


class Fingerprint(NamedTuple):
    info: Occurrence | None
    warn: Occurrence | None
    error: Occurrence | None
    complete: bool
    # Which signatures the three occurrences belong to (same order).
    info_signature: str | None = None
    warn_signature: str | None = None
    error_signature: str | None = None

    def to_json(self) -> dict[str, Any]:
        def one(sig_id: str | None, occ: Occurrence | None) -> dict[str, Any] | None:
            return None if occ is None else {"signature": sig_id, **occ.to_json()}

        return {
            "complete": self.complete,
            "info": one(self.info_signature, self.info),
            "warn": one(self.warn_signature, self.warn),
            "error": one(self.error_signature, self.error),
        }


class Report(NamedTuple):
    lines: int
    findings: tuple[Finding, ...]
    initiating: tuple[str, Occurrence] | None
    fingerprint: Fingerprint | None
    batch_at_failure: dict[str, BatchStats]
    # Each rank's first warning-or-worse occurrence ("" for lines without a rank), earliest first.
    first_by_rank: Mapping[str, tuple[str, Occurrence]]
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        findings = []
        for f in self.findings:
            findings.append(
                {
                    "signature": f.signature.id,
                    "severity": f.signature.severity,
                    "count": f.count,
                    "first": f.first.to_json(),
                    "context_before": list(f.context_before),
                    "title": f.signature.title,
                    "subsystem": f.signature.subsystem,
                    "role": f.signature.role,
                    "context_after": list(f.context_after),
                }
            )
        initiating = None
        if self.initiating is not None:
            sig_id, occ = self.initiating
            initiating = {"signature": sig_id, "rank": occ.rank, "file": occ.file, "line": occ.line}
        return {
            "lines": self.lines,
            "findings": findings,
            "initiating": initiating,
            "fingerprint": None if self.fingerprint is None else self.fingerprint.to_json(),
            "batch_at_failure": {
                rank: stats._asdict() for rank, stats in self.batch_at_failure.items()
            },
            "first_by_rank": {
                rank: {"signature": sig_id, **occ.to_json()}
                for rank, (sig_id, occ) in self.first_by_rank.items()
            },
            "notes": list(self.notes),
        }


def _initiating(states: list[_FindingState]) -> tuple[str, Occurrence] | None:
    """(signature id, first occurrence) of the initiating finding; `states` in occurrence order."""
    for role in ROLES:
        found = [s for s in states if s.signature.role == role and s.signature.level >= _WARNING]
        if not found:
            continue
        if role != "cause":  # a reaction that names a rank says more than the parent's rankless one
            found = [s for s in found if s.first.rank] or found
        first = found[0]
        if first.record and first.record[1]:  # a known record: its last cause names it
            first = max((s for s in found if s.record == first.record), key=lambda s: s.key)
        return first.signature.id, first.first
    return None


# -- the builder ----------------------------------------------------------------------------------


class _FileState:
    __slots__ = (
        "name",
        "order",
        "offset",
        "node",
        "ring",
        "opener",
        "opener_line",
        "opener_parsed",
        "pending",
        "frozen",
        "infos",
        "last_epoch",
        "waiting",
    )

    def __init__(self, name: str, order: int, offset: float, context: int, node: str = "") -> None:
        self.name = name
        self.order = order
        self.offset = offset
        self.node = node  # the node that wrote the file ("": this one)
        self.ring: deque[str] = deque(maxlen=context)  # the lines before the current one
        self.opener: str | None = None  # the last line that opened a record
        self.opener_line = 0  # its line number (0: none yet)
        self.opener_parsed: LogLine | None = None  # its parse, filled on demand
        self.pending: list[_FindingState] = []  # findings still collecting context_after
        self.frozen = False  # saw an error: batch stats after it do not count
        self.infos: deque[tuple[_Key, str, Occurrence]] = deque(maxlen=_INFO_HISTORY)
        self.last_epoch: float | None = None  # of the last timed occurrence: orders an untimed one
        self.waiting: list[_Waiting] = []  # rankless occurrences waiting for the lines after them


class _Waiting:
    """An occurrence without a rank whose first_by_rank (or info) entry waits for the lines after it."""

    __slots__ = ("key", "index", "occ", "left")

    def __init__(self, key: _Key, index: int, occ: Occurrence) -> None:
        self.key = key
        self.index = index
        self.occ = occ
        self.left = RANK_LOOKAHEAD  # lines still to look at


class _FindingState:
    __slots__ = ("signature", "count", "first", "key", "before", "after", "after_left", "record")

    def __init__(
        self, signature: Signature, first: Occurrence, key: _Key, before: tuple[str, ...]
    ) -> None:
        # (file order, line that opened the record, that line); () until it is set
        self.record: tuple[int, int, str | None] | tuple[()] = ()
        self.signature = signature
        self.count = 0
        self.first = first
        self.key = key
        self.before = before
        self.after: list[str] = []
        self.after_left = 0


_NO_TIME = float("-inf")


class NodeClock(NamedTuple):
    """The node that wrote a file, and what to add to its times to put them on this node's clock."""

    name: str
    offset_s: float


def _tagged(st: _FileState, rank: str | None) -> str | None:
    return f"{st.node} {rank}" if st.node and rank is not None else rank


class FindingsBuilder:
    def __init__(
        self,
        catalog: Catalog,
        *,
        matcher: Matcher | None = None,
        context: int = CONTEXT_BEFORE,
        after: int = 20,
        clock_offsets: Mapping[str, float] | None = None,
        node_of: Callable[[str], NodeClock | None] | None = None,
    ) -> None:
        if matcher is None:
            from radixtop.diagnosis.matcher import Matcher

            matcher = Matcher(catalog.signatures)
        self.catalog = catalog
        self.matcher = matcher
        self.context = max(0, int(context))
        self.after = max(0, int(after))
        self._signatures = catalog.signatures
        self._levels = tuple(sig.level for sig in catalog.signatures)
        self._ids = tuple(sig.id for sig in catalog.signatures)
        self._offsets = dict(clock_offsets or {})
        self._node_of = node_of
        self._files: dict[str, _FileState] = {}
        self._findings: dict[int, _FindingState] = {}
        self._seen_in_file: set[tuple[int, int]] = set()  # (signature index, file order)
        self._lines = 0
        self._batch: dict[tuple[int, str], deque[tuple[_Key, BatchStats]]] = {}
        self._batch_snapshots: dict[
            int, Mapping[str, BatchStats]
        ] = {}  # file order -> at its first failure
        self._first_by_rank: dict[str, tuple[_Key, str, Occurrence]] = {}
        self._last_fed: _FileState | None = None
        self._active: dict[str, _FileState] = {}  # insertion order = least recently fed first

    # -- live path ----------------------------------------------------------------------------

    def feed(self, file: str, lineno: int, text: str) -> tuple[str, ...]:
        """One line as it arrives: parse lazily, match, keep context. Returns the matched ids."""
        st = self._files.get(file) or self._new_file(file)
        if st is not self._last_fed:
            self._touch(st)
        if "\x1b" in text:
            text = strip_ansi(text)
        if text[-1:] in ("\n", "\r"):
            text = text.rstrip("\r\n")
        self._lines += 1
        if st.pending:
            self._collect_after(st, text)
        if st.waiting:
            self._look_ahead(st, text)
        opens = opens_record(text)
        if opens:
            st.opener = text
            st.opener_line = lineno
            st.opener_parsed = None
        indices = self.matcher.match(text)
        if indices:
            for index in indices:
                self._hit(st, lineno, text, index, None, None, opens)
        elif opens and not st.frozen and "batch" in text:
            parsed = st.opener_parsed = parse_line(text)  # the opener, just set
            if parsed.batch is not None:
                self._record_batch(st, lineno, parsed, parsed.batch)
        st.ring.append(text)
        if not indices:
            return ()
        return tuple(self._ids[i] for i in indices)

    # -- fast-scan path -----------------------------------------------------------------------

    def add_hit(
        self,
        file: str,
        lineno: int,
        text: str,
        signature_index: int,
        context_before: Sequence[str],
        batch_before: Mapping[str, BatchStats],
        *,
        context_after: Sequence[str] = (),
        opener: str | None = None,
    ) -> None:
        """One hit found by the scanner, with the lines before it and the batch stats seen so far.

        ``opener`` (optional) is the line that opened the hit's record, for a hit inside a
        traceback; without it the last record-opening line of ``context_before`` is used.
        """
        st = self._files.get(file) or self._new_file(file)
        text = strip_ansi(text).rstrip("\r\n")
        opener_line = lineno
        opens = opens_record(text)
        if opens:
            opener = text
        else:
            found = find_opener(reversed(context_before))
            opener_line = lineno - found[0] if found else 0
            if opener is None and found:
                opener = found[1]
        st.opener = opener
        st.opener_line = opener_line
        st.opener_parsed = None
        if batch_before and self._levels[signature_index] >= _ERROR:
            self._batch_snapshots.setdefault(st.order, dict(batch_before))
        before = tuple(strip_ansi(x).rstrip("\r\n") for x in context_before)
        self._hit(st, lineno, text, signature_index, before, tuple(context_after), opens)

    def add_lines(self, n: int) -> None:
        """Lines read by the fast-scan path."""
        self._lines += int(n)

    # -- shared ------------------------------------------------------------------------------

    def _new_file(self, file: str) -> _FileState:
        node = self._node_of(file) if self._node_of is not None else None
        if node is None:
            st = _FileState(file, len(self._files), float(self._offsets.get(file, 0.0)), self.context)
        else:
            st = _FileState(file, len(self._files), node.offset_s, self.context, node.name)
        self._files[file] = st
        return st

    def _touch(self, st: _FileState) -> None:
        """Mark st as the file being fed; past _ACTIVE_FILES files (a followed log rotates into a new
        generation, and each generation is a file here), the least recently fed one drops its ring."""
        self._last_fed = st
        self._active.pop(st.name, None)
        self._active[st.name] = st
        if len(self._active) > _ACTIVE_FILES:
            oldest = self._active.pop(next(iter(self._active)))
            oldest.ring.clear()
            for state in oldest.pending:
                state.after_left = 0
            oldest.pending = []
            self._settle(oldest, None)

    def _opener_parsed(self, st: _FileState) -> LogLine | None:
        if st.opener_parsed is None and st.opener is not None:
            st.opener_parsed = parse_line(st.opener)
        return st.opener_parsed

    def _occurrence(self, st: _FileState, lineno: int, text: str) -> tuple[_Key, Occurrence]:
        parsed = parse_line(text)
        time, epoch, rank = parsed.time, parsed.epoch, parsed.rank
        # The record's opener gives a continuation line its time, and its rank when the line names
        # none, when it is near enough (the evidence policy's lookback; opener_line 0: a caller's
        # opener, looked up within it).
        if time is None and (st.opener_line == 0 or lineno - st.opener_line <= OPENER_LOOKBACK):
            opener = self._opener_parsed(st)
            if opener is not None:
                time, epoch, rank = opener.time, opener.epoch, rank or opener.rank
        if epoch is not None and st.offset:
            epoch += st.offset
        occ = Occurrence(st.name, lineno, time, epoch, _tagged(st, rank), text)
        if epoch is None:
            # No time of its own or its record's (a fast-scan hit without context): order it
            # after the last timed occurrence of its file rather than before everything.
            epoch = _NO_TIME if st.last_epoch is None else st.last_epoch
        else:
            st.last_epoch = epoch
        return (epoch, st.order, lineno), occ

    def _hit(
        self,
        st: _FileState,
        lineno: int,
        text: str,
        index: int,
        before: tuple[str, ...] | None,
        after: tuple[str, ...] | None,
        opens: bool,
    ) -> None:
        level = self._levels[index]
        state = self._findings.get(index)
        seen = (index, st.order)
        found: tuple[_Key, Occurrence] | None = None  # parsed once, and only when needed
        waiting = False
        if state is None or seen not in self._seen_in_file:
            self._seen_in_file.add(seen)
            key, occ = self._occurrence(st, lineno, text)
            if occ.rank is None and not opens:
                # No rank on the line nor its record: the lines after it may name one.
                if after is None:
                    waiting = True  # the live path: they have not arrived yet
                else:
                    rank = rank_ahead(after)
                    if rank is not None:
                        occ = occ._replace(rank=_tagged(st, rank))
            found = key, occ
            if state is None or key < state.key:
                if state is not None and state.after_left:
                    self._drop_pending(state)
                context = (
                    tuple(st.ring)
                    if before is None
                    else before[-self.context :]
                    if self.context
                    else ()
                )
                new = _FindingState(self._signatures[index], occ, key, context)
                new.record = (st.order, st.opener_line, st.opener)
                if state is not None:
                    new.count = state.count
                state = self._findings[index] = new
                if after is not None:
                    state.after = list(after[: self.after])
                elif self.after:
                    state.after_left = self.after
                    st.pending.append(state)
        state.count += 1
        if level >= _ERROR:
            st.frozen = True
        if level == _INFO or level >= _WARNING:
            key, occ = found or self._occurrence(st, lineno, text)
            if waiting:
                st.waiting.append(_Waiting(key, index, occ))
            else:
                self._note(st, key, index, occ, self._first_by_rank)

    def _note(
        self,
        st: _FileState,
        key: _Key,
        index: int,
        occ: Occurrence,
        first_by_rank: dict[str, tuple[_Key, str, Occurrence]],
    ) -> None:
        """An occurrence into the file's infos or the first warning-or-worse per rank."""
        if self._levels[index] == _INFO:
            st.infos.append((key, self._ids[index], occ))
            return
        rank = occ.rank or ""
        known = first_by_rank.get(rank)
        if known is None or key < known[0]:
            first_by_rank[rank] = (key, self._ids[index], occ)

    def _look_ahead(self, st: _FileState, text: str) -> None:
        """One more line after the file's rankless occurrences: settle those it decides."""
        stop, rank = rank_handed_back(text)
        if stop:
            self._settle(st, rank)
            return
        for w in st.waiting:
            w.left -= 1
        if any(w.left <= 0 for w in st.waiting):
            done = [w for w in st.waiting if w.left <= 0]
            st.waiting = [w for w in st.waiting if w.left > 0]
            self._settle(st, None, done)

    def _settle(self, st: _FileState, rank: str | None, which: list[_Waiting] | None = None) -> None:
        """Give waiting occurrences their rank (None: they stay rankless) and note them."""
        if which is None:
            which, st.waiting = st.waiting, []
        for w in which:
            occ = w.occ
            if rank is not None:
                occ = occ._replace(rank=_tagged(st, rank))
                state = self._findings.get(w.index)
                if state is not None and state.first is w.occ:
                    state.first = occ
            self._note(st, w.key, w.index, occ, self._first_by_rank)

    def _collect_after(self, st: _FileState, text: str) -> None:
        done = False
        for state in st.pending:
            state.after.append(text)
            state.after_left -= 1
            done = done or state.after_left <= 0
        if done:
            st.pending = [s for s in st.pending if s.after_left > 0]

    def _drop_pending(self, state: _FindingState) -> None:
        for st in self._files.values():
            if state in st.pending:
                st.pending.remove(state)
        state.after_left = 0

    def _record_batch(self, st: _FileState, lineno: int, parsed: LogLine, batch: BatchStats) -> None:
        epoch = parsed.epoch
        if epoch is not None and st.offset:
            epoch += st.offset
        key = (_NO_TIME if epoch is None else epoch, st.order, lineno)
        slot = (st.order, parsed.rank or "")
        history = self._batch.get(slot)
        if history is None:
            history = self._batch[slot] = deque(maxlen=_BATCH_HISTORY)
        history.append((key, batch))

    # -- the report ---------------------------------------------------------------------------

    def report(self) -> Report:
        states = sorted(self._findings.values(), key=lambda s: s.key)
        # Occurrences still waiting for the lines after them count as they stand (rankless); a
        # later report settles them. The builder's own lists are left as they are.
        waiting = [(st, w) for st in self._files.values() for w in st.waiting]
        firsts = self._first_by_rank
        if waiting:
            firsts = dict(firsts)
            for st, w in waiting:
                if self._levels[w.index] >= _WARNING:
                    self._note(st, w.key, w.index, w.occ, firsts)
        findings = tuple(
            Finding(s.signature, s.count, s.first, s.before, tuple(s.after)) for s in states
        )
        initiating = _initiating(states)
        failure = next((s for s in states if s.signature.level >= _ERROR), None)
        fingerprint = None
        batch: dict[str, BatchStats] = {}
        if failure is not None:
            fingerprint = self._fingerprint(states, failure)
            batch = self._batch_before(failure)
        first_by_rank = {
            rank: (sig_id, occ)
            for rank, (_, sig_id, occ) in sorted(firsts.items(), key=lambda item: item[1][0])
        }
        return Report(
            lines=self._lines,
            findings=findings,
            initiating=initiating,
            fingerprint=fingerprint,
            batch_at_failure=batch,
            first_by_rank=first_by_rank,
            notes=tuple(self.catalog.notes),
        )

    def _fingerprint(self, states: list[_FindingState], failure: _FindingState) -> Fingerprint:
        info_key = info_id = info = None
        for st in self._files.values():
            infos: Iterable[tuple[_Key, str, Occurrence]] = st.infos
            if st.waiting:  # still waiting for a rank: counted as they stand
                infos = [
                    *st.infos,
                    *((w.key, self._ids[w.index], w.occ) for w in st.waiting if self._levels[w.index] == _INFO),
                ]
            for key, sig_id, occ in infos:
                if key < failure.key and (info_key is None or key > info_key):
                    info_key, info_id, info = key, sig_id, occ
        warnings = [s for s in states if s.signature.level == _WARNING and s.key < failure.key]
        warn_state = None
        if info_key is not None:
            warn_state = next((s for s in warnings if s.key > info_key), None)
        if warn_state is None and warnings:
            warn_state = warnings[0]
        complete = (
            info_key is not None
            and warn_state is not None
            and info_key < warn_state.key < failure.key
        )
        # A wrapper ("Scheduler hit an exception: Traceback ...") and the error its traceback ends
        # with share one record: report the last error line of that record, which names the cause.
        symptom = failure
        for s in states:
            if s.signature.level >= _ERROR and s.record == failure.record and s.key > symptom.key:
                symptom = s
        return Fingerprint(
            info=info,
            warn=None if warn_state is None else warn_state.first,
            error=symptom.first,
            complete=complete,
            info_signature=info_id,
            warn_signature=None if warn_state is None else warn_state.signature.id,
            error_signature=symptom.signature.id,
        )

    def _batch_before(self, failure: _FindingState) -> dict[str, BatchStats]:
        cutoff = failure.key
        best: dict[str, tuple[_Key, BatchStats]] = {}
        for (_, rank), history in self._batch.items():
            for key, stats in reversed(history):
                if key < cutoff:
                    known = best.get(rank)
                    if known is None or key > known[0]:
                        best[rank] = (key, stats)
                    break
        out = {rank: stats for rank, (_, stats) in sorted(best.items())}
        snapshot = self._batch_snapshots.get(failure.key[1])
        if snapshot:
            for rank, stats in snapshot.items():
                out.setdefault(rank, stats)
        return out
