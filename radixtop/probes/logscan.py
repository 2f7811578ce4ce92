"""Scan whole log files for signature hits, fast: the engine behind `radixtop scan`.

Files are read in 4 MiB chunks into reused buffers (reads of 32 MiB and more measured slower
here; a smaller regular file gets buffers its size), cut at the chunk's last newline, and each
chunk of whole lines goes to `Matcher.scan` in one call; the partial last line moves to the front
of the next buffer. Line numbers come from counting newlines: up to each of a chunk's (sorted,
rare) hits and from the last one to the chunk's end, or the whole chunk when it has none; never a
Python loop over lines.

`threads=True` runs each chunk's scan on a worker thread (hyperscan releases the GIL) while this
thread reads the next chunk (the read releases it too) and counts this chunk's newlines: three
buffers then, the previous one kept for look-back. `threads=None` decides per input, by whether
a core is idle; the default stays False, for callers that run their own threads. On a busy
machine the thread costs a little; see benchmarks/README.md, "Scan".

Only for hits does it look closer, and always within a bound:
- the `context` lines before the first hit of each signature in a file (at most CONTEXT_WINDOW
  bytes back);
- the last batch-stats line per rank before the file's first error/critical hit, from at most
  BATCH_WINDOW (8 MiB) before it: a rank whose last batch line is further back is left out;
- for a hit inside a traceback or another continuation line, the line that opened the record
  (at most OPENER_LOOKBACK lines / OPENER_WINDOW bytes back), for its time and rank.
Looking back uses the current and previous buffer, then `os.pread` on regular files; a `.gz` or
stdin cannot be re-read, so there it sees only what is still in memory (4 to 8 MiB).

A line longer than MAX_LINE is scanned in pieces of MAX_LINE (memory stays bounded); a match that
straddles two pieces is missed, and a hit's text is then its piece.

How far each look reaches, and how much of a line is kept, is diagnosis/evidence_policy.py's: the
live log pane finds the same findings with the same evidence. Evidence lines (a hit's text, its
context before and after, its opener) are kept to EVIDENCE_LINE characters with the follower's
marker " …[line truncated: N bytes]", so a log of huge lines cannot multiply into huge findings
(each finding holds over a hundred lines).
"""

from __future__ import annotations

import os
import stat
import sys
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import IO, TYPE_CHECKING, NamedTuple, Protocol, cast

from radixtop.diagnosis.evidence_policy import (
    CONTEXT_BEFORE,
    OPENER_LOOKBACK,
    batch_stats_before,
    evidence_text,
    find_opener,
)
from radixtop.diagnosis.severity import Severity

if TYPE_CHECKING:
    from radixtop.diagnosis.findings import FindingsBuilder
    from radixtop.diagnosis.logline import BatchStats
    from radixtop.diagnosis.matcher import Matcher

CHUNK_SIZE = 4 << 20
MAX_LINE = 64 << 20
CONTEXT_WINDOW = 8 << 20
BATCH_WINDOW = 8 << 20
OPENER_WINDOW = 1 << 20
STDIN_NAME = "<stdin>"


class ScanInputError(Exception):
    """An input cannot be read. str() is one line: the path, what is wrong, what to do."""


# A NamedTuple, not a dataclass: `radixtop scan` starts without importing dataclasses (and inspect).
class ScanHit(NamedTuple):
    file: str  # the name shown for the input: its path as given, or "<stdin>"
    line: int  # 1-based
    signature_index: int  # into Matcher.signatures
    raw: bytes  # the line as stored, without its newline (a MAX_LINE piece for overlong lines)
    context_before: tuple[str, ...] = ()  # only on a file's first hit of this signature
    batch_before: Mapping[str, BatchStats] = MappingProxyType({})  # first failure hit only
    opener: str | None = None  # for a continuation line: the line that opened its record
    context_after: tuple[str, ...] = ()  # only on a file's first hit of this signature

    @property
    def text(self) -> str:
        return evidence_text(self.raw)


class FileSummary(NamedTuple):
    file: str
    lines: int
    hits: int
    note: str | None = None  # e.g. a truncated .gz: what was scanned is still reported


# -- opening inputs -------------------------------------------------------------------------------


