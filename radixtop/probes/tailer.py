"""The synchronous core of following log files: `Tailer.poll` reads what is new in every file.

It runs on the follower's reader thread (probes/follow.py), reads with plain blocking `os.pread`
calls (up to 1 MiB at a time), splits the bytes into lines with C-level bytes/str methods, and
keeps what it read (runs of lines, probes/logbatch.py), its notices and the parts of files before
where following began (probes/backlog.py) until the follower takes them.

What it survives:
- rotation (the path now names another inode): the old file is kept open and read to its end,
  and for a short grace period after, because writers reopen late; then the new file is followed
  from its first byte. Old-generation lines are delivered before the new file is read.
- copytruncate (same inode, size below our offset, or refilled past it within one poll: the bytes
  just before our offset changed): a "truncated" notice, then reading restarts at byte 0.
- a path that does not exist yet, or is deleted: "waiting"/"deleted", followed when it (re)appears.
- limits of following by path, said on screen rather than lost silently ("lost" notices): files
  rotated away between two polls (rotation every few ms) are never opened; the notice counts
  them (those written since the last poll, under names that begin with the followed one) and
  their bytes. A copytruncate that empties the file before its last lines were read: those
  lines are read from the copy beside it (same name plus a suffix, holding the same bytes up to
  where reading stopped); with no such copy, a notice counts the bytes seen but not read.
- a gzip-compressed file (a rotated log kept as .gz): decompressed and read once from its start,
  with a "compressed" notice saying it is not followed (nothing is appended to a .gz).
- globs: re-expanded every 0.5 s; a file that appears later is read from its start. A glob that
  matches more files than the open-file limit allows (each followed file may hold three
  descriptors) follows the newest of them, with a "capped" notice saying how many and why.

Lines: UTF-8 with replacement characters, CR before the newline removed, ANSI CSI/OSC sequences
stripped, cut to `max_line` characters with a visible marker " …[line truncated: N bytes]" (N is
the whole line's length in bytes; of a line still arriving at most 4 * max_line bytes are kept,
the rest is skipped and counted, never buffered). A partial last line (no newline yet) is held
until its newline arrives; at stop() it is dropped, not emitted, because it may be half-written.
A rotated or deleted file's partial last line is emitted once that file is done with, and a
truncated file's when the truncation is seen, since no newline can ever arrive for them.
"""

from __future__ import annotations

import codecs
import glob
import os
import stat
import threading
import time
import zlib
from collections.abc import Sequence
from typing import Any, NamedTuple

from radixtop.probes.backlog import Numbering, SkippedLines, close_quietly, count_in_background, start_of_backlog
from radixtop.probes.logbatch import HealthState, LogLines, LogNotice, LogRun, NoticeKind, SourceHealth
from radixtop.textsafe import strip_ansi

_CHUNK = 1 << 20  # bytes per pread
_READ_BUDGET = 4 << 20  # bytes per file per poll: one busy file cannot starve the others
GLOB_EVERY = 0.5  # seconds between glob re-expansions and retries of failed opens
_ROTATED_GRACE = 1.0  # keep reading a rotated/deleted file until it has been quiet this long
_BOUNDARY = 64  # bytes before the offset re-read with each read to catch truncate-and-refill
_MAX_FILES = 1000  # files followed at most, whatever the open-file limit
_RECOVER_MAX = 64 << 20  # bytes read back from a copytruncate copy at most
_RESERVED_FDS = 128  # descriptors left for the rest of the process (sockets, NVML, the terminal)
_FDS_PER_FILE = 3  # a followed file, its line counter's copy and the history scan's copy

def _clean(text: str) -> str:
    return strip_ansi(text.removesuffix("\r"))


def _cut(text: str, max_line: int, nbytes: int) -> str:
    return f"{text[:max_line]} …[line truncated: {nbytes} bytes]"


def _line_text(data: bytes, dropped: int, max_line: int) -> tuple[str, bool]:
    """One line's text, cut to max_line characters with a marker; returns (text, was_cut).
    dropped: how many more bytes the line had beyond data (skipped: it was too long to keep)."""
    if not dropped:
        text = _clean(data.decode("utf-8", "replace"))
        if len(text) <= max_line:
            return text, False
        return _cut(text, max_line, len(data)), True
    # data ends at an arbitrary byte: final=False drops a character cut in half there.
    text = _clean(codecs.getincrementaldecoder("utf-8")("replace").decode(data, final=False))
    return _cut(text, max_line, len(data) + dropped), True


