"""Where following starts in a file that exists already, and the count of the lines before it.

Following starts at the file's end (like `tail -f -n 0`), or with `backlog_lines=N` at the start of
its last N whole lines (like `tail -n N -f`), or at its first line with `from_start`
(`start_of_backlog`). Line numbers stay true when following starts past line 1, without making the
last lines wait for the count: the lines before are counted on a short-lived counter thread (about
0.5 to 0.9 s per GiB from the page cache here) while the tail is delivered at once; the runs read
meanwhile share a `Numbering` that the count fills in (`count_in_background`). With `history=True`
each such file's batch also carries a `SkippedLines` (the part before, with its own file descriptor
and line count), so the caller can scan it for what happened earlier, and count its lines on the
way: the counter thread then leaves them (`SkippedLines.claim`), and the bytes are read once.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

_COUNT_BLOCK = 4 << 20  # bytes per pread while counting


class Numbering:
    """The line count before where following began in one generation, filled in after the tail
    has been delivered: by the history scan, which reads those lines anyway, or else by a counter
    thread (see `count_in_background`). Whoever claims it first counts."""

    __slots__ = ("_claimed", "_lock", "base", "done", "error")

    def __init__(self) -> None:
        self.base = 0
        self.error: str | None = None
        self.done = threading.Event()
        self._claimed = False
        self._lock = threading.Lock()

    def claim(self) -> bool:
        """Take the count on (then finish() it); False if someone else has."""
        with self._lock:
            if self._claimed:
                return False
            self._claimed = True
            return True

    def finish(self, base: int, error: str | None = None) -> None:
        self.base, self.error = base, error
        self.done.set()


class SkippedLines:
    """The part of a file before where following began (history=True): bytes [0, end) of the
    generation's inode, through a file descriptor of its own (`fd`; `close()` it when done).
    `lines` is how many lines lie there; it waits for their count (`wait` bounds that).

    A scan of the part can count them on its way (`claim`, then `counted`): the counter thread
    then leaves them, and the bytes are read once. A part claimed and closed uncounted is counted
    on a thread of its own then: the live lines' numbers wait for it."""

    __slots__ = ("_claimed", "_numbering", "_stopping", "end", "fd", "generation", "source")

    def __init__(
        self, source: str, generation: int, end: int, fd: int, numbering: Numbering, stopping: threading.Event
    ) -> None:
        self.source = source
        self.generation = generation
        self.end = end
        self.fd: int | None = fd
        self._numbering = numbering
        self._stopping = stopping
        self._claimed = False

    def claim(self) -> bool:
        """Count the lines in the caller's scan, not on the counter thread: True if the counter
        had not begun; the caller then calls counted() (or close() counts them)."""
        self._claimed = self._numbering.claim()
        return self._claimed

    def counted(self, lines: int) -> None:
        """The claimed count: `lines` end before `end`."""
        self._numbering.finish(lines)

    def wait(self, timeout: float | None = None) -> bool:
        """True once the lines before `end` are counted."""
        return self._numbering.done.wait(timeout)

    @property
    def lines(self) -> int:
        self._numbering.done.wait()
        return self._numbering.base

    def close(self) -> None:
        fd, self.fd = self.fd, None
        if fd is None:
            return
        if self._claimed and not self._numbering.done.is_set():
            _start_counter(fd, self.end, self._numbering, self._stopping, self.source)  # it closes fd
        else:
            close_quietly(fd)

    def __del__(self) -> None:  # a consumer that drops it must not leak the descriptor
        self.close()

    def __repr__(self) -> str:
        return f"SkippedLines({self.source!r}, gen {self.generation}, {self.end} bytes)"


def close_quietly(fd: int) -> None:
    """Close a descriptor the follower owns (a followed file, a counter's or a skipped part's copy)."""
    try:
        os.close(fd)
    except OSError:
        pass  # closing is best effort: nothing useful to tell anyone