class _Reader(Protocol):
    """What a scan reads from: a raw file, stdin's buffer or a _GzipReader."""

    def readinto(self, view: memoryview, /) -> int | None: ...

    def close(self) -> None: ...


class _Source:
    __slots__ = ("fd", "name", "owned", "reader", "size")

    def __init__(
        self, name: str, reader: _Reader, fd: int | None, *, owned: bool, size: int | None = None
    ) -> None:
        self.name = name
        self.reader = reader
        self.fd = fd  # for os.pread look-back; None when the input cannot be re-read
        self.owned = owned
        self.size = size  # a regular file's size when opened; None for stdin, pipes, .gz

    def close(self) -> None:
        if self.owned:
            self.reader.close()


def _input_error(path: str, exc: OSError) -> ScanInputError:
    if isinstance(exc, FileNotFoundError):
        return ScanInputError(f"{path}: no such file; check the path (and that the glob matched)")
    if isinstance(exc, IsADirectoryError):
        return ScanInputError(f"{path}: is a directory; pass the log files in it, e.g. {path}/*.log")
    if isinstance(exc, PermissionError):
        return ScanInputError(f"{path}: permission denied; run as a user who can read it")
    reason = exc.strerror or str(exc)
    return ScanInputError(f"{path}: cannot read ({reason}); check the file and try again")


def check_input(path: str) -> None:
    """Raise ScanInputError now if `path` cannot be scanned (so nothing is printed for half a run)."""
    if path == "-":
        return
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode) and not stat.S_ISDIR(st.st_mode):
            # A FIFO or a device is read once, as a stream, as grep reads it: opening it here
            # would take (and, closing it, end) its writer's output.
            if not os.access(path, os.R_OK):
                raise PermissionError(path)
            return
        with open(path, "rb", buffering=0) as f:
            if stat.S_ISDIR(os.fstat(f.fileno()).st_mode):
                raise IsADirectoryError(path)
            if path.endswith(".gz") and f.read(2) != b"\x1f\x8b":
                raise ScanInputError(
                    f"{path}: not a gzip file despite its .gz name; decompress or rename it"
                )
    except OSError as exc:
        raise _input_error(path, exc) from None


def _open(path: str) -> _Source:
    if path == "-":
        # typeshed's BinaryIO has no readinto; stdin's buffer is an io.BufferedReader, which does.
        return _Source(STDIN_NAME, cast(_Reader, sys.stdin.buffer), None, owned=False)
    try:
        raw = open(path, "rb", buffering=0)  # noqa: SIM115 - _Source.close() closes it
    except OSError as exc:
        raise _input_error(path, exc) from None
    st = os.fstat(raw.fileno())
    if stat.S_ISDIR(st.st_mode):
        raw.close()
        raise _input_error(path, IsADirectoryError(path))
    if path.endswith(".gz"):
        return _Source(path, _GzipReader(raw), None, owned=True)
    size = st.st_size if stat.S_ISREG(st.st_mode) else None
    return _Source(path, raw, raw.fileno(), owned=True, size=size)


class _GzipReader:
    """Decompress a .gz (every member of it) straight into the caller's buffer.

    zlib directly rather than gzip.GzipFile: when a file ends early (a log still being written,
    a copy cut short), GzipFile raises from inside a large readinto and the bytes it already
    decompressed there are lost; here every byte before the break is delivered, then EOFError.
    """

    def __init__(self, raw: IO[bytes]) -> None:
        self._raw = raw
        self._d = zlib.decompressobj(16 + zlib.MAX_WBITS)  # gzip header and trailer
        self._tail = b""

    def readinto(self, view: memoryview) -> int:
        while True:
            d = self._d
            if d.eof:  # one member done: another may follow (concatenated gzip files)
                rest = d.unused_data or self._raw.read(1 << 20)
                if not rest:
                    return 0
                if not rest.startswith(b"\x1f\x8b"):
                    raise zlib.error("unexpected bytes after the last gzip member")
                self._d = d = zlib.decompressobj(16 + zlib.MAX_WBITS)
                self._tail = rest
            data = self._tail or self._raw.read(1 << 20)
            if not data:
                raise EOFError("the file ends before the end-of-stream marker")
            out = d.decompress(data, len(view))
            self._tail = d.unconsumed_tail
            if out:
                view[: len(out)] = out
                return len(out)

    def close(self) -> None:
        self._raw.close()