def file_budget() -> tuple[int, int | None]:
    """How many files may be followed at once, and the open-file limit it comes from."""
    import resource

    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ValueError, OSError):
        return _MAX_FILES, None
    if soft == resource.RLIM_INFINITY:
        return _MAX_FILES, None
    return max(1, min(_MAX_FILES, (soft - _RESERVED_FDS) // _FDS_PER_FILE)), soft


def _head_of(fd: int) -> bytes:
    try:
        return os.pread(fd, 2, 0)
    except OSError:
        return b""


def _is_a_directory(path: str) -> str:
    return f"{path} is a directory; give a log file, or a glob such as {os.path.join(path, '*.log')}"


def _head(path: str) -> bytes | None:
    """The first bytes of a file, to tell a renamed file we read from a new one on a reused inode."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        return os.pread(fd, _BOUNDARY, 0)
    except OSError:
        return None
    finally:
        os.close(fd)


class _Lines(NamedTuple):
    """What a read's bytes held: its complete lines, the longest one's length, and the lines'
    bytes as read (joined by newlines) where decoding them changed nothing, for the matcher."""

    texts: list[str]
    widest: int
    raw: bytes | None


_NO_LINES = _Lines([], 0, None)


class _Generation:
    """One opened file (one inode) at a path: its fd, read offset and the line being assembled."""

    __slots__ = (
        "fd", "dev", "ino", "number", "offset", "lineno", "partial", "dropped", "boundary", "quiet_since",
        "cut", "cut_noticed", "numbering", "gunzip",
    )

    def __init__(self, fd: int, st: os.stat_result, number: int, offset: int) -> None:
        self.fd = fd
        self.dev, self.ino = st.st_dev, st.st_ino
        self.number = number
        self.offset = offset
        self.lineno = 0
        self.partial = bytearray()  # bytes of the unfinished last line, at most 4 * max_line ...
        self.dropped = 0  # ... and how many more of its bytes were skipped
        self.boundary = b""  # the last bytes before offset (see _BOUNDARY)
        self.quiet_since = 0.0
        self.cut = 0  # lines cut at max_line ...
        self.cut_noticed = False  # ... and whether the "capped" notice went out
        # While the lines before the starting offset are being counted: lineno counts from there.
        self.numbering: Numbering | None = None
        self.gunzip: Any = None  # a zlib decompressor for a compressed file (offset: compressed bytes)

    def restart(self, number: int) -> None:
        self.number, self.offset, self.lineno, self.boundary = number, 0, 0, b""
        self.numbering = None
        self.partial.clear()
        self.dropped = 0
        self.cut, self.cut_noticed = 0, False

    def hold(self, data: bytes, max_line: int) -> None:
        # max_line characters take at most 4 * max_line bytes of UTF-8: keep no more than that of a
        # line that has no newline yet, so a 10 GiB line costs 256 KiB, not 10 GiB.
        room = 4 * max_line - len(self.partial)
        if len(data) <= room:
            self.partial += data
        else:
            if room > 0:
                self.partial += data[:room]
            self.dropped += len(data) - max(room, 0)

    def take_partial(self, max_line: int) -> str:
        text, cut = _line_text(bytes(self.partial), self.dropped, max_line)
        self.cut += cut
        self.partial.clear()
        self.dropped = 0
        return text

    def split(self, data: bytes, max_line: int) -> _Lines:
        """Complete lines in data (prefixed by the held partial line); keeps the new partial."""
        first_nl = data.find(b"\n")
        if first_nl < 0:
            self.hold(data, max_line)
            return _NO_LINES
        lines: list[str] = []
        widest = 0
        start = 0
        if self.partial or self.dropped:
            self.hold(data[:first_nl], max_line)
            lines.append(self.take_partial(max_line))
            widest = len(lines[0])
            start = first_nl + 1
        last_nl = data.rfind(b"\n")
        raw = None
        if last_nl >= start:
            block = data[start:last_nl]
            block_lines, block_widest, exact = self._block(block, max_line)
            raw = block if exact and not lines else None
            lines.extend(block_lines)
            widest = max(widest, block_widest)
        self.hold(data[last_nl + 1 :], max_line)
        return _Lines(lines, widest, raw)

    def _block(self, block: bytes, max_line: int) -> tuple[list[str], int, bool]:
        """Lines of a block of whole lines (no final newline), decoded and cleaned in one call
        each; their longest length; and whether they are the block's bytes unchanged (valid
        UTF-8, no CR, escape or cut line).

        '\n' never occurs inside a UTF-8 multi-byte sequence, and neither the CR nor the ANSI
        replacement touches it, so doing them on the whole block then splitting gives the same
        lines as splitting first, at a fraction of the per-line cost."""
        try:
            text = block.decode("utf-8")
            exact = True
        except UnicodeDecodeError:
            text = block.decode("utf-8", "replace")
            exact = False
        if "\r" in text:
            text = text.replace("\r\n", "\n").removesuffix("\r")
            exact = False
        cleaned = strip_ansi(text)
        exact = exact and cleaned is text
        lines = cleaned.split("\n")
        widest = max(map(len, lines))  # once here: the pane's width and the cut below both need it
        if widest > max_line:
            exact = False
            raw = block.split(b"\n")  # rare: only to tell each long line's length in bytes
            for i, line in enumerate(lines):
                if len(line) > max_line:
                    lines[i] = _cut(line, max_line, len(raw[i]))
                    self.cut += 1
            widest = max(map(len, lines))
        return lines, widest, exact


class _Source:
    """Everything followed at one path: the current generation and any rotated ones still draining."""

    def __init__(self, path: str, *, start_at_end: bool) -> None:
        self.path = path
        self.start_at_end = start_at_end  # only for a file that already existed when following began
        self.current: _Generation | None = None
        self.draining: list[_Generation] = []
        self.next_number = 0
        self.state: HealthState = "waiting"
        self.detail = "waiting for the file to appear"
        self.lines = 0
        self.last_line_at: float | None = None
        self.last_error = ""
        self.next_retry = 0.0
        self.announced = False  # a "waiting" notice went out (or the file was there from the start)
        self.once = False  # a compressed file read to its end: never read again
        self.seen_at = time.time()  # when the path was last looked at (files written since: unread)
        self.last_size = 0  # the current file's size at that look
        self.opened: set[tuple[int, int]] = set()  # every inode read at this path


class Tailer:
    """The synchronous core, run on the reader thread: poll() reads what is new in every file."""

    def __init__(
        self,
        patterns: Sequence[str],
        *,
        from_start: bool,
        max_line: int,
        backlog_lines: int = 0,
        history: bool = False,
        count_delay: float = 0.0,
    ) -> None:
        self.max_line = max_line
        self.backlog_lines = max(0, backlog_lines)
        # Line counts wait for this (LogFollower.start_counting) or count_delay seconds at most.
        self.count_gate = threading.Event()
        self.count_delay = count_delay
        if count_delay <= 0:
            self.count_gate.set()
        self.history = history  # report SkippedLines for files followed from past their start
        self.literals: list[str] = []
        self.globs: list[str] = []
        for pattern in patterns:
            (self.globs if glob.has_magic(pattern) else self.literals).append(pattern)
        self.sources: dict[str, _Source] = {}  # by absolute path
        self.unmatched: set[str] = set()  # globs matching nothing yet (shown as "waiting")
        # Files we read to their end and closed, with their first bytes (see expand_globs).
        self.finished: dict[tuple[int, int], bytes] = {}
        self.lock = threading.Lock()  # guards the sources dict shape for health() on another thread
        self.next_glob = 0.0
        self.budget, self.fd_limit = file_budget()
        self.capped_at = 0  # files matching the globs when the last "capped" notice went out
        self.from_start = from_start
        self.runs: list[LogRun] = []
        self.notices: list[LogNotice] = []
        self.skipped: list[SkippedLines] = []
        self.stopping = threading.Event()  # set by LogFollower.stop(): cuts a long line count short

    # -- bookkeeping -------------------------------------------------------------------------------

    def notice(self, source: str, kind: NoticeKind, message: str) -> None:
        self.notices.append(LogNotice(source, kind, message, time.time()))

    def take(self) -> tuple[LogLines, list[LogNotice]]:
        runs, notices = self.runs, self.notices
        self.runs, self.notices = [], []
        return LogLines(runs), notices

    def take_runs(self) -> tuple[list[LogRun], list[LogNotice], list[SkippedLines]]:
        runs, notices, skipped = self.runs, self.notices, self.skipped
        self.runs, self.notices, self.skipped = [], [], []
        return runs, notices, skipped

    def add_source(self, path: str, *, start_at_end: bool) -> _Source:
        key = os.path.abspath(path)  # "x.log" and "./x.log" are one source
        source = self.sources.get(key)
        if source is None:
            source = _Source(path, start_at_end=start_at_end)
            with self.lock:
                self.sources[key] = source
        return source

    def start(self) -> None:
        """The initial scan: files that exist now start at their end unless from_start."""
        for path in self.literals:
            self.add_source(path, start_at_end=not self.from_start and os.path.lexists(path))
        self.expand_globs(time.monotonic(), initial=True)
        for source in list(self.sources.values()):
            self.try_open(source, time.monotonic(), initial=True)

    def close(self) -> None:
        for source in self.sources.values():
            for gen in [source.current, *source.draining]:
                if gen is not None:
                    close_quietly(gen.fd)
            source.current, source.draining = None, []

    def watch_targets(self) -> dict[str, set[str]]:
        """Directory -> the names (or glob patterns) in it whose changes matter: each followed path
        and, when it is a link, what it points to; each glob whose directory part is plain."""
        from radixtop.probes.fswait import glob_base

        wanted: dict[str, set[str]] = {}
        with self.lock:
            paths = [source.path for source in self.sources.values()]
        for path in paths:
            for p in {os.path.abspath(path), os.path.realpath(path)}:
                directory, name = os.path.split(p)
                wanted.setdefault(directory, set()).add(name)
        for pattern in self.globs:
            base = glob_base(pattern)
            if base is not None:
                wanted.setdefault(base[0], set()).add(base[1])
        return wanted

    def rotating(self) -> bool:
        """A rotated or deleted file is still being read out: its writes come under a name nobody
        watches for, so the reader polls until it is done."""
        return any(source.draining for source in self.sources.values())

    def held_identities(self) -> set[tuple[int, int]]:
        return {
            (gen.dev, gen.ino)
            for source in self.sources.values()
            for gen in [source.current, *source.draining]
            if gen is not None
        }

    def expand_globs(self, now: float, *, initial: bool = False) -> None:
        self.next_glob = now + GLOB_EVERY
        held: set[tuple[int, int]] | None = None
        named: set[tuple[int, int]] = set()
        fresh: list[tuple[float, str]] = []  # (mtime, path) of files to follow from now on
        for pattern in self.globs:
            matched = False
            for path in sorted(glob.glob(pattern, recursive=True)):
                if os.path.abspath(path) in self.sources:
                    matched = True
                    continue
                try:
                    st = os.stat(path)
                except OSError:
                    continue
                if not stat.S_ISREG(st.st_mode):
                    continue  # a glob matching directories or sockets is not an error worth a notice
                identity = (st.st_dev, st.st_ino)
                named.add(identity)
                matched = True
                if held is None:
                    held = self.held_identities()
                # A glob like "*.log*" also matches the names rotated files get (server.log.1, then
                # .2, ...): files we are reading or have read, not new ones. An open inode cannot be
                # reused; a closed one can, once deleted, so its first bytes must match as well.
                if identity in held or (identity in self.finished and self.finished[identity] == _head(path)):
                    continue
                fresh.append((st.st_mtime, path))
            if matched:
                self.unmatched.discard(pattern)
            elif pattern not in self.unmatched:
                self.unmatched.add(pattern)
                self.notice(pattern, "waiting", f"no file matches {pattern} yet; waiting for one to appear")
        self._add_fresh(fresh, now, initial)
        if not initial:  # forget files no glob names any more: their inode numbers may be reused
            self.finished = {k: v for k, v in self.finished.items() if k in named}

    def _add_fresh(self, fresh: list[tuple[float, str]], now: float, initial: bool) -> None:
        """Follow the files a glob newly matches: the newest of them when they would pass the
        open-file budget, with one "capped" notice per change in how many matched."""
        room = self.budget - len(self.sources)
        paths = list(dict.fromkeys(path for _, path in fresh))
        if len(paths) > room:
            newest = sorted(fresh, reverse=True)
            keep = set(dict.fromkeys(path for _, path in newest[: max(0, room)]))
            if len(paths) != self.capped_at:
                self.capped_at = len(paths)
                limit = (
                    f"the open-file limit (ulimit -n) is {self.fd_limit}" if self.fd_limit else "radixtop's own limit"
                )
                self.notice(
                    ", ".join(self.globs), "capped",
                    f"{len(paths) + len(self.sources):,} files to follow, more than {self.budget:,} "
                    f"({limit}); following the newest {len(self.sources) + len(keep):,}: narrow the glob "
                    "or raise the limit",
                )
            paths = [path for path in paths if path in keep]
        for path in paths:
            source = self.add_source(path, start_at_end=initial and not self.from_start)
            source.announced = True
            if not initial:
                self.try_open(source, now)

    # -- opening -----------------------------------------------------------------------------------

    def fail(self, source: _Source, message: str) -> None:
        # Retried, but not every poll: a missing file is retried each poll (cheap, and we want a
        # new file quickly); a file we cannot read only every GLOB_EVERY seconds.
        source.next_retry = time.monotonic() + GLOB_EVERY
        source.state, source.detail = "error", message
        if message != source.last_error:
            source.last_error = message
            self.notice(source.path, "error", message)

    def try_open(self, source: _Source, now: float, *, initial: bool = False, kind: NoticeKind = "created") -> bool:
        """Open the file at source.path as a new generation; notices for what went wrong."""
        if now < source.next_retry:
            return False
        path = source.path
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            source.start_at_end = False  # when it appears, it is new: read it from its start
            if not source.announced:
                source.announced = True
                self.notice(path, "waiting", f"{path} does not exist yet; waiting for it to appear")
            return False
        except IsADirectoryError:
            self.fail(source, _is_a_directory(path))
            return False
        except PermissionError:
            self.fail(source, f"cannot read {path}: permission denied; fix its permissions or run as its owner")
            return False
        except OSError as exc:
            self.fail(source, f"cannot open {path}: {exc.strerror or exc}; check the path")
            return False
        try:
            st = os.fstat(fd)
        except OSError as exc:
            os.close(fd)
            self.fail(source, f"cannot stat {path}: {exc.strerror or exc}")
            return False
        if stat.S_ISDIR(st.st_mode):
            os.close(fd)
            self.fail(source, _is_a_directory(path))
            return False
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            self.fail(source, f"{path} is not a regular file (a pipe or device?); only files can be followed")
            return False
        if path.endswith(".gz") or _head_of(fd) == b"\x1f\x8b":
            return self.open_compressed(source, fd, st)
        offset = 0
        if source.start_at_end:
            offset = start_of_backlog(fd, st.st_size, self.backlog_lines, self.max_line)
        source.start_at_end = False
        gen = source.current = _Generation(fd, st, source.next_number, offset)
        source.opened.add((gen.dev, gen.ino))
        if offset:
            back = min(offset, _BOUNDARY)
            gen.boundary = os.pread(fd, back, offset - back)
            # The lines before are counted on a thread of their own: the tail does not wait for it.
            gen.numbering = Numbering()
            try:
                count_in_background(os.dup(fd), offset, gen.numbering, self.stopping, path, self.count_gate,
                                     self.count_delay)
                if self.history:
                    part = SkippedLines(path, gen.number, offset, os.dup(fd), gen.numbering, self.stopping)
                    self.skipped.append(part)
            except OSError as exc:  # out of descriptors: the lines still come, unnumbered
                gen.numbering.finish(0, f"line numbers of {path} unknown: {exc.strerror or exc}")
        source.next_number += 1
        source.last_error = ""
        source.state = "ok"
        source.detail = f"following generation {source.current.number}"
        if not initial:
            if kind == "rotated":
                self.notice(path, "rotated", f"{path} was rotated; following the new file")
            else:
                where = "its start" if offset == 0 else "its end"
                self.notice(path, "created", f"{path} appeared; following it from {where}")
        source.announced = True
        return True

    def open_compressed(self, source: _Source, fd: int, st: os.stat_result) -> bool:
        gen = source.current = _Generation(fd, st, source.next_number, 0)
        gen.gunzip = zlib.decompressobj(16 + zlib.MAX_WBITS)
        source.next_number += 1
        source.start_at_end = False
        source.last_error, source.state = "", "ok"
        source.detail = "compressed: reading it once"
        source.announced = True
        self.notice(source.path, "compressed", f"{source.path} is compressed: read once from its start, not followed")
        return True

    # -- reading -----------------------------------------------------------------------------------

    def read(
        self, source: _Source, gen: _Generation, *, check_boundary: bool, size: int | None = None
    ) -> tuple[int, bool]:
        """Read new bytes of gen into records, up to the budget, and up to `size` (the file's size
        at its stat) when given. Returns (bytes read, refilled): refilled means the bytes before
        our offset changed (truncated and rewritten past it)."""
        got = 0
        while got < _READ_BUDGET:
            back = len(gen.boundary) if check_boundary else 0
            # Asking for what the stat said is there, not a whole chunk: pread allocates what it
            # is asked for, and a megabyte's allocation and page faults cost four times the read
            # of a poll's 100 kB. What came after the stat is read at the next poll.
            want = _CHUNK if size is None else min(_CHUNK, size - gen.offset)
            if want <= 0:
                break
            # Reading the last few known bytes again costs nothing extra (same syscall) and tells
            # a file truncated and refilled past our offset between two polls from a plain append.
            data = os.pread(gen.fd, want + back, gen.offset - back)
            if back:
                if data[:back] != gen.boundary:
                    return got, True
                data = data[back:]
            if not data:
                break
            received = time.monotonic()
            gen.offset += len(data)
            got += len(data)
            if check_boundary:
                gen.boundary = (gen.boundary + data[-_BOUNDARY:])[-_BOUNDARY:]
            split = gen.split(data, self.max_line)
            if split.texts:
                self.emit(source, gen, split.texts, received, split.widest, split.raw)
            if len(data) < want:
                break
        return got, False

    def emit(
        self, source: _Source, gen: _Generation, texts: list[str], received: float, widest: int | None = None,
        raw: bytes | None = None,
    ) -> None:
        numbering = gen.numbering
        if numbering is not None and numbering.done.is_set():
            gen.lineno += numbering.base  # counted: from now on runs carry true numbers directly
            gen.numbering = None
            if numbering.error:
                self.notice(source.path, "error", numbering.error)
        self.runs.append(LogRun(source.path, gen.number, gen.lineno + 1, texts, received, gen.numbering, widest, raw))
        gen.lineno += len(texts)
        source.lines += len(texts)
        source.last_line_at = received
        if gen.cut and not gen.cut_noticed:
            # One notice per generation: the marker in each cut line's text says the rest.
            gen.cut_noticed = True
            self.notice(
                source.path,
                "capped",
                f"{source.path} has lines longer than {self.max_line} characters; they are cut and marked",
            )

    def finish(self, source: _Source, gen: _Generation) -> None:
        """A rotated/deleted generation is done: its partial last line can never complete."""
        if gen.partial or gen.dropped:
            self.emit(source, gen, [gen.take_partial(self.max_line)], time.monotonic())
        if self.globs:
            try:
                self.finished[(gen.dev, gen.ino)] = os.pread(gen.fd, _BOUNDARY, 0)
            except OSError:
                pass
        close_quietly(gen.fd)

    def poll(self, now: float) -> bool:
        """Read what is new everywhere. Returns True when a file still has unread bytes (no sleep)."""
        if now >= self.next_glob:
            if self.globs:
                self.expand_globs(now)
            else:
                self.next_glob = now + GLOB_EVERY
        busy = False
        for source in list(self.sources.values()):
            try:
                busy |= self.poll_source(source, now)
            except Exception as exc:  # a surprise in one file must not stop the others
                self.fail(source, f"error following {source.path}: {exc!r}; will retry")
        return busy

    def poll_source(self, source: _Source, now: float) -> bool:
        backlog = False
        for gen in list(source.draining):
            try:
                got, _ = self.read(source, gen, check_boundary=False)
            except OSError:
                got = 0  # the old file went bad; nothing more can come from it
                gen.quiet_since = 0.0
            if got:
                gen.quiet_since = now
                backlog |= got >= _READ_BUDGET
            elif now - gen.quiet_since >= _ROTATED_GRACE:
                source.draining.remove(gen)
                self.finish(source, gen)
        if backlog:
            return True  # the old generation first: the new file waits until it is read out
        if source.once:
            return False
        if source.current is None and not self.try_open(source, now):
            return False
        return self.follow(source, now)

    def follow(self, source: _Source, now: float) -> bool:
        gen = source.current
        assert gen is not None
        if gen.gunzip is not None:
            return self.read_compressed(source, gen)
        path = source.path
        try:
            st = os.stat(path)
        except FileNotFoundError:
            self.lost(source, now)
            return True
        except OSError as exc:
            # e.g. the directory became unreadable: keep reading through the open fd meanwhile.
            st = None
            if source.last_error != str(exc):
                source.last_error = str(exc)
                message = f"cannot stat {path}: {exc.strerror or exc}; still reading the open file"
                self.notice(path, "error", message)
        seen_before, source.seen_at = source.seen_at, time.time()
        if st is not None and (st.st_dev, st.st_ino) != (gen.dev, gen.ino):
            self.note_unread_rotations(source, st, seen_before)
            self.retire(source, gen, now)
            source.current = None
            source.next_retry = 0.0
            source.state, source.detail = "waiting", "rotated; waiting for the new file to open"
            self.try_open(source, now, kind="rotated")
            return True  # read the old one out first, on the next pass
        size = st.st_size if st is not None else os.fstat(gen.fd).st_size
        last_size, source.last_size = source.last_size, size
        if size < gen.offset:
            self.truncated(source, gen, last_size)
        elif size == gen.offset:
            return False
        try:
            got, refilled = self.read(source, gen, check_boundary=True, size=size)
            if refilled:
                self.truncated(source, gen, last_size)
                got, _ = self.read(source, gen, check_boundary=True, size=size)
        except OSError as exc:
            # e.g. EIO on a network filesystem: keep the fd and our offset, and try again next poll
            # (reopening would read the file again from its start).
            self.fail(source, f"cannot read {path}: {exc.strerror or exc}; retrying")
            return False
        if source.state == "error":
            source.state, source.detail, source.last_error = "ok", f"following generation {gen.number}", ""
        return got >= _READ_BUDGET

    def read_compressed(self, source: _Source, gen: _Generation) -> bool:
        """Decompress the next part of a compressed file (at most _READ_BUDGET bytes out, so a
        small file that inflates hugely is read a budget at a time); True while there is more."""
        produced = 0
        while produced < _READ_BUDGET:
            d = gen.gunzip
            raw = d.unconsumed_tail
            if not raw:
                try:
                    raw = os.pread(gen.fd, _CHUNK, gen.offset)
                except OSError as exc:
                    return self.done_compressed(source, gen, f"cannot read it: {exc.strerror or exc}")
                gen.offset += len(raw)
                if not raw:
                    return self.done_compressed(source, gen, "" if d.eof else "it ends before its end-of-stream marker")
            try:
                out = d.decompress(raw, _CHUNK)
            except zlib.error as exc:
                return self.done_compressed(source, gen, f"it is not valid gzip past this point ({exc})")
            if d.eof:  # another member may follow (concatenated gzip files): from its first byte
                gen.offset -= len(d.unused_data)
                gen.gunzip = zlib.decompressobj(16 + zlib.MAX_WBITS)
            if out:
                produced += len(out)
                split = gen.split(out, self.max_line)
                if split.texts:
                    self.emit(source, gen, split.texts, time.monotonic(), split.widest, split.raw)
        return True

    def done_compressed(self, source: _Source, gen: _Generation, problem: str) -> bool:
        if gen.partial or gen.dropped:
            self.emit(source, gen, [gen.take_partial(self.max_line)], time.monotonic())
        close_quietly(gen.fd)
        source.current, source.once = None, True
        source.detail = f"compressed: read once ({source.lines:,} lines), not followed"
        if problem:
            source.state = "error"
            self.notice(source.path, "error", f"{source.path}: read {source.lines:,} lines, then stopped: {problem}")
        return False

    def _siblings(self, source: _Source) -> list[tuple[str, os.stat_result]]:
        """Regular files beside the followed one whose names begin with its name (its rotations)."""
        directory, name = os.path.split(os.path.abspath(source.path))
        found = []
        try:
            with os.scandir(directory) as entries:
                for entry in entries:
                    if entry.name != name and entry.name.startswith(name):
                        try:
                            st = entry.stat(follow_symlinks=False)
                        except OSError:
                            continue
                        if stat.S_ISREG(st.st_mode):
                            found.append((entry.path, st))
        except OSError:
            pass
        return found

    def note_unread_rotations(self, source: _Source, new: os.stat_result, seen_before: float) -> None:
        """The path names a new file: if it was rotated more than once since the last look, the
        files between were never opened. Count those still beside it (written since then, never
        read here; a compressed copy of a file that was read is not one of them)."""
        skip = source.opened | {(new.st_dev, new.st_ino)}
        unread = [
            (path, st) for path, st in self._siblings(source)
            if (st.st_dev, st.st_ino) not in skip and st.st_mtime >= seen_before and not path.endswith(".gz")
        ]
        if unread:
            names = ", ".join(os.path.basename(p) for p, _ in sorted(unread)[:5])
            self.notice(
                source.path, "lost",
                f"{source.path} was rotated faster than it is followed: {len(unread)} file(s), "
                f"{sum(st.st_size for _, st in unread):,} bytes, were never read ({names}; still on disk)",
            )

    def recover_truncated(self, source: _Source, gen: _Generation, last_size: int) -> None:
        """Before a truncated file is read again from its start: what was written after our
        offset and before the truncation (copytruncate with no pause) is read from the copy,
        when one is beside it; else a notice says it could not be read."""
        best: tuple[float, str] | None = None
        if not gen.boundary:  # nothing read yet: no bytes to match a copy against, nothing of it skipped
            return
        for path, st in self._siblings(source):
            if st.st_size <= gen.offset or path.endswith(".gz") or (st.st_dev, st.st_ino) in source.opened:
                continue
            back = len(gen.boundary)
            try:
                fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
                try:
                    same = os.pread(fd, back, gen.offset - back) == gen.boundary
                finally:
                    os.close(fd)
            except OSError:
                continue
            if same and (best is None or st.st_mtime > best[0]):
                best = (st.st_mtime, path)
        if best is None:
            unread = last_size - gen.offset  # seen at the last look, not read since
            if unread > 0:
                self.notice(source.path, "lost", f"{source.path} was truncated before {unread:,} bytes after byte "
                            f"{gen.offset:,} were read; they could not be read (no copy of it found beside it)")
            return
        copy = best[1]
        lines = got = 0
        try:
            fd = os.open(copy, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            return
        try:
            while got < _RECOVER_MAX:
                data = os.pread(fd, _CHUNK, gen.offset + got)
                if not data:
                    break
                got += len(data)
                split = gen.split(data, self.max_line)
                if split.texts:
                    lines += len(split.texts)
                    self.emit(source, gen, split.texts, time.monotonic(), split.widest, split.raw)
        except OSError:
            pass
        finally:
            os.close(fd)
        self.notice(source.path, "truncated", f"{source.path} was truncated before {got:,} bytes ({lines:,} lines) "
                    f"were read; they were read from its copy {os.path.basename(copy)}")

    def truncated(self, source: _Source, gen: _Generation, last_size: int = 0) -> None:
        self.recover_truncated(source, gen, last_size)
        if gen.partial or gen.dropped:
            self.emit(source, gen, [gen.take_partial(self.max_line)], time.monotonic())
        gen.restart(source.next_number)
        source.next_number += 1
        source.detail = f"following generation {gen.number}"
        self.notice(source.path, "truncated", f"{source.path} was truncated; reading it again from its start")

    def retire(self, source: _Source, gen: _Generation, now: float) -> None:
        gen.quiet_since = now
        source.draining.append(gen)

    def lost(self, source: _Source, now: float) -> None:
        """The path is gone. Moved away (the inode has other links) is a rotation in progress;
        otherwise it was deleted. Either way the open fd is read to its end first."""
        gen = source.current
        assert gen is not None
        try:
            moved = os.fstat(gen.fd).st_nlink > 0
        except OSError:
            moved = False
        self.retire(source, gen, now)
        source.current = None
        source.next_retry = 0.0
        path = source.path
        if moved:
            source.state, source.detail = "waiting", "moved away (rotated?); waiting for a new file"
            self.notice(path, "rotated", f"{path} was moved away; finishing it and waiting for a new file")
        else:
            source.state, source.detail = "deleted", "deleted; waiting for it to reappear"
            self.notice(path, "deleted", f"{path} was deleted; waiting for it to reappear")

    # -- health ------------------------------------------------------------------------------------

    def health(self) -> list[SourceHealth]:
        with self.lock:
            sources = list(self.sources.values())
            unmatched = sorted(self.unmatched)
        out = [SourceHealth(s.path, s.state, s.detail, s.lines, s.last_line_at) for s in sources]
        out += [SourceHealth(p, "waiting", "no file matches this glob yet", 0, None) for p in unmatched]
        return out