_BACKLOG_MAX_BYTES = 64 << 20  # look back at most this far for backlog_lines (then fewer lines)


def start_of_backlog(fd: int, size: int, lines: int, max_line: int) -> int:
    """Where following "from the end" starts: the start of the last `lines` whole lines, or with
    lines=0 EOF (or the start of an unfinished last line, so that a line being written right now is
    delivered whole rather than as a fragment).

    Reads backwards in growing blocks. An unfinished last line is not counted among `lines`. If the
    look-back limit (4 * max_line, and _BACKLOG_MAX_BYTES for a backlog) is reached first, it starts
    at the first line start it found (fewer lines), or at EOF when there was none (a last line
    longer than max_line: give up on it)."""
    limit = min(size, max(4 * max_line, _BACKLOG_MAX_BYTES if lines else 0))
    want = lines + 1  # newlines to find from the end: the one ending the unfinished line counts
    pos = size
    found = 0
    first_start = -1  # the earliest line start seen so far
    block = 1 << 16
    while pos > size - limit:
        take = min(block, pos - (size - limit))
        data = os.pread(fd, take, pos - take)
        if len(data) < take:
            break  # the file shrank under us: whatever we found stands
        end = len(data)
        while True:
            nl = data.rfind(b"\n", 0, end)
            if nl < 0:
                break
            found += 1
            first_start = pos - take + nl + 1
            if found == want:
                return first_start
            end = nl
        pos -= take
        block = min(block * 4, 8 << 20)
    if size - limit == 0 and pos == 0:
        return 0  # the whole file holds fewer lines than asked for
    return first_start if first_start >= 0 else size


def _count_newlines(data: bytes) -> int:
    # bytes.count(b"\n") walks byte by byte in CPython 3.11; replace() finds them with memchr and
    # copies the rest, about twice as fast (see logscan._count_newlines).
    return len(data) - len(data.replace(b"\n", b""))


def _count_lines(fd: int, end: int, stopping: threading.Event) -> int:
    """Newlines before byte end, so line numbers stay true when following starts past line 1.
    About 0.5 to 0.9 s per GiB from the page cache here."""
    count = pos = 0
    while pos < end and not stopping.is_set():
        data = os.pread(fd, min(_COUNT_BLOCK, end - pos), pos)
        if not data:
            break
        count += _count_newlines(data)
        pos += len(data)
        time.sleep(0)  # let the UI thread have the GIL between blocks
    return count


def count_in_background(
    fd: int, end: int, numbering: Numbering, stopping: threading.Event, path: str, gate: threading.Event, delay: float
) -> None:
    """Count the lines before `end` on a thread of its own, so the tail is not held back by it;
    from when `gate` is set (or `delay` seconds at most), unless a history scan has claimed the
    count by then (it reads those lines anyway)."""

    def counting() -> bool:
        gate.wait(delay)
        return numbering.claim()

    _start_counter(fd, end, numbering, stopping, path, counting)


def _start_counter(
    fd: int, end: int, numbering: Numbering, stopping: threading.Event, path: str,
    counting: Callable[[], bool] = lambda: True,
) -> None:
    """Count on a thread of its own (when `counting()` says to) and close fd."""

    def run() -> None:
        try:
            if counting():
                numbering.finish(_count_lines(fd, end, stopping))
        except Exception as exc:  # whatever happens, nobody may wait forever for the count
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else repr(exc)
            numbering.finish(
                0,
                f"cannot count the lines of {path} before where following began ({reason}); "
                "its line numbers count from there",
            )
        finally:
            close_quietly(fd)

    try:
        threading.Thread(target=run, name="radixtop-line-count", daemon=True).start()
    except RuntimeError as exc:  # no thread (the interpreter exiting, or none left): none may wait
        close_quietly(fd)
        numbering.finish(
            0,
            f"cannot count the lines of {path} before where following began ({exc}); "
            "its line numbers count from there",
        )