# -- look-back ------------------------------------------------------------------------------------


class _Window:
    """Bytes that ended at some absolute offset: the current buffer, the previous one, the file."""

    def __init__(self, fd: int | None) -> None:
        self.fd = fd
        self.cur: bytearray | None = None
        self.cur_base = 0
        self.prev: bytearray | None = None
        self.prev_base = 0
        self.prev_len = 0

    def before(self, end: int, want: int) -> tuple[bytes, bool]:
        """Up to `want` bytes ending at absolute offset `end`, and whether they begin at a line
        start (fewer bytes near the input's start, or when it cannot be re-read and the bytes
        have left memory)."""
        start = max(0, end - want)
        if self.cur is not None and start >= self.cur_base:
            data = bytes(self.cur[start - self.cur_base : end - self.cur_base])
            return data, start in (0, self.cur_base)
        if self.fd is not None:
            try:
                return os.pread(self.fd, end - start, start), start == 0
            except OSError:
                pass  # fall back to what is in memory
        # Not re-readable: the previous buffer's lines, then the current one's (they are contiguous).
        pieces = []
        first = None  # absolute offset of the first byte returned
        if self.prev is not None:
            lo = max(start, self.prev_base)
            hi = self.prev_base + self.prev_len
            if lo < hi:
                pieces.append(bytes(self.prev[lo - self.prev_base : hi - self.prev_base]))
                first = lo
        if self.cur is not None:
            pieces.append(bytes(self.cur[: end - self.cur_base]))
            first = self.cur_base if first is None else first
        # Buffers start at line starts, so a window that begins at one is whole from its start.
        return b"".join(pieces), first in (0, self.prev_base, self.cur_base)

    def lines_before(self, end: int, count: int, cap: int) -> list[bytes]:
        """The last `count` whole lines before absolute offset `end`, oldest first, looking back
        at most `cap` bytes (reads grow 64 KiB, 256 KiB, ... so the usual case reads little)."""
        if count <= 0:
            return []
        want = 1 << 16
        while True:
            want = min(want, cap)
            data, aligned = self.before(end, want)
            lines = _last_lines(data, count + 1)
            if len(lines) > count:
                return lines[1:]
            if len(data) < want or want >= cap:
                # All there is (or may look at): the oldest line is whole only if aligned.
                return lines if aligned else lines[1:]
            want *= 4


def _last_lines(data: bytes, count: int) -> list[bytes]:
    """The last `count` lines of data (which ends where a line starts), oldest first."""
    if count <= 0 or not data:
        return []
    pos = len(data) - 1 if data.endswith(b"\n") else len(data)
    lines: list[bytes] = []
    while len(lines) < count:
        start = data.rfind(b"\n", 0, pos) + 1
        lines.append(data[start:pos])
        if start == 0:
            break
        pos = start - 1
    lines.reverse()
    return lines


# -- the scan -------------------------------------------------------------------------------------


def _fill(reader: _Reader, view: memoryview) -> tuple[int, Exception | None]:
    """Read until view is full or the input ends: (bytes read, the error that ended it early).

    Only decompression errors come back as values (what was read before them is kept); other
    errors propagate."""
    total = 0
    size = len(view)
    while total < size:
        try:
            got = reader.readinto(view[total:])
        except (EOFError, zlib.error) as exc:
            return total, exc
        if not got:
            break
        total += got
    return total, None


def _worth_a_worker(file_size: int | None, chunk_size: int) -> bool:
    """Whether a scan worker thread would pay: the input spans several chunks (or its size is
    unknown) and a core is idle. The load average is a coarse signal, but the choice only
    changes the speed: on a busy machine the thread costs a few percent in hand-offs, on an idle
    one it overlaps reading and scanning (see benchmarks/README.md, "Scan")."""
    if file_size is not None and file_size < 4 * chunk_size:
        return False
    try:
        cpus = len(os.sched_getaffinity(0))
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return False
    return cpus >= 2 and load <= cpus - 1.5


def _chunk_for(chunk_size: int, file_size: int | None) -> int:
    """The read size for one input: chunk_size, or less for a smaller regular file, because
    zeroing two 4 MiB buffers costs more than scanning a small file does."""
    if file_size is None:
        return chunk_size
    step = 64 << 10
    return max(1, min(chunk_size, (file_size // step + 1) * step))


def _count_newlines(buf: bytearray, start: int, end: int) -> int:
    """Newlines in buf[start:end]. bytes.count(b"\\n") walks byte by byte in CPython 3.11; replace()
    finds them with memchr and copies the rest, about twice as fast even with the copy of a slice
    it needs (benchmarks/README.md, "Scan"). A short span is counted the plain way."""
    if end - start < _REPLACE_MIN:
        return buf.count(b"\n", start, end)
    if start == 0 and end == len(buf):
        return len(buf) - len(buf.replace(b"\n", b""))
    with memoryview(buf) as view:
        part = view[start:end].tobytes()
    return len(part) - len(part.replace(b"\n", b""))


_REPLACE_MIN = 1 << 14  # below this, the copy and the call cost more than count() saves


class LogScanner:
    """Scan inputs with one Matcher; hand each hit to a callback in file and line order."""

    def __init__(
        self,
        matcher: Matcher,
        *,
        context: int = CONTEXT_BEFORE,
        after: int = 20,
        details: bool = True,
        chunk_size: int = CHUNK_SIZE,
        max_line: int = MAX_LINE,
        threads: bool | None = False,
    ) -> None:
        self.matcher = matcher
        self.context = max(0, context)
        self.after = max(0, after)
        self.details = details  # context, batch stats and openers; `--matches` needs none
        self.chunk_size = chunk_size
        self.max_line = max(max_line, 1)
        # False, True, or None: per input, only when a core is idle (see _worth_a_worker).
        self.threads = threads
        self._failure = frozenset(
            i for i, sig in enumerate(matcher.signatures) if sig.level >= Severity.ERROR
        )
        self._buffers = [bytearray(), bytearray()]  # grown to chunk_size (+ a line) on first use

    def scan(self, path: str, on_hit: Callable[[ScanHit], None], *, stop_at: int | None = None) -> FileSummary:
        """Scan one input ("-" is stdin, ".gz" is decompressed). Raises ScanInputError.

        With `stop_at`, a line start's byte offset, the lines from there on are not matched: the
        scan ends once the hits before it have their lines after, and the summary's `lines` are
        those that end before it (a followed file's history: the follower reads the rest)."""
        source = _open(path)
        try:
            return self._scan_source(source, on_hit, stop_at)
        finally:
            source.close()

    def _scan_source(
        self, source: _Source, on_hit: Callable[[ScanHit], None], stop_at: int | None = None
    ) -> FileSummary:
        threads = self.threads
        if threads is None:
            threads = _worth_a_worker(source.size, self.chunk_size)
        worker = _ScanWorker(self.matcher) if threads else None
        try:
            return self._scan_loop(source, on_hit, worker, stop_at)
        finally:
            if worker is not None:
                worker.close()

    def _scan_loop(
        self, source: _Source, on_hit: Callable[[ScanHit], None], worker: _ScanWorker | None, stop_at: int | None
    ) -> FileSummary:
        matcher = self.matcher
        chunk = _chunk_for(self.chunk_size, source.size)
        # Buffers are reused from file to file: zeroing 8 MiB per small file adds up. One thread
        # reads the next chunk only after this one is done, into the buffer before it; with a
        # worker, the next read runs while the worker scans, so it needs a third buffer (the
        # previous one stays readable for look-back).
        bufs = self._buffers
        ring = 3 if worker is not None else 2
        while len(bufs) < ring:
            bufs.append(bytearray())
        which = 0
        window = _Window(source.fd)
        base = 0  # absolute offset of the current buffer's byte 0
        lineno = 1  # number of the line that starts at the current buffer's byte 0
        newlines = 0
        last_byte: bytes | bytearray = b""
        hits_total = 0
        state = _FileState()
        lines_before_stop: int | None = None  # set once the region holding stop_at is scanned
        region = self._read_region(source, bufs[0], 0, chunk, first=True)
        while True:
            if region.failure is not None:
                raise region.failure
            cur, n, cut = region.buf, region.n, region.cut
            ahead = None
            if cut and lines_before_stop is not None:  # past stop_at: only the hits' lines after
                self._feed_after(state, cur, cut)
                self._deliver(state, on_hit, final=False)
            elif cut:
                window.cur, window.cur_base = cur, base
                if worker is not None:
                    worker.submit(cur, cut)
                    if not region.eof:  # read the next chunk while the worker scans this one
                        ahead = self._read_region(source, bufs[(which + 1) % ring], n - cut, chunk)
                        ahead.take_carry(cur, cut, n)
                    region_newlines = _count_newlines(cur, 0, n)
                    hits = worker.result()
                else:
                    hits = matcher.scan(cur, cut)
                    region_newlines = None  # counted with the hits' line numbers
                if state.queue:
                    self._feed_after(state, cur, cut)
                    self._deliver(state, on_hit, final=False)
                # stop_at is a line start, so it lies at or before this region's cut when it lies in it.
                stop = stop_at - base if stop_at is not None and base + cut >= stop_at else None
                if stop is not None:
                    hits = [hit for hit in hits if hit[0] < stop]
                counted = pos = 0
                if hits:
                    reported, counted, pos = self._report_hits(
                        source.name, cur, base, lineno, cut, hits, window, state, on_hit
                    )
                    hits_total += reported
                if stop is not None:
                    lines_before_stop = lineno - 1 + counted + _count_newlines(cur, pos, stop)
                else:
                    if region_newlines is None:  # the hits counted the lines up to the last one
                        region_newlines = counted + _count_newlines(cur, pos, n)
                    lineno += region_newlines
                    newlines += region_newlines
                    last_byte = cur[cut - 1 : cut]
            if region.eof or (lines_before_stop is not None and not state.queue):
                break
            if ahead is None:
                ahead = self._read_region(source, bufs[(which + 1) % ring], n - cut, chunk)
                ahead.take_carry(cur, cut, n)
            # The carried partial line now starts the next buffer; this one stays for look-back.
            window.prev, window.prev_base, window.prev_len = cur, base, cut
            base += cut
            which = (which + 1) % ring
            region = ahead
        self._deliver(state, on_hit, final=True)
        if stop_at is not None:  # the lines that end before it (all of them, if the input ended first)
            lines = newlines if lines_before_stop is None else lines_before_stop
        else:
            lines = newlines + (1 if last_byte and last_byte != b"\n" else 0)
        return FileSummary(source.name, lines, hits_total, region.note)

    def _read_region(
        self, source: _Source, buf: bytearray, carry: int, chunk: int, *, first: bool = False
    ) -> _Region:
        """Fill buf after its first `carry` bytes (the partial line the caller copies in with
        take_carry) until it holds a newline, the input ends, or max_line. Never raises: a read
        error is kept in the region, so the hits of the chunk before it are reported first."""
        region = _Region(buf, carry)
        try:
            self._fill_region(source, region, chunk, first)
        except ScanInputError as exc:
            region.failure = exc
        except OSError as exc:
            region.failure = _input_error(source.name, exc)
        return region

    def _fill_region(self, source: _Source, region: _Region, chunk: int, first: bool) -> None:
        cur = region.buf
        n = region.carry
        while True:
            if len(cur) < n + chunk:
                cur.extend(bytes(n + chunk - len(cur)))
            elif len(cur) > n + chunk:
                del cur[n + chunk :]
            with memoryview(cur) as view:
                got, error = _fill(source.reader, view[n : n + chunk])
            if error is not None:
                if first and n + got == 0:
                    raise ScanInputError(
                        f"{source.name}: not readable as gzip ({_one_line(error)}); "
                        "decompress it or pass the plain log"
                    )
                region.note = (
                    f"{source.name}: compressed data ends early ({_one_line(error)}); "
                    "scanned what was readable"
                )
            if error is not None and got:
                n += got
                got = 0
            if got == 0:
                region.eof = True
                region.n = region.cut = n
                return
            n += got
            region.n = n
            region.cut = cur.rfind(b"\n", n - got, n) + 1
            if region.cut:
                return
            if n >= self.max_line:
                region.cut = n  # an overlong line: scan this piece of it now
                return

    def _report_hits(
        self,
        name: str,
        buf: bytearray,
        base: int,
        lineno: int,
        region_end: int,
        hits: Sequence[tuple[int, int]],
        window: _Window,
        state: _FileState,
        on_hit: Callable[[ScanHit], None],
    ) -> tuple[int, int, int]:
        """Report the chunk's hits; returns how many were reported, and the newlines counted up to
        `pos` (the end of the last hit's line) to number them."""
        count = 0
        pos = 0
        line = lineno
        last_line = state.last_line
        for line_end, index in hits:
            if line_end != pos:
                line += _count_newlines(buf, pos, line_end)
                pos = line_end
            if last_line.get(index) == line:
                continue  # the same overlong line, seen again in its next piece
            last_line[index] = line
            start = buf.rfind(b"\n", 0, line_end) + 1
            raw = bytes(buf[start:line_end])
            count += 1
            if not self.details:
                on_hit(ScanHit(name, line, index, raw))
                continue
            pending = self._detailed_hit(name, line, index, raw, base + start, window, state)
            if pending.need:
                more = _lines_after(buf, line_end + 1, region_end, pending.need)
                pending.after.extend(more)
                pending.need -= len(more)
            state.queue.append(pending)
        self._deliver(state, on_hit, final=False)
        return count, line - lineno, pos

    def _feed_after(self, state: _FileState, buf: bytearray, region_end: int) -> None:
        """Give hits from earlier chunks their context_after from this chunk's first lines."""
        for pending in state.queue:
            if pending.need > 0:
                more = _lines_after(buf, 0, region_end, pending.need)
                pending.after.extend(more)
                pending.need -= len(more)

    @staticmethod
    def _deliver(state: _FileState, on_hit: Callable[[ScanHit], None], final: bool) -> None:
        # In line order: a hit still waiting for its lines after holds back the ones behind it.
        queue = state.queue
        while queue and (final or queue[0].need <= 0):
            p = queue.popleft()
            after = tuple(p.after)
            on_hit(
                ScanHit(p.file, p.line, p.index, p.raw, p.context, p.batch, p.opener, after)
            )

    def _detailed_hit(
        self,
        name: str,
        line: int,
        index: int,
        raw: bytes,
        line_start: int,
        window: _Window,
        state: _FileState,
    ) -> _PendingHit:
        from radixtop.diagnosis.logline import is_continuation

        context: tuple[str, ...] = ()
        need = 0
        if index not in state.first_seen:
            # Only a file's first hit of a signature can become the finding's first occurrence.
            state.first_seen.add(index)
            need = self.after
            if self.context:
                lines = window.lines_before(line_start, self.context, CONTEXT_WINDOW)
                context = tuple(evidence_text(x) for x in lines)
        batch: Mapping[str, BatchStats] = {}
        if not state.failure_seen and index in self._failure:
            state.failure_seen = True
            batch = batch_stats_before(window.before(line_start, BATCH_WINDOW)[0])
        opener = None
        if is_continuation(evidence_text(raw)):
            opener = self._opener(line_start, window)
        return _PendingHit(name, line, index, raw, context, batch, opener, need)

    def _opener(self, line_start: int, window: _Window) -> str | None:
        lines = window.lines_before(line_start, OPENER_LOOKBACK, OPENER_WINDOW)
        found = find_opener(evidence_text(line) for line in reversed(lines))
        return found[1] if found else None


def _lines_after(buf: bytearray, start: int, end: int, count: int) -> list[str]:
    """Up to `count` lines of buf[start:end], from start (a line start), as evidence lines."""
    lines: list[str] = []
    pos = start
    while len(lines) < count and pos < end:
        nl = buf.find(b"\n", pos, end)
        if nl < 0:
            nl = end
        lines.append(evidence_text(buf, pos, nl))
        pos = nl + 1
    return lines


class _Region:
    """One buffer's worth of input: buf[:n] was read, buf[:cut] is whole lines (or a MAX_LINE
    piece), buf[cut:n] is a partial line for the next buffer."""

    __slots__ = ("buf", "carry", "cut", "eof", "failure", "n", "note")

    def __init__(self, buf: bytearray, carry: int) -> None:
        self.buf = buf
        self.carry = carry  # bytes at the front that continue the previous buffer's last line
        self.n = carry
        self.cut = 0
        self.eof = False
        self.note: str | None = None  # e.g. a truncated .gz
        self.failure: ScanInputError | None = None  # raised once the chunk before it is reported

    def take_carry(self, prev: bytearray, cut: int, n: int) -> None:
        """Copy the previous buffer's partial last line to the front (read after it, in place)."""
        self.buf[: self.carry] = prev[cut:n]


class _PendingHit:
    """A hit waiting for its context_after (the lines after it may be in the next chunk)."""

    __slots__ = ("after", "batch", "context", "file", "index", "line", "need", "opener", "raw")

    def __init__(
        self,
        file: str,
        line: int,
        index: int,
        raw: bytes,
        context: tuple[str, ...],
        batch: Mapping[str, BatchStats],
        opener: str | None,
        need: int,
    ) -> None:
        self.file = file
        self.line = line
        self.index = index
        self.raw = raw
        self.context = context
        self.batch = batch
        self.opener = opener
        self.after: list[str] = []  # evidence lines
        self.need = need  # lines after still wanted


class _ScanWorker:
    """One thread running Matcher.scan on a chunk while the caller reads the next chunk and
    counts this one's newlines.

    hyperscan releases the GIL while it scans, and so does a read; reading and counting cost
    about what the scan does, so on an idle second core the two sides overlap. A bare thread and three semaphores:
    concurrent.futures costs ~14 ms of import time, and `radixtop scan` must start like grep.
    """

    def __init__(self, matcher: Matcher) -> None:
        import threading

        self._matcher = matcher
        self._go = threading.Semaphore(0)
        self._started = threading.Semaphore(0)
        self._done = threading.Semaphore(0)
        self._job: tuple[bytearray, int] | None = None
        self._result: list[tuple[int, int]] = []
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="radixtop-scan", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            self._go.acquire()
            job = self._job
            if job is None:
                return
            self._started.release()
            try:
                self._result = self._matcher.scan(job[0], job[1])
            except BaseException as exc:  # noqa: BLE001 - re-raised by result() in the caller
                self._error = exc
            self._done.release()

    def submit(self, data: bytearray, end: int) -> None:
        self._job = (data, end)
        self._go.release()
        # Block (GIL released) until the worker runs: otherwise the caller's next C call, which
        # holds the GIL for milliseconds, would keep the worker from even starting its scan.
        self._started.acquire()

    def result(self) -> list[tuple[int, int]]:
        self._done.acquire()
        self._job = None
        error, self._error = self._error, None
        if error is not None:
            raise error
        return self._result

    def close(self) -> None:
        self._job = None
        self._go.release()
        self._thread.join()


class _FileState:
    """Per input: which signatures were seen, whether a failure was, hits awaiting lines after."""

    __slots__ = ("failure_seen", "first_seen", "last_line", "queue")

    def __init__(self) -> None:
        self.first_seen: set[int] = set()
        self.failure_seen = False
        self.last_line: dict[int, int] = {}  # signature index -> line of its last hit
        self.queue: deque[_PendingHit] = deque()


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


# -- feeding the findings -------------------------------------------------------------------------


def scan_into(
    builder: FindingsBuilder,
    paths: Iterable[str],
    matcher: Matcher,
    *,
    context: int = CONTEXT_BEFORE,
    after: int = 20,
    threads: bool | None = False,
) -> list[FileSummary]:
    """Scan every input into a FindingsBuilder (the report path of `radixtop scan`)."""
    scanner = LogScanner(matcher, context=context, after=after, threads=threads)
    summaries = []

    def add(hit: ScanHit) -> None:
        builder.add_hit(
            hit.file,
            hit.line,
            hit.text,
            hit.signature_index,
            hit.context_before,
            hit.batch_before,
            context_after=hit.context_after,
            opener=hit.opener,
        )

    for path in paths:
        summary = scanner.scan(path, add)
        builder.add_lines(summary.lines)
        summaries.append(summary)
    return summaries
